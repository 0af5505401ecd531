"""llmb-rocm: peak matching, settings and the environment it sets; the GPU paths where a ROCm device exists."""

import json
import os
from types import SimpleNamespace

import llmb_cuda
import llmb_rocm
import pytest
import torch
from click.testing import CliRunner

from llmb.api.errors import UsageError
from llmb.cli import cli
from llmb.registry.plugins import get_backend, resolve_settings
from llmb.toolkit import fp8

HAS_ROCM = torch.version.hip is not None and torch.cuda.is_available()
needs_rocm = pytest.mark.skipif(not HAS_ROCM, reason="no ROCm device on this machine")
ENV = ("PYTORCH_TUNABLEOP_ENABLED", "TORCH_BLAS_PREFER_HIPBLASLT")
ROCM = llmb_rocm.RocmBackend()


def test_the_rocm_plugin_leaves_every_gpu_it_knows_to_llmbs_table():
    # llmb/spec/peak_table.py has the MI250X (per GCD) and MI300X (tests/test_peaks.py); the plugin declares none.
    assert llmb_rocm.PEAKS == () and ROCM.peak_sources() == {}
    assert llmb_cuda.match_peak("AMD Instinct MI300X", "BF16", llmb_rocm.PEAKS) is None


def test_settings_extend_the_cuda_plugin():
    assert get_backend("rocm").plugin.distribution == "llmb-rocm"
    assert resolve_settings(ROCM, {}) == {
        "compile": "default",
        "fused_adamw": True,
        "activation_checkpointing": "none",
        "fp8": "none",
        "fp8_emulate": False,
        "tunableop": False,
        "hipblaslt": True,
    }
    assert resolve_settings(ROCM, {"tunableop": "on", "hipblaslt": "off"})["tunableop"] is True
    with pytest.raises(UsageError, match="expected one of true/false/yes/no/on/off/1/0"):
        resolve_settings(ROCM, {"tunableop": "sometimes"})


def test_setup_backend_sets_rocm_environment(monkeypatch):
    for name in ENV:
        monkeypatch.delenv(name, raising=False)  # restored to unset after the test
    settings = resolve_settings(ROCM, {"tunableop": "true", "hipblaslt": "false"})
    ROCM.setup(torch.device("cpu"), "BF16", settings)
    assert {name: os.environ[name] for name in ENV} == {
        "PYTORCH_TUNABLEOP_ENABLED": "1",
        "TORCH_BLAS_PREFER_HIPBLASLT": "0",
    }
    values = {f.name: f.value for f in ROCM.precision_facts(torch.device("cuda"), "BF16", settings)}
    assert values["PYTORCH_TUNABLEOP_ENABLED"] == "1" and values["TORCH_BLAS_PREFER_HIPBLASLT"] == "0"
    assert "llmb_cuda.compile" in values and "HIPBLASLT_ALLOW_TF32" in values


def test_device_services_are_inherited_from_the_cuda_backend():
    assert isinstance(ROCM, llmb_cuda.CudaBackend)
    assert ROCM.device_types() == ["cuda"]
    assert ROCM.available() is HAS_ROCM
    for method in ("synchronize", "new_event", "reset_peak_memory", "peak_memory_bytes", "process_model"):
        assert getattr(type(ROCM), method) is getattr(llmb_cuda.CudaBackend, method)
    assert ROCM.distributed_backend(torch.device("cuda")) == "nccl"
    assert ROCM.peak_sources() == {entry.label: entry.source for entry in llmb_rocm.PEAKS}


@pytest.mark.parametrize(
    "arch, supported", [("gfx942:sramecc+:xnack-", True), ("gfx950", True), ("gfx90a:sramecc+:xnack-", False)]
)
def test_fp8_is_asked_of_the_gpu_architecture(monkeypatch, arch, supported):
    # A ROCm GPU, simulated (none exists here): MI250X (gfx90a) answers compute capability 9.0 but has no float8.
    monkeypatch.setattr(torch.version, "hip", "6.2.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index=None: SimpleNamespace(gcnArchName=arch))
    monkeypatch.setattr(torch.cuda.tunable, "enable", lambda on: None)
    monkeypatch.setattr(torch.backends.cuda, "preferred_blas_library", lambda name: None)
    monkeypatch.setattr(fp8, "torchao_unavailable", lambda: None)  # the GPU check alone is under test
    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    settings = resolve_settings(ROCM, {"fp8": "rowwise"})
    reason = ROCM.fp8_unsupported(torch.device("cuda", 0))
    assert (reason is None) is supported
    if supported:
        ROCM.setup(torch.device("cuda", 0), "BF16", settings)
    else:
        assert "gfx90a" in reason and "MI300" in reason
        with pytest.raises(UsageError, match="^fp8=rowwise: gfx90a "):
            ROCM.setup(torch.device("cuda", 0), "BF16", settings)


def test_cuda_plugin_steps_aside_on_a_rocm_build(monkeypatch):
    monkeypatch.setattr(torch.version, "hip", "6.2.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a ROCm GPU, simulated: none exists here
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert llmb_cuda.CudaBackend().available() is False
    assert ROCM.available() is True


@needs_rocm
def test_tiny_run_on_the_gpu(tmp_path):
    args = ["run", "--plugin", "rocm", "--preset", "tiny", "--steps", "5", "--warmup-steps", "2", "--precision", "BF16"]
    result = CliRunner().invoke(cli, [*args, "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    (path,) = tmp_path.glob("*.json")
    record = json.loads(path.read_text())
    assert record["invalid_reasons"] == []
    assert record["timing"]["method"] == "device-events"
    assert record["facts"]["hip_runtime"] == torch.version.hip
