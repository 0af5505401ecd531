"""Faults and hostile plugins in the commands earlier probes left out: commbench, hung plugins, files that change
while a command reads them."""

import os
import subprocess
import sys
import threading

from conftest import install_plugin, plugin_env

from llmb.judge import cleanroom
from llmb.records import files as record_files
from llmb.run import runner
from llmb.spec.presets import PRESETS

# A plugin whose process group is named by an object that is no str: handed to torch.distributed as it was.
ODD_GROUP_PLUGIN = """
from llmb import CpuBackend, hookimpl


class OddGroup(CpuBackend):
    name = "oddgroup"

    def available(self):
        return False

    def distributed_backend(self, device):
        return 7


@hookimpl
def register_backends(register):
    register(OddGroup())
"""


def test_a_process_group_of_the_wrong_type_is_the_plugins_one_line_error(tmp_path):
    """It was torch's "ValueError: Backend constructor parameter must be string-ish" from a rank, naming neither the
    plugin nor its method."""
    site = install_plugin(tmp_path, "oddgroup", ODD_GROUP_PLUGIN)
    command = [sys.executable, "-m", "llmb", "commbench", "--plugin", "oddgroup", "--device", "cpu"]
    command += ["--nproc-per-node", "2", "--sizes", "1K", "--iters", "1", "--warmup", "0"]
    proc = subprocess.run(command, capture_output=True, text=True, env=plugin_env(site), timeout=300)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    (line,) = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert "backend 'oddgroup' failed in distributed_backend" in line and "not a str or None" in line, line


def test_a_sweep_log_that_is_no_file_is_skipped_naming_it_once(tmp_path):
    """A log replaced by a FIFO (or gone) while `llmb report` read its folder was skipped as "X: X: not a readable
    sweep log (X: a FIFO, not a regular file)": the path three times in one line."""
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    os.mkfifo(sweep / "sweep.jsonl")
    out = tmp_path / "report.md"
    proc = subprocess.run(
        [sys.executable, "-m", "llmb", "report", str(sweep), "--out", str(out)], capture_output=True, text=True
    )
    (line,) = [line for line in proc.stderr.splitlines() if "sweep.jsonl" in line]  # nothing else there: an error
    assert line.count(str(sweep / "sweep.jsonl")) == 1, line
    assert f"{sweep / 'sweep.jsonl'}: not a readable sweep log (a FIFO, not a regular file)" in line, line
    assert "Traceback" not in proc.stderr


def test_a_run_says_it_is_setting_up_before_the_plugins_setup_runs():
    """The progress draws on events only: before the first warmup step it drew nothing, so a plugin hanging in its
    setup or post-processing left a blank terminal until Ctrl-C (which still ends it: tests/test_run_cli.py)."""
    seen: list[str] = []

    class Phases:
        def phase(self, name: str, total: int) -> None:
            seen.append(name)

        def advance(self) -> None: ...

    options = runner.RunOptions(
        config=PRESETS["tiny"], preset="tiny", plugin="cpu", device="cpu", precision="FP32", steps=2, warmup_steps=1
    )
    records, error = cleanroom.run_clean_keeping([options], progress=Phases())
    assert error is None and len(records) == 1
    assert seen[:2] == ["setup", "warmup"], seen


# A plugin that claims a million devices: commbench's default process count is the plugin's device count.
MANY_DEVICES_PLUGIN = """
from llmb import CpuBackend, hookimpl


class Many(CpuBackend):
    name = "many"

    def available(self):
        return False

    def device_count(self, device):
        return 10**6


@hookimpl
def register_backends(register):
    register(Many())
"""


def test_a_plugin_claiming_more_devices_than_a_node_runs_is_its_one_line_error(tmp_path):
    """commbench once started a process per claimed device until the host ran out of file descriptors."""
    site = install_plugin(tmp_path, "many", MANY_DEVICES_PLUGIN)
    command = [sys.executable, "-m", "llmb", "commbench", "--plugin", "many", "--device", "cpu", "--sizes", "1K"]
    proc = subprocess.run(command, capture_output=True, text=True, env=plugin_env(site), timeout=300)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == [
        "error: backend 'many' failed in device_count: ValueError: returned 1000000, more than one node starts (at "
        "most 4096); give --nproc-per-node"
    ]


def test_a_folder_that_vanishes_while_a_reader_walks_is_passed_by(tmp_path):
    """The readers' walk (records.files.under: llmb report, package-submission, features, reproduce) was Path.rglob,
    which raised FileNotFoundError where a sub-folder went between its listing and its walk: package-submission ended
    as "error: No such file or directory: <path>" while a sweep beside it tidied up. Here sub-folders come and go
    while the folder is walked; every walk lists the results that stay, and none fails."""
    for i in range(5):
        (tmp_path / f"r{i}.json").write_text("{}")
    stop = threading.Event()

    def churn() -> None:
        while not stop.is_set():
            for i in range(5):
                (tmp_path / f"gone{i}.json").mkdir(exist_ok=True)
            for i in range(5):
                (tmp_path / f"gone{i}.json").rmdir()

    thread = threading.Thread(target=churn, daemon=True)
    thread.start()
    try:
        walks = [record_files.under(tmp_path, "*.json") for _ in range(2000)]  # before: about one walk in seven failed
    finally:
        stop.set()
        thread.join()
    assert all(walk == [tmp_path / f"r{i}.json" for i in range(5)] for walk in walks)
