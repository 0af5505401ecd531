"""llmb sweep: the search (pure functions), trial classification, and real sweeps of `llmb run` subprocesses.

The out-of-memory trials here are simulated with the cpu plugin's oom_above_batch_size setting, which raises
torch.OutOfMemoryError above a batch size: the CPU has no device memory limit a test could hit.
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import TINY_SWEEP

from llmb import sweep
from llmb.config import build_config
from llmb.errors import UsageError
from llmb.runner import RunOptions


def trial(batch, tps=None, status="ok"):
    return sweep.Trial("FP32", batch, "search", 0, status, tokens_per_second=tps)


def search(measure, max_batch_size=64, known=None):
    """Drive the automatic search against a throughput function (None: out of memory); return the batches tried."""
    points = dict(known or {})
    tried = []
    while True:
        batch, _reason = sweep.next_batch(points, max_batch_size)
        if batch is None:
            return tried, points
        tried.append(batch)
        tps = measure(batch)
        points[batch] = trial(batch, tps, "ok" if tps is not None else "oom")


def test_auto_doubles_until_oom_then_bisects_for_the_largest_batch_that_fits():
    tried, points = search(lambda b: 10.0 * b if b <= 6 else None)
    assert tried == [1, 2, 4, 8, 6, 7]
    assert sweep.best_point(points).batch_size == 6


def test_auto_stops_on_a_plateau_and_refines_toward_the_faster_end():
    tried, points = search(lambda b: 10.0 * min(b, 8))
    assert tried[:5] == [1, 2, 4, 8, 16]  # 8 -> 16 gains nothing: a plateau
    assert tried[5:] == [12, 14, 15]  # REFINE_POINTS bisection steps between 8 and 16
    assert sweep.best_point(points).batch_size == 8  # equal throughput: the smaller batch wins


def test_auto_respects_the_cap_and_a_failing_first_batch():
    assert search(lambda b: 10.0 * b, max_batch_size=5)[0] == [1, 2, 4, 5]
    tried, points = search(lambda b: None)
    assert tried == [1] and sweep.best_point(points) is None


def test_search_is_a_function_of_the_log():
    measure = {1: 10.0, 2: 19.0, 4: 30.0, 8: 31.0, 6: 33.0, 7: None, 5: 32.0}.get
    full, points = search(measure)
    for k in range(len(full)):
        known = {b: points[b] for b in full[:k]}
        assert full[:k] + search(measure, known=known)[0] == full


def test_listed_sizes_skip_those_above_an_oom():
    points = {1: trial(1, 5.0), 4: trial(4, status="oom")}
    assert sweep.next_listed_batch(points, [1, 2, 4, 8]) == (2, "listed")
    points[2] = trial(2, 9.0)
    assert sweep.next_listed_batch(points, [1, 2, 4, 8])[0] is None


@pytest.mark.parametrize(
    "returncode, stderr, record, status",
    [
        (None, "", None, "timeout"),
        (1, "error: out of memory at batch size 8 on cuda:0: CUDA out of memory", None, "oom"),
        (-9, "", None, "crash"),
        (1, "Traceback...\nRuntimeError: device lost", None, "crash"),
        (0, "", None, "invalid"),
        (0, "", {"invalid_reasons": ["non-finite loss"], "tokens_per_second": 5.0}, "invalid"),
        (0, "", {"invalid_reasons": [], "tokens_per_second": 5.0}, "ok"),
    ],
)
def test_trials_are_classified_from_exit_code_stderr_and_result(returncode, stderr, record, status):
    assert sweep.classify(returncode, stderr, record, 60)[0] == status


def test_usage_errors_are_caught_before_any_trial(tmp_path):
    options = sweep.SweepOptions(run=RunOptions(config=build_config("tiny"), device="cpu"), out=tmp_path)
    with pytest.raises(UsageError, match="does not support TF32"):
        sweep.sweep(replace(options, precision="TF32"))
    with pytest.raises(UsageError, match="--batch-sizes"):
        sweep.parse_batch_sizes("1,x")
    assert not (tmp_path / sweep.LOG_NAME).exists()


def read_trials(out: Path) -> list[dict]:
    lines = (out / sweep.LOG_NAME).read_text().splitlines()
    return [json.loads(line) for line in lines if json.loads(line)["type"] == "trial"]


def test_auto_finds_a_best_batch_for_every_cpu_precision_with_oom_points(tiny_sweep):
    summary = json.loads((tiny_sweep / sweep.SUMMARY_NAME).read_text())
    assert list(summary["precisions"]) == ["FP32", "TF32", "FP16", "BF16"]
    assert summary["precisions"]["TF32"]["status"] == "unsupported by the plugin"
    trials = read_trials(tiny_sweep)
    for name in ("FP32", "FP16", "BF16"):
        entry = summary["precisions"][name]
        assert entry["status"] == "ok" and entry["best_batch_size"] == 1
        assert entry["effective_precision"] == name
        assert entry["stop"] == "oom at batch 2"
        mine = {t["batch_size"]: t for t in trials if t["precision"] == name}
        assert mine[1]["status"] == "ok" and mine[1]["tokens_per_second"] > 0
        assert mine[2]["status"] == "oom" and "simulated" in mine[2]["detail"]
        assert (tiny_sweep / "failed" / f"{name}-b2-search0.stderr.txt").exists()
        record = json.loads((tiny_sweep / mine[1]["result"]).read_text())
        assert record["tokens_per_second"] == entry["tokens_per_second"] == mine[1]["tokens_per_second"]
    assert len(list(tiny_sweep.glob("*.json"))) == 3 + 1  # three results and the summary
    assert not list(tiny_sweep.glob(".*")), "no scratch directories or temporary files left"


def processes_mentioning(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if text in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc and relies on PR_SET_PDEATHSIG")
def test_a_killed_sweep_resumes_without_redoing_finished_points(tmp_path):
    out = tmp_path / "sweep"
    command = [sys.executable, "-m", "llmb", "sweep", *TINY_SWEEP, "--precision", "FP32"]
    command += ["--max-batch-size", "1", "--repeats", "1", "--out", str(out)]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while not ((out / sweep.LOG_NAME).exists() and read_trials(out)):
        assert proc.poll() is None and time.monotonic() < deadline, "the sweep ended before its first point"
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    first = read_trials(out)
    assert len(first) == 1 and first[0]["batch_size"] == 1 and first[0]["status"] == "ok"
    for _ in range(50):  # the trial in flight dies with its parent (PR_SET_PDEATHSIG), leaving no orphan
        if not processes_mentioning(str(out)):
            break
        time.sleep(0.1)
    assert not processes_mentioning(str(out))

    resumed = subprocess.run(command + ["--resume"], capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    trials = read_trials(out)
    assert trials[0] == first[0], "the finished point was kept, not rerun"
    keys = [(t["precision"], t["phase"], t["batch_size"], t["index"]) for t in trials]
    assert len(keys) == len(set(keys)) == 2  # b1 (the cap) and one re-run of it
    assert [t["phase"] for t in trials] == ["search", "repeat"]
    results = sorted(p.name for p in out.glob("*.json") if p.name != sweep.SUMMARY_NAME)
    assert results == sorted(t["result"] for t in trials), "one result file per finished point, none twice"
    summary = json.loads((out / sweep.SUMMARY_NAME).read_text())["precisions"]["FP32"]
    assert summary["runs"] == 1 and summary["headline_result"] == trials[1]["result"]
    assert summary["best_batch_size"] == 1 and summary["stop"] == "--max-batch-size 1 reached"

    again = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert again.returncode == 2 and "use --resume" in again.stderr


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_sigterm_kills_the_trial_keeps_the_log_and_exits_non_zero(tmp_path):
    options = sweep.SweepOptions(
        run=RunOptions(config=build_config("tiny"), preset="tiny", device="cpu", steps=2, warmup_steps=1),
        out=tmp_path,
        precision="FP32",
    )

    def terminate_when_a_trial_starts():
        while not list(tmp_path.glob(".trial-*/stderr.txt")):
            time.sleep(0.05)
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGTERM)

    handler = signal.getsignal(signal.SIGTERM)
    threading.Thread(target=terminate_when_a_trial_starts, daemon=True).start()
    with pytest.raises(sweep.Interrupted) as caught:
        sweep.sweep(options)
    assert caught.value.exit_code == 143
    assert "sweep interrupted at FP32 batch 1; 0 finished points kept" in str(caught.value)
    assert "\n" not in str(caught.value)
    assert (tmp_path / sweep.LOG_NAME).exists() and not list(tmp_path.glob(".trial-*"))
    assert not processes_mentioning(str(tmp_path))
    assert signal.getsignal(signal.SIGTERM) is handler
