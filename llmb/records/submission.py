"""submission.json, a bundle's index, as a typed record: the packager writes it from this type and `llmb verify`
reads it back strictly, so a bundle whose index holds a value of another type (a list for its date, a number for a
result's path) is refused with the field named, as a result file is. And system.json's fields that llmb fills, by
type: a user's --system-file may add fields of its own (MLPerf's system description has more), never retype these."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar

from llmb.records.codec import SUBMISSION_SCHEMA, Record, RecordError, Typed, _join, _parse

DIVISIONS = ("closed", "open")  # closed: llmb as released; open: llmb's own files changed (llmb_changes)


@dataclass(kw_only=True)
class DebugResult(Typed):
    """A result that makes the bundle a debug one, and why."""

    result: str
    reasons: list[str]


@dataclass(kw_only=True)
class DebugInfo(Typed):
    """Whether the bundle is a debug one (results at other shapes, or invalid ones kept), and what made it so."""

    is_debug: bool
    reasons: list[str]
    allow_debug_shapes: bool
    include_debug: bool
    results: list[DebugResult]


@dataclass(kw_only=True)
class SubmittedPlugin(Typed):
    """A plugin whose results the bundle holds: its distribution and version, and where its source is."""

    name: str
    distribution: str
    version: str
    precisions: list[str]
    source: str


@dataclass(kw_only=True)
class Submission(Record):
    """A bundle's index: who submits which system, its division, the debug marks, and every file of results,
    conformance and plugin source it holds."""

    SCHEMA: ClassVar[str] = SUBMISSION_SCHEMA
    submitter: str
    system_name: str
    division: str
    llmb_changes: list[str]
    debug: DebugInfo
    note: str = ""
    plugins: list[SubmittedPlugin]
    results: list[str]
    conformance: list[str] = field(default_factory=list)

    def check(self, path: str) -> None:
        super().check(path)
        if self.division not in DIVISIONS:
            raise RecordError(f"{_join(path, 'division')}: {self.division[:40]!r} (one of {', '.join(DIVISIONS)})")
        try:
            datetime.fromisoformat(self.created)
        except ValueError:
            raise RecordError(f"{_join(path, 'created')}: {self.created[:40]!r} is no ISO 8601 time") from None


# system.json's fields that llmb fills (llmb.run.sysinfo.collect, then the packager), with the type each holds, read
# as every record's fields are (codec._parse); counts are integers of 0 or more (host_processor_threads null where
# the OS does not say).
SYSTEM_FIELDS: dict[str, Any] = {
    **dict.fromkeys(
        ("number_of_nodes", "host_processors_per_node", "host_processor_core_count", "accelerators_per_node"), int
    ),
    "host_processor_threads": int | None,
    **dict.fromkeys(
        (
            "host_processor_model_name", "host_memory_capacity", "accelerator_model_name", "accelerator_type",
            "accelerator_memory_capacity", "accelerator_interconnect", "framework", "operating_system", "python",
            "llmb_version", "status", "cooling", "hw_notes", "submitter", "system_name", "division",
        ),
        str,
    ),
    **dict.fromkeys(("devices", "plugins", "fields_to_complete"), list[Any]),
    **dict.fromkeys(("runtime_versions", "software_versions", "environment"), dict[str, Any]),
}  # fmt: skip


def system_problems(system: dict[str, Any]) -> list[str]:
    """What in a system description (system.json, or the --system-file merged over it) gives one of the fields llmb
    fills a value of another type, or a negative count; one line each, the field named. Other fields are free."""
    problems = []
    for name, hint in SYSTEM_FIELDS.items():
        if name not in system:
            continue
        try:
            value = _parse(system[name], hint, name)
        except RecordError as exc:
            problems.append(str(exc))
            continue
        if isinstance(value, int) and value < 0:
            problems.append(f"{name}: {value} (0 or more)")
    return problems
