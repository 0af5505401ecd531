"""Red team, clock and evidence: adversarial plugins (installed distributions with an entry point) against
`llmb run`'s clean room. Each attack must be caught, and the test names the stage (run) and the reason."""

import os

import pytest
from redteam_kit import install, reasons, run

SLOW_CLOCK = """
import time as _time

import llmb.training.loop as _train


class _SlowClock:
    def __getattr__(self, name):
        return getattr(_time, name)

    @staticmethod
    def perf_counter():
        return _time.perf_counter() / 1.5


_train.time = _SlowClock()
"""


def judged_longer_than_claimed(record: dict, factor: float) -> bool:
    timing = record["timing"]
    return timing["clock"] == "judge" and timing["window_seconds"] > factor * timing["worker_window_seconds"]


def test_a_patched_clock_cannot_shorten_the_window(tmp_path):
    proc, record = run(install(tmp_path / "site", "clock", SLOW_CLOCK), tmp_path, "--plugin", "clock")
    assert record is not None, proc.stderr[-2000:]
    # The headline is the clean clock's; the plugin's clock disagrees with the host's, and the run says so.
    assert judged_longer_than_claimed(record, 1.3)
    assert reasons(record, "clock: the plugin's process timed window 1"), record["invalid_reasons"]


def test_a_patched_measure_that_scales_its_times_is_caught(tmp_path):
    code = """
    import dataclasses

    import llmb.training.loop as _train

    _measure = _train.Trainer.measure


    def _scaled(self, *args, **kwargs):
        m = _measure(self, *args, **kwargs)
        return dataclasses.replace(
            m, window_seconds=m.window_seconds / 1.5, step_seconds=[s / 1.5 for s in m.step_seconds]
        )


    _train.Trainer.measure = _scaled
    """
    proc, record = run(install(tmp_path / "site", "measure", code), tmp_path, "--plugin", "measure")
    assert record is not None, proc.stderr[-2000:]
    assert judged_longer_than_claimed(record, 1.3)
    assert reasons(record, "timing: the plugin's process recorded window 1"), record["invalid_reasons"]


def test_fake_device_events_cannot_shorten_the_window(tmp_path):
    code = """
    class _Event:
        def record(self):
            pass

        def synchronize(self):
            pass

        def elapsed_time(self, other):
            return 0.001  # a microsecond a step


    def _new_event(device):
        return _Event()
    """
    proc, record = run(install(tmp_path / "site", "events", code), tmp_path, "--plugin", "events")
    assert record is not None, proc.stderr[-2000:]
    assert record["timing"]["method"] == "device-events" and record["timing"]["clock"] == "judge"
    assert reasons(record, "timing: the plugin's step times add up to"), record["invalid_reasons"]


def test_an_installed_plugin_that_is_never_selected_never_reaches_the_judge(tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    mark = f"import os\nimport pathlib\n\npathlib.Path({str(marks)!r}, str(os.getpid())).write_text('imported')\n"
    code = mark + SLOW_CLOCK
    site = install(tmp_path / "site", "bystander", code)
    proc, record = run(site, tmp_path, "--plugin", "cpu")
    assert record is not None, proc.stderr[-2000:]
    imported_in = {int(p.name) for p in marks.iterdir()}
    assert record["judge"]["pid"] not in imported_in, "the judging process imported a plugin"
    assert "bystander" in [p["name"] for p in record["judge"]["installed_plugins"]]
    # Where the worker still imports every installed plugin, its patched clock is caught; where it imports only the
    # selected one, the bystander never runs at all.
    assert not imported_in or reasons(record, "clock:"), record["invalid_reasons"]


HALF_TOKENS_WHEN = """
import inspect

_calls = [0]


def _cheat(model):
    raise NotImplementedError


def _process_model(model, optimizer, device, precision, settings):
    forward = model.forward

    def halved(input_ids, labels=None):
        _calls[0] += 1
        if _cheat(model):
            half = input_ids.shape[1] // 2
            input_ids = input_ids[:, :half]
            labels = labels[:, :half] if labels is not None else None
        return forward(input_ids, labels)

    model.forward = halved
    return model
"""


@pytest.mark.parametrize(
    "name, cheat, extra",
    [
        # Honest only when llmb/conformance/check.py is on the stack (check-plugin).
        ("stack", "return not any('conformance' in f.filename for f in inspect.stack())", ()),
        # Honest only at a check-plugin preset's shape.
        ("shape", "return model.config.intermediate_size not in (128, 1024)", ("--intermediate-size", "96")),
        # Honest for the default warmup and check-plugin's 5 steps: cheats from the 6th forward on.
        ("late", "return _calls[0] >= 6", ("--warmup-steps", "5")),
    ],
)
def test_plugins_that_behave_only_when_checked_fail_the_runs_own_replay(tmp_path, name, cheat, extra):
    code = HALF_TOKENS_WHEN.replace("raise NotImplementedError", cheat)
    proc, record = run(install(tmp_path / "site", name, code), tmp_path, "--plugin", name, *extra)
    assert record is not None, proc.stderr[-2000:]
    failed = reasons(record, "replay: step 1: recorded loss")
    assert failed, record["invalid_reasons"]
    assert record["evidence"]["replay"]["passed"] is False


def test_a_plugin_that_trains_no_model_fails_the_replay(tmp_path):
    code = """
    import torch

    _calls = [0]


    def _process_model(model, optimizer, device, precision, settings):
        anchor = next(model.parameters())

        def fabricated(input_ids, labels=None):
            _calls[0] += 1
            logits = torch.zeros(*input_ids.shape, model.config.vocab_size)
            return anchor.sum() * 0 + (10.4 - 0.01 * _calls[0]), logits

        model.forward = fabricated
        return model
    """
    proc, record = run(install(tmp_path / "site", "nomodel", code), tmp_path, "--plugin", "nomodel")
    assert record is not None, proc.stderr[-2000:]
    assert reasons(record, "replay: step 1: recorded loss"), record["invalid_reasons"]


def test_an_honest_run_is_judged_clean_and_replays(tmp_path):
    proc, record = run(None, tmp_path, "--plugin", "cpu", "--repeats", "2")
    assert record is not None, proc.stderr[-2000:]
    assert record["invalid_reasons"] == [] and record["judge"]["clean_room"] is True
    windows = record["evidence"]["windows"]
    assert len({w["challenge"] for w in windows}) == 2, "every window its own challenge"
    assert record["timing"]["repeat_window_seconds"] == [w["clean_window_seconds"] for w in windows]
    assert all(0 < w["worker_window_seconds"] <= w["clean_window_seconds"] for w in windows)
    assert record["evidence"]["replay"]["passed"] is True and os.getpid() != record["judge"]["pid"]


# What the pickling plugins below send: unpickled, it runs `exec` in the unpickling process, which leaves a file
# named after its pid in MARKS.
PAYLOAD = """
class _Payload:
    def __reduce__(self):
        code = "import os, pathlib; pathlib.Path(MARKS, str(os.getpid())).write_text('ran')"
        return (exec, (code,))
"""


# The plugin finds the worker's link to the judge and sends a pickle that names a callable: unpickled in the judge,
# it would run there (here it only leaves a file named after the process that ran it; it could patch the judge's
# clock). The judge loads plain data only.
PICKLE_INTO_THE_JUDGE = (
    """
import gc as _gc

import llmb.run.clean_worker as _clean_worker
"""
    + PAYLOAD
    + """

for _found in _gc.get_objects():
    if isinstance(_found, _clean_worker.Link):
        _found.connection.send(("note", _Payload()))
"""
)


def test_a_pickle_sent_through_the_link_never_runs_in_the_judge(tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    code = PICKLE_INTO_THE_JUDGE.replace("MARKS", repr(str(marks)))
    proc, record = run(install(tmp_path / "site", "pickler", code), tmp_path, "--plugin", "pickler")
    assert not list(marks.iterdir()), "the worker's pickle ran code in the judging process"
    assert record is None and proc.returncode != 0
    assert "error: the worker process sent what llmb never sends (UnpicklingError: builtins.exec" in proc.stderr, (
        proc.stderr[-2000:]
    )


# In a job (--nproc-per-node), torch's launcher runs in the judging process. Started with a function, each rank's
# return value came back through a multiprocessing queue that the launcher unpickled: a plugin in a rank finds the
# queue and puts its pickle first. The ranks are commands now (llmb.run.rank_worker): no queue, nothing
# unpickled.
PICKLE_INTO_THE_LAUNCHER = (
    """
import gc as _gc
import multiprocessing.queues as _queues
import os as _os
import pathlib as _pathlib
"""
    + PAYLOAD
    + """

for _found in _gc.get_objects():
    if isinstance(_found, _queues.SimpleQueue):
        _found.put(_Payload())
        _pathlib.Path(TRIED, str(_os.getpid())).write_text("put")
"""
)


@pytest.mark.slow
def test_a_pickle_put_on_the_launchers_return_queue_never_runs_in_the_judge(tmp_path):
    marks, tried = tmp_path / "marks", tmp_path / "tried"
    marks.mkdir()
    tried.mkdir()
    code = PICKLE_INTO_THE_LAUNCHER.replace("MARKS", repr(str(marks))).replace("TRIED", repr(str(tried)))
    site = install(tmp_path / "site", "queuepickler", code)
    proc, record = run(site, tmp_path, "--plugin", "queuepickler", "--nproc-per-node", "2", "--dist-timeout", "60")
    assert not list(marks.iterdir()), "a rank's pickle ran code in the judging process"
    # Nothing of the launcher's for the plugin to find: the run is judged as any other.
    assert not list(tried.iterdir()), "a rank process holds a queue that the launcher reads"
    assert record is not None and proc.returncode == 0, proc.stderr[-2000:]
    assert record["judge"]["clean_room"] is True and record["world_size"] == 2


# The worker ends in the middle of the run without a word: by a signal (as the kernel's out-of-memory killer ends
# it), or by an exit from inside the plugin that skips every handler, status 0 included. Before, `llmb run` then
# exited 0 with no result and nothing said, and a sweep logged "exit 0 but no result JSON".
ENDS_ITS_WORKER = {
    "sigkill": ("import os\nimport signal\n", "os.kill(os.getpid(), signal.SIGKILL)", "killed by SIGKILL"),
    "exit0": ("import os\n", "os._exit(0)", "exited with code 0"),
}


@pytest.mark.parametrize("how", sorted(ENDS_ITS_WORKER))
def test_a_worker_that_ends_without_a_word_fails_the_run_in_one_line(tmp_path, how):
    imports, end, said = ENDS_ITS_WORKER[how]
    code = f"{imports}\n\ndef _process_model(model, optimizer, device, precision, settings):\n    {end}\n"
    proc, record = run(install(tmp_path / "site", f"end{how}", code), tmp_path, "--plugin", f"end{how}")
    assert record is None
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-2000:])
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("error: the worker process") and said in lines[-1], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
