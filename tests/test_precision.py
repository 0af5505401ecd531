import json

import pytest
import torch
from conftest import TINY_CPU, invoke

from llmb import Backend, Peak, PrecisionFact
from llmb.audit import precision
from llmb.judge import replay
from llmb.spec.flops import fom, model_flops_per_token, parameter_count
from llmb.spec.presets import PRESETS
from llmb.spec.shape import OFFICIAL_CONFIG

TINY = [*TINY_CPU, "--steps", "3"]


def run(tmp_path, *args):
    result = invoke("run", *TINY, "--out", tmp_path, *args, catch_exceptions=True)
    records = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("*.json"))]
    return result, records


@pytest.fixture(autouse=True)
def restore_matmul_precision():
    yield
    precision.apply_backend_recipe("FP32")


@pytest.mark.parametrize(
    "name, mode, param_dtype, autocast, probe",
    [
        ("FP32", "pure", "float32", None, "FP32"),
        ("BF16", "pure", "bfloat16", None, "FP32"),  # FP32 probe inputs, no autocast: the dtypes carry the label
        ("BF16", "amp", "float32", "bfloat16", "BF16"),
        ("FP16", "pure", "float16", None, "FP32"),
        ("FP16", "amp", "float32", "float16", "FP16"),
    ],
)
def test_cpu_runs_record_a_correct_audit(tmp_path, name, mode, param_dtype, autocast, probe):
    result, [record] = run(tmp_path, "--precision", name, "--precision-mode", mode)
    assert result.exit_code == 0, result.output
    audit = record["precision"]["audit"]
    assert record["precision"] == {**record["precision"], "requested": name, "effective": name, "mode": mode}
    assert set(audit["parameter_dtypes"]) == {param_dtype}
    assert set(audit["gradient_dtypes"]) == {param_dtype}
    assert set(audit["optimizer_state_dtypes"]) == {param_dtype}
    assert audit["buffer_dtypes"] == {}  # the model keeps none (its rotary tables are made each forward)
    assert audit["autocast_dtype"] == autocast
    assert audit["grad_scaler"] is (name == "FP16" and mode == "amp")
    assert audit["matmul_probe"]["verdict"] == probe
    assert {"name": "torch.float32_matmul_precision", "value": "highest", "implies": None} in audit["backend"]
    assert record["invalid_reasons"] == []


class MediumMatmulBackend(Backend):
    """Sets float32 matmuls to "medium" under FP32: oneDNN then multiplies in BF16 on this CPU."""

    name = "medium"

    def setup(self, device, precision, settings):
        torch.set_float32_matmul_precision("medium")


def test_medium_matmul_precision_under_fp32_is_labelled_by_what_ran(register_backend, tmp_path):
    register_backend(MediumMatmulBackend())
    result, [record] = run(tmp_path, "--plugin", "medium", "--precision", "FP32")
    assert result.exit_code == 0, result.output
    audit = record["precision"]["audit"]
    assert record["precision"]["requested"] == "FP32"
    # "medium" allows BF16; whether oneDNN uses it depends on the CPU (AVX512-BF16/AMX). The label follows the
    # probe and the dispatch record (what ran), and the record keeps the disagreement where the switch said more.
    probe = audit["matmul_probe"]["verdict"]
    assert record["precision"]["effective"] == precision.lowest([probe, audit["dispatch"]["effective"]])
    assert {"name": "torch.float32_matmul_precision", "value": "medium", "implies": "BF16"} in audit["backend"]
    if probe == "FP32":
        assert audit["switches_vs_probe"]["allow"] == "BF16" and audit["switches_vs_probe"]["label"] == "probe"
    else:
        assert record["precision"]["effective"] == "BF16"
        assert "PRECISION: requested FP32 but the audit found BF16" in result.output


def test_an_fp32_request_is_replayed_by_the_weights_and_matmuls_that_ran(register_backend, tmp_path):
    """The replay judges what ran, as check-plugin does. BF16 matmuls over FP32 weights (where this CPU runs "medium"
    as BF16) are held to BF16 amp's row, every loss compared; a model the plugin cast to BF16 (post-processing the
    rules allow) trained pure BF16 weights and is replayed as a pure BF16 request is, in BF16 too. Before, both took the
    request's word: the first had its later losses only bracketed, and the second, whose BF16 weights keep little of
    AdamW's updates, failed the whole window's update digest as an honest run (0.82 against 0.05 in a 5-step
    fused-AdamW run of the tiny preset)."""

    class CastToBF16(MediumMatmulBackend):
        name = "castbf16"

        def setup(self, device, precision, settings):
            pass

        def process_model(self, model, optimizer, device, precision, settings):
            return model.to(torch.bfloat16)

    register_backend(MediumMatmulBackend())
    register_backend(CastToBF16())
    for plugin in ("medium", "castbf16"):
        result, [record] = run(tmp_path / plugin, "--plugin", plugin, "--precision", "FP32")
        assert result.exit_code == 0, result.output
        precision.apply_backend_recipe("FP32")
        replayed = replay.replay_record(record, steps=record["steps"])  # the whole window, as the judge may draw it
        assert replayed["passed"] and replayed["whole_window"], [c for c in replayed["checks"] if not c["passed"]]
        checks = {c["name"]: c["detail"] for c in replayed["checks"]}
        ran = record["precision"]["effective"]
        if plugin == "castbf16":
            assert ran == "BF16" and replayed["same_precision"]["dtype"] == "bfloat16"
            assert "against a BF16 replay" in checks["same-precision-moments"]
        else:  # FP32 weights: every loss against the FP32 replay, in the row of what ran
            row = {"FP32": "FP32 pure", "BF16": "BF16 amp"}[ran]
            assert "relative error" in checks["replay-loss-3"] and row in checks["replay-loss-3"], checks
            if ran == "BF16":  # and, as AMP on the CPU, its moments against a replay under autocast (autocast_checks)
                assert replayed["same_precision"]["autocast"] == "bfloat16"
                assert "against a BF16 autocast replay" in checks["autocast-moment-directions"]
            else:
                assert "same_precision" not in replayed


def test_high_on_the_cpu_is_not_labelled_tf32(register_backend, tmp_path):
    """No CPU computes TF32: "high" under FP32 keeps the FP32 label the probe shows, and records the switch."""

    class High(MediumMatmulBackend):
        name = "high"

        def setup(self, device, precision, settings):
            torch.set_float32_matmul_precision("high")

    register_backend(High())
    result, [record] = run(tmp_path, "--plugin", "high", "--precision", "FP32")
    assert result.exit_code == 0, result.output
    audit = record["precision"]["audit"]
    assert audit["matmul_probe"]["verdict"] == "FP32"
    assert record["precision"]["effective"] == "FP32"
    assert audit["switches_vs_probe"] == {
        "switches": {"torch.float32_matmul_precision": "TF32", "torch.backends.mkldnn.matmul.fp32_precision": "TF32"},
        "allow": "TF32",
        "probe": "FP32",
        "label": "probe",
    }


def test_one_new_api_switch_does_not_crash_the_audit(register_backend, tmp_path):
    """A plugin that sets one per-backend fp32_precision switch makes torch refuse to read the global matmul
    precision ("checking the matmul precision without a specific backend name"); the audit records that, reads the
    per-backend switches, and labels what the probe shows (no CPU computes TF32)."""

    class ConvTweak(MediumMatmulBackend):
        name = "convtweak"

        def setup(self, device, precision, settings):
            torch.backends.mkldnn.matmul.fp32_precision = "tf32"
            torch.backends.mkldnn.conv.fp32_precision = "tf32"

    register_backend(ConvTweak())
    result, [record] = run(tmp_path, "--plugin", "convtweak", "--precision", "FP32")
    assert result.exit_code == 0, result.output
    backend = {f["name"]: f for f in record["precision"]["audit"]["backend"]}
    assert backend["torch.float32_matmul_precision"]["value"].startswith("unreadable")
    assert backend["torch.backends.mkldnn.matmul.fp32_precision"]["implies"] == "TF32"
    # The fixed model has no convolution (one that ran would show in the dispatch record): no implication.
    assert backend["torch.backends.mkldnn.conv.fp32_precision"]["implies"] is None
    assert record["precision"]["effective"] == record["precision"]["audit"]["matmul_probe"]["verdict"] == "FP32"
    assert record["invalid_reasons"] == []


def test_medium_probe_agrees_with_what_the_cpu_really_computes():
    # Whether "medium" makes oneDNN's FP32 matmuls BF16 depends on the CPU (AMX or AVX512-BF16, and oneDNN's choice
    # per CPU: an AVX512-BF16 EPYC keeps them FP32). Ground truth independent of the probe: 1 + 2**-10 is exact in
    # FP32 and rounds to 1 in BF16 (7 mantissa bits), so a row of them times ones shows which format ran.
    torch.set_float32_matmul_precision("medium")
    a = torch.full((256, 256), 1 + 2**-10)
    ran_bf16 = bool((torch.mm(a, torch.ones(256, 256)) == 256).all())
    probe = precision.matmul_probe(torch.device("cpu"), None, lambda: None)
    assert probe["verdict"] == ("BF16" if ran_bf16 else "FP32"), probe


class AutocastForwardBackend(MediumMatmulBackend):
    """Wraps the model's forward in autocast(bf16) under an FP32 request: every tensor at rest stays FP32."""

    name = "autocast_forward"

    def setup(self, device, precision, settings):
        pass

    def process_model(self, model, optimizer, device, precision, settings):
        forward = model.forward

        def autocast_forward(*args, **kwargs):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return forward(*args, **kwargs)

        model.forward = autocast_forward
        return model


def test_strict_precision_makes_a_lower_effective_precision_an_error(register_backend, tmp_path):
    register_backend(AutocastForwardBackend())
    result, [record] = run(tmp_path, "--plugin", "autocast_forward", "--precision", "FP32", "--strict-precision")
    assert record["precision"]["audit"]["evidence"]["dispatch"] == "BF16"
    assert result.exit_code == 1
    assert any("--strict-precision" in r for r in record["invalid_reasons"])


class CachedRotary(torch.nn.Module):
    """A vendor's rotary cache: the tables made once and kept as BF16 buffers, returned in the activations' dtype."""

    def __init__(self, rotary: torch.nn.Module, positions: int) -> None:
        super().__init__()
        cos, sin = rotary(torch.zeros(1), positions)
        self.register_buffer("cos", cos.to(torch.bfloat16))
        self.register_buffer("sin", sin.to(torch.bfloat16))

    def forward(self, x, seq_len):
        return self.cos[:seq_len].to(x.dtype), self.sin[:seq_len].to(x.dtype)


class CachedRotaryBackend(Backend):
    """Keeps every parameter in FP32 but caches the rotary tables in BF16 buffers."""

    name = "cached_rotary"

    def process_model(self, model, optimizer, device, precision, settings):
        model.rotary = CachedRotary(model.rotary, model.config.sequence_length)
        return model


def test_buffers_in_a_lower_format_lower_the_label(register_backend, tmp_path):
    register_backend(CachedRotaryBackend())
    result, [record] = run(tmp_path, "--plugin", "cached_rotary", "--precision", "FP32")
    audit = record["precision"]["audit"]
    assert set(audit["parameter_dtypes"]) == {"float32"}
    assert audit["buffer_dtypes"] == {"bfloat16": 2}
    assert audit["evidence"]["buffers"] == "BF16"
    assert record["precision"]["effective"] == "BF16"


def test_plugin_precision_facts_lower_the_label(register_backend, tmp_path):
    class ClaimsTF32(Backend):
        name = "claims_tf32"

        def precision_facts(self, device, precision, settings):
            return [PrecisionFact("vendor.matmul_mode", "fast", "TF32"), PrecisionFact("vendor.note", "x", None)]

    register_backend(ClaimsTF32())
    result, [record] = run(tmp_path, "--plugin", "claims_tf32")
    assert result.exit_code == 0, result.output
    assert record["precision"]["effective"] == "TF32"
    assert {"name": "vendor.matmul_mode", "value": "fast", "implies": "TF32"} in record["precision"]["audit"]["backend"]


def test_probe_verdicts_for_each_format():
    cpu = torch.device("cpu")
    assert precision.matmul_probe(cpu, None, lambda: None)["verdict"] == "FP32"
    assert precision.matmul_probe(cpu, torch.bfloat16, lambda: None)["verdict"] == "BF16"
    fp16 = precision.matmul_probe(cpu, torch.float16, lambda: None)
    assert fp16["verdict"] == "FP16" and fp16["fp16_range_overflow"]


def test_lowest_format_ranks_by_mantissa_bits():
    assert precision.lowest(["FP32", "TF32"]) == "TF32"
    assert precision.lowest(["FP16", "BF16", "FP32"]) == "BF16"
    assert precision.lowest([None, "FP32"]) == "FP32"
    assert precision.lowest([]) == "FP32"


def test_tf32_is_unsupported_on_cpu_and_all_runs_the_rest(tmp_path):
    result, records = run(tmp_path, "--precision", "all")
    assert result.exit_code == 0, result.output
    assert "TF32: unsupported" in result.output
    assert sorted(r["precision"]["effective"] for r in records) == ["BF16", "FP16", "FP32"]


class PeakBackend(Backend):
    name = "peak"

    def precisions(self):
        return ["FP32", "BF16"]

    def peak_flops(self, device, precision):
        # A peak with its public source; the host CPU is not in llmb's peak table.
        return Peak(1e12, "https://example.com/datasheet") if precision == "FP32" else None


def test_mfu_uses_the_plugins_peak_for_the_effective_precision(register_backend, tmp_path):
    register_backend(PeakBackend())
    result, records = run(tmp_path, "--plugin", "peak", "--precision", "FP32")
    assert result.exit_code == 0, result.output
    [record] = records
    assert record["peak"]["flops"] == 1e12
    assert record["peak"]["origin"] == "declared by plugin"
    assert record["peak"]["source"] == "https://example.com/datasheet"
    assert record["mfu"] == pytest.approx(record["tflops"] * 1e12 / 1e12)
    result, records = run(tmp_path / "bf16", "--plugin", "peak", "--precision", "BF16")
    assert records[0]["mfu"] is None and records[0]["peak"]["flops"] is None


def test_cpu_plugin_declares_no_peak_so_mfu_is_null(tmp_path):
    _, [record] = run(tmp_path)
    assert record["mfu"] is None


def test_official_flops_per_token():
    # torchtitan: 6 x (1,433,680,000 - 102,400,000) + 12 x 12 x 32 x 100 x 256
    assert parameter_count(OFFICIAL_CONFIG) == 1_433_680_000
    assert model_flops_per_token(OFFICIAL_CONFIG) == 6 * 1_331_280_000 + 117_964_800
    assert model_flops_per_token(OFFICIAL_CONFIG) == pytest.approx(8.106e9, rel=1e-3)


def test_alcf_fom():
    config = PRESETS["tiny"]
    s, d, layers = config.sequence_length, config.hidden_size, config.num_hidden_layers
    assert fom(config, 4, 0.5) == (6 * s * d * d + s * s * d) * 4 * layers / 0.5
