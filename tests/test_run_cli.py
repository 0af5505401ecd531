import dataclasses
import json
import types
import typing
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import TINY_CPU, invoke

from llmb import Backend
from llmb.cli import cli
from llmb.records import RESULT_SCHEMA as SCHEMA
from llmb.records import Result, field_tree

TINY = [*TINY_CPU, "--steps", "3"]  # three measured steps: the per-step times are counted below


def free_form(cls: type, prefix: str = "") -> set[str]:
    """The names of a record type's free-form maps (a ``dict[...]`` field, or ``Any``), from the types themselves."""
    names = set()
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        name = prefix + f.metadata.get("key", f.name)
        hint = hints[f.name]
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        inner = args[0] if typing.get_origin(hint) in (typing.Union, types.UnionType) and len(args) == 1 else hint
        if inner is typing.Any or typing.get_origin(inner) is dict or inner is dict:
            names.add(name)
        elif dataclasses.is_dataclass(inner):
            names |= free_form(inner, f"{name}.")
    return names


def written_paths(data: dict, prefix: str = "", free: set[str] | None = None) -> set[str]:
    """Every key of a written record, nested objects dotted, lists of objects as name[] (free-form maps excluded)."""
    free = free_form(Result) | {"config"} if free is None else free  # config: the shape, checked elsewhere
    paths = set()
    for key, value in data.items():
        name = prefix + key
        paths.add(name)
        if isinstance(value, dict) and name not in free:
            paths |= written_paths(value, f"{name}.", free)
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            for item in value:
                paths |= written_paths(item, f"{name}[].", free)
    return paths


def test_tiny_fp32_run_writes_a_complete_result(tmp_path):
    result = invoke("run", *TINY, "--precision", "FP32", "--out", str(tmp_path))
    assert result.exit_code == 0, result.output
    files = list(tmp_path.glob("*.json"))
    assert len(files) == 1
    record = json.loads(files[0].read_text())
    # Every field the runner writes is declared in the record type, and every declared field is written.
    declared = {k for k in field_tree(Result) if not k.startswith("config.")}
    # Written only in a multi-process job.
    not_always_written = {
        "precision.audit.rank_effective",
        "launcher",
        "per_rank_busy_seconds",
        "per_rank_step_seconds",
    }
    # Written only when they say something: a plugin that declares a peak, switches that disagree with the probe, a
    # device memory the backend knows (the host CPU's is None).
    not_always_written |= {"peak.declared_flops", "precision.audit.switches_vs_probe", "device.memory_bytes"}
    # Written only when the replay's device failed it and the CPU replayed instead.
    not_always_written.add("evidence.replay.device_fallback")
    # Written only for a pure FP16/BF16 window, replayed in its own format too, or a CPU AMP window drawn whole,
    # replayed under autocast too (this run is FP32).
    replayed_twice = ("", ".dtype", ".seconds", ".steps", ".autocast")
    not_always_written |= {f"evidence.replay.same_precision{k}" for k in replayed_twice}
    # Written only for a pure window whose matmuls ran below its weights' format (FP8 over BF16 weights).
    not_always_written.add("evidence.replay.unreplayed")
    # Written only where the audit step ran out of memory at the window's rows and ran fewer (llmb.run.audit_step).
    not_always_written.add("precision.audit.window.audit_rows")
    # Written as the judge's draw falls: the replay's budget past the prefix (the whole window needs none).
    drawn = {"evidence.replay.budget_seconds"}
    # Written only where the judge built the replay's initial model beside the worker: a run replayed on an accelerator.
    prebuilt = ("", ".build_seconds", ".worker_waited_seconds")
    not_always_written |= {f"evidence.replay.initial_model{k}" for k in prebuilt}
    # Written only where a replay placed a twin of the initial model on its device (an accelerator, or a CPU replay
    # of a prebuilt model another replay takes next).
    placed = ("", "[].allocate_seconds", "[].copy_seconds", "[].route")
    not_always_written |= {f"evidence.replay.placements{k}" for k in placed}
    # The energy section holds the counter's figures or the reason there are none, as the host has a counter or not.
    written = {k for k in written_paths(record) if not k.startswith("energy.")} - drawn
    assert written == {k for k in declared if not k.startswith("energy.")} - not_always_written - drawn
    budgeted = "evidence.replay.budget_seconds" in written_paths(record)
    assert budgeted is not record["evidence"]["replay"]["drawn"]["whole"]
    assert Result.from_dict(record).to_dict() == record
    assert record["schema"] == SCHEMA
    assert record["official"] is False and record["valid"] is False
    assert record["invalid_reasons"] == []
    assert len(record["timing"]["step_seconds"]) == 3
    assert record["timing"]["method"] == "host-synchronised"
    tokens = record["batch_size"] * record["sequence_length"] * record["steps"]
    assert record["tokens_per_second"] == pytest.approx(tokens / record["timing"]["window_seconds"])
    assert record["precision"] == {**record["precision"], "requested": "FP32", "effective": "FP32", "mode": "pure"}
    assert "DEBUG RUN" in result.output
    assert not list(tmp_path.glob(".*")), "no temporary files left behind"


def test_repeats_report_the_median_window(tmp_path):
    result = invoke("run", *TINY, "--repeats", "3", "--out", str(tmp_path))
    assert result.exit_code == 0, result.output
    record = json.loads(next(tmp_path.glob("*.json")).read_text())
    windows = record["timing"]["repeat_window_seconds"]
    assert len(windows) == 3
    assert record["timing"]["window_seconds"] == sorted(windows)[1]


@pytest.mark.parametrize(
    "args, code, message",
    [
        (["--precision", "FP64"], 2, "unknown precision"),
        (["--batch-size", "0"], 2, "0 is not in the range 1<=x<=1048576"),
        (["--batch-size", str(10**30)], 2, "is not in the range 1<=x<=1048576"),
        (["--device", "nosuchdevice"], 2, "cannot parse device"),
        (["--device", "cuda"], 2, "serves cpu, not 'cuda'"),
        (["--device", "no" * 50_000], 2, "(100000 characters)"),  # said by its start and length, not echoed whole
        # torch keeps a device index in 8 bits and takes any index on the CPU: both once ran and wrote results.
        (["--device", "cpu:999"], 2, "index 999 is out of range"),
        (["--device", "cpu:3"], 2, "the host's CPU is one device"),
        # An unset variable in a script (--device "$DEVICE"): said, not run on the plugin's default device.
        (["--device", ""], 2, "'--device': is empty"),
        (["--device", "  "], 2, "'--device': is empty"),
        (["--hidden-size", "65"], 2, "not divisible"),
        (["--plugin", "nosuch"], 2, "no plugin named"),
        (["-O", "nosetting=1"], 2, "has no setting"),
        (["-O", "compile=fast"], 2, "expected one of"),
        (["--precision", "TF32"], 2, "does not support TF32"),
        (["--batch-size", "1048576", "--sequence-length", "1048576"], 1, "out of memory"),  # 8 TB of token ids
    ],
)
def test_bad_input_is_one_line_and_an_exit_code(args, code, message, tmp_path):
    result = CliRunner().invoke(cli, ["run", *TINY, "--out", str(tmp_path), *args])
    assert result.exit_code == code, result.output
    assert message in result.output
    assert "Traceback" not in result.output
    assert len(result.output) < 1000, result.output[:300]
    assert not list(tmp_path.glob("*.json"))


@pytest.mark.parametrize(
    "folder, said",
    [
        (lambda tmp: tmp / ("a" * 300), "a name of 300 bytes"),
        (lambda tmp: tmp.joinpath(*["b" * 250] * 20), "a path of"),
    ],
    ids=["name", "path"],
)
def test_an_out_folder_the_file_system_cannot_hold_is_refused_before_anything_is_measured(tmp_path, folder, said):
    """A --out folder to be made whose name, or whole path, is longer than the file system takes was accepted and
    failed only when the result was written, after the whole run (the record then went to the temporary folder)."""
    result = CliRunner().invoke(cli, ["run", *TINY, "--out", str(folder(tmp_path))])
    assert result.exit_code == 2, result.output
    assert "is not a writable folder" in result.output and said in result.output, result.output
    assert "step" not in result.output.lower() and "Traceback" not in result.output, result.output
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", [["peak", "--precision", "FP32"], ["commbench", "--nproc-per-node", "2"]])
def test_every_command_refuses_a_device_its_plugin_does_not_serve_in_one_line(command):
    """`llmb peak` and `llmb commbench` pick their device by the rule `llmb run` does (llmb.run.device.plugin_device):
    --device as given, else the plugin's first device type; one the plugin does not serve is refused in one line."""
    result = CliRunner().invoke(cli, [*command, "--plugin", "cpu", "--device", "cuda:1"])
    assert result.exit_code == 2, result.output
    assert "serves cpu, not 'cuda'" in result.output and "Traceback" not in result.output, result.output


class CudaOnlyBackend(Backend):
    """In-memory backend that claims CUDA devices; this machine has none, so the device is absent."""

    name = "cuda_only"

    def device_types(self):
        return ["cuda"]


def test_absent_device_is_a_usage_error(register_backend, tmp_path):
    register_backend(CudaOnlyBackend())
    result = CliRunner().invoke(cli, ["run", *TINY[2:], "--plugin", "cuda_only", "--out", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert "device 'cuda' is not available" in result.output


class CrashingKernelBackend(Backend):
    """A backend whose post-processed model fails inside the loop with an unexpected error (not an llmb error)."""

    name = "crashing_kernel"

    def process_model(self, model, optimizer, device, precision, settings):
        def fail(module, args):
            raise RuntimeError("Expected query, key, and value to have the same dtype\nmore detail")

        model.register_forward_pre_hook(fail)
        return model


def test_an_unexpected_failure_is_one_line_and_exit_1(register_backend, tmp_path, monkeypatch):
    monkeypatch.delenv("LLMB_DEBUG", raising=False)
    register_backend(CrashingKernelBackend())
    result = CliRunner().invoke(cli, ["run", *TINY, "--plugin", "crashing_kernel", "--out", str(tmp_path)])
    assert result.exit_code == 1, result.output
    assert "error: RuntimeError: Expected query, key, and value to have the same dtype" in result.output
    assert "more detail" not in result.output and "Traceback" not in result.output
    assert not list(tmp_path.glob("*.json"))


FAILS_IN_BF16 = """
from llmb import CpuBackend, hookimpl


class FailsInBf16(CpuBackend):
    name = "failsbf16"

    def precisions(self):
        return ["FP32", "BF16"]

    def process_model(self, model, optimizer, device, precision, settings):
        if precision == "BF16":
            raise RuntimeError("no BF16 kernels on this device")
        return super().process_model(model, optimizer, device, precision, settings)


@hookimpl
def register_backends(register):
    register(FailsInBf16())
"""


STALLS_IN_BF16 = FAILS_IN_BF16.replace("failsbf16", "stallsbf16").replace(
    'raise RuntimeError("no BF16 kernels on this device")', "__import__('time').sleep(600)"
)


def replayed(out: Path) -> bool:
    """A record in `out` whose replay is done: it is first kept unchecked, then replaced by the replayed one."""
    return any(json.loads(p.read_text())["evidence"]["replay"] for p in out.glob("*.json"))


def stalled_in_bf16(tmp_path):
    """`llmb run --precision all` of a plugin whose BF16 setup sleeps 600 s, once FP32's record is replayed and
    kept: (the judge's process, its --out folder, the pids of the worker processes it spawned)."""
    import os
    import subprocess
    import sys
    import time

    from conftest import install_plugin

    site = install_plugin(tmp_path, "stallsbf16", STALLS_IN_BF16)
    env = dict(os.environ, PYTHONPATH=str(site))
    env.pop("LLMB_IN_PROCESS", None)
    out = tmp_path / "out"
    command = [sys.executable, "-m", "llmb", "run", "--plugin", "stallsbf16", "--precision", "all", *TINY]
    proc = subprocess.Popen([*command, "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    deadline = time.monotonic() + 600
    while not replayed(out) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
    if proc.poll() is not None:  # still in BF16, which never ends, or the test fails here
        proc.kill()
        pytest.fail(proc.communicate()[1][-2000:].decode(errors="replace"))
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
    spawned = [Path(f"/proc/{pid}/cmdline") for pid in (children.read_text().split() if children.exists() else [])]
    return proc, out, [path.parent.name for path in spawned if b"spawn_main" in path.read_bytes()]


def test_precision_all_saves_each_precision_before_the_next_runs(tmp_path):
    """A run stopped by a signal during BF16 (a job's time limit) has already kept FP32: each record is judged and
    saved while the worker waits, not at the end of the whole run. The run says in one line why it ended (SIGTERM
    used to end it where it stood, exit 143 with nothing said) and its worker does not outlive it."""
    import signal

    proc, out, workers = stalled_in_bf16(tmp_path)
    try:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        proc.kill()
        _, stderr = proc.communicate()
    assert proc.returncode == 143, stderr[-2000:]
    assert stderr.decode().strip().splitlines()[-1] == "stopped by SIGTERM" and b"Traceback" not in stderr
    for pid in workers:
        status = Path(f"/proc/{pid}/status")
        assert not status.exists() or "State:\tZ" in status.read_text(), f"worker {pid} still running"
    (record,) = [json.loads(p.read_text()) for p in out.glob("*.json")]
    assert record["precision"]["requested"] == "FP32" and record["tokens_per_second"] > 0
    assert record["evidence"]["replay"]["passed"] is True


def test_an_interrupt_sent_to_the_judge_alone_stops_the_worker_at_once(tmp_path):
    """SIGINT to the judging process only (`kill -INT`, not a terminal's Ctrl-C, which the worker gets too): the
    worker, stalled in BF16's setup for 600 s, is stopped rather than waited for, and FP32's record is kept."""
    import signal

    proc, out, workers = stalled_in_bf16(tmp_path)
    try:
        assert workers, "no worker process found under the judge's (/proc/<pid>/task/<pid>/children)"
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)  # far less than the 600 s the worker would sleep
    finally:
        proc.kill()
        _, stderr = proc.communicate()
    assert proc.returncode == 130 and b"interrupted" in stderr and b"Traceback" not in stderr, stderr[-2000:]
    for pid in workers:  # none outlives the judge (a zombie reaped already reads as gone)
        status = Path(f"/proc/{pid}/status")
        assert not status.exists() or "State:\tZ" in status.read_text(), f"worker {pid} still running"
    (record,) = [json.loads(p.read_text()) for p in out.glob("*.json")]
    assert record["precision"]["requested"] == "FP32" and record["tokens_per_second"] > 0


def test_precision_all_keeps_the_results_finished_before_a_failure(tmp_path):
    """`--precision all` runs FP32, then BF16, in one worker: BF16 failing must not lose FP32's measured result."""
    import os
    import subprocess
    import sys

    from conftest import install_plugin

    site = install_plugin(tmp_path, "failsbf16", FAILS_IN_BF16)
    env = dict(os.environ, PYTHONPATH=str(site))
    env.pop("LLMB_IN_PROCESS", None)
    out = tmp_path / "out"
    command = [sys.executable, "-m", "llmb", "run", "--plugin", "failsbf16", "--precision", "all", *TINY]
    proc = subprocess.run([*command, "--out", str(out)], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "no BF16 kernels on this device" in proc.stderr.strip().splitlines()[-1]
    (record,) = [json.loads(p.read_text()) for p in out.glob("*.json")]
    assert record["precision"]["requested"] == "FP32" and record["tokens_per_second"] > 0
