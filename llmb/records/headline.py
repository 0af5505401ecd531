"""The headline rule every reader shares: what may be pooled (RunGroup), a median that is a run that happened, and
the best batch's runs (records.best_batch_runs), used by the run, the sweep, the report and summary.md."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from llmb.records.codec import SPREAD_WARNING

if TYPE_CHECKING:  # annotations only: the records import this module's RunGroup
    from llmb.records.schemas import Result

# The headline rule and what may be pooled


@dataclass(frozen=True, order=True)
class RunGroup:
    """What runs must share to be compared under one headline; runs differing in any of these are never pooled.
    The batch size is not among them: the headline rule (best_batch_runs) picks a group's batch."""

    plugin: str
    settings: str
    precision: str  # the effective one
    mode: str
    shape: str
    device: str
    nodes: int
    world_size: int
    parallel: str


def median_index(values: list[float]) -> int:
    """Index of the median value, the lower middle for an even count, so a headline is always a run that happened.

    Called with throughputs (higher is better), an even count takes the slower of the two middle runs."""
    order = sorted(range(len(values)), key=values.__getitem__)
    return order[(len(order) - 1) // 2]


@dataclass
class Headline:
    """A group's headline: its median run (a run that happened) and the runs that median is over (best_batch_runs)."""

    run: Result
    runs: list[Result]

    @property
    def low(self) -> float:
        return min(r.tokens_per_second for r in self.runs)

    @property
    def high(self) -> float:
        return max(r.tokens_per_second for r in self.runs)

    @property
    def spread(self) -> float:
        """(max - min) / headline of the runs' tokens/s."""
        return (self.high - self.low) / self.run.tokens_per_second

    @property
    def noisy(self) -> bool:
        return self.spread > SPREAD_WARNING


T = TypeVar("T")
REPEAT_PHASE = "repeat"  # a sweep's re-runs of its best batch (SweepTrial.phase)
# Runs at one batch size for its median to head a group ahead of a faster batch with fewer (a median, not one lucky
# run); the packager asks for this many at the headline's batch of each precision.
MIN_RUNS = 3


def _no_phase(run: Any) -> str | None:
    return None


def counted_runs(runs: Sequence[T], phase: Callable[[T], str | None]) -> list[T]:
    """The runs a figure may be the median of: a sweep's re-runs where there are any, else all the runs. The search
    trials that picked a batch are never pooled with its re-runs."""
    repeats = [r for r in runs if phase(r) == REPEAT_PHASE]
    return repeats or list(runs)


def best_batch_runs(runs: Sequence[T], phase: Callable[[T], str | None] = _no_phase) -> tuple[T, list[T]] | None:
    """The headline rule, the one every reader calls: (the headline run, the runs its median is over) of one group's
    finished runs (a RunGroup: all they share but the batch size), or None for no runs. `runs` are results, report
    points or sweep trials: anything with `batch_size` and `tokens_per_second`; `phase` names a run's sweep phase
    where it is known (a sweep log's), else None.

    Per batch size, the runs that count are its re-runs where it has any (counted_runs). Batches then compete in
    this order: a batch a sweep re-ran over one it only searched (the re-runs are the sweep's verdict), a batch with
    MIN_RUNS runs over one with fewer, then the fastest median run (median_index: a run that happened), the smaller
    batch on a tie. The sweep's summary and live line, `llmb report`, a bundle's summary.md and `llmb reproduce` all
    show this run, and the packager keeps only a group's re-runs where a sweep made any, so a bundle read without its
    sweep log still leads here to the same run."""
    by_batch: dict[int, list[T]] = {}
    for run in runs:
        by_batch.setdefault(run.batch_size, []).append(run)
    counted = {batch: counted_runs(members, phase) for batch, members in sorted(by_batch.items())}
    reran = {batch: members for batch, members in counted.items() if phase(members[0]) == REPEAT_PHASE}
    competing = reran or counted
    competing = {b: members for b, members in competing.items() if len(members) >= MIN_RUNS} or competing
    best: tuple[T, list[T]] | None = None
    for members in competing.values():  # ascending batch sizes: a tie keeps the smaller
        run = members[median_index([m.tokens_per_second for m in members])]
        if best is None or run.tokens_per_second > best[0].tokens_per_second:
            best = run, members
    return best


def headline(runs: list[Result], phase: Callable[[Result], str | None] = _no_phase) -> Headline:
    """The headline of one group's results by the headline rule (best_batch_runs): its figures are all its median
    run's, its spread that of the runs the median is over."""
    if len({r.group for r in runs}) > 1:
        raise ValueError("runs of different groups cannot share a headline")
    chosen = best_batch_runs(runs, phase)
    if chosen is None:
        raise ValueError("a headline needs at least one run")
    return Headline(*chosen)


def group_runs(runs: list[Result]) -> dict[RunGroup, list[Result]]:
    """Results by the group they may be compared in (every batch size of it), in RunGroup order."""
    groups: dict[RunGroup, list[Result]] = {}
    for run in runs:
        groups.setdefault(run.group, []).append(run)
    return dict(sorted(groups.items()))


def spread_warning(h: Headline) -> str | None:
    """A one-line warning when the runs of a headline spread more than SPREAD_WARNING, else None."""
    if not h.noisy:
        return None
    return (
        f"the {len(h.runs)} runs of {h.run.precision.effective} batch {h.run.batch_size} spread "
        f"{h.spread:.1%} ({h.low:,.1f}-{h.high:,.1f} tokens/s, more than {SPREAD_WARNING:.0%}): a noisy host?"
    )
