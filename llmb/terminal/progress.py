"""rich's progress bars for the commands that time steps: drawn when a step or a phase ends, never by a timer."""

from __future__ import annotations

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
