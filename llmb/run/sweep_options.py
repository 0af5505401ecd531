"""A sweep's options and fixed constants: what a point measures (a resumed sweep must match its log), the
search's thresholds, the file names."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from llmb.api.errors import LlmbError, UsageError
from llmb.records import (
    SWEEP_SUMMARY_NAME,
)
from llmb.run import runner

if TYPE_CHECKING:
    pass


SUMMARY_NAME = SWEEP_SUMMARY_NAME
# A doubling that gains less than this is a plateau: a larger batch only costs memory.
PLATEAU_GAIN = 0.05
# Trials of a batch size before it may end the search or be declared the best (its figure is their median).
CONFIRM_TRIALS = 2
# Bisection points tried between the last two sizes once doubling stops.
REFINE_POINTS = 3
MAX_BATCH_SIZE = 2**20  # the bound of --batch-size and --max-batch-size (llmb.cli.click_types.BATCH)
# Options that decide what a point measures: a resumed sweep must have the same ones as its log.
IDENTITY = ("plugin", "device", "settings", "mode", "preset", "config", "steps", "warmup_steps", "seed")
IDENTITY_SEARCH = ("batch_sizes", "max_batch_size")


class Interrupted(LlmbError):
    """The sweep was stopped by Ctrl-C or SIGTERM; its finished points are in the log."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class FirstTrialRefused(UsageError):
    """`llmb run` refused a sweep's first trial, nothing measured yet: the sweep's own request is the likelier cause.
    A --search tells it apart from its other usage errors: it ends that combination's sweep only."""


@dataclass
class SweepOptions:
    run: runner.RunOptions  # the template: precision and batch size are set per trial
    out: Path
    precision: str = "all"
    batch_sizes: list[int] | None = None  # None: the automatic search
    repeats: int = 3
    max_batch_size: int | None = 1024  # None: names.SWEEP_DEVICE_DEFAULTS for the device, else SWEEP_DEFAULTS
    trial_timeout: float | None = 600.0
    resume: bool = False
    secret: frozenset[str] = frozenset()  # settings kept off the trials' command lines (set by sweep())
