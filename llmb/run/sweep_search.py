"""The batch-size search: pure functions of the points found so far, so a resumed sweep takes the same decisions
(doubling from 1, confirmations, bisection between the last two sizes, the headline)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING

from llmb.records import SweepTrial as Trial
from llmb.records import (
    best_batch_runs,
    median_index,
)
from llmb.run.sweep_options import CONFIRM_TRIALS, PLATEAU_GAIN, REFINE_POINTS

if TYPE_CHECKING:
    pass


# The search: pure functions of the points found so far. A batch size's points are its search trials (the first,
# then its confirmations); its figure is their median trial's (records.median_index: a run that happened).

Points = dict[int, list[Trial]]


def failure(trials: list[Trial]) -> Trial | None:
    """The first failed trial of a batch size (one failure fails the size: it does not reliably run)."""
    return next((t for t in trials if not t.ok), None)


def median_trial(trials: list[Trial]) -> Trial:
    """The median trial by tokens/s (the slower middle one for an even count) of a batch size that ran."""
    return trials[median_index([t.tokens_per_second for t in trials])]


def _tps(points: Points, batch: int) -> float:
    return median_trial(points[batch]).tokens_per_second


def _unconfirmed(points: Points, batches: list[int]) -> int | None:
    """The first of these sizes that has fewer than CONFIRM_TRIALS trials (each is measured again before it decides
    anything: one noisy trial must not pick or end the search)."""
    return next((b for b in batches if len(points[b]) < CONFIRM_TRIALS), None)


def next_batch(points: Points, max_batch_size: int) -> tuple[int | None, str]:
    """The next batch size the automatic search measures (None when done) and why it stopped growing."""
    batch, previous = 1, None
    while True:
        trials = points.get(batch)
        if not trials:
            return batch, "growing"
        failed = failure(trials)
        if failed is not None:
            if previous is None:
                return None, f"batch 1 failed ({failed.status})"
            lo, hi, failed_above, reason = previous, batch, True, f"{failed.status} at batch {batch}"
            break
        # Where the search already grew past this size (a later confirmation lowered a median), the log's walk
        # stands: a stop declared below sizes that ran would contradict the best batch it found up there.
        grown_past = batch < max_batch_size and min(batch * 2, max_batch_size) in points
        if (
            previous is not None
            and not grown_past
            and _tps(points, batch) < _tps(points, previous) * (1 + PLATEAU_GAIN)
        ):
            # Before a plateau is declared, both sides are measured again; the medians decide.
            again = _unconfirmed(points, [previous, batch])
            if again is not None:
                return again, f"confirming batch {previous} -> {batch}"
            now, before = _tps(points, batch), _tps(points, previous)
            if now < before * (1 + PLATEAU_GAIN):
                lo, hi, failed_above = previous, batch, False
                if now < before:
                    reason = f"slower: batch {previous} -> {batch} lost {1 - now / before:.1%} (medians)"
                else:
                    reason = (
                        f"plateau: batch {previous} -> {batch} gained {now / before - 1:.1%}, under {PLATEAU_GAIN:.0%}"
                    )
                break
        if batch >= max_batch_size:
            return None, f"--max-batch-size {max_batch_size} reached"
        previous, batch = batch, min(batch * 2, max_batch_size)
    # Refinement: after a failure, bisect for the largest size that runs; after a plateau, toward the faster end.
    for _ in range(REFINE_POINTS):
        if hi - lo <= 1:
            break
        mid = (lo + hi) // 2
        trials = points.get(mid)
        if not trials:
            return mid, reason
        if failure(trials) is not None:
            hi, failed_above = mid, True
        elif failed_above or _tps(points, hi) >= _tps(points, lo):
            lo = mid
        else:
            hi = mid
    return None, reason


def next_listed_batch(points: Points, sizes: list[int]) -> tuple[int | None, str]:
    """The next size of an explicit list; sizes above one that ran out of memory are skipped."""
    oom = [b for b, trials in points.items() if any(t.status == "oom" for t in trials)]
    for size in sizes:
        if size in points:
            continue
        if oom and size > min(oom):
            return None, f"sizes above {min(oom)} skipped (out of memory there)"
        return size, "listed"
    return None, "every listed size ran"


def best_batch(points: Points) -> int | None:
    """The batch size whose median trial is fastest (the smaller one on a tie), among those that ran."""
    ran = [b for b, trials in points.items() if trials and failure(trials) is None]
    return max(ran, key=lambda b: (_tps(points, b), -b)) if ran else None


def confirming(points: Points) -> int | None:
    """Before a best batch is declared, it and its measured neighbours that ran have CONFIRM_TRIALS trials each."""
    best = best_batch(points)
    if best is None:
        return None
    ran = sorted(b for b, trials in points.items() if trials and failure(trials) is None)
    at = ran.index(best)
    return _unconfirmed(points, [best, *ran[max(at - 1, 0) : at], *ran[at + 1 : at + 2]])


def next_point(points: Points, search: Callable[[Points], tuple[int | None, str]]) -> tuple[int | None, str]:
    """The search's next size, else a confirmation of the best size and its neighbours, else None and the reason the
    search stopped. Each size gets at most CONFIRM_TRIALS trials, so this ends."""
    batch, reason = search(points)
    if batch is not None:
        return batch, reason
    again = confirming(points)
    return (again, "confirming the best batch") if again is not None else (None, bracketing(points, reason))


def bracketing(points: Points, reason: str) -> str:
    """The stop reason, told again where the confirmations moved the best batch below the pair it names: "slower:
    batch 2 -> 4" beside a best batch 1 would say the search grew past a size it found best. The pair then becomes
    the best batch and the next size measured above it, with their final medians."""
    pair = re.search(r"batch (\d+) -> (\d+)", reason)
    best = best_batch(points)
    if pair is None or best is None or int(pair.group(1)) <= best <= int(pair.group(2)):
        return reason
    above = min((b for b in points if b > best and points[b]), default=None)
    if above is None:
        return reason
    failed = failure(points[above])
    if failed is not None:
        return f"{failed.status} at batch {above}"
    now, before = _tps(points, above), _tps(points, best)
    if now < before:
        return f"slower: batch {best} -> {above} lost {1 - now / before:.1%} (medians)"
    return f"plateau: batch {best} -> {above} gained {now / before - 1:.1%}, under {PLATEAU_GAIN:.0%}"


def headline_of(points: Points, repeats: list[Trial]) -> tuple[Trial, list[Trial]] | None:
    """(the headline trial, the trials its median is over) by the headline rule the report and summary.md share
    (records.best_batch_runs): the re-runs of the best batch where any ran, else the search trials of a size that
    ran. The live best-so-far line and the summary both show this."""
    # A size with a failed trial does not reliably run (failure), so none of its trials may head the sweep.
    ran = [t for trials in points.values() if failure(trials) is None for t in trials]
    return best_batch_runs(ran + [t for t in repeats if t.ok], lambda t: t.phase)
