"""A sweep's trials: each one `llmb run` subprocess, killed with its parent, classified from its exit code, stderr
and result JSON."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from llmb.api.errors import UsageError
from llmb.api.settings import SECRET_OPTIONS_ENV
from llmb.records import SweepTrial as Trial
from llmb.records.result_files import read_result
from llmb.run import runner
from llmb.run.sweep_options import SweepOptions
from llmb.spec.presets import PRESETS, SHAPE_FIELDS
from llmb.spec.redact import REDACTED, is_secret

if TYPE_CHECKING:
    pass


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
    if returncode == UsageError.exit_code:
        # The sweep checked its own options before the first trial, so this is the plugin (or llmb) refusing this
        # point, a batch too large for it say: a failed point like any other, not the end of the sweep.
        return "refused", _last_line(stderr)
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
