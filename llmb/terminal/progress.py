"""rich's progress bars for the commands that time steps: drawn when a step or a phase ends, never by a timer."""

from __future__ import annotations

from collections.abc import Callable
from time import monotonic
from typing import TYPE_CHECKING

from llmb.terminal import console as term

if TYPE_CHECKING:
    # Lazy: rich.progress loads only when a bar is drawn (not for --help, nor under --json).
    from rich.progress import Progress


def run_progress() -> Progress:
    """The progress display of a command that times steps. Drawn when a step or phase ends, never by rich's timer
    (10 renders a second from a thread of the judging process, which on a CPU host shares the cores the timed
    steps run on: nothing llmb does may change the speed of what it times)."""
    # Lazy: rich.progress loads only when a bar is drawn (not for --help, nor under --json).
    from rich.progress import Progress

    return Progress(*progress_columns(), console=term.err, transient=True, auto_refresh=False)


def progress_columns() -> tuple:
    """rich's progress columns for a long command: what it does, how far, the time taken and rich's estimate of the
    time left (from the rate of the steps so far)."""
    # Lazy: rich.progress loads only when a bar is drawn (not for --help, nor under --json).
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    return (
        TextColumn("{task.description}", markup=False),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("left"),
        TimeRemainingColumn(),
    )


class RichProgress:
    """runner.Progress drawn with rich's progress bars."""

    def __init__(self, progress: Progress, label: str) -> None:
        self.progress, self.label, self.task = progress, label, None

    def phase(self, name: str, total: int) -> None:
        if self.task is not None:
            self.progress.remove_task(self.task)
        self.task = self.progress.add_task(f"{self.label} {name}", total=total)
        self.progress.refresh()

    def advance(self) -> None:
        self.progress.advance(self.task)
        self.progress.refresh()

    def note(self, text: str) -> None:
        self.progress.console.print(term.text(text, "bold yellow"), soft_wrap=True)


class Pace:
    """What is left of a run of like tasks (the precisions of `check-plugin --precision all`, the checks the packager
    runs), estimated from those already done: their mean time times the number still to do."""

    def __init__(self, total: int | None = None, clock: Callable[[], float] | None = None) -> None:
        self.total, self.finished, self.clock = total, 0, clock or monotonic
        self.start = self.clock()

    def done(self, total: int | None = None) -> None:
        """One more task done; `total` once it is known (after the first record names the plugin's precisions)."""
        self.finished += 1
        if total is not None:
            self.total = total

    def left(self) -> str:
        """ "; about 40 s left (2 of 3 done)", or nothing before the first task ends or after the last."""
        if not self.finished or self.total is None or self.finished >= self.total:
            return ""
        seconds = (self.clock() - self.start) / self.finished * (self.total - self.finished)
        return f"; about {seconds:.0f} s left ({self.finished} of {self.total} done)"
