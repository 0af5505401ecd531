"""Energy per token (llmb.records.energy): the backend's counter read at the windows' edges, the judge's figures and
checks.

No host here has a GPU, and most have no readable RAPL: the counters below that stand in for hardware say they are
mocks. The one real counter tested is the host's RAPL, where it is readable."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
import torch
from conftest import TINY, invoke, run_record
from records_factory import make_result

from llmb import Backend, EnergyCounter, records
from llmb.judge.verdict import JudgedWindow, finish
from llmb.records import energy
from llmb.submit import package as submission


class MockWattsBackend(Backend):
    """The host CPU with a MOCK energy counter (no hardware): joules = `watts` x the host's monotonic clock."""

    name = "mockwatts"
    watts = 50.0
    limit: float | None = None

    def energy_counter(self, device):
        return EnergyCounter(lambda: self.watts * time.perf_counter(), "mock counter (no hardware)", self.limit)


def test_a_run_with_a_mock_counter_records_joules_watts_and_tokens_per_joule(tmp_path, register_backend):
    backend = register_backend(MockWattsBackend())
    record = run_record(tmp_path, "--plugin", backend.name, "--device", "cpu", "--repeats", "2")
    section = record["energy"]
    assert section["scope"] == "mock counter (no hardware)" and section.get("reason") is None
    assert len(section["window_joules"]) == 2
    # The two reads bracket the window, so the mock's constant power comes back within the reads' own time.
    assert section["watts"] == pytest.approx(backend.watts, rel=0.1)
    tokens = record["global_batch_size"] * record["sequence_length"] * record["steps"] * 2
    assert section["tokens_per_joule"] == pytest.approx(tokens / section["joules"])
    assert not [r for r in record["invalid_reasons"] if r.startswith("energy:")]
    assert records.Result.from_dict(record).energy.tokens_per_joule == section["tokens_per_joule"]


class BackwardsBackend(MockWattsBackend):
    """A MOCK counter (no hardware) that runs backwards: what a broken or forged counter reports."""

    name = "backwards"
    watts = -50.0


def test_a_counter_that_ran_backwards_is_an_invalid_reason(tmp_path, register_backend):
    backend = register_backend(BackwardsBackend())
    record = run_record(tmp_path, "--plugin", backend.name, "--device", "cpu")
    assert any(r.startswith("energy: the counter ran backwards in window 1") for r in record["invalid_reasons"])
    assert record["energy"]["reason"] == "no plausible energy figure" and "joules" not in record["energy"]


class FailingBackend(Backend):
    name = "failing"

    def energy_counter(self, device):
        raise RuntimeError("driver gone\nsecond line")


def test_a_backend_without_a_counter_or_with_a_failing_one_gives_the_reason():
    device = torch.device("cpu")
    assert energy.Meter(Backend(), device).reason == "backend '' offers no energy counter"
    meter = energy.Meter(FailingBackend(), device)
    assert meter.read() is None
    assert meter.reason == "the backend's energy counter failed: RuntimeError: driver gone"
    assert energy.summarise(meter.describe(), [None], [1.0], 100.0) == ({"reason": meter.reason}, [])


def test_the_judge_refuses_an_average_power_above_the_devices_limit():
    counter = {"scope": "mock counter (no hardware)", "limit_watts": 100.0}
    ok, problems = energy.summarise(counter, [[0.0, 140.0]], [1.0], 1000.0)
    assert not problems and ok["watts"] == 140.0 and ok["tokens_per_joule"] == pytest.approx(1000 / 140)
    section, problems = energy.summarise(counter, [[0.0, 160.0]], [1.0], 1000.0)
    assert problems == ["energy: 160.0 W average over the measured windows, above the plausible 150.0 W for one device"]
    assert "watts" not in section
    # A plugin claiming no limit, or a huge one, is held to the ceiling.
    _, problems = energy.summarise({"scope": "x", "limit_watts": 1e9}, [[0.0, energy.CEILING_WATTS + 1]], [1.0], 1.0)
    assert problems and problems[0].startswith("energy:")


def test_the_clean_judge_computes_the_energy_on_its_own_clock():
    """clean_verdict.finish: the worker's answers carry the readings, the judge's windows give the seconds."""
    record = make_result().to_dict()
    record["energy"] = {"scope": "mock counter (no hardware)", "joules": 1.0, "watts": 1.0}  # the worker's, replaced
    windows = []
    for k in range(record["repeats"]):
        window = JudgedWindow(challenge=k, opened=10.0 * k, closed=10.0 * k + 2.0)
        window.answer = {"losses": [], "energy_joules": [100.0 * k, 100.0 * k + 80.0]}
        windows.append(window)
    judged = finish(record, windows, replay_steps=0)
    section = judged["energy"]
    assert section["watts"] == pytest.approx(40.0) and section["joules"] == pytest.approx(80.0 * record["repeats"])
    tokens = record["global_batch_size"] * record["sequence_length"] * record["steps"] / record["world_size"]
    assert section["tokens_per_joule"] == pytest.approx(tokens / 80.0)
    windows[-1].answer["energy_joules"] = [5.0, 1.0]
    judged = finish(record, windows, replay_steps=0)
    assert (
        f"energy: the counter ran backwards in window {record['repeats']} (5.000 J to 1.000 J)"
        in (judged["invalid_reasons"])
    )


def test_an_old_record_without_energy_still_reads():
    data = make_result().to_dict()
    data.pop("energy", None)
    assert records.Result.from_dict(data).energy is None


def _zone(root: Path, index: int, name: str, uj: int, max_uj: int) -> Path:
    """A sysfs powercap zone as files: the kernel interface's layout, with values this test sets (no hardware)."""
    zone = root / f"intel-rapl:{index}"
    zone.mkdir(parents=True)
    (zone / "name").write_text(name + "\n")
    (zone / "energy_uj").write_text(f"{uj}\n")
    (zone / "max_energy_range_uj").write_text(f"{max_uj}\n")
    return zone


def test_rapl_sums_the_packages_and_undoes_the_wraparound(tmp_path):
    package = _zone(tmp_path, 0, "package-0", 900_000, 999_999)
    _zone(tmp_path, 1, "psys", 5, 999_999)  # overlaps the packages: left out
    (tmp_path / "intel-rapl:0:0").mkdir()  # a subzone (core): inside its package, left out
    counter = energy.rapl_counter(tmp_path)
    assert isinstance(counter, EnergyCounter) and counter.scope.startswith("RAPL package-0:")
    start = counter.read()
    (package / "energy_uj").write_text("300000\n")  # wrapped: 900000 -> 999999 -> 0 -> 300000
    assert counter.read() - start == pytest.approx(0.4)
    assert energy.rapl_counter(tmp_path / "absent").startswith("RAPL not exposed")


@pytest.mark.skipif(os.geteuid() == 0, reason="as root every file is readable whatever its mode")
def test_rapl_that_only_root_may_read_says_permission_denied(tmp_path):
    zone = _zone(tmp_path, 0, "package-0", 1, 10)
    (zone / "energy_uj").chmod(0)
    assert energy.rapl_counter(tmp_path).startswith("RAPL permission denied")


@pytest.mark.slow
def test_a_clean_cpu_run_records_rapl_energy_or_why_not(tmp_path):
    """The real counter: the clean room's record carries RAPL's figures where this host exposes them readable, and
    otherwise the same reason rapl_counter gives here."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("LLMB_IN_PROCESS", None)
    command = [sys.executable, "-m", "llmb", "run", "--plugin", "cpu", "--device", "cpu", *TINY, "--out", str(tmp_path)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr
    (path,) = tmp_path.glob("*.json")
    section = json.loads(path.read_text())["energy"]
    here = energy.rapl_counter()
    if isinstance(here, str):
        assert section == {"reason": here}
        pytest.skip(f"no readable RAPL on this host: {here}")
    assert section["scope"] == here.scope and section["joules"] > 0 and section["tokens_per_joule"] > 0


class FakeNvml(types.ModuleType):
    """A MOCK of nvidia-ml-py's pynvml (no GPU here): GPU `index`'s counter in millijoules, 300 W power limit."""

    def __init__(self) -> None:
        super().__init__("pynvml")
        self.millijoules = 5_000_000
        self.asked = None

    def nvmlInit(self) -> None: ...

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        self.asked = index
        return index

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: int) -> int:
        return self.millijoules

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: int) -> int:
        return 300_000


def test_the_cuda_plugin_reads_nvmls_energy_counter_of_the_visible_gpu(monkeypatch):
    llmb_cuda = pytest.importorskip("llmb_cuda")
    fake = FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    counter = llmb_cuda.CudaBackend().energy_counter(torch.device("cuda", 1))
    assert isinstance(counter, EnergyCounter) and fake.asked == 3  # torch's GPU 1 is NVML's 3
    assert counter.limit_watts == 300.0 and counter.scope == "NVML total energy of GPU 3"
    start = counter.read()
    fake.millijoules += 1500
    assert counter.read() - start == pytest.approx(1.5)


def test_the_cuda_plugin_without_nvidia_ml_py_says_so(monkeypatch):
    llmb_cuda = pytest.importorskip("llmb_cuda")
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails as if not installed
    reason = llmb_cuda.CudaBackend().energy_counter(torch.device("cuda", 0))
    assert reason == "no energy counter: nvidia-ml-py is not installed (pip install nvidia-ml-py)"


class FakeAmdsmi(types.ModuleType):
    """A MOCK of ROCm's amdsmi (no GPU here): an accumulator of 15.3 microjoule units, ROCm 6.2's key names."""

    def __init__(self) -> None:
        super().__init__("amdsmi")
        self.count = 1000

    def amdsmi_init(self) -> None: ...

    def amdsmi_get_processor_handles(self) -> list[str]:
        return ["gpu0", "gpu1"]

    def amdsmi_get_energy_count(self, handle: str) -> dict:
        return {"energy_accumulator": self.count, "counter_resolution": 15.3, "timestamp": 0}

    def amdsmi_get_power_cap_info(self, handle: str) -> dict:
        return {"power_cap": 750_000_000}


def test_the_rocm_plugin_reads_amdsmis_energy_accumulator(monkeypatch):
    llmb_rocm = pytest.importorskip("llmb_rocm")
    fake = FakeAmdsmi()
    monkeypatch.setitem(sys.modules, "amdsmi", fake)
    monkeypatch.setattr(torch.cuda, "_get_amdsmi_device_index", lambda index: index)  # HIP's numbering needs a GPU
    counter = llmb_rocm.RocmBackend().energy_counter(torch.device("cuda", 1))
    assert isinstance(counter, EnergyCounter) and counter.limit_watts == 750.0
    start = counter.read()
    fake.count += 100_000
    assert counter.read() - start == pytest.approx(1.53)


def with_energy(watts: float = 40.0, **fields) -> records.Result:
    """A made-up result (records_factory) whose device drew `watts` over its one measured window."""
    result = make_result(**fields)
    seconds = result.timing.repeat_window_seconds
    tokens = result.global_batch_size * result.sequence_length * result.steps / result.world_size
    section, problems = energy.summarise(
        {"scope": "mock counter (no hardware)", "limit_watts": None},
        [[0.0, watts * s] for s in seconds],
        seconds,
        tokens,
    )
    assert not problems
    return dataclasses.replace(result, energy=records.Energy.from_dict(section))


def test_verify_recomputes_the_energy_figures_and_catches_a_forged_one():
    honest = with_energy()
    assert energy.record_problems(honest) == []
    assert energy.record_problems(make_result()) == []  # an older record claims nothing
    forged = dataclasses.replace(
        honest, energy=dataclasses.replace(honest.energy, tokens_per_joule=honest.energy.tokens_per_joule * 2)
    )
    (problem,) = energy.record_problems(forged)
    assert problem.startswith("energy: tokens_per_joule recorded")
    hot = dataclasses.replace(honest, energy=dataclasses.replace(honest.energy, window_joules=[1e9]))
    assert any("above the plausible" in p for p in energy.record_problems(hot))


def test_report_and_summary_show_tokens_per_joule_beside_tokens_per_second(tmp_path):
    result = with_energy(watts=40.0)
    folder = tmp_path / "results"
    folder.mkdir()
    (folder / "r.json").write_text(json.dumps(result.to_dict()))
    shown = invoke("report", folder, "--format", "json")
    assert shown.exit_code == 0, shown.output
    (best,) = [t for t in json.loads(shown.output)["tables"] if t["name"] == "best"]
    assert best["rows"][0]["tokens_per_joule"] == pytest.approx(result.energy.tokens_per_joule)
    table = invoke("report", folder, "--format", "md").output
    assert "| Tokens/s | Spread (min-max) | Tokens/J |" in table
    assert f"{result.energy.tokens_per_joule:,.4g}" in table

    sub = {"submitter": "t", "system_name": "s", "plugins": [{"name": "cpu", "precisions": ["FP32"]}]}
    sub["debug"] = {"is_debug": False, "reasons": []}
    summary = submission.render_summary(sub, [result])
    header = next(line for line in summary.splitlines() if line.startswith("| Precision"))
    columns = [c.strip() for c in header.strip("|").split("|")]
    assert columns.index("Tokens/J") == columns.index("Spread (min-max)") + 1
    assert energy.energy_cell(result.energy) in summary and "(40.0 W)" in energy.energy_cell(result.energy)
    # A bundle made before llmb measured energy keeps the summary it was sealed with.
    assert "Tokens/J" not in submission.render_summary(sub, [make_result()])


def test_the_xpu_plugin_never_reports_the_hosts_rapl_as_a_gpus_energy():
    llmb_xpu = pytest.importorskip("llmb_xpu")
    backend = llmb_xpu.XpuBackend()
    assert backend.energy_counter(torch.device("xpu", 0)).startswith("no energy counter: torch.xpu exposes none")
    on_cpu = backend.energy_counter(torch.device("cpu"))  # the IPEX path on the host: the cpu backend's RAPL
    assert isinstance(on_cpu, EnergyCounter) or on_cpu == energy.rapl_counter()
