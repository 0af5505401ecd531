"""Bounded click types for the numeric options: a value out of range (or NaN, or infinite) is a usage error with
click's one-line message, never a raw Python error deep in a run, and click shows every bound in --help. A value
longer than any an option takes is named by its start and length, never echoed whole."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import click

from llmb.api.errors import LONGEST_SHOWN, shown
from llmb.api.settings import did_you_mean
from llmb.spec import vocab as names


class _NoLongerThanShown(click.ParamType):
    """Refuses a value longer than any the option takes before click's own message repeats it whole."""

    def convert(self, value, param, ctx):
        if isinstance(value, str) and len(value) > LONGEST_SHOWN:
            self.fail(f"{shown(value)} is longer than any value this option takes.", param, ctx)
        return super().convert(value, param, ctx)


class IntRange(_NoLongerThanShown, click.IntRange):
    """click.IntRange whose error never repeats an over-long value whole."""


class FiniteFloatRange(_NoLongerThanShown, click.FloatRange):
    """click.FloatRange that also refuses NaN (every comparison with NaN is false, so a range alone lets it in)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{shown(value)} is not a finite number.", param, ctx)
        return number


BATCH = IntRange(1, 2**20)
SHAPE = IntRange(1, 2**20)
STEPS = IntRange(1, 10**6)
WARMUP = IntRange(1, 10**6)  # runner.resolve needs one untimed step
REPEATS = IntRange(1, 1000)
SWEEP_REPEATS = IntRange(0, 1000)
SEED = IntRange(0, names.SEED_MAX)
SECONDS = FiniteFloatRange(0, 7 * 24 * 3600, min_open=True)
SHARE = FiniteFloatRange(0, 1)  # a probability or a share of a run's wall time
REPLAY_STEPS = IntRange(0, 10**6)  # 0: no replay (and no valid result)
PROCESSES = IntRange(1, names.MAX_PROCESSES_PER_NODE)
NODES = IntRange(1, 100_000)
NODE_RANK = IntRange(0, 99_999)
PORT = IntRange(1, 65_535)
COUNT = IntRange(1, 10**6)
PROJECT = IntRange(1, 10**12)  # `llmb project` sizes a model on paper: large, but still a bound


class Choice(_NoLongerThanShown, click.Choice):
    """A fixed choice matched in any case, whose error names the choices and the closest one ("unknown preset 'tny'
    (choose from official, small, tiny; did you mean tiny?)"); `what` names the kind of value (the option's name
    otherwise)."""

    def __init__(self, values: Sequence[str], what: str | None = None, aliases: dict[str, str] | None = None) -> None:
        super().__init__(values, case_sensitive=False)
        self.what = what
        self.aliases = {k.lower(): v for k, v in (aliases or {}).items()}

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        if isinstance(value, str) and value.lower() in self.aliases:
            value = self.aliases[value.lower()]
        try:
            return super().convert(value, param, ctx)
        except click.BadParameter:
            what = self.what or (param.name.replace("_", " ") if param is not None and param.name else "value")
            self.fail(unknown_choice(what, str(value), [str(c) for c in self.choices]), param, ctx)


def unknown_choice(what: str, value: str, choices: Sequence[str]) -> str:
    """The one error of every fixed choice: what was given, what may be, and the closest, compared in any case."""
    return f"unknown {what} {shown(value)} (choose from {', '.join(choices)}){did_you_mean(value, choices)}"


def choice(values: Sequence[str], what: str | None = None, aliases: dict[str, str] | None = None) -> click.Choice:
    """Every fixed choice on the command line, matched in any case (`--preset Tiny` as `--precision bf16`); the
    value passed on is the listed spelling (an alias's listed value)."""
    return Choice(values, what, aliases)


# --precision: a benchmark precision, or all (every precision the plugin supports); checked before torch is imported.
PRECISION = choice([*names.PRECISIONS, "all"], "precision")
# commbench --dtype: a torch dtype's name, or the benchmark's name of the same format (fp32, fp16, bf16).
COMM_DTYPE = choice(names.COMM_DTYPES, "dtype", {"FP32": "float32", "FP16": "float16", "BF16": "bfloat16"})
