"""Bounded click types for the numeric options: a value out of range (or NaN, or infinite) is a usage error with
click's one-line message, never a raw Python error deep in a run, and click shows every bound in --help."""

from __future__ import annotations

import math
from collections.abc import Sequence

import click

from llmb.spec import vocab as names


class FiniteFloatRange(click.FloatRange):
    """click.FloatRange that also refuses NaN (every comparison with NaN is false, so a range alone lets it in)."""

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return number


BATCH = click.IntRange(1, 2**20)
SHAPE = click.IntRange(1, 2**20)
STEPS = click.IntRange(1, 10**6)
WARMUP = click.IntRange(1, 10**6)  # runner.resolve needs one untimed step
REPEATS = click.IntRange(1, 1000)
SWEEP_REPEATS = click.IntRange(0, 1000)
SEED = click.IntRange(0, 2**63 - 1)  # torch.manual_seed takes a 64-bit integer
SECONDS = FiniteFloatRange(0, 7 * 24 * 3600, min_open=True)
PROCESSES = click.IntRange(1, 4096)
NODES = click.IntRange(1, 100_000)
NODE_RANK = click.IntRange(0, 99_999)
PORT = click.IntRange(1, 65_535)
COUNT = click.IntRange(1, 10**6)
PROJECT = click.IntRange(1, 10**12)  # `llmb project` sizes a model on paper: large, but still a bound


class Choice(click.Choice):
    """A fixed choice matched in any case; `what` names it in the error ("unknown precision 'FP64' (choose from
    ...)"), click's own message otherwise."""

    def __init__(self, values: Sequence[str], what: str | None = None) -> None:
        super().__init__(values, case_sensitive=False)
        self.what = what

    def convert(self, value, param, ctx):
        try:
            return super().convert(value, param, ctx)
        except click.BadParameter:
            if self.what is None:
                raise
            self.fail(f"unknown {self.what} {value!r} (choose from {', '.join(self.choices)})", param, ctx)


def choice(values: Sequence[str], what: str | None = None) -> click.Choice:
    """Every fixed choice on the command line, matched in any case (`--preset Tiny` as `--precision bf16`); the
    value passed on is the listed spelling."""
    return Choice(values, what)


# --precision: a benchmark precision, or all (every precision the plugin supports); checked before torch is imported.
PRECISION = choice([*names.PRECISIONS, "all"], "precision")
