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
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from rich.console import Console, Group
from rich.live import Live
from rich.spinner import Spinner
from rich.table import Table

from llmb import precision, runner
from llmb.bundle_io import read_regular
from llmb.config import PRESETS, SHAPE_FIELDS
from llmb.errors import LlmbError, UsageError
from llmb.results import check_writable, load_result, median_index, write_json_atomic
from llmb.settings import recorded

LOG_NAME = "sweep.jsonl"
RECORD_LIMIT = 64 * 2**20  # a result or a log larger than this is not one llmb wrote: refused unread
SUMMARY_NAME = "sweep-summary.json"
LOG_SCHEMA = "llmb.sweep/1"
SUMMARY_SCHEMA = "llmb.sweep-summary/1"
STATUSES = ("ok", "oom", "crash", "timeout", "invalid")
# A doubling that gains less than this is a plateau: a larger batch only costs memory.
PLATEAU_GAIN = 0.05
# Bisection points tried between the last two sizes once doubling stops.
REFINE_POINTS = 3
MAX_BATCH_SIZE = 2**20  # the bound of --batch-size and --max-batch-size (llmb.bounds.BATCH)
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
    max_batch_size: int = 1024
    trial_timeout: float = 600.0
    resume: bool = False


@dataclass
class Trial:
    """One finished point: a `llmb run` subprocess at one precision and batch size."""

    precision: str
    batch_size: int
    phase: str  # "search", or "repeat" for the re-runs of the best batch
    index: int  # which repeat (0 for search points)
    status: str  # one of STATUSES
    tokens_per_second: float | None = None
    peak_memory_bytes: int | None = None
    result: str | None = None  # the result JSON's file name in the sweep directory
    run_id: str | None = None
    seconds: float = 0.0
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def key(self) -> tuple:
        return (self.precision, self.phase, self.batch_size, self.index)


# The search: pure functions of the points found so far.


def next_batch(points: dict[int, Trial], max_batch_size: int) -> tuple[int | None, str]:
    """The next batch size the automatic search tries (None when done) and why it stopped growing."""
    batch, previous = 1, None
    while True:
        point = points.get(batch)
        if point is None:
            return batch, "growing"
        if not point.ok:
            if previous is None:
                return None, f"batch 1 failed ({point.status})"
            lo, hi, failed, reason = previous, batch, True, f"{point.status} at batch {batch}"
            break
        if previous is not None and point.tokens_per_second < points[previous].tokens_per_second * (1 + PLATEAU_GAIN):
            lo, hi, failed = previous, batch, False
            reason = f"plateau: batch {previous} -> {batch} gained less than {PLATEAU_GAIN:.0%}"
            break
        if batch >= max_batch_size:
            return None, f"--max-batch-size {max_batch_size} reached"
        previous, batch = batch, min(batch * 2, max_batch_size)
    # Refinement: after a failure, bisect for the largest size that runs; after a plateau, toward the faster end.
    for _ in range(REFINE_POINTS):
        if hi - lo <= 1:
            break
        mid = (lo + hi) // 2
        point = points.get(mid)
        if point is None:
            return mid, reason
        if not point.ok:
            hi, failed = mid, True
        elif failed or points[hi].tokens_per_second >= points[lo].tokens_per_second:
            lo = mid
        else:
            hi = mid
    return None, reason


def next_listed_batch(points: dict[int, Trial], sizes: list[int]) -> tuple[int | None, str]:
    """The next size of an explicit list; sizes above one that ran out of memory are skipped."""
    oom = [b for b, p in points.items() if p.status == "oom"]
    for size in sizes:
        if size in points:
            continue
        if oom and size > min(oom):
            return None, f"sizes above {min(oom)} skipped (out of memory there)"
        return size, "listed"
    return None, "every listed size ran"


def best_point(points: dict[int, Trial]) -> Trial | None:
    ok = [p for p in points.values() if p.ok]
    return max(ok, key=lambda p: (p.tokens_per_second, -p.batch_size)) if ok else None


# Trials: a subprocess each, classified from its exit code, stderr and result JSON.


def child_args(run_options: runner.RunOptions, precision_name: str, batch: int) -> list[str]:
    """The `llmb run` arguments for one trial (one repeat; the sweep does its own repeats)."""
    o = run_options
    args = ["--plugin", o.plugin, "--device", o.device, "--precision", precision_name, "--precision-mode", o.mode]
    args += ["--batch-size", batch, "--steps", o.steps, "--warmup-steps", o.warmup_steps, "--repeats", 1]
    args += ["--seed", o.seed, "--preset", o.preset]
    base = PRESETS[o.preset]
    for name in SHAPE_FIELDS:
        if getattr(o.config, name) != getattr(base, name):
            args += [f"--{name.replace('_', '-')}", getattr(o.config, name)]
    for key, value in o.settings.items():  # the raw -O values, as given
        args += ["-O", f"{key}={value}"]
    return [str(a) for a in args]


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
    argv = [sys.executable, "-m", "llmb", "run", *child_args(options.run, precision_name, batch)]
    argv += ["--out", str(scratch)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "200"}
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
        stderr = (scratch / "stderr.txt").read_text(errors="replace")
        results = sorted(scratch.glob("*.json"))
        record = load_result(results[0]) if results and returncode == 0 else None
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
        if not path.exists():  # --resume with nothing to resume starts the sweep
            out.mkdir(parents=True, exist_ok=True)
            log = cls(path, header, [])
            log._append({"type": "sweep", **header})
            return log
        if not resume:
            raise UsageError(f"{out} already holds a sweep; use --resume to continue it or another --out")
        logged, trials = read_log(path)
        for key in IDENTITY + IDENTITY_SEARCH:
            if logged.get(key) != header.get(key):
                raise UsageError(
                    f"--resume: {path} was written for another sweep ({key} is {logged.get(key)!r} there, "
                    f"{header.get(key)!r} here)"
                )
        with open(path, "rb+") as f:  # the sweep holds the folder's lock: cut a torn last line before appending
            data = f.read()
            if data and not data.endswith(b"\n"):
                f.truncate(data.rfind(b"\n") + 1)
        return cls(path, logged, trials)

    def find(self, precision_name: str, phase: str, batch: int, index: int = 0) -> Trial | None:
        return self.trials.get((precision_name, phase, batch, index))

    def add(self, trial: Trial) -> None:
        self._append({"type": "trial", **asdict(trial)})
        self.trials[trial.key] = trial

    def _append(self, entry: dict) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(entry) + "\n")
            f.flush()
            os.fsync(f.fileno())


def read_log(path: Path) -> tuple[dict, list[Trial]]:
    """The header and the trials of a sweep log; a line torn by a kill mid-write is left out (the file is untouched)."""
    try:
        text = read_regular(path, RECORD_LIMIT).decode("utf-8")
    except ValueError as exc:  # not a plain file, too large, not UTF-8
        raise LlmbError(f"{path}: not a readable sweep log ({exc})") from None
    if text and not text.endswith("\n"):  # cut here, in memory only: a reader never writes (SweepLog.open repairs)
        text = text[: text.rfind("\n") + 1]
    header, trials = {}, []
    for number, line in enumerate(text.splitlines(), 1):
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            raise LlmbError(f"{path}:{number}: not JSON") from None
        kind = entry.pop("type", None)
        if kind == "sweep":
            header = entry
        elif kind == "trial":
            trials.append(Trial(**entry))
    if header.get("schema") != LOG_SCHEMA:
        raise LlmbError(f"{path}: not a sweep log (schema {header.get('schema')!r})")
    return header, trials


# Display: what a sweep reports while it works; the CLI draws it live, tests ignore it.


class Display:
    def trial(self, precision_name: str, batch: int, phase: str, number: int) -> None: ...

    def finished(self, trial: Trial, reused: bool) -> None: ...

    def best(self, precision_name: str, trial: Trial | None) -> None: ...


@dataclass
class LiveDisplay(Display):
    console: Console
    current: str = ""
    started: float = 0.0
    rows: list[Trial] = field(default_factory=list)
    bests: dict[str, Trial] = field(default_factory=dict)
    live: Live | None = None

    def __enter__(self) -> LiveDisplay:
        self.live = Live(get_renderable=self.render, console=self.console, refresh_per_second=4, transient=False)
        self.live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.current = ""
        self.live.__exit__(*exc)
        if not self.console.is_terminal and self.rows:  # off a terminal, Live leaves its last line open
            self.console.line()

    def trial(self, precision_name: str, batch: int, phase: str, number: int) -> None:
        what = "search" if phase == "search" else f"repeat {number}"
        self.current = f"{precision_name}  batch {batch}  {what}  (trial {len(self.rows) + 1})"
        self.started = time.monotonic()

    def finished(self, trial: Trial, reused: bool) -> None:
        self.rows.append(replace(trial, detail=("from the log; " if reused else "") + trial.detail))
        self.current = ""

    def best(self, precision_name: str, trial: Trial | None) -> None:
        if trial is not None:
            self.bests[precision_name] = trial

    def render(self):
        if not self.rows and not self.current:  # nothing yet: a sweep refused before its first trial draws nothing
            return Group()
        table = Table(title="llmb sweep", title_justify="left")
        for column in ("precision", "batch", "phase", "status", "tokens/s", "s", "detail"):
            numeric = column in ("batch", "tokens/s", "s")
            table.add_column(column, justify="right" if numeric else "left", no_wrap=True, overflow="ellipsis")
        for t in self.rows[-12:]:
            style = "green" if t.ok else "red"
            tps = f"{t.tokens_per_second:,.0f}" if t.tokens_per_second else ""
            phase = t.phase if t.phase == "search" else f"repeat {t.index + 1}"
            table.add_row(
                t.precision, str(t.batch_size), phase, f"[{style}]{t.status}[/]", tps, f"{t.seconds:.1f}", t.detail
            )
        best = "  ".join(f"{p}: b{t.batch_size} {t.tokens_per_second:,.0f} tok/s" for p, t in self.bests.items())
        parts = [table, f"best so far: {best or '-'}"]
        if self.current:
            spinner = Spinner("dots", text=f"{self.current}  {time.monotonic() - self.started:.0f} s")
            parts.append(spinner)
        return Group(*parts)


# The sweep.


def precisions_to_sweep(plugin, requested: str) -> tuple[list[str], list[str]]:
    """(precisions to sweep, precisions the plugin does not support) for a --precision value."""
    supported = plugin.precisions()
    if requested.upper() == "ALL":
        return [p for p in precision.PRECISIONS if p in supported], [
            p for p in precision.PRECISIONS if p not in supported
        ]
    return [requested.upper()], []


def sweep(options: SweepOptions, display: Display | None = None) -> dict:
    """Run (or resume) a sweep; return its summary, which is also written to SUMMARY_NAME in the out directory.
    The sweep holds an exclusive lock on its folder for its whole life: a second sweep there is refused."""
    out = Path(options.out)
    created = not out.exists()
    try:
        check_writable(out)
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


def _sweep(options: SweepOptions, display: Display | None = None) -> dict:
    display = display or Display()
    for name, value, low in (("repeats", options.repeats, 0), ("max-batch-size", options.max_batch_size, 1)):
        if value < low:
            raise UsageError(f"--{name} must be at least {low}, got {value}")
    if options.trial_timeout <= 0:
        raise UsageError(f"--trial-timeout must be positive, got {options.trial_timeout}")
    plugin, device, settings = runner.resolve(options.run)
    names, unsupported = precisions_to_sweep(plugin, options.precision)
    for name in names:  # every precision is checked before the first trial starts
        runner.resolve(replace(options.run, precision=name))
    run_options = replace(options.run, plugin=plugin.name, device=str(device))
    header = {
        "schema": LOG_SCHEMA,
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
        "plateau_gain": PLATEAU_GAIN,
        "refine_points": REFINE_POINTS,
    }
    options = replace(options, run=run_options, out=Path(options.out))
    log = SweepLog.open(options.out, header, options.resume)
    for stale in options.out.glob(".trial-*"):  # scratch left by a killed sweep
        shutil.rmtree(stale, ignore_errors=True)
    summary = {
        "schema": SUMMARY_SCHEMA,
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
    points: dict[int, Trial] = {}
    while True:
        if options.batch_sizes:
            batch, reason = next_listed_batch(points, options.batch_sizes)
        else:
            batch, reason = next_batch(points, options.max_batch_size)
        if batch is None:
            break
        points[batch] = point(name, batch, "search", 0)
        display.best(name, best_point(points))
    best = best_point(points)
    entry = {
        "stop": reason,
        "search": [_brief(points[b]) for b in sorted(points)],
    }
    if best is None:
        return {"status": "no batch size ran", **entry}
    repeats = [point(name, best.batch_size, "repeat", i) for i in range(options.repeats)]
    measured = [t for t in repeats if t.ok] or ([best] if not options.repeats else [])
    entry.update(best_batch_size=best.batch_size, repeats=[_brief(t) for t in repeats])
    if not measured:
        return {"status": f"every re-run of batch {best.batch_size} failed", **entry}
    headline = measured[median_index([t.tokens_per_second for t in measured])]
    record = load_result(options.out / headline.result)
    return {
        "status": "ok",
        "best_batch_size": best.batch_size,
        "tokens_per_second": headline.tokens_per_second,  # the median run's (the lower middle for even counts)
        "runs": len(measured),
        "headline_result": headline.result,
        "effective_precision": record["precision"]["effective"],
        "tflops": record["tflops"],
        "mfu": record["mfu"],
        "peak_memory_bytes": record["peak_memory_bytes"],
        **entry,
    }


def _brief(trial: Trial) -> dict:
    return {k: v for k, v in asdict(trial).items() if k not in ("precision", "phase") and v not in (None, "")}


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
    table = Table(title=f"llmb sweep: {summary['plugin']} on {summary['device']}", title_justify="left")
    for column in ("precision", "best batch", "tokens/s (median)", "runs", "TFLOP/s", "stopped because"):
        table.add_column(column)
    for name, entry in summary["precisions"].items():
        if entry.get("status") != "ok":
            table.add_row(name, "", entry["status"], "", "", entry.get("stop", ""))
            continue
        table.add_row(
            name,
            str(entry["best_batch_size"]),
            f"{entry['tokens_per_second']:,.1f}",
            str(entry["runs"]),
            f"{entry['tflops']:.3g}",
            entry["stop"],
        )
    console.print(table)
