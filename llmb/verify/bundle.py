"""What verify holds of a bundle while it checks it: the bundle's files read under the limits, its results parsed
on demand within a memory budget, and the rows of the table the checks fill."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from llmb.api.errors import describe
from llmb.bundle import reader as bundle_io
from llmb.bundle.reader import Limits
from llmb.records import (
    Result,
)

# Parsed results verify keeps at once, by the size of their files: past it a result is read again from the bundle
# each time a check needs it, so verify's memory is bounded by what it checks, not by the bundle's size (a bundle
# within every limit may hold 60 results of 4 MiB, which parsed all at once passed 1 GiB resident; a typical
# bundle's dozen 15 kB results are read once).
RESULT_CACHE_BYTES = 32 * 2**20


class ResultFiles(Mapping):
    """The bundle's results that read as a Result, by path: parsed on demand, kept parsed up to RESULT_CACHE_BYTES
    of their files (in the order they were first read)."""

    def __init__(self, read: Callable[[str], Result], budget: int | None = None) -> None:
        self._read, self._budget = read, RESULT_CACHE_BYTES if budget is None else budget
        self._sizes: dict[str, int] = {}
        self._kept: dict[str, Result] = {}

    def add(self, path: str, result: Result, size: int) -> None:
        self._sizes[path] = size
        if sum(self._sizes[p] for p in self._kept) + size <= self._budget:
            self._kept[path] = result

    def __getitem__(self, path: str) -> Result:
        if path in self._kept:
            return self._kept[path]
        if path not in self._sizes:
            raise KeyError(path)
        return self._read(path)

    def __iter__(self) -> Iterator[str]:
        return iter(self._sizes)

    def __len__(self) -> int:
        return len(self._sizes)


def headline_view(r: Result) -> Result:
    """A result as the headline rule and summary.md read it, without its bulk (evidence, per-step and per-rank
    figures, facts, host): what verify holds of every result at once to find the headlines."""
    timing = replace(
        r.timing,
        step_seconds=[],
        repeat_window_seconds=[],
        worker_repeat_window_seconds=None,
        seal_seconds=None,
        warmup_step_seconds=[],
    )
    return replace(
        r,
        evidence=None,
        judge=None,
        facts={},
        host=None,
        per_rank=None,
        per_rank_busy_seconds=None,
        per_rank_step_seconds=None,
        timing=timing,
        invalid_reasons=r.invalid_reasons[:1],  # the headline rule asks only whether there are any
    )


@dataclass
class Row:
    check: str
    passed: bool
    detail: str


@dataclass
class Bundle:
    root: Path
    accept_debug: bool
    rows: list[Row] = field(default_factory=list)
    submission: dict | None = None
    limits: Limits = field(default_factory=Limits)
    replay_steps: int = 0  # --replay: steps of each headline window replayed here (0: none)
    # path -> record, the ones that read as a Result (check_results_schema), read again past a memory budget
    results: ResultFiles = field(init=False)
    _views: list[Result] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.results = ResultFiles(lambda path: Result.from_dict(self.json(path)))

    def headline_views(self) -> list[Result]:
        """Every result as headline_view shows it, made once (check_runs, check_summary and the leaderboard)."""
        if self._views is None:
            self._views = [headline_view(r) for r in self.results.values()]
        return self._views

    def add(self, check: str, problems: list[str], passed_detail: str) -> None:
        shown = "; ".join(problems[:3]) + (f" (+{len(problems) - 3} more)" if len(problems) > 3 else "")
        self.rows.append(Row(check, not problems, shown if problems else str(passed_detail)))

    def text(self, name: str, max_bytes: int | None = None) -> str:
        """A text file of the bundle itself (never through a link, refused unread over the limit); ValueError with
        a short reason otherwise."""
        data = bundle_io.read_bytes(self.root, name, self.limits.text_bytes if max_bytes is None else max_bytes)
        try:
            return data.decode("utf-8")  # bytes, not read_text: a diff's \r must survive
        except UnicodeDecodeError as exc:
            raise ValueError(f"{name} is unreadable ({exc.__class__.__name__})") from None

    def json(self, name: str) -> dict:
        """A JSON object from the bundle; raises ValueError with a short reason when it is not one."""
        try:
            data = json.loads(self.text(name, self.limits.json_bytes))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{name} is not valid JSON ({exc.__class__.__name__}: {exc})") from None
        if not isinstance(data, dict):
            raise ValueError(f"{name} is not a JSON object")
        return data


def per_result(b: Bundle, check: str, problems_of: Callable[[Bundle, str, dict], list[str]], passed: str) -> None:
    paths_of: dict[str, list[str]] = {}  # problem -> the results that have it, so a shared one is said once
    for path, record in b.results.items():
        try:
            found = problems_of(b, path, record)
        except Exception as exc:  # a field of the wrong type deep inside a record
            found = [f"malformed ({describe(exc)})"]
        for problem in found:
            paths_of.setdefault(problem, []).append(path)
    problems = [
        f"{paths[0]}: {problem}" if len(paths) == 1 else f"{len(paths)} results: {problem}"
        for problem, paths in paths_of.items()
    ]
    b.add(check, problems, passed.format(n=len(b.results)))
