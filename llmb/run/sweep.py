"""Batch-size sweeps: every trial a `llmb run` subprocess, every finished point logged at once, resumable.

The automatic search doubles the batch from 1 until a trial fails (out of memory, crash, timeout, invalid) or the
throughput stops growing, then bisects between the last two sizes. Its next step is a pure function of the points
found so far, so a sweep resumed from its log takes the same decisions and reruns nothing finished.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console, Group
from rich.live import Live
from rich.spinner import Spinner
from rich.table import Table
from rich.text import Text

from llmb.api.errors import LlmbError, UsageError
from llmb.api.settings import SECRET_OPTIONS_ENV, recorded
from llmb.audit import precision
from llmb.records import (
    RECORD_LIMIT,
    SPREAD_WARNING,
    SWEEP_LOG_SCHEMA,
    SWEEP_SUMMARY_NAME,
    SWEEP_SUMMARY_SCHEMA,
    RecordError,
    Result,
    best_batch_runs,
    envelope,
    median_index,
    read_sweep_log,
)
from llmb.records import SWEEP_LOG_NAME as LOG_NAME
from llmb.records import SweepTrial as Trial
from llmb.records import files as record_files
from llmb.records.result_files import check_writable, read_result, write_json_atomic
from llmb.run import runner
from llmb.spec import vocab as names
from llmb.spec.presets import PRESETS, SHAPE_FIELDS
from llmb.spec.redact import REDACTED, is_secret
from llmb.terminal import console as term

if TYPE_CHECKING:
    import torch

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


def next_point(points: Points, search) -> tuple[int | None, str]:
    """The search's next size, else a confirmation of the best size and its neighbours, else None and the reason the
    search stopped. Each size gets at most CONFIRM_TRIALS trials, so this ends."""
    batch, reason = search(points)
    if batch is not None:
        return batch, reason
    again = confirming(points)
    return (again, "confirming the best batch") if again is not None else (None, reason)


def headline_of(points: Points, repeats: list[Trial]) -> tuple[Trial, list[Trial]] | None:
    """(the headline trial, the trials its median is over) by the headline rule the report and summary.md share
    (records.best_batch_runs): the re-runs of the best batch where any ran, else the search trials of a size that
    ran. The live best-so-far line and the summary both show this."""
    # A size with a failed trial does not reliably run (failure), so none of its trials may head the sweep.
    ran = [t for trials in points.values() if failure(trials) is None for t in trials]
    return best_batch_runs(ran + [t for t in repeats if t.ok], lambda t: t.phase)


# Trials: a subprocess each, classified from its exit code, stderr and result JSON.


def child_args(
    run_options: runner.RunOptions, precision_name: str, batch: int, secret: frozenset[str] = frozenset()
) -> list[str]:
    """The `llmb run` arguments for one trial (one repeat; the sweep does its own repeats). Secret settings are
    not among them (any user can read a command line): run_trial passes them in the trial's environment."""
    o = run_options
    args = ["--plugin", o.plugin, "--device", o.device, "--precision", precision_name, "--precision-mode", o.mode]
    args += ["--batch-size", batch, "--steps", o.steps, "--warmup-steps", o.warmup_steps, "--repeats", 1]
    args += ["--seed", o.seed, "--preset", o.preset]
    base = PRESETS[o.preset]
    for name in SHAPE_FIELDS:
        if getattr(o.config, name) != getattr(base, name):
            args += [f"--{name.replace('_', '-')}", getattr(o.config, name)]
    for key, value in o.settings.items():  # the raw -O values, as given
        if key not in secret and not is_secret(key):
            args += ["-O", f"{key}={value}"]
    return [str(a) for a in args]


def argv_settings(argv: list[str]) -> set[str]:
    """The setting names given as -O on a command line."""
    return {argv[i + 1].partition("=")[0] for i, a in enumerate(argv[:-1]) if a == "-O"}


def _redact_values(text: str, values) -> str:
    """A trial's stderr (kept in failed/) with any secret setting's value taken out, whatever printed it."""
    for value in values:
        if value:
            text = text.replace(str(value), REDACTED)
    return text


def _die_with(parent: int):
    """Linux: the trial gets SIGKILL if the sweep itself is killed, so no orphan keeps the device busy."""

    def set_death_signal() -> None:  # pragma: no cover - runs in the child between fork and exec
        with contextlib.suppress(Exception):
            import ctypes

            ctypes.CDLL(None).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the sweep died before the line above took effect
            os._exit(1)

    return set_death_signal if sys.platform.startswith("linux") else None


def _kill(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1].removeprefix("error: ")[:300] if lines else ""


def classify(returncode: int | None, stderr: str, record: dict | None, timeout: float) -> tuple[str, str]:
    """(status, one-line detail) of a finished trial; returncode None means it was killed at the time limit."""
    if returncode is None:
        return "timeout", f"no result after {timeout:g} s (killed)"
    if returncode == 0:
        if record is None:
            return "invalid", "exit 0 but no result JSON"
        if record["invalid_reasons"]:
            return "invalid", "; ".join(record["invalid_reasons"])
        tps = record.get("tokens_per_second")
        if not isinstance(tps, (int, float)) or not tps > 0 or tps == float("inf"):
            return "invalid", f"tokens/s is {tps!r}"
        return "ok", ""
    # The CLI says "out of memory" for every error runner.is_out_of_memory recognises; a raw traceback may too.
    if "out of memory" in stderr.lower():
        return "oom", _last_line(stderr)
    if returncode < 0:
        return "crash", f"killed by {signal.Signals(-returncode).name}"
    return "crash", f"exit {returncode}: {_last_line(stderr)}"


def run_trial(options: SweepOptions, precision_name: str, batch: int, phase: str, index: int) -> Trial:
    """Run one trial in its own process, in a scratch directory; move its result beside the log."""
    scratch = Path(tempfile.mkdtemp(prefix=".trial-", dir=options.out))
    argv = [sys.executable, "-m", "llmb", "run", *child_args(options.run, precision_name, batch, options.secret)]
    argv += ["--out", str(scratch)]
    hidden = {k: v for k, v in options.run.settings.items() if k not in argv_settings(argv)}
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "200", SECRET_OPTIONS_ENV: json.dumps(hidden)}
    start = time.monotonic()
    returncode: int | None = None
    try:
        with open(scratch / "stdout.txt", "wb") as out, open(scratch / "stderr.txt", "wb") as err:
            proc = subprocess.Popen(
                argv,
                stdout=out,
                stderr=err,
                env=env,
                start_new_session=True,  # Ctrl-C reaches the sweep, which then kills the trial's whole group
                preexec_fn=_die_with(os.getpid()),
            )
            try:
                returncode = proc.wait(timeout=options.trial_timeout)
            except subprocess.TimeoutExpired:
                returncode = None
            finally:
                if proc.poll() is None:
                    _kill(proc)
        seconds = time.monotonic() - start
        stderr = _redact_values((scratch / "stderr.txt").read_text(errors="replace"), hidden.values())
        results = sorted(scratch.glob("*.json"))
        try:
            record = read_result(results[0]).to_dict() if results and returncode == 0 else None
        except ValueError as exc:  # a result that does not read as one (RecordError names the field)
            record, returncode, stderr = None, 1, f"{stderr}\nunreadable result: {exc}"
        status, detail = classify(returncode, stderr, record, options.trial_timeout)
        if returncode == 2:
            raise UsageError(f"{precision_name} batch {batch}: llmb run refused the trial: {_last_line(stderr)}")
        trial = Trial(precision_name, batch, phase, index, status, seconds=round(seconds, 3), detail=detail)
        if record is not None:
            # Moved before the log line: a kill in between leaves a measured result that the log does not claim.
            os.replace(results[0], options.out / results[0].name)
            trial.result, trial.run_id = results[0].name, record["run_id"]
            trial.tokens_per_second, trial.peak_memory_bytes = record["tokens_per_second"], record["peak_memory_bytes"]
        if status != "ok":
            failed = options.out / "failed" / f"{precision_name}-b{batch}-{phase}{index}.stderr.txt"
            failed.parent.mkdir(exist_ok=True)
            failed.write_text(stderr)
        return trial
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


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

    def __exit__(self, *exc) -> None:
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

    def render(self):
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


# The sweep.


def precisions_to_sweep(plugin, requested: str) -> tuple[list[str], list[str]]:
    """(precisions to sweep, precisions the plugin does not support) for a --precision value."""
    return names.expand_precision(requested, plugin.backend.precisions())


def emulated_note(device: torch.device, names: list[str]) -> str | None:
    """The warning a sweep on the host CPU gives before its first trial for the 16-bit precisions this CPU only
    emulates (from its flags): their trials take several times FP32's (issue 27). None elsewhere."""
    from llmb.run import sysinfo

    slow = sysinfo.cpu_emulated_precisions() if device.type == "cpu" else []  # reads /proc/cpuinfo: once
    emulated = [p for p in names if p in slow]
    if not emulated:
        return None
    them = "them" if len(emulated) > 1 else "it"
    return (
        f"warning: {', '.join(emulated)} emulated on this CPU (no native matmul for {them}): their trials run several "
        "times slower than FP32's"
    )


def sweep(options: SweepOptions, display: Display | None = None) -> dict:
    """Run (or resume) a sweep; return its summary, which is also written to SUMMARY_NAME in the out directory.
    The sweep holds an exclusive lock on its folder for its whole life: a second sweep there is refused."""
    out = Path(options.out)
    created = not out.exists()
    try:
        check_writable(out)
        out.mkdir(parents=True, exist_ok=True)  # the lock is taken on the folder; removed below if nothing ran
        with _folder_lock(out):
            return _sweep(options, display)
    except BaseException:
        if created and out.is_dir() and not any(out.iterdir()):
            out.rmdir()  # a sweep refused before its first trial leaves no empty folder behind
        raise


@contextlib.contextmanager
def _folder_lock(out: Path):
    fd = os.open(out, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)  # close-on-exec: trials never hold it
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise LlmbError(
                f"{out} is in use by another sweep (it holds the folder's lock): wait, or use another --out"
            ) from None
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def trial_bound(options: SweepOptions, precisions: int) -> int:
    """The most trials a sweep of this many precisions can take: each size of the search (a list's, or the doublings
    up to the ceiling and the refinement's) measured at most CONFIRM_TRIALS times, then the re-runs."""
    sizes = len(options.batch_sizes) if options.batch_sizes else options.max_batch_size.bit_length() + REFINE_POINTS
    return precisions * (sizes * CONFIRM_TRIALS + options.repeats)


def scaled_to_device(options: SweepOptions) -> tuple[SweepOptions, str]:
    """The sweep's options with those not given (None) set for the device it runs on, and a line saying which."""
    run = options.run
    given = {
        "steps": run.steps,
        "warmup_steps": run.warmup_steps,
        "max_batch_size": options.max_batch_size,
        "trial_timeout": options.trial_timeout,
    }
    if all(value is not None for value in given.values()):
        return options, ""
    _, device, _ = runner.resolve(replace(run, steps=run.steps or 1, warmup_steps=run.warmup_steps or 1))
    defaults = names.SWEEP_DEVICE_DEFAULTS.get(device.type, names.SWEEP_DEFAULTS)
    chosen = {k: defaults[k] if v is None else v for k, v in given.items()}
    taken = [k for k, v in given.items() if v is None]
    line = (
        f"sweep on {device.type}: {chosen['steps']} + {chosen['warmup_steps']} warmup steps a trial, batch sizes up "
        f"to {chosen['max_batch_size']}, {chosen['trial_timeout']:g} s a trial at most (the {device.type} defaults "
        f"of {', '.join('--' + k.replace('_', '-') for k in taken)})"
    )
    run = replace(run, steps=chosen["steps"], warmup_steps=chosen["warmup_steps"])
    scaled = replace(options, run=run, max_batch_size=chosen["max_batch_size"], trial_timeout=chosen["trial_timeout"])
    return scaled, line


def _sweep(options: SweepOptions, display: Display | None = None) -> dict:
    display = display or Display()
    options, line = scaled_to_device(options)
    if line:
        display.note(line)
    for name, value, low in (("repeats", options.repeats, 0), ("max-batch-size", options.max_batch_size, 1)):
        if value < low:
            raise UsageError(f"--{name} must be at least {low}, got {value}")
    if options.trial_timeout <= 0:
        raise UsageError(f"--trial-timeout must be positive, got {options.trial_timeout}")
    plugin, device, settings = runner.resolve(options.run)
    names, unsupported = precisions_to_sweep(plugin, options.precision)
    line = emulated_note(device, names)
    if line:  # said once the folder's lock is held: a refused sweep says one line, the refusal
        display.note(line)
    display.plan(trial_bound(options, len(names)))
    for name in names:  # every precision is checked before the first trial starts
        runner.resolve(replace(options.run, precision=name))
    run_options = replace(options.run, plugin=plugin.name, device=str(device))
    header = {
        "schema": SWEEP_LOG_SCHEMA,
        "plugin": plugin.name,
        "device": str(device),
        "settings": recorded(settings),
        "mode": run_options.mode,
        "preset": run_options.preset,
        "config": run_options.config.to_dict(),
        "steps": run_options.steps,
        "warmup_steps": run_options.warmup_steps,
        "seed": run_options.seed,
        "batch_sizes": options.batch_sizes or "auto",
        "max_batch_size": options.max_batch_size,
        # Not identity (a resumed sweep may change them), but --resume takes them from here when not given again.
        "precision": options.precision,
        "repeats": options.repeats,
        "trial_timeout": options.trial_timeout,
        "plateau_gain": PLATEAU_GAIN,
        "refine_points": REFINE_POINTS,
        "confirm_trials": CONFIRM_TRIALS,
    }
    secret = frozenset(getattr(settings, "secret", frozenset()))
    options = replace(options, run=run_options, out=Path(options.out), secret=secret)
    log = SweepLog.open(options.out, header, options.resume)
    for stale in options.out.glob(".trial-*"):  # scratch left by a killed sweep
        shutil.rmtree(stale, ignore_errors=True)
    summary = {
        **envelope(SWEEP_SUMMARY_SCHEMA),
        "log": LOG_NAME,
        **{k: header[k] for k in ("plugin", "device", "settings", "mode", "preset", "steps", "warmup_steps")},
        "repeats": options.repeats,
        "precisions": {
            name: {"status": "unsupported by the plugin" if name in unsupported else "not run yet"}
            for name in precision.PRECISIONS
            if name in names or name in unsupported
        },
    }
    current = ["", 0]

    def point(precision_name: str, batch: int, phase: str, index: int) -> Trial:
        found = log.find(precision_name, phase, batch, index)
        if found is None:
            current[:] = [precision_name, batch]
            display.trial(precision_name, batch, phase, index + 1)
            found = run_trial(options, precision_name, batch, phase, index)
            log.add(found)
            display.finished(found, reused=False)
        else:
            display.finished(found, reused=True)
        return found

    try:
        with _sigterm_as_interrupt():
            for name in names:
                summary["precisions"][name] = _sweep_precision(options, name, point, display)
                write_json_atomic(options.out / SUMMARY_NAME, summary)
    except KeyboardInterrupt as exc:
        code = 143 if isinstance(exc, _Terminated) else 130
        where = f" at {current[0]} batch {current[1]}" if current[0] else ""
        raise Interrupted(
            f"sweep interrupted{where}; {len(log.trials)} finished points kept in {log.path} (continue with --resume)",
            code,
        ) from None
    write_json_atomic(options.out / SUMMARY_NAME, summary)
    return summary


def _sweep_precision(options: SweepOptions, name: str, point, display: Display) -> dict:
    points: Points = {}
    search = (
        (lambda p: next_listed_batch(p, options.batch_sizes))
        if options.batch_sizes
        else (lambda p: next_batch(p, options.max_batch_size))
    )
    while True:
        batch, reason = next_point(points, search)
        if batch is None:
            break
        trials = points.setdefault(batch, [])
        trials.append(point(name, batch, "search", len(trials)))
        display.best(name, headline_of(points, []))
    best = best_batch(points)
    entry = {
        "stop": reason,
        "search": [_brief(t) for b in sorted(points) for t in points[b]],
    }
    if best is None:
        return {"status": "no batch size ran", **entry}
    repeats = []
    for i in range(options.repeats):
        repeats.append(point(name, best, "repeat", i))
        display.best(name, headline_of(points, repeats))
    entry.update(best_batch_size=best, repeats=[_brief(t) for t in repeats])
    if options.repeats and not any(t.ok for t in repeats):
        return {"status": f"every re-run of batch {best} failed", **entry}
    headline, measured = headline_of(points, repeats)
    record = read_result(options.out / headline.result)
    values = [t.tokens_per_second for t in measured]
    return {
        "status": "ok",
        "best_batch_size": best,
        "tokens_per_second": headline.tokens_per_second,  # the median run's (the slower middle for even counts)
        "spread": [min(values), max(values)],
        "runs": len(measured),
        "headline_result": headline.result,
        "effective_precision": record.precision.effective,
        "tflops": record.tflops,
        "mfu": record.mfu,
        "peak_memory_bytes": record.peak_memory_bytes,
        **entry,
    }


def _brief(trial: Trial) -> dict:
    return {k: v for k, v in trial.to_dict().items() if k not in ("precision", "phase") and v not in (None, "")}


class _Terminated(KeyboardInterrupt):
    pass


@contextlib.contextmanager
def _sigterm_as_interrupt():
    """SIGTERM stops the sweep the way Ctrl-C does: the running trial is killed, the log is kept."""

    def handler(signum, frame):
        raise _Terminated()

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: leave SIGTERM alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def parse_batch_sizes(text: str) -> list[int] | None:
    """ "auto" (None) or a comma-separated list of positive sizes, sorted."""
    if text.strip().lower() == "auto":
        return None
    try:
        sizes = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise UsageError(f"--batch-sizes expects auto or a list like 1,2,4, got {text!r}") from None
    if not sizes or sizes[0] < 1 or sizes[-1] > MAX_BATCH_SIZE:
        raise UsageError(f"--batch-sizes must be integers from 1 to {MAX_BATCH_SIZE}, got {text!r}")
    return sizes


def print_summary(summary: dict, console: Console) -> None:
    table = term.table(f"llmb sweep: {summary['plugin']} on {summary['device']}")
    columns = ("precision", "best batch", "tokens/s (median)", "spread (min-max)", "runs", "TFLOP/s", "stopped because")
    for column in columns:
        term.column(table, column, numeric=column in ("best batch", "tokens/s (median)", "runs", "TFLOP/s"))
    warnings = []
    for name, entry in summary["precisions"].items():
        if entry.get("status") != "ok":
            term.row(table, name, "", entry["status"], "", "", "", entry.get("stop", ""))
            continue
        low, high = entry["spread"]
        term.row(
            table,
            name,
            str(entry["best_batch_size"]),
            f"{entry['tokens_per_second']:,.1f}",
            f"{low:,.1f}-{high:,.1f}",
            str(entry["runs"]),
            f"{entry['tflops']:.3g}",
            entry["stop"],
        )
        spread = (high - low) / entry["tokens_per_second"]
        if spread > SPREAD_WARNING:
            warnings.append(
                f"NOISY: {name} batch {entry['best_batch_size']}: the {entry['runs']} runs spread {spread:.1%} "
                f"({low:,.1f}-{high:,.1f} tokens/s, more than {SPREAD_WARNING:.0%}); re-run on a quieter host"
            )
    console.print(table)
    for warning in warnings:
        console.print(term.text(warning, "bold yellow"), soft_wrap=True)
