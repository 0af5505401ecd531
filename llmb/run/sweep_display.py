"""What a sweep reports while it works: the Display protocol (tests ignore it) and the live view the CLI draws."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from rich.console import Console, Group
from rich.live import Live
from rich.spinner import Spinner
from rich.table import Table
from rich.text import Text

from llmb.records import SweepTrial as Trial
from llmb.terminal import console as term

if TYPE_CHECKING:
    pass


# Display: what a sweep reports while it works; the CLI draws it live, tests ignore it.


class Display:
    def note(self, text: str) -> None: ...

    def plan(self, most: int) -> None:
        """The most trials the sweep can take (trial_bound), for an estimate of the time left."""

    def trial(self, precision_name: str, batch: int, phase: str, number: int) -> None: ...

    def finished(self, trial: Trial, reused: bool) -> None: ...

    def best(self, precision_name: str, headline: tuple[Trial, list[Trial]] | None) -> None: ...


@dataclass
class LiveDisplay(Display):
    console: Console
    current: str = ""
    most: int = 0
    started: float = 0.0
    rows: list[Trial] = field(default_factory=list)
    bests: dict[str, tuple[Trial, list[Trial]]] = field(default_factory=dict)
    live: Live | None = None
    said: set[str] = field(default_factory=set)

    def __enter__(self) -> LiveDisplay:
        # Off a terminal (nohup, CI, Slurm) a live table draws nothing until the end: a line per trial instead.
        if self.console.is_terminal:
            # Once a second: the sweep's process shares the host with the trial it times (each render builds the
            # whole table), and a spinner needs no more.
            self.live = Live(get_renderable=self.render, console=self.console, refresh_per_second=1, transient=False)
            self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.current = ""
        if self.live is not None:
            self.live.__exit__(*exc)

    def note(self, text: str) -> None:
        if text in self.said:  # a search's sweeps share one display: each of its notes is said once
            return
        self.said.add(text)
        self.console.print(term.text(text), soft_wrap=True)

    def plan(self, most: int) -> None:
        self.most = most

    def left(self) -> str:
        """At most how long the trials not yet run take, at the median length of those so far ("" before any)."""
        ran = sorted(t.seconds for t in self.rows if t.seconds)
        if not ran or not self.most:
            return ""
        remaining = max(self.most - len(self.rows), 0)
        if not remaining:  # the last trial has run: nothing is left to estimate
            return ""
        return f"at most {remaining} trials left, ~{remaining * ran[len(ran) // 2] / 60:.0f} min at most"

    def trial(self, precision_name: str, batch: int, phase: str, number: int) -> None:
        what = ("search" if number == 1 else f"confirm {number}") if phase == "search" else f"repeat {number}"
        self.current = f"{precision_name}  batch {batch}  {what}  (trial {len(self.rows) + 1})"
        self.started = time.monotonic()

    def finished(self, trial: Trial, reused: bool) -> None:
        done = replace(trial, detail="; ".join(filter(None, ["from the log" if reused else "", trial.detail])))
        self.rows.append(done)
        self.current = ""
        if self.live is None:
            tps = f"{done.tokens_per_second:,.1f} tokens/s" if done.tokens_per_second else ""
            parts = [f"trial {len(self.rows)}: {done.precision} batch {done.batch_size} {_phase(done)} ", _status(done)]
            parts += [f" {tps} {done.seconds:.1f} s", f" {done.detail}" if done.detail else ""]
            parts += [f" ({self.left()})" if self.left() else ""]
            self.console.print(term.line(*parts), soft_wrap=True)

    def best(self, precision_name: str, headline: tuple[Trial, list[Trial]] | None) -> None:
        if headline is not None:
            self.bests[precision_name] = headline

    def render(self) -> Group:
        if not self.rows and not self.current:  # nothing yet: a sweep refused before its first trial draws nothing
            return Group()
        table = Table(title="llmb sweep", title_justify="left")
        for column in ("precision", "batch", "phase", "status", "tokens/s", "s", "detail"):
            numeric = column in ("batch", "tokens/s", "s")
            table.add_column(column, justify="right" if numeric else "left", no_wrap=True, overflow="ellipsis")
        for t in self.rows[-12:]:  # the live view on a terminal: the last trials, the log holds them all
            tps = f"{t.tokens_per_second:,.0f}" if t.tokens_per_second else ""
            term.row(table, t.precision, str(t.batch_size), _phase(t), _status(t), tps, f"{t.seconds:.1f}", t.detail)
        # The same figure the summary will show: the median trial of the runs that decide (records.median_index).
        best = "  ".join(
            f"{p}: b{t.batch_size} {t.tokens_per_second:,.1f} tok/s (median of {len(runs)})"
            for p, (t, runs) in self.bests.items()
        )
        parts = [table, f"best so far: {best or '-'}"]
        if self.current:
            left = f"  ({self.left()})" if self.left() else ""
            spinner = Spinner("dots", text=f"{self.current}  {time.monotonic() - self.started:.0f} s{left}")
            parts.append(spinner)
        return Group(*parts)


def _phase(t: Trial) -> str:
    if t.phase == "search":
        return "search" if t.index == 0 else f"confirm {t.index + 1}"
    return f"repeat {t.index + 1}"


def _status(t: Trial) -> Text:
    return term.text(t.status, "green" if t.ok else "red")
