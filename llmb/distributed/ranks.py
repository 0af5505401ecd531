"""What the ranks of a job must agree on before they start, and what they measured, put together afterwards.

Agreement: before the first step every rank's facts (its run options, the model fingerprint, llmb's, torch's and
the plugin's versions, the plugin's resolved settings, the layout) are gathered and compared with rank 0's. A rank
that differs stops the job with one line naming it and the field (exit 2), within seconds, not as a collective
that aborts minutes later or a record with a wrong global batch.

Afterwards: the global batch is the sum of the rows the data-parallel ranks really ran; the loss is their global
mean (weighted by rows); per-rank step times and busy time show stragglers; threads are recorded per rank.
"""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from llmb.api.errors import UsageError

# A step is a straggler's when it takes this many times the median step of the job (every rank's steps pooled):
# compute steps of one layout are near-constant, and a pause (a preempted or throttled rank) is large against them.
STEP_FACTOR = 3.0
# Ranks whose busy time differs by more than this fraction of the busiest rank's ran on unequal footing (a shared or
# slower core): the job ran at the slowest rank's pace.
BUSY_SPREAD = 0.5


class Disagreement(UsageError):
    """Ranks of one job were started with different options or software."""


def disagreements(facts: list[dict]) -> list[tuple[int, str, Any, Any]]:
    """(rank, field, the rank's value, rank 0's value) for every field where a rank differs from rank 0."""
    reference = facts[0]
    found = []
    for rank, theirs in enumerate(facts[1:], start=1):
        for name in sorted(set(reference) | set(theirs)):
            if theirs.get(name) != reference.get(name):
                found.append((rank, name, theirs.get(name), reference.get(name)))
    return found


def check_agreement(facts: dict) -> None:
    """Gather every rank's facts on every rank and stop the job, on every rank, at the first disagreement."""
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, facts)
    found = disagreements(gathered)
    if found:
        rank, name, theirs, ours = found[0]
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise Disagreement(f"ranks disagree: rank {rank} has {name} = {theirs!r}, rank 0 has {ours!r}{more}")


def busy_seconds() -> float | None:
    """Seconds the calling thread (the one that steps the model) ran or waited to run: the Linux scheduler's
    on-CPU time plus its run-queue delay. A rank waiting for its peers in a collective sleeps, so it is not busy; a
    rank that wants a core it shares with others is. The main thread only: the console's refresh thread on rank 0
    is no work of the benchmark. None where the kernel does not say."""
    try:
        fields = Path("/proc/thread-self/schedstat").read_text().split()
        return (int(fields[0]) + int(fields[1])) / 1e9
    except (OSError, ValueError, IndexError):
        return None


@dataclass
class RankReport:
    """What one rank sends rank 0 after measuring."""

    effective: str
    invalid: list[str]
    windows: list[float]
    own: list[float | None]
    steps: list[list[float]]  # per repeat, each step's seconds
    busy: list[float | None]  # per repeat
    losses: dict[str, float]  # initial, and per repeat first/last under "first:<k>", "last:<k>"
    rows: int  # the samples of the global batch this rank contributed per step (0: a tensor/pipeline peer's copy)
    threads: int
    node: int
    stage: int = 0  # the pipeline stage: stages do different work, so only a stage's ranks compare busy times
    extra: dict = field(default_factory=dict)


def global_losses(reports: list[RankReport]) -> dict[str, float]:
    """The global mean of every recorded loss: each data-parallel rank's, weighted by its rows."""
    weights = [r.rows for r in reports]
    total = sum(weights) or 1
    return {
        key: sum(r.losses[key] * w for r, w in zip(reports, weights, strict=True)) / total for key in reports[0].losses
    }


def stragglers(reports: list[RankReport], repeat: int) -> list[str]:
    """Straggler notes for one repeat: steps slower than STEP_FACTOR x the median step; busy-time spread."""
    notes = []
    pooled = [s for r in reports for s in r.steps[repeat]]
    if pooled:
        median = statistics.median(pooled)
        for rank, report in enumerate(reports):
            slow = [(k, s) for k, s in enumerate(report.steps[repeat]) if median > 0 and s > STEP_FACTOR * median]
            if slow:
                k, s = max(slow, key=lambda item: item[1])
                notes.append(
                    f"rank {rank} (node {report.node}): {len(slow)} step(s) over {STEP_FACTOR:g}x the median "
                    f"{median:.4g} s (slowest: step {k + 1}, {s:.4g} s)"
                )
    for stage in sorted({r.stage for r in reports}):
        members = [(rank, r.busy[repeat]) for rank, r in enumerate(reports) if r.stage == stage]
        busy = [b for _, b in members]
        if len(busy) < 2 or not all(b is not None and b > 0 for b in busy):
            continue
        (high, top), (low, bottom) = max(members, key=lambda m: m[1]), min(members, key=lambda m: m[1])
        spread = (top - bottom) / top
        if spread > BUSY_SPREAD:
            notes.append(
                f"busy time differs by {spread:.0%} across ranks (over {BUSY_SPREAD:.0%}): rank {high} "
                f"{top:.3g} s, rank {low} {bottom:.3g} s; the job ran at its slowest rank's pace"
            )
    return notes


def threads_note(threads: list[int]) -> str | None:
    if len(set(threads)) > 1:
        return f"ranks ran different thread counts: {threads}"
    return None


def intra_op_threads() -> int:
    return torch.get_num_threads()


def launcher_name() -> str:
    return os.environ.get("LLMB_LAUNCHER", "torchrun")
