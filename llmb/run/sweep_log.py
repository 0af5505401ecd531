"""The sweep log: one JSON line per finished point, each flushed and fsynced before the next trial starts, and
its reading back (a resumed sweep's options and points)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from llmb.api.errors import LlmbError, UsageError
from llmb.records import (
    RECORD_LIMIT,
    RecordError,
    Result,
    read_sweep_log,
)
from llmb.records import SWEEP_LOG_NAME as LOG_NAME
from llmb.records import SweepTrial as Trial
from llmb.records import files as record_files
from llmb.run.sweep_options import IDENTITY, IDENTITY_SEARCH
from llmb.spec.presets import SHAPE_FIELDS
from llmb.spec.redact import REDACTED
from llmb.terminal import console as term

if TYPE_CHECKING:
    pass


# The log: one JSON line per finished point, each flushed and fsynced before the next trial starts.


class SweepLog:
    def __init__(self, path: Path, header: dict, trials: list[Trial]) -> None:
        self.path, self.header = path, header
        self.trials = {t.key: t for t in trials}

    @classmethod
    def open(cls, out: Path, header: dict, resume: bool) -> SweepLog:
        path = out / LOG_NAME
        if not path.exists():  # a new sweep (the command refuses --resume where there is no log)
            out.mkdir(parents=True, exist_ok=True)
            log = cls(path, header, [])
            log._append({"type": "sweep", **header})
            return log
        if not resume:
            raise UsageError(f"{out} already holds a sweep; use --resume to continue it or another --out")
        skipped: list[str] = []
        logged, trials = read_log(path, skipped)
        trials = [t for t in trials if _result_reads(out, t, skipped)]
        for line in skipped:  # each point left out is named, with why, and measured again
            term.warning("skipped: ", line, " (the point is run again)")
        wrong = [
            f"{key} is {logged.get(key)!r} there, {header.get(key)!r} here"
            for key in IDENTITY + IDENTITY_SEARCH
            if logged.get(key) != header.get(key)
        ]
        if wrong:  # every mismatch at once: the user fixes them in one go
            raise UsageError(
                f"--resume: {path} was written for another sweep ({'; '.join(wrong)}); leave out an option to take "
                "the log's value"
            )
        with open(path, "rb+") as f:  # the sweep holds the folder's lock: cut a torn last line before appending
            data = f.read()
            if data and not data.endswith(b"\n"):
                f.truncate(data.rfind(b"\n") + 1)
        return cls(path, logged, trials)

    def find(self, precision_name: str, phase: str, batch: int, index: int = 0) -> Trial | None:
        return self.trials.get((precision_name, phase, batch, index))

    def add(self, trial: Trial) -> None:
        self._append({"type": "trial", **trial.to_dict()})
        self.trials[trial.key] = trial

    def _append(self, entry: dict) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(entry) + "\n")
            f.flush()
            os.fsync(f.fileno())


def logged_options(out: Path, given: set[str]) -> dict:
    """For --resume: the sweep command's options as its log's header recorded them, by parameter name, leaving out
    those given again (SweepLog.open then checks they match) and secret settings (never logged: give them again).
    Empty where there is no log yet."""
    path = Path(out) / LOG_NAME
    if not path.is_file():
        return {}
    header, _ = read_log(path)
    # Only what the header holds (an older log lacks precision, repeats and trial_timeout): a missing or malformed
    # entry is left to the option's own default, and SweepLog.open names any mismatch that follows.
    names = {"precision": "precision_name", "repeats": "repeats", "trial_timeout": "trial_timeout"}
    keys = ("plugin", "device", "mode", "preset", "steps", "warmup_steps", "seed", "max_batch_size", *names)
    taken: dict = {names.get(k, k): header[k] for k in keys if header.get(k) is not None}
    sizes = header.get("batch_sizes")
    if isinstance(sizes, str) or (isinstance(sizes, list) and sizes):
        taken["batch_sizes"] = sizes if isinstance(sizes, str) else ",".join(map(str, sizes))
    settings, config = header.get("settings"), header.get("config")
    if isinstance(settings, dict):
        taken["options"] = tuple(
            f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in settings.items() if v != REDACTED
        )
    if isinstance(config, dict):
        taken |= {k: v for k, v in config.items() if k in SHAPE_FIELDS}
    return {k: v for k, v in taken.items() if k not in given}


def resume_options(out: Path, folder: Path, given: set[str], searched: dict[str, list[str]]) -> dict:
    """For `llmb sweep --resume`: the options to continue with from the log in ``folder`` (``out``, or a search's
    first combination's sub-folder), by parameter name, those ``given`` again left out. With a search, the logged
    settings lose the searched ones (each combination's own values are the search's, not fixed settings). Nothing to
    continue is a usage error: starting a sweep there would run whatever the defaults are (the official shape, every
    precision) where the user meant to resume one."""
    if not (folder / LOG_NAME).is_file():
        what = "search to continue in its combinations' folders" if searched else "sweep to continue"
        raise UsageError(
            f"--resume: {out} holds no {what} (no {LOG_NAME}); leave out --resume to start one there"
            + ("" if searched else " (a search resumes with its --search options given again)")
        )
    logged = logged_options(folder, given)
    if searched and "options" in logged:
        logged["options"] = tuple(o for o in logged["options"] if o.partition("=")[0] not in searched)
    return logged


def read_log(path: Path, skipped: list[str] | None = None) -> tuple[dict, list[Trial]]:
    """The header and the trials of a sweep log; a line torn by a kill mid-write is left out (the file is untouched:
    a reader never writes; SweepLog.open repairs). Given ``skipped``, a bad trial line is named there and left out."""
    try:
        return read_sweep_log(path, RECORD_LIMIT, skipped=skipped)
    except RecordError as exc:  # not a plain file, too large, not UTF-8, no header: named
        raise LlmbError(str(exc)) from None


def _result_reads(out: Path, trial: Trial, skipped: list[str]) -> bool:
    """Whether a logged trial's result is a readable result file in the sweep folder (always, for a failed trial);
    one that is not (cut short, replaced, named like a path) is named in ``skipped``."""
    if not trial.ok:
        return True
    name = trial.result or ""
    if not name or Path(name).name != name or name.startswith("."):  # a name from the log is never a path
        skipped.append(f"{out / LOG_NAME}: trial {trial.key}: result {name!r} is not a file name in {out}")
        return False
    try:
        record_files.parse(Result, record_files.read_object(out / name))
    except record_files.Unreadable as exc:
        skipped.append(record_files.skipped_line(out / name, exc))
        return False
    return True
