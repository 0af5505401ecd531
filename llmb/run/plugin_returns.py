"""What a backend's methods return for the record (its device's name and count, its peak memory, its run facts),
read so that no returned value can end a measured run or make its record unreadable.

These are read after the last window: a name whose __str__ raises, a count of NaN or a fact of 10**400 once ended
the run there with an error that named neither backend nor method, and every measured window was lost; a surrogate
or a 70 MB fact made `llmb run` write a result its own readers refused. Now a value of the wrong type or range is
recorded as unknown and the run is invalid, saying which method returned what (the record would otherwise describe a
device the plugin did not describe); the facts, which are the plugin's free text, are kept as the record can hold
them (llmb.records.files.as_record_value).
"""

from __future__ import annotations

from typing import Any

from llmb.records.files import as_record_value

# A device's name is a product name ("NVIDIA H100 80GB HBM3"), never a paragraph.
NAME_LIMIT = 200
# No host has more devices of one type, nor more memory in bytes than an int64 counts.
MAX_DEVICES = 1_000_000
MAX_BYTES = 2**63 - 1


def _said(value: Any) -> str:
    """A returned value in a problem's line: its type, and the value itself where it is a short plain one."""
    if type(value) is int and value.bit_length() > 128:  # repr() of one past 4300 digits raises
        return f"a {value.bit_length()}-bit integer"
    if type(value) in (bool, int, float) or value is None:  # these types exactly: a subclass's repr is its own code
        return repr(value)
    if isinstance(value, str):
        return f"text of {len(value)} characters" if len(value) > 40 else repr(as_record_value(value))
    return f"a {type(value).__name__}"


class PluginReturns:
    """One backend's returned values as the record takes them; `problems` says each one refused."""

    def __init__(self, backend_name: str) -> None:
        self.backend_name = backend_name
        self.problems: list[str] = []

    def _refused(self, method: str, value: Any, expected: str) -> None:
        self.problems.append(
            f"backend {self.backend_name!r}: {method} returned {_said(value)}, not {expected} (recorded as unknown)"
        )

    def name(self, method: str, value: Any) -> str:
        """A device's name: non-empty text, kept to NAME_LIMIT characters on one line; else "unknown"."""
        if not isinstance(value, str) or not value.strip():
            self._refused(method, value, "a device's name (text)")
            return "unknown"
        return as_record_value(" ".join(value.split()), NAME_LIMIT)

    def count(self, method: str, value: Any) -> int | None:
        """A number of devices: an integer from 1 to MAX_DEVICES; else None."""
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_DEVICES:
            self._refused(method, value, f"a number of devices (an integer from 1 to {MAX_DEVICES})")
            return None
        return value

    def byte_count(self, method: str, value: Any) -> int | None:
        """A number of bytes, or None where the backend does not know: an integer from 0 to MAX_BYTES; else None."""
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_BYTES:
            self._refused(method, value, "a number of bytes (an integer of 0 or more) or None")
            return None
        return value

    def facts(self, method: str, value: Any) -> dict:
        """The run's facts: an object (None: none), each value as the record can hold it."""
        if value is None:
            return {}
        if not isinstance(value, dict):
            self._refused(method, value, "an object of facts")
            return {}
        return as_record_value(value)
