"""llmb-cuda: the pure logic and the device-independent post-processing here; the GPU paths where a GPU exists."""

import json
import os

import llmb_cuda
import pytest
import torch
from click.testing import CliRunner

from llmb.cli import cli
from llmb.config import build_config
from llmb.errors import UsageError
from llmb.model import LlamaModel, count_parameters
from llmb.plugins import get_backend, resolve_settings

HAS_CUDA = torch.cuda.is_available() and torch.version.hip is None
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device on this machine")
CUDA = llmb_cuda.CudaBackend()


def flops(name: str, precision: str, table=llmb_cuda.PEAKS) -> float | None:
    """The table's figure alone (match_peak returns it with its source)."""
    peak = llmb_cuda.match_peak(name, precision, table)
    return peak.flops if peak else None


@pytest.mark.parametrize(
    "name, label",
    [
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA A100-SXM4-40GB", "A100"),
        ("NVIDIA A100 80GB PCIe", "A100"),
        ("NVIDIA A100-PCIE-40GB", "A100"),
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100 SXM5 80GB", "H100 SXM"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA B200", "B200"),
        # Other clocks, power or silicon: no figure rather than a neighbour's.
        ("NVIDIA H100 NVL", None),
        ("NVIDIA H100", None),
        ("NVIDIA H200 NVL", None),
        ("NVIDIA GH200 480GB", None),
        ("NVIDIA GB200", None),
        ("NVIDIA H800", None),
        ("NVIDIA A100X", None),
        ("NVIDIA GeForce RTX 4090", None),
        ("", None),
    ],
)
def test_device_names_match_one_table_entry_or_none(name, label):
    entry = llmb_cuda.match_entry(name)
    assert (entry.label if entry else None) == label
    if label is None:
        assert all(flops(name, p) is None for p in ("FP32", "TF32", "FP16", "BF16"))


@pytest.mark.parametrize(
    "name, sparse_bf16_tflops",
    # The datasheets' BF16 tensor figures are quoted with 2:4 sparsity; the table must hold the dense half.
    [
        ("NVIDIA A100-SXM4-80GB", 624),
        ("NVIDIA H100 80GB HBM3", 1979),
        ("NVIDIA H100 PCIe", 1513),
        ("NVIDIA H200", 1979),
        ("NVIDIA B200", 4500),
    ],
)
def test_peaks_are_dense_figures(name, sparse_bf16_tflops):
    assert flops(name, "BF16") == pytest.approx(sparse_bf16_tflops * 1e12 / 2, rel=1e-3)
    assert flops(name, "FP16") == flops(name, "BF16")
    fp32, tf32, bf16 = (flops(name, p) for p in ("FP32", "TF32", "BF16"))
    assert fp32 < tf32 < bf16
    assert flops(name, "FP8") is None  # not a benchmark precision: never a peak


def test_every_entry_covers_the_four_precisions():
    for entry in llmb_cuda.PEAKS:
        assert set(entry.peaks) == {"FP32", "TF32", "FP16", "BF16"}, entry.label


def test_every_peak_names_its_public_source():
    peak = llmb_cuda.match_peak("NVIDIA H100 80GB HBM3", "BF16")
    assert peak.source.startswith("H100 SXM: https://")
    assert CUDA.peak_sources() == {entry.label: entry.source for entry in llmb_cuda.PEAKS}
    assert all(source.startswith("https://") for source in CUDA.peak_sources().values())


def test_settings_are_declared_and_validated():
    assert get_backend("cuda").plugin.distribution == "llmb-cuda"
    assert resolve_settings(CUDA, {}) == {"compile": "none", "fused_adamw": False, "activation_checkpointing": "none"}
    given = {"compile": "max-autotune", "fused_adamw": "true", "activation_checkpointing": "selective"}
    assert resolve_settings(CUDA, given) == {
        "compile": "max-autotune",
        "fused_adamw": True,
        "activation_checkpointing": "selective",
    }
    for bad in ({"compile": "fast"}, {"activation_checkpointing": "half"}, {"fused_adamw": "sure"}, {"tf32": "1"}):
        with pytest.raises(UsageError):
            resolve_settings(CUDA, bad)


def test_capabilities_here():
    assert CUDA.device_types() == ["cuda"]
    assert CUDA.precisions() == ["FP32", "TF32", "FP16", "BF16"]
    assert CUDA.available() is HAS_CUDA
    device = torch.device("cuda")
    assert CUDA.optimizer_options(device, "FP32", {"fused_adamw": True}) == {"fused": True}
    assert CUDA.optimizer_options(device, "FP32", {"fused_adamw": False}) == {}
    assert CUDA.distributed_backend(device) == "nccl"


def test_facts_record_what_the_plugin_changes():
    settings = {"compile": "default", "fused_adamw": True, "activation_checkpointing": "full"}
    facts = {f.name: f for f in CUDA.precision_facts(torch.device("cuda"), "BF16", settings)}
    assert facts["llmb_cuda.compile"].value == "default" and facts["llmb_cuda.fused_adamw"].value is True
    assert all(f.implies is None for f in facts.values())


def test_driver_version_is_read_from_proc_or_none():
    if os.path.exists("/proc/driver/nvidia/version"):
        assert llmb_cuda.driver_version()
    else:
        assert llmb_cuda.driver_version() is None


@pytest.mark.parametrize("mode, wrapped", [("none", []), ("selective", [0, 2]), ("full", [0, 1, 2, 3])])
def test_checkpointed_layers(mode, wrapped):
    assert llmb_cuda.checkpointed_layers(mode, 4) == wrapped


def tiny_model_and_batch(layers: int = 4):
    config = build_config("tiny", num_hidden_layers=layers)
    torch.manual_seed(0)
    model = LlamaModel(config)
    ids = torch.randint(0, config.vocab_size, (2, config.sequence_length), generator=torch.Generator().manual_seed(1))
    return model, ids


def loss_and_grads(model, ids):
    model.zero_grad(set_to_none=True)
    loss, _ = model(ids, labels=ids)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("mode", ["selective", "full"])
def test_activation_checkpointing_keeps_loss_and_gradients(mode):
    model, ids = tiny_model_and_batch()
    parameters = list(model.parameters())
    eager_loss, eager_grads = loss_and_grads(model, ids)

    settings = {"activation_checkpointing": mode, "compile": "none"}
    processed = CUDA.process_model(model, None, torch.device("cpu"), "FP32", settings)
    wrapped = [i for i, layer in enumerate(processed.layers) if isinstance(layer, llmb_cuda.CheckpointedLayer)]
    assert wrapped == llmb_cuda.checkpointed_layers(mode, 4)
    # The same parameter objects, so the optimizer built before post-processing still holds every one.
    assert [id(p) for p in processed.parameters()] == [id(p) for p in parameters]
    assert count_parameters(processed) == sum(p.numel() for p in parameters)

    loss, grads = loss_and_grads(processed, ids)
    torch.testing.assert_close(loss, eager_loss, rtol=0, atol=1e-6)
    for got, expected in zip(grads, eager_grads, strict=True):
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)


def test_compile_modes_reach_torch_compile(monkeypatch):
    calls = []
    monkeypatch.setattr(llmb_cuda.torch, "compile", lambda model, mode=None: calls.append(mode) or model)
    model = torch.nn.Linear(2, 2)
    for mode in llmb_cuda.COMPILE_MODES:
        assert llmb_cuda.compile_model(model, mode) is model
    assert calls == [None, "reduce-overhead", "max-autotune"]  # "none" does not compile; "default" is mode=None


def test_checkpointed_model_traces_under_torch_compile():
    # Dynamo capture with the eager AOT backend: the checkpoint wrappers must trace, and the result must not move.
    # (Inductor's own code generation is the slow test below.)
    model, ids = tiny_model_and_batch(layers=2)
    eager_loss, eager_grads = loss_and_grads(model, ids)
    compiled = torch.compile(llmb_cuda.apply_activation_checkpointing(model, "full"), backend="aot_eager")
    loss, grads = loss_and_grads(compiled, ids)
    torch.testing.assert_close(loss, eager_loss, rtol=0, atol=1e-6)
    for got, expected in zip(grads, eager_grads, strict=True):
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)


@pytest.mark.skipif(
    os.environ.get("LLMB_SLOW_TESTS") != "1",
    reason="inductor's first CPU compile takes minutes on a 2-core machine; set LLMB_SLOW_TESTS=1 to run it",
)
def test_compile_default_mode_gives_the_same_loss():
    model, ids = tiny_model_and_batch(layers=2)
    with torch.no_grad():
        eager, _ = model(ids, labels=ids)
        compiled, _ = llmb_cuda.compile_model(model, "default")(ids, labels=ids)
    torch.testing.assert_close(compiled, eager, rtol=1e-6, atol=1e-6)


@needs_cuda
def test_device_services_on_the_gpu():
    device = torch.device("cuda")
    start, end = CUDA.new_event(device), CUDA.new_event(device)
    CUDA.reset_peak_memory(device)
    start.record()
    x = torch.randn(1024, 1024, device=device)
    y = x @ x
    end.record()
    CUDA.synchronize(device)
    assert start.elapsed_time(end) > 0
    assert CUDA.peak_memory_bytes(device) >= y.numel() * 4
    assert CUDA.device_name(device) == torch.cuda.get_device_name(0)
    assert CUDA.device_count(device) == torch.cuda.device_count()
    facts = CUDA.run_facts(device)
    assert facts["cuda_runtime"] == torch.version.cuda and facts["gpu"]


@needs_cuda
def test_tiny_run_on_the_gpu(tmp_path):
    args = ["run", "--plugin", "cuda", "--preset", "tiny", "--steps", "5", "--warmup-steps", "2", "--precision", "BF16"]
    args += ["-O", "fused_adamw=true", "-O", "activation_checkpointing=selective", "--out", str(tmp_path)]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    (path,) = tmp_path.glob("*.json")
    record = json.loads(path.read_text())
    assert record["invalid_reasons"] == []
    assert record["timing"]["method"] == "device-events"
    assert record["peak_memory_bytes"] > 0
    assert record["optimizer"]["defaults"]["fused"] is True
    assert record["device"]["name"] == torch.cuda.get_device_name(0)
    assert record["facts"]["cuda_runtime"] == torch.version.cuda
    assert (record["mfu"] is None) == (flops(record["device"]["name"], "BF16") is None)
    assert (record["peak"]["source"] is None) == (record["mfu"] is None)
