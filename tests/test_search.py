"""llmb sweep --search: the batch-size sweep over every combination of the searched plugin settings."""

import json
import signal
import subprocess
import sys
import time

import pytest
from conftest import TINY_SWEEP, install_plugin, plugin_env

from llmb.api.errors import UsageError
from llmb.run import grid


def test_search_items_parse_into_a_grid_and_its_combinations():
    searched = grid.parse_search(["compile=none,default", "fused_adamw=true,false,true"], {"threads": 1})
    assert searched == {"compile": ["none", "default"], "fused_adamw": ["true", "false"]}
    combos = grid.combinations(searched)
    assert combos[0] == {"compile": "none", "fused_adamw": "true"} and len(combos) == 4
    assert [grid.folder_name(c) for c in combos][-1] == "compile=default,fused_adamw=false"


@pytest.mark.parametrize(
    "items, fixed, message",
    [
        (["compile"], {}, "expected KEY=V1,V2"),
        (["=none"], {}, "expected KEY=V1,V2"),
        (["compile="], {}, "comma-separated values"),
        (["compile=../x"], {}, "comma-separated values"),
        (["compile=none,,default"], {}, "comma-separated values"),
        (["compile=none", "compile=default"], {}, "given twice"),
        (["threads=1,2"], {"threads": 1}, "also fixed by -O threads"),
    ],
)
def test_bad_search_items_are_one_line_usage_errors(items, fixed, message):
    with pytest.raises(UsageError, match=message):
        grid.parse_search(items, fixed)


def test_a_search_sweeps_each_combination_and_names_the_best(tmp_path):
    out = tmp_path / "search"
    args = ["--plugin", "cpu", "--precision", "FP32", "--batch-sizes", "1", "--repeats", "1"]
    args += ["--search", "fused_adamw=true,false", "--out", str(out)]
    proc = subprocess.run(
        [sys.executable, "-m", "llmb", "sweep", *TINY_SWEEP, *args], capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((out / grid.SEARCH_SUMMARY_NAME).read_text())
    folders = [entry["folder"] for entry in summary["combinations"]]
    assert folders == ["fused_adamw=true", "fused_adamw=false"]
    for folder in folders:  # each combination is a whole sweep of its own
        assert json.loads((out / folder / "sweep-summary.json").read_text())["settings"]["fused_adamw"] == (
            folder.endswith("true")
        )
    headlines = {e["folder"]: e["precisions"]["FP32"]["tokens_per_second"] for e in summary["combinations"]}
    best = summary["best"]["FP32"]
    assert best["tokens_per_second"] == max(headlines.values()) and headlines[best["folder"]] == max(headlines.values())
    assert f"FP32: best {best['folder']} at batch 1" in proc.stdout


def search_command(out, *extra: str) -> list[str]:
    args = ["--plugin", "cpu", "--precision", "FP32", "--batch-sizes", "1", "--repeats", "0"]
    return [sys.executable, "-m", "llmb", "sweep", *TINY_SWEEP, *args, "--out", str(out), *extra]


def logged_trials(folder) -> list[dict]:
    lines = (folder / "sweep.jsonl").read_text().splitlines() if (folder / "sweep.jsonl").exists() else []
    return [entry for entry in map(json.loads, lines) if entry["type"] == "trial"]


@pytest.mark.slow
def test_an_interrupted_search_resumes_where_it_stopped_and_keeps_every_point(tmp_path):
    """A search keeps no log of its own (one per combination's sub-folder): --resume once refused it outright ("holds
    no sweep to continue"), though the interrupted search said to continue with --resume."""
    out = tmp_path / "search"
    command = search_command(out, "--search", "fused_adamw=true,false")
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not logged_trials(out / "fused_adamw=true"):
        assert proc.poll() is None and time.monotonic() < deadline, "the search ended before its first point"
        time.sleep(0.2)
    assert proc.poll() is None, "the search ended before the interrupt was sent"  # Popen then sends nothing
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "continue with --resume" in stderr, stderr[-2000:]
    (first,) = logged_trials(out / "fused_adamw=true")
    # Given again: only --search and --out; the rest is the first combination's log's (its own value left out).
    resumed = subprocess.run(
        [sys.executable, "-m", "llmb", "sweep", "--search", "fused_adamw=true,false", "--out", str(out), "--resume"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    for folder in ("fused_adamw=true", "fused_adamw=false"):
        trials = logged_trials(out / folder)
        keys = [(t["phase"], t["batch_size"], t["index"]) for t in trials]
        assert keys == [("search", 1, 0), ("search", 1, 1)], folder  # each point once, none lost nor run again
    assert logged_trials(out / "fused_adamw=true")[0] == first
    summary = json.loads((out / grid.SEARCH_SUMMARY_NAME).read_text())
    assert [e["folder"] for e in summary["combinations"]] == ["fused_adamw=true", "fused_adamw=false"]
    assert all(e["precisions"]["FP32"]["status"] == "ok" for e in summary["combinations"])


def test_resume_without_a_search_to_continue_is_one_line(tmp_path):
    proc = subprocess.run(
        search_command(tmp_path / "none", "--search", "fused_adamw=true,false", "--resume"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error: --resume: ") and "holds no search to continue" in line


# A plugin that refuses its AdamW loop without the fused kernel: one searched value it cannot run.
CHOOSY_PLUGIN = """
from llmb import CpuBackend, UsageError, hookimpl


class Choosy(CpuBackend):
    name = "choosy"

    def available(self):
        return False

    def process_model(self, model, optimizer, device, precision, settings):
        if not settings.get("fused_adamw"):
            raise UsageError("this device runs the fused AdamW only")
        return super().process_model(model, optimizer, device, precision, settings)


@hookimpl
def register_backends(register):
    register(Choosy())
"""


def choosy_search(tmp_path, values: str) -> subprocess.CompletedProcess:
    site = tmp_path / "site-choosy"
    if not site.exists():
        install_plugin(tmp_path, "choosy", CHOOSY_PLUGIN)
    env = plugin_env(site)
    command = search_command(tmp_path / "out", "--search", f"fused_adamw={values}")
    command[command.index("cpu", command.index("--plugin"))] = "choosy"
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)


@pytest.mark.slow
def test_a_refused_first_trial_ends_only_its_combination(tmp_path):
    """It once ended the whole search (exit 2), the combinations after it never run."""
    proc = choosy_search(tmp_path, "false,true")
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((tmp_path / "out" / grid.SEARCH_SUMMARY_NAME).read_text())
    refused, ran = summary["combinations"]
    assert refused["error"] == (
        "refused: FP32 batch 1: llmb run refused the sweep's first trial: this device runs the fused AdamW only"
    )
    assert "precisions" not in refused and ran["precisions"]["FP32"]["status"] == "ok"
    assert summary["best"]["FP32"]["folder"] == "fused_adamw=true"


@pytest.mark.slow
def test_a_search_whose_every_combination_refused_fails_with_the_reason(tmp_path):
    proc = choosy_search(tmp_path, "false")
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert lines == [
        "error: FP32 batch 1: llmb run refused the sweep's first trial: this device runs the fused AdamW only"
    ]
