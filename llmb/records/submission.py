"""submission.json, a bundle's index, as a typed record: the packager writes it from this type and `llmb verify`
reads it back strictly, so a bundle whose index holds a value of another type (a list for its date, a number for a
result's path) is refused with the field named, as a result file is."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import ClassVar

from llmb.records.codec import SUBMISSION_SCHEMA, Record, RecordError, Typed, _join

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
