"""The xpu plugin: Intel GPU runs where a device exists, and its optional IPEX post-processing on the CPU device.

`tox -e ipex` installs torch==2.8.0 + intel-extension-for-pytorch==2.8.0 (IPEX's PyPI build runs on the CPU) and runs
this file; in the plain test env IPEX is absent and its tests skip, and no machine here has an XPU.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json

import llmb_xpu
import pytest
import torch
from click.testing import CliRunner

from llmb import CpuBackend
from llmb.cli import cli
from llmb.registry.plugins import registrations, select_backend

HAS_IPEX = importlib.util.find_spec("intel_extension_for_pytorch") is not None
requires_ipex = pytest.mark.skipif(
    not HAS_IPEX, reason="intel_extension_for_pytorch is not installed here (its own env: tox -e ipex)"
)
requires_xpu = pytest.mark.skipif(not torch.xpu.is_available(), reason="no XPU device on this machine")
TINY = ["--plugin", "xpu", "--preset", "tiny", "--steps", "2", "--warmup-steps", "1"]


@pytest.fixture
def xpu(register_backend):
    """The xpu backend, from its entry point where the package is installed, else registered from its source."""
    from llmb.registry import plugins

    plugins.load(["xpu"])
    if "xpu" not in registrations():
        register_backend(llmb_xpu.XpuBackend())
    return "xpu"


def run(tmp_path, *args):
    result = CliRunner().invoke(cli, ["run", *TINY, "--out", str(tmp_path), *args])
    records = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("*.json"))]
    return result, records


def test_declares_xpu_first_and_an_ipex_switch_off_by_default(xpu):
    backend = select_backend(xpu).backend
    assert backend.device_types() == ["xpu", "cpu"]
    assert "TF32" not in backend.precisions()
    settings = {s.name: s for s in backend.settings()}
    assert settings["ipex"].type is bool and settings["ipex"].default is False
    assert settings["fused_adamw"].type is bool and settings["fused_adamw"].default is True


def test_on_the_cpu_device_the_services_are_the_cpu_backends():
    backend, cpu, device = llmb_xpu.XpuBackend(), CpuBackend(), torch.device("cpu")
    assert isinstance(backend, CpuBackend)
    assert backend.device_name(device) == cpu.device_name(device)
    assert backend.new_event(device) is None and backend.peak_flops(device, "FP32") is None
    assert backend.distributed_backend(device) == "gloo"
    assert backend.peak_memory_bytes(device) > 0


def test_on_the_xpu_device_the_services_are_torch_xpus(monkeypatch):
    # torch.xpu is mocked because no machine here has an XPU: this checks which calls each service makes, not the GPU.
    calls = []
    props = type("Props", (), {"total_memory": 64 << 30, "driver_version": "1.0"})()
    fake = {
        "set_device": lambda index: calls.append(("set_device", index)),
        "synchronize": lambda device: calls.append(("synchronize", device)),
        "Event": lambda enable_timing: ("event", enable_timing),
        "reset_peak_memory_stats": lambda device: calls.append(("reset", device)),
        "max_memory_allocated": lambda device: 123,
        "get_device_name": lambda device: "Intel(R) Data Center GPU Max 1550",
        "device_count": lambda: 2,
        "get_device_properties": lambda device: props,
    }
    for name, value in fake.items():
        monkeypatch.setattr(torch.xpu, name, value, raising=False)
    backend, device = llmb_xpu.XpuBackend(), torch.device("xpu", 1)
    backend.setup(device, "FP32", llmb_xpu.XpuSettings(ipex=False))
    backend.synchronize(device)
    backend.reset_peak_memory(device)
    assert calls == [("set_device", 1), ("synchronize", device), ("reset", device)]
    assert backend.new_event(device) == ("event", True)
    assert backend.peak_memory_bytes(device) == 123
    assert backend.device_name(device) == "Intel(R) Data Center GPU Max 1550"
    assert backend.device_count(device) == 2
    assert backend.device_memory_bytes(device) == 64 << 30
    assert backend.peak_flops(device, "BF16") is None  # no confirmed datasheet figure (PEAK_TFLOPS is empty)
    assert backend.energy_counter(device).startswith("no energy counter")
    assert backend.distributed_backend(device) in ("xccl", "ccl")
    facts = backend.run_facts(device)
    assert (facts["xpu_driver"], facts["xpu_total_memory"]) == ("1.0", 64 << 30) and "torch_xpu" in facts


@pytest.mark.skipif(torch.xpu.is_available(), reason="this machine has an XPU")
def test_absent_xpu_is_not_auto_selected(xpu):
    assert select_backend(None).name != "xpu"


@pytest.mark.skipif(HAS_IPEX, reason="intel_extension_for_pytorch is installed here")
def test_ipex_true_without_ipex_is_one_clear_error(xpu, tmp_path):
    result, records = run(tmp_path, "--device", "cpu", "-O", "ipex=true")
    assert result.exit_code == 1, result.output
    assert "-O ipex=true needs intel_extension_for_pytorch" in result.output
    assert "Traceback" not in result.output and records == []


@requires_xpu
@pytest.mark.parametrize("precision", ["FP32", "BF16"])
def test_tiny_run_on_the_xpu(xpu, tmp_path, precision):
    result, records = run(tmp_path, "--device", "xpu", "--precision", precision)
    assert result.exit_code == 0, result.output
    (record,) = records
    assert record["invalid_reasons"] == []
    assert record["timing"]["method"] == "device-events"
    assert record["device"]["name"] == torch.xpu.get_device_name(0)
    assert record["device"]["count"] == torch.xpu.device_count()
    assert record["peak_memory_bytes"] > 0
    assert record["precision"]["effective"] == precision


@requires_ipex
@pytest.mark.parametrize("precision", ["FP32", "BF16", "FP16"])
def test_ipex_post_processing_trains_on_the_cpu(xpu, tmp_path, precision):
    result, records = run(tmp_path, "--device", "cpu", "--precision", precision, "-O", "ipex=true")
    assert result.exit_code == 0, result.output
    (record,) = records
    # ipex.optimize replaces torch functions and aten kernels process-wide: the guard accepts them as a known,
    # unmodified IPEX release's own (llmb/audit/vendor_libraries.py) and records how many; nothing makes the run
    # invalid.
    assert record["invalid_reasons"] == [], record["invalid_reasons"]
    label = f"intel-extension-for-pytorch {importlib.metadata.version('intel-extension-for-pytorch')}"
    assert record["facts"]["vendor_library_replacements"][label] > 0
    # The harness's other checks hold after ipex.optimize: the same AdamW over every parameter, stepped once a step
    # (one warmup step, two timed steps, and the window audit's untimed step after the last window).
    assert record["optimizer"]["optimizer_steps"] == record["optimizer"]["harness_steps"] == 1 + 2 + 1
    assert record["precision"]["audit"]["window"]["recorded_step"] == 2 + 1
    # AdamW's fused kernel by default: with the per-tensor loop an honest pure FP16 run failed the replay's FP32
    # bracket at step 2 on every draw (its g^2 underflows in FP16).
    assert record["plugin"]["settings"] == {"ipex": True, "fused_adamw": True}
    assert record["optimizer"]["defaults"]["fused"] is True
    assert record["facts"]["ipex"] == importlib.metadata.version("intel-extension-for-pytorch")
    assert record["precision"]["effective"] == precision
    fact = {f["name"]: f for f in record["precision"]["audit"]["backend"]}["ipex.dtype"]
    expected = {"FP32": ("float32", None), "BF16": ("bfloat16", "BF16"), "FP16": ("float16", "FP16")}[precision]
    assert (fact["value"], fact["implies"]) == expected
    assert record["loss"]["last"] < record["loss"]["first"]  # it trained (the window repeats one challenge batch)


@requires_ipex
def test_ipex_refuses_mixed_precision(xpu, tmp_path):
    result, records = run(tmp_path, "--device", "cpu", "--precision", "BF16", "--precision-mode", "amp", "-O", "ipex=1")
    assert result.exit_code == 1, result.output
    assert "supports pure FP16/BF16 only" in result.output and records == []


OVERRIDE_BESIDE_IPEX = """
import torch
from llmb.audit import guard, vendor_libraries
baseline = guard.capture()  # before IPEX is imported, as llmb captures it before any plugin import
import intel_extension_for_pytorch as ipex
from llmb_xpu import XpuBackend
model = torch.nn.Linear(8, 8)
ipex.optimize(model, optimizer=torch.optim.AdamW(model.parameters()))
changed, accepted = guard.changes(baseline)
# Not named by the running backend: IPEX's replacements are nobody's, every one a change.
assert changed and not accepted, accepted
vendor_libraries.use(XpuBackend().vendor_libraries())  # what llmb does before the xpu backend's setup
changed, accepted = guard.changes(baseline)
assert changed == [], changed
assert sum(len(v) for v in accepted.values()) > 0, accepted
library = torch.library.Library("aten", "IMPL")
library.impl("mm", lambda a, b: torch.ops.aten.mm.default(a.bfloat16(), b.bfloat16()).float(), "CPU")
saved = torch.embedding_bag
torch.embedding_bag = lambda *args, **kwargs: saved(*args, **kwargs)
changed, _ = guard.changes(baseline)
assert any("aten::mm " in c for c in changed), changed
assert "torch.embedding_bag was replaced" in changed, changed
print("ok")
"""


@requires_ipex
def test_a_python_kernel_override_beside_ipex_is_still_caught():
    """IPEX's own replacements are accepted where the running backend names IPEX (and only there); a torch.library
    override from Python made beside them is not, and neither is a torch function replaced by code that is not
    IPEX's."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", OVERRIDE_BESIDE_IPEX], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]
