"""A plugin that hangs ends a command only where the user gave it a time: `llmb run --time-limit` stops the worker,
keeps each record judged before, says one line and exits 124 (as timeout(1) does); the sweep bounds its own calls
into the plugin, before any trial, by --trial-timeout, as each trial already was. Found open in the notes of
2026-11-27: a plain `llmb run` had no time limit, and a plugin hanging in a call the sweep makes itself hung the
sweep past every trial's limit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import TINY, TINY_CPU, install_plugin, invoke, plugin_env

from llmb import CpuBackend
from llmb.api import errors
from llmb.api.errors import TimeLimitReached, time_limit
from llmb.api.last_resort import children_of

# Hangs wherever `HANG_IN` names: in the worker, set up for any precision but FP32 (so a `--precision all` run judges
# FP32 first), or in the sweep's own process, asked for its precisions. In Python (time.sleep), which the limit's
# signal interrupts; or, with HANG_MASKED, with SIGALRM blocked first: the signal never reaches the sleeping thread,
# as it never reaches one inside a C call that does not return (a driver's, a collective's); or, with
# HANG_HOLDING_GIL, inside a C call that also holds Python's GIL, so that no thread of the process runs Python.
HANGING_PLUGIN = """
import ctypes
import os
import signal
import time

from llmb import CpuBackend, hookimpl


def hang():
    if os.environ.get("HANG_MASKED"):
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    if os.environ.get("HANG_HOLDING_GIL"):  # libc's sleep with the GIL held, SIGALRM kept from ending it early
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        ctypes.PyDLL(None).sleep(3600)
    time.sleep(3600)


class Hanging(CpuBackend):
    name = "hanging"

    def available(self):
        return False

    def precisions(self):
        if os.environ.get("HANG_IN") == "precisions":
            hang()
        return super().precisions()

    def process_model(self, model, optimizer, device, precision, settings):
        if os.environ.get("HANG_IN") == "process_model" and precision != "FP32":
            hang()
        return super().process_model(model, optimizer, device, precision, settings)


@hookimpl
def register_backends(register):
    register(Hanging())
"""


def hanging(tmp_path, where: str, *command: str, **env_extra: str) -> tuple[subprocess.CompletedProcess, float]:
    site = install_plugin(tmp_path, "hanging", HANGING_PLUGIN)
    env = {**plugin_env(site), "HANG_IN": where, "HANGING_TEST": str(tmp_path), **env_extra}
    started = time.monotonic()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "llmb", *command], capture_output=True, text=True, env=env, timeout=300
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"`llmb {' '.join(command)}` still ran after 300 s: its time limit did not end it")
    return proc, time.monotonic() - started


def error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("error:")]


def test_no_limit_is_set_for_none_zero_or_less():
    for seconds in (None, 0, -1.0):
        with time_limit(seconds, "never said"):
            time.sleep(0.05)


def test_the_limit_interrupts_the_main_thread_with_its_line_and_is_gone_afterwards():
    with pytest.raises(TimeLimitReached, match="^said here$") as caught:
        with time_limit(0.1, "said here"):
            time.sleep(5)
    assert caught.value.exit_code == 124
    with time_limit(0.1, "said here"):
        pass
    time.sleep(0.2)  # the timer was cleared on the way out: nothing fires now


def test_the_watchdog_ends_a_main_thread_the_limits_signal_cannot_reach(monkeypatch):
    """A main thread hung where SIGALRM cannot reach it (blocked here, as inside a C call that never returns) is
    never interrupted: the watchdog, HUNG_GRACE_SECONDS past the limit, ends the process (here: records that it
    would have). Found in the notes of 2026-11-28: --time-limit could not end a hang inside a C call in-process."""
    ended = threading.Event()
    said_to = []
    monkeypatch.setattr(errors, "HUNG_GRACE_SECONDS", 0.2)
    monkeypatch.setattr(errors, "_start_last_resort", lambda seconds, said: None)  # it would end pytest itself
    monkeypatch.setattr(errors, "_end_hung_process", lambda said, last_resort: (said_to.append(said), ended.set()))
    with pytest.raises(TimeLimitReached):  # raised once the main thread runs Python again, after the watchdog
        with time_limit(0.1, "said here"):
            before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
            try:
                assert ended.wait(10), "the watchdog did not fire"
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, before)
    assert said_to == ["said here"]


def test_the_watchdogs_last_line_shows_outside_text_as_data():
    """What the watchdog says is one line whatever the limit's words hold (they name a plugin's call): its control,
    line-break and bidi characters shown escaped, by the same cleaner as every console line (llmb.spec.printable),
    and the process ends with 124 at once."""
    said = "plugin \x1b]0;owned\x07 hung\nerror: forged line \u202eevil"
    code = f"from llmb.api import errors; errors._end_hung_process({said!r})"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == TimeLimitReached.exit_code, done
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: plugin "), done.stderr
    assert "\x1b" not in done.stderr and "\u202e" not in done.stderr, done.stderr
    assert all(shown in done.stderr for shown in ("\\x1b", "\\x07", "hung\\nerror: forged", "\\u202e")), done.stderr


def test_the_watchdog_does_not_fire_where_the_limit_interrupted_the_main_thread(monkeypatch):
    fired = threading.Event()
    monkeypatch.setattr(errors, "HUNG_GRACE_SECONDS", 0.2)
    monkeypatch.setattr(errors, "_start_last_resort", lambda seconds, said: None)  # it would end pytest itself
    monkeypatch.setattr(errors, "_end_hung_process", lambda said, last_resort: fired.set())
    with pytest.raises(TimeLimitReached):
        with time_limit(0.1, "said here"):
            time.sleep(5)
    assert not fired.wait(0.5)
    with time_limit(0.1, "said here"):
        pass
    assert not fired.wait(0.5)


def test_an_in_process_run_past_its_limit_exits_124_in_one_line(register_backend, tmp_path):
    class Stalling(CpuBackend):
        name = "stalling"

        def process_model(self, model, optimizer, device, precision, settings):
            time.sleep(60)
            return model

    register_backend(Stalling())
    started = time.monotonic()
    result = invoke("run", *TINY_CPU, "--plugin", "stalling", "--time-limit", "1", "--out", tmp_path)
    assert time.monotonic() - started < 30
    assert result.exit_code == 124, result.output
    assert error_lines(result.output) == [
        f"error: the run went past its time limit of 1 s and was stopped (--time-limit); each record judged before "
        f"it is saved in {tmp_path}"
    ], result.output
    assert "Traceback" not in result.output


@pytest.mark.slow
def test_a_clean_room_run_past_its_limit_stops_the_worker_and_keeps_the_precision_judged_before(tmp_path):
    out = tmp_path / "out"
    run = ["run", "--plugin", "hanging", "--device", "cpu", *TINY, "--precision", "all", "--out", str(out)]
    proc, seconds = hanging(tmp_path, "process_model", *run, "--replay-steps", "1", "--time-limit", "60")
    assert proc.returncode == 124, proc.stderr[-2000:]
    assert 60 <= seconds < 200, seconds  # stopped at its limit, not at the plugin's hour
    (line,) = error_lines(proc.stderr)
    assert line.startswith("error: the run went past its time limit of 60 s and was stopped"), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    (saved,) = out.glob("*.json")  # FP32, judged before FP16 hung in its setup
    record = json.loads(saved.read_text())
    assert record["precision"]["requested"] == "FP32" and record["tokens_per_second"] > 0


@pytest.mark.slow
def test_the_sweeps_own_calls_into_a_hanging_plugin_end_at_the_trial_timeout(tmp_path):
    out = tmp_path / "out"
    sweep = ["sweep", "--plugin", "hanging", "--device", "cpu", *TINY, "--batch-sizes", "1", "--out", str(out)]
    proc, seconds = hanging(tmp_path, "precisions", *sweep, "--trial-timeout", "5")
    assert proc.returncode == 124, proc.stderr[-2000:]
    assert seconds < 120, seconds
    assert error_lines(proc.stderr) == [
        "error: the plugin did not answer the sweep's own checks within 5 s (--trial-timeout); no trial was run"
    ], proc.stderr[-2000:]


# The plugin runs in the command's own process: the sweep's own checks, and an in-process run.
IN_PROCESS = pytest.mark.parametrize(
    "where, command, env, said",
    [
        (
            "precisions",
            ["sweep", "--batch-sizes", "1", "--trial-timeout", "5"],
            {},
            "error: the plugin did not answer the sweep's own checks within 5 s (--trial-timeout); no trial was run",
        ),
        (
            "process_model",
            ["run", "--precision", "BF16", "--time-limit", "5"],
            {"LLMB_IN_PROCESS": "1"},
            "error: the run went past its time limit of 5 s and was stopped (--time-limit)",
        ),
    ],
    ids=["sweep-checks", "in-process-run"],
)


@pytest.mark.slow
@IN_PROCESS
def test_a_plugin_hung_where_the_limits_signal_cannot_reach_still_ends_at_124(tmp_path, where, command, env, said):
    """The plugin runs in the command's own process here and blocks SIGALRM before it hangs, as a call into C that
    never returns would keep the signal from ever being handled: the watchdog ends the process HUNG_GRACE_SECONDS
    past the limit, one line, exit 124, no traceback. Before it, the command hung for the plugin's hour."""
    out = tmp_path / "out"
    full = [command[0], "--plugin", "hanging", "--device", "cpu", *TINY, *command[1:], "--out", str(out)]
    proc, seconds = hanging(tmp_path, where, *full, HANG_MASKED="1", **env)
    assert proc.returncode == 124, proc.stderr[-2000:]
    assert 5 + errors.HUNG_GRACE_SECONDS <= seconds < 5 + errors.HUNG_GRACE_SECONDS + 60, seconds
    (line,) = error_lines(proc.stderr)
    assert line.startswith(said) and "ended there" in line, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert not processes_marked(str(tmp_path))


@pytest.mark.slow
@IN_PROCESS
def test_a_plugin_hung_holding_the_gil_is_ended_by_the_last_resort(tmp_path, where, command, env, said):
    """The plugin hangs inside a C call that holds Python's GIL: neither the limit's signal handler nor the watchdog
    thread ever runs. The last resort, a process of its own, says the line 2 x HUNG_GRACE_SECONDS past the limit and
    kills the command (SIGKILL) and what it started. Before it, the command hung for the plugin's hour."""
    out = tmp_path / "out"
    full = [command[0], "--plugin", "hanging", "--device", "cpu", *TINY, *command[1:], "--out", str(out)]
    proc, seconds = hanging(tmp_path, where, *full, HANG_HOLDING_GIL="1", **env)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert 5 + 2 * errors.HUNG_GRACE_SECONDS <= seconds < 5 + 2 * errors.HUNG_GRACE_SECONDS + 60, seconds
    (line,) = error_lines(proc.stderr)
    assert line.startswith(said) and line.endswith("did not return; killed)"), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert not processes_gone_within(str(tmp_path), 10)


def test_the_last_resort_ends_a_main_thread_holding_the_gil_and_what_it_started(tmp_path):
    """time_limit with a short grace, around libc's sleep called with the GIL held (ctypes.PyDLL), in a process that
    started a child first: the last resort says one line, shown as data (the limit's words name a plugin's call),
    and kills the child and the process. Exit -SIGKILL: nothing in a process whose interpreter is held exits more
    cleanly."""
    said = "plugin \x1b]0;owned\x07 hung\nerror: forged line"
    code = f"""
import ctypes, signal, subprocess, sys
from llmb.api import errors
errors.HUNG_GRACE_SECONDS = 0.5
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"], stderr=subprocess.DEVNULL)
with errors.time_limit(1, {said!r}):
    signal.pthread_sigmask(signal.SIG_BLOCK, {{signal.SIGALRM}})  # as a C call that retries on EINTR
    ctypes.PyDLL(None).sleep(3600)
"""
    env = {**os.environ, "HANGING_TEST": str(tmp_path)}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == -signal.SIGKILL, done
    assert 2 <= time.monotonic() - started < 45
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: plugin "), done.stderr
    assert "\x1b" not in done.stderr and "hung\\nerror: forged line" in done.stderr, done.stderr
    assert not processes_gone_within(str(tmp_path), 10)


def test_the_last_resort_goes_with_the_limit_and_with_its_process(tmp_path):
    """Started with the limit, gone once the limit's block is left or the limit is reached (a slow unwinding is not a
    hang); and gone at once, silent, where the process ends some other way inside the block (its pipe closes): it
    never outlives the command to fire at a later process."""
    mark = str(tmp_path)
    with time_limit(600, "never said"):
        (pid,) = last_resorts_of(os.getpid())
    assert not last_resorts_of(os.getpid())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # reaped, not left a zombie
    left_while_unwinding = []
    with pytest.raises(TimeLimitReached):  # reached: gone as the unwinding starts, however long that takes
        with time_limit(0.2, "said here"):
            assert last_resorts_of(os.getpid())
            try:
                time.sleep(10)
            finally:
                left_while_unwinding += last_resorts_of(os.getpid())
    assert left_while_unwinding == []
    code = "import os\nfrom llmb.api import errors\nwith errors.time_limit(600, 'never said'):\n    os._exit(3)\n"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, "HANGING_TEST": mark}
    )
    assert done.returncode == 3 and done.stderr == "", done
    assert not processes_gone_within(mark, 10)


def test_an_interrupt_while_the_limit_is_set_up_leaves_no_last_resort(monkeypatch):
    """A Ctrl-C that lands after the last resort started and before the limit holds (here: as the SIGALRM handler is
    set) is raised from time_limit with the last resort already stopped: it never outlives the limit's block, even
    while the interrupt's traceback keeps the block's frame alive."""
    set_handler = signal.signal

    def interrupted(number, handler):
        if number == signal.SIGALRM:
            raise KeyboardInterrupt
        return set_handler(number, handler)

    monkeypatch.setattr(errors.signal, "signal", interrupted)
    with pytest.raises(KeyboardInterrupt) as raised:
        with time_limit(600, "never said"):
            pass
    assert raised.traceback and not last_resorts_of(os.getpid())


def last_resorts_of(parent: int) -> list[int]:
    """The live last-resort processes whose parent is ``parent`` (Linux's /proc, read as the last resort reads it)."""
    found = []
    for pid in children_of(parent):
        try:
            words = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue  # ended meanwhile
        if any(word.endswith(b"last_resort.py") for word in words) and state != b"Z":
            found.append(pid)
    return found


def processes_gone_within(mark: str, seconds: float) -> list[int]:
    """processes_marked(mark) once it is empty, or after ``seconds``: a killed process's children are reaped by
    whoever adopts them, a moment later."""
    deadline = time.monotonic() + seconds
    while (left := processes_marked(mark)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


@pytest.mark.slow
def test_a_launched_job_past_its_limit_stops_every_rank(tmp_path):
    """Under --nproc-per-node the judge waits in torch's launcher: the limit ends it there, and the launcher stops
    every rank on its way out (no rank is left running: the plugin's hour would outlive the command)."""
    run = ["run", "--plugin", "hanging", "--device", "cpu", *TINY, "--precision", "BF16", "--nproc-per-node", "2"]
    proc, seconds = hanging(tmp_path, "process_model", *run, "--out", str(tmp_path / "out"), "--time-limit", "20")
    assert proc.returncode == 124, proc.stderr[-2000:]
    assert 20 <= seconds < 120, seconds
    (line,) = error_lines(proc.stderr)
    assert line.startswith("error: the run went past its time limit of 20 s"), proc.stderr[-2000:]
    assert not processes_marked(str(tmp_path))


def processes_marked(mark: str) -> list[int]:
    """This host's processes whose environment holds HANGING_TEST=`mark`: the command's and every process it
    started, which inherit it (Linux's /proc)."""
    wanted = f"HANGING_TEST={mark}".encode()
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if wanted in environ.read_bytes().split(b"\0"):
                found.append(int(environ.parent.name))
        except OSError:  # ended meanwhile, or not ours
            continue
    return found


@pytest.mark.slow
@pytest.mark.parametrize(
    "sent, code, said", [(signal.SIGTERM, 143, "stopped by SIGTERM"), (signal.SIGINT, 130, "interrupted")]
)
def test_a_signal_during_the_judges_replay_exits_with_its_code_and_keeps_the_record_unchecked(
    tmp_path, sent, code, said
):
    """The replay ran in the judge's thread: a signal during it ended the main thread while that thread went on inside
    torch, and the interpreter's exit aborted the process ("terminate called without an active exception", exit 134;
    found 2026-11-27 with --time-limit, and SIGTERM and Ctrl-C did the same). The record kept before the replay is
    the trigger here: the judge saves it (unchecked) just before it replays."""
    out = tmp_path / "out"
    command = [sys.executable, "-m", "llmb", "run", "--device", "cpu", "--preset", "small", "--steps", "10"]
    command += ["--warmup-steps", "1", "--replay-whole", "1", "--out", str(out)]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 500
    while not list(out.glob("*.json")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(sent)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == code, stderr[-2000:]
    assert said in stderr and "terminate called" not in stderr and "Traceback" not in stderr, stderr[-2000:]
    (saved,) = out.glob("*.json")
    record = json.loads(saved.read_text())
    assert not record["valid"] and any(r.startswith("replay: not finished") for r in record["invalid_reasons"])
