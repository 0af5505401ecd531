"""Errors the CLI turns into one line on stderr and an exit code, never a traceback."""

from __future__ import annotations


class LlmbError(Exception):
    """A run failed (exit code 1)."""

    exit_code = 1


class UsageError(LlmbError):
    """The user asked for something that cannot be done (exit code 2)."""

    exit_code = 2


class PluginError(LlmbError):
    """A backend raised inside one of its methods; the message names the backend and the method."""

    def __init__(self, backend: str, method: str, error: BaseException) -> None:
        self.backend, self.method, self.error = backend, method, error
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""  # one line, never a traceback
        super().__init__(f"backend {backend!r} failed in {method}: {type(error).__name__}: {first_line}")
