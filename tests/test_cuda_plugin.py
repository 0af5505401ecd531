"""llmb-cuda: the pure logic and the device-independent post-processing here; the GPU paths where a GPU exists."""

import json
import os

import llmb_cuda
import pytest
import torch
from click.testing import CliRunner

from llmb.api.errors import UsageError
from llmb.cli import cli
from llmb.model import LlamaModel, count_parameters
from llmb.registry.plugins import get_backend, resolve_settings
from llmb.spec import peak_table as peaks
from llmb.spec.presets import build_config
from llmb.toolkit import checkpointing, compilers, fp8

HAS_CUDA = torch.cuda.is_available() and torch.version.hip is None
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device on this machine")
NO_TORCHAO = fp8.torchao_unavailable()
needs_torchao = pytest.mark.skipif(NO_TORCHAO is not None, reason=f"torchao float8 cannot run here: {NO_TORCHAO}")
NO_THUNDER = compilers.thunder_unavailable()
CUDA = llmb_cuda.CudaBackend()


# A GPU llmb's peak table lacks, as a vendor would add it to the plugin's table (invented: no such GPU exists).
ACME = llmb_cuda.PeakEntry(
    "Acme A1", r"\bAcme A1\b", r"\bLite\b", {"FP32": 1e12, "BF16": 4e12}, "https://acme.example/a1-datasheet"
)


def test_a_gpu_llmbs_table_lacks_gets_the_plugins_declared_peak_with_its_source():
    peak = llmb_cuda.match_peak("Acme A1 80GB", "BF16", (ACME,))
    assert (peak.flops, peak.source) == (4e12, "Acme A1: https://acme.example/a1-datasheet")
    assert llmb_cuda.match_peak("Acme A1 80GB", "TF32", (ACME,)) is None  # no figure for it: no MFU
    assert llmb_cuda.match_entry("Acme A1 Lite", (ACME,)) is None  # excluded look-alike
    assert llmb_cuda.match_entry("Acme A1", (ACME, ACME)) is None  # two rows: never a guess


def test_the_cuda_plugin_leaves_every_gpu_it_knows_to_llmbs_table():
    assert llmb_cuda.PEAKS == () and CUDA.peak_sources() == {}
    assert llmb_cuda.match_peak("NVIDIA H100 80GB HBM3", "BF16") is None  # llmb's table has it (tests/test_peaks.py)


DEFAULTS = {
    "compile": "default",
    "fused_adamw": True,
    "activation_checkpointing": "none",
    "fp8": "none",
    "fp8_emulate": False,
}
# The defaults on the eager path: what the post-processing tests below start from (compiling is tested apart).
EAGER = {**DEFAULTS, "compile": "none"}


def test_settings_are_declared_and_validated():
    assert get_backend("cuda").plugin.distribution == "llmb-cuda"
    assert resolve_settings(CUDA, {}) == DEFAULTS
    given = {
        "compile": "thunder",
        "fused_adamw": "true",
        "activation_checkpointing": "selective-ops",
        "fp8": "rowwise",
        "fp8_emulate": "true",
    }
    assert resolve_settings(CUDA, given) == {
        "compile": "thunder",
        "fused_adamw": True,
        "activation_checkpointing": "selective-ops",
        "fp8": "rowwise",
        "fp8_emulate": True,
    }
    for bad in ({"compile": "fast"}, {"activation_checkpointing": "half"}, {"fused_adamw": "sure"}, {"tf32": "1"}):
        with pytest.raises(UsageError):
            resolve_settings(CUDA, bad)
    with pytest.raises(UsageError, match="expected one of none, tensorwise, rowwise, rowwise_with_gw_hp"):
        resolve_settings(CUDA, {"fp8": "delayed"})  # torchao >= 0.18 scales dynamically only


def test_the_features_are_llmbs_shared_ones():
    # One source of truth: the cuda plugin offers what llmb.toolkit.checkpointing / compilers / fp8 implement.
    settings = {s.name: s for s in CUDA.settings()}
    assert settings["activation_checkpointing"].choices == checkpointing.MODES
    assert settings["compile"].choices == ("none", *compilers.INDUCTOR_MODES, compilers.THUNDER)
    assert settings["fp8"].choices == fp8.RECIPES
    assert "dynamic" in settings["fp8"].help and "delayed" in settings["fp8"].help
    assert not hasattr(llmb_cuda, "CheckpointedLayer") and not hasattr(llmb_cuda, "compile_model")


def test_the_old_layer_wise_name_is_a_one_line_error_naming_the_new_ones():
    with pytest.raises(UsageError) as info:
        resolve_settings(CUDA, {"activation_checkpointing": "selective"})
    message = str(info.value)
    assert "\n" not in message and "selective-layers" in message and "selective-ops" in message


def test_capabilities_here():
    assert CUDA.device_types() == ["cuda"]
    assert CUDA.precisions() == ["FP32", "TF32", "FP16", "BF16"]
    assert CUDA.available() is HAS_CUDA
    device = torch.device("cuda")
    assert CUDA.optimizer_options(device, "FP32", {"fused_adamw": True}) == {"fused": True}
    assert CUDA.optimizer_options(device, "FP32", {"fused_adamw": False}) == {}
    assert CUDA.distributed_backend(device) == "nccl"


def test_facts_record_what_the_plugin_changes():
    settings = {**EAGER, "compile": "default", "fused_adamw": True, "activation_checkpointing": "full"}
    facts = {f.name: f for f in CUDA.precision_facts(torch.device("cuda"), "BF16", settings)}
    assert facts["llmb_cuda.compile"].value == "default" and facts["llmb_cuda.fused_adamw"].value is True
    assert all(f.implies is None for f in facts.values())
    # FP8 is the one that lowers the format: the same fact as the cpu plugin's, implying FP8.
    facts = {f.name: f for f in CUDA.precision_facts(torch.device("cuda"), "BF16", {**settings, "fp8": "rowwise"})}
    assert facts["llmb.fp8"].value == "rowwise" and facts["llmb.fp8"].implies == "FP8"


def test_driver_version_is_read_from_proc_or_none():
    if os.path.exists("/proc/driver/nvidia/version"):
        assert llmb_cuda.driver_version()
    else:
        assert llmb_cuda.driver_version() is None


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


@pytest.mark.parametrize("mode", ["selective-layers", "selective-ops", "full"])
def test_activation_checkpointing_keeps_loss_and_gradients(mode):
    # process_model's post-processing is device-agnostic: exercised here on the CPU device (no GPU on this machine).
    model, ids = tiny_model_and_batch()
    parameters = list(model.parameters())
    eager_loss, eager_grads = loss_and_grads(model, ids)

    processed = CUDA.process_model(
        model, None, torch.device("cpu"), "FP32", {**EAGER, "activation_checkpointing": mode}
    )
    wrapped = [i for i, layer in enumerate(processed.layers) if isinstance(layer, checkpointing.CheckpointedLayer)]
    assert (
        wrapped
        == checkpointing.checkpointed_layers(mode, 4)
        == ([0, 2] if mode == "selective-layers" else [0, 1, 2, 3])
    )
    assert all(processed.layers[i].per_op is (mode == "selective-ops") for i in wrapped)
    # The same parameter objects, so the optimizer built before post-processing still holds every one.
    assert [id(p) for p in processed.parameters()] == [id(p) for p in parameters]
    assert count_parameters(processed) == sum(p.numel() for p in parameters)

    loss, grads = loss_and_grads(processed, ids)
    torch.testing.assert_close(loss, eager_loss, rtol=0, atol=1e-6)
    for got, expected in zip(grads, eager_grads, strict=True):
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)


def test_compile_modes_reach_torch_compile(monkeypatch):
    calls = []
    monkeypatch.setattr(compilers.torch, "compile", lambda model, mode=None: calls.append(mode) or model)
    model, _ = tiny_model_and_batch(layers=1)
    for mode in compilers.INDUCTOR_MODES:
        assert CUDA.process_model(model, None, torch.device("cpu"), "FP32", {**EAGER, "compile": mode}) is model
    assert CUDA.process_model(model, None, torch.device("cpu"), "FP32", {**EAGER, "compile": "none"}) is model
    assert calls == [None, "reduce-overhead", "max-autotune"]  # "none" does not compile; "default" is mode=None
    CUDA.process_model(model, None, torch.device("cpu"), "FP32", resolve_settings(CUDA, {}))
    assert calls[-1] is None  # the plugin's default path is compiled (Inductor's default mode)


@pytest.mark.skipif(NO_THUNDER is None, reason="Thunder imports here (the thunder tox env)")
def test_thunder_where_it_cannot_run_stops_setup_in_one_line():
    # Before the model exists: the reason (the torch version) in one line, as the cpu plugin says it.
    with pytest.raises(UsageError, match="compile=thunder: ") as info:
        CUDA.setup(torch.device("cpu"), "FP32", {**EAGER, "compile": "thunder"})
    assert str(info.value) == f"compile=thunder: {NO_THUNDER}" and "\n" not in str(info.value)


@pytest.mark.skipif(NO_THUNDER is not None, reason=f"Thunder cannot run here: {NO_THUNDER}")
def test_thunder_jits_the_model_with_the_same_parameters_and_gradients():
    model, ids = tiny_model_and_batch(layers=2)
    parameters = list(model.parameters())
    eager_loss, eager_grads = loss_and_grads(model, ids)
    settings = {**EAGER, "compile": "thunder", "activation_checkpointing": "none"}
    CUDA.setup(torch.device("cpu"), "FP32", settings)
    jitted = CUDA.process_model(model, None, torch.device("cpu"), "FP32", settings)
    assert type(jitted).__module__.startswith("thunder")
    assert [id(p) for p in jitted.parameters()] == [id(p) for p in parameters]
    loss, grads = loss_and_grads(jitted, ids)
    torch.testing.assert_close(loss, eager_loss, rtol=1e-5, atol=1e-6)
    for got, expected in zip(grads, eager_grads, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-6)


@needs_torchao
def test_fp8_emulated_swaps_the_linears_but_the_head_and_trains_close_to_eager():
    # torchao's emulation runs on the CPU device; the GPU's float8 kernels (fp8_emulate=false) cannot run here.
    from torchao.float8.float8_linear import Float8Linear

    model, ids = tiny_model_and_batch(layers=2)
    parameters = list(model.parameters())
    eager_loss, _ = loss_and_grads(model, ids)
    settings = {**EAGER, "fp8": "tensorwise", "fp8_emulate": True, "activation_checkpointing": "selective-ops"}
    CUDA.setup(torch.device("cpu"), "FP32", settings)
    processed = CUDA.process_model(model, None, torch.device("cpu"), "FP32", settings)
    float8 = {name for name, m in processed.named_modules() if isinstance(m, Float8Linear)}
    linears = {name for name, m in processed.named_modules() if isinstance(m, torch.nn.Linear)}
    assert float8 and float8 == linears - {"lm_head"}
    assert [id(p) for p in processed.parameters()] == [id(p) for p in parameters]
    loss, grads = loss_and_grads(processed, ids)
    assert loss != eager_loss  # float8 rounding did happen
    torch.testing.assert_close(loss, eager_loss, rtol=2e-2, atol=0)
    assert all(torch.isfinite(g).all() for g in grads)


def simulated_gpu(monkeypatch, name: str, capability: tuple[int, int]) -> None:
    """A CUDA GPU answered by mocks: none exists on this machine."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: name)


@needs_torchao
def test_fp8_on_a_gpu_without_float8_gemms_is_one_line_before_the_model(monkeypatch):
    simulated_gpu(monkeypatch, "NVIDIA A100-SXM4-80GB", (8, 0))
    settings = {**EAGER, "fp8": "rowwise"}
    with pytest.raises(UsageError) as info:
        CUDA.setup(torch.device("cuda", 0), "BF16", settings)
    message = str(info.value)
    assert "\n" not in message and message.startswith("fp8=rowwise: NVIDIA A100") and "8.9" in message
    CUDA.setup(torch.device("cuda", 0), "BF16", {**settings, "fp8_emulate": True})  # emulation runs anywhere
    simulated_gpu(monkeypatch, "NVIDIA H100 80GB HBM3", (9, 0))
    CUDA.setup(torch.device("cuda", 0), "BF16", settings)
    assert CUDA.fp8_unsupported(torch.device("cuda", 0)) is None


def test_fp8_without_torchao_is_one_line(monkeypatch):
    monkeypatch.setattr(fp8, "torchao_unavailable", lambda: "torchao is not installed (pip install 'llmb[fp8]')")
    with pytest.raises(UsageError, match=r"^fp8=tensorwise: torchao is not installed"):
        CUDA.setup(torch.device("cpu"), "BF16", {**EAGER, "fp8": "tensorwise"})


def test_checkpointed_model_traces_under_torch_compile():
    # Dynamo capture with the eager AOT backend: the checkpoint wrappers must trace, and the result must not move.
    # (Inductor's own code generation is the slow test below.)
    model, ids = tiny_model_and_batch(layers=2)
    eager_loss, eager_grads = loss_and_grads(model, ids)
    processed = CUDA.process_model(
        model, None, torch.device("cpu"), "FP32", {**EAGER, "activation_checkpointing": "full"}
    )
    compiled = torch.compile(processed, backend="aot_eager")
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
        compiled, _ = CUDA.process_model(model, None, torch.device("cpu"), "FP32", {**EAGER, "compile": "default"})(
            ids, labels=ids
        )
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
    args += ["-O", "fused_adamw=true", "-O", "activation_checkpointing=selective-layers", "--out", str(tmp_path)]
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
    assert (record["mfu"] is None) == (peaks.choose(record["device"]["name"], "BF16").flops is None)
    assert (record["peak"]["source"] is None) == (record["mfu"] is None)
    # NVML's counter, where the GPU has one (Volta and later): joules over the window, at a power under the limit.
    counter = llmb_cuda.nvml_energy_counter(torch.device("cuda"))
    energy = record["energy"]
    if isinstance(counter, str):
        assert energy["reason"] and not energy.get("scope")
    elif energy.get("joules") is None:  # a tiny window can end before NVML's counter (10-100 ms) moves
        assert energy["scope"].startswith("NVML") and "did not advance" in energy["reason"]
    else:
        assert energy["tokens_per_joule"] > 0 and 0 < energy["watts"] <= counter.limit_watts * 1.05


@needs_cuda
def test_the_nvml_energy_counter_on_the_gpu():
    counter = llmb_cuda.nvml_energy_counter(torch.device("cuda"))
    if isinstance(counter, str):
        pytest.skip(counter)
    x = torch.randn(8192, 8192, device="cuda")
    before = counter.read()
    for _ in range(50):
        x = (x @ x).clamp_(-1, 1)
    torch.cuda.synchronize()
    after = counter.read()
    assert after > before, "the counter did not advance over 50 large matmuls"
    assert counter.limit_watts and counter.limit_watts > 0


@needs_cuda
def test_fp8_run_on_the_gpu_is_labelled_fp8(tmp_path):
    major, minor = torch.cuda.get_device_capability(0)
    if (major, minor) < llmb_cuda.FP8_CAPABILITY:
        pytest.skip(f"compute capability {major}.{minor}: no float8 GEMMs")
    if NO_TORCHAO:
        pytest.skip(NO_TORCHAO)
    args = ["run", "--plugin", "cuda", "--preset", "tiny", "--steps", "5", "--warmup-steps", "2", "--precision", "BF16"]
    args += ["--precision-mode", "amp", "-O", "fp8=tensorwise", "--out", str(tmp_path)]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    (path,) = tmp_path.glob("*.json")
    record = json.loads(path.read_text())
    assert record["precision"]["effective"] == "FP8" and record["mfu"] is None


def test_the_device_memory_is_the_gpus_total_memory(monkeypatch):
    # torch.cuda.get_device_properties answered by a mock: no GPU exists on this machine.
    class Properties:
        total_memory = 85_520_809_984  # what an H100 80GB HBM3 reports

    asked = []
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: asked.append(index) or Properties())
    assert CUDA.device_memory_bytes(torch.device("cuda", 1)) == 85_520_809_984 and asked == [1]
