"""The protocols the harness's parts meet without a shared base class: a measured window's judge, and a run's
progress. Typing only (no torch); a checker, not an isinstance test, holds the implementations to them."""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class WindowJudge(Protocol):
    """Opens and closes each measured window of a run: a challenge as the clock starts (the window's data seed),
    the worker's answer as it stops, answered with the seal's key (the directions AdamW's moments are projected onto,
    llmb.audit.evidence.moment_seal), then the digests computed after the clock. ``clean`` says whether the judge
    lives in a process that imported no plugin (only then can the run be valid). Before all that, ``setup`` says the
    run's backend is set up on its device (the judge may prepare its own work beside the rest of the setup) and
    ``ready`` returns once that work is done, so none of it runs beside a step the run times.

    Implemented by llmb.training.loop.LocalJudge (the run's own process), llmb.run.clean_worker.Link (the worker's
    end of the clean room's connection) and llmb.distributed.job_judge.JobJudge (a job's ranks, as one)."""

    clean: bool

    def setup(self, device: str) -> None: ...

    def ready(self) -> None: ...

    def open(self, digest_start: list[list[float]]) -> int: ...

    def close(self, answer: dict) -> int: ...

    def seal(self, evidence: dict) -> None: ...


@runtime_checkable
class RunProgress(Protocol):
    """What a run reports while it works: each phase with its number of steps, each step done, and a note worth the
    console's attention. llmb.run.options.Progress draws nothing; llmb.terminal.progress.RichProgress draws bars."""

    def phase(self, name: str, total: int) -> None: ...

    def advance(self) -> None: ...

    def note(self, text: str) -> None: ...
