"""`llmb check-plugin`: bad plugins fail the check that names what they broke; faithful ones pass.

Every bad plugin is an in-memory plugin serving the CPU, so these run anywhere; each does what a cheating or buggy
plugin would really do through the methods it has.
"""

import json

import pytest
import torch

from llmb import Backend, Setting
from llmb.conformance.check import check_plugin, failed_checks, normalise_name
from llmb.records import CONFORMANCE_SCHEMA as SCHEMA
from llmb.records import Conformance
from llmb.run.runner import RunOptions, run
from llmb.spec.presets import PRESETS

STEPS = 2


def check(plugin, precision="FP32", **kwargs) -> dict:
    """The record as written (and read back strictly, so what check-plugin writes is what verify can read)."""
    record = check_plugin(plugin, "cpu", precision, steps=STEPS, **kwargs).to_dict()
    assert Conformance.from_dict(record).to_dict() == record
    return record


def details(record):
    return {c["name"]: c["detail"] for c in record["checks"]}


class CpuPlugin(Backend):
    """Serves the CPU at every precision the cpu backend has; subclasses add the misbehaviour."""

    def precisions(self):
        return ["FP32", "FP16", "BF16"]


class DropLayer(CpuPlugin):
    def process_model(self, model, optimizer, device, precision, settings):
        del model.layers[-1]  # "the last layer barely matters": it is the model's function
        return model


class ScaleLogits(CpuPlugin):
    def settings(self):
        return [Setting("scale", float, 1.05, "factor on lm_head's output")]

    def process_model(self, model, optimizer, device, precision, settings):
        model.lm_head.register_forward_hook(lambda module, args, out: out * settings["scale"])
        return model


class ReplaceStep(CpuPlugin):
    """Swaps AdamW for SGD by replacing the harness optimizer's step on the instance."""

    def process_model(self, model, optimizer, device, precision, settings):
        optimizer.step = torch.optim.SGD(model.parameters(), lr=1e-2).step
        return model


class RaiseLearningRate(CpuPlugin):
    def process_model(self, model, optimizer, device, precision, settings):
        for group in optimizer.param_groups:
            group["lr"] = 1e-3
        return model


class SgdInForward(CpuPlugin):
    """Trains with its own SGD inside forward, and hands the harness a loss that reaches no parameter."""

    def process_model(self, model, optimizer, device, precision, settings):
        forward = model.forward
        parameters = list(model.parameters())

        def cheating_forward(input_ids, labels=None):
            loss, logits = forward(input_ids, labels=labels)
            if labels is not None and torch.is_grad_enabled():
                grads = torch.autograd.grad(loss, parameters)
                with torch.no_grad():
                    torch._foreach_add_(parameters, grads, alpha=-1e-2)
                loss = loss.detach().requires_grad_()
            return loss, logits

        model.forward = cheating_forward
        return model


class FreezeNorm(CpuPlugin):
    def process_model(self, model, optimizer, device, precision, settings):
        model.norm.weight.requires_grad_(False)
        return model


class CastToBF16(CpuPlugin):
    """Claims FP32, runs the model in BF16."""

    def process_model(self, model, optimizer, device, precision, settings):
        return model.to(torch.bfloat16)


class MediumMatmul(CpuPlugin):
    """Claims FP32, lets FP32 matmuls run with BF16 inputs."""

    def setup(self, device, precision, settings):
        torch.set_float32_matmul_precision("medium")


def test_medium_matmuls_fail_precision_where_the_cpu_really_computes_bf16(register_backend):
    """ "medium" allows BF16; oneDNN uses it only on some CPUs (AVX512-BF16/AMX, and not on every one of those). The
    label follows what the probe and the dispatch record show, so the check fails exactly where BF16 ran, and only
    on precision: the function is held to the row of what ran (BF16 compute over FP32 weights: BF16 amp's)."""
    register_backend(MediumMatmul(), name="bad")
    record = check("bad")
    ran_bf16 = record["precision"]["effective"] == "BF16"
    assert record["passed"] is not ran_bf16
    assert {c["name"] for c in record["checks"] if not c["passed"]} == ({"precision"} if ran_bf16 else set())


@pytest.mark.parametrize(
    "plugin, broken",
    [
        pytest.param(DropLayer, {"parameter-names", "forward-logits"}, marks=pytest.mark.slow),
        pytest.param(ScaleLogits, {"forward-logits", "forward-loss"}, marks=pytest.mark.slow),
        (ReplaceStep, {"optimizer", "optimizer-steps"}),
        pytest.param(RaiseLearningRate, {"optimizer", "trained-parameters"}, marks=pytest.mark.slow),
        pytest.param(SgdInForward, {"gradients", "trained-parameters", "loss-curve"}, marks=pytest.mark.slow),
        pytest.param(FreezeNorm, {"optimizer", "gradients"}, marks=pytest.mark.slow),
        (CastToBF16, {"precision"}),
    ],
)
def test_bad_plugin_fails_the_check_it_broke(plugin, broken, register_backend):
    register_backend(plugin(), name="bad")
    record = check("bad")
    assert record["passed"] is False
    failed = set(failed_checks(Conformance.from_dict(record)))
    assert broken <= failed, record["checks"]
    # The checks a plugin did not touch still pass: each failure points at what it broke.
    assert "fingerprint" not in failed
    text = details(record)
    if plugin is ReplaceStep:
        assert "the optimizer instance replaces its class's step" in text["optimizer"]
        assert text["optimizer-steps"] == f"AdamW.step() ran 0 times for {STEPS} harness steps"
    if plugin is RaiseLearningRate:
        assert "optimizer lr is 0.001, fixed value is 1e-05" in text["optimizer"]
    if plugin is FreezeNorm:
        assert "frozen (first: norm.weight)" in text["optimizer"]
        assert "none for 1 parameters (first: norm.weight)" in text["gradients"]
    if plugin is DropLayer:
        assert "missing (first: layers.1." in text["parameter-names"]
    if plugin in (CastToBF16, MediumMatmul):
        assert record["precision"]["effective"] == "BF16"
        assert text["precision"].startswith("requested FP32, audited BF16")


@pytest.mark.slow
def test_the_run_guard_misses_the_subtle_logit_scale_that_conformance_catches(register_backend):
    register_backend(ScaleLogits(), name="scaler")  # its default scale, 1.05, fails forward-logits above
    options = RunOptions(config=PRESETS["tiny"], preset="tiny", plugin="scaler", steps=2, warmup_steps=1)
    assert run(options).invalid_reasons == []


@pytest.mark.slow
def test_run_loss_guard_makes_a_run_with_scaled_logits_invalid(register_backend):
    register_backend(ScaleLogits(), name="scaler")
    options = RunOptions(
        config=PRESETS["tiny"], preset="tiny", plugin="scaler", steps=2, warmup_steps=1, settings={"scale": "100"}
    )
    reasons = run(options).invalid_reasons
    assert len(reasons) == 1 and "outside the band" in reasons[0] and "around ln(vocab)" in reasons[0]


# FP32 through the CLI below.
@pytest.mark.slow
@pytest.mark.parametrize("precision, mode", [("BF16", "pure"), ("BF16", "amp")])
def test_cpu_plugin_conforms(precision, mode):
    record = check("cpu", precision, mode=mode)
    assert record["passed"], record["checks"]
    assert record["precision"] == {"requested": precision, "effective": precision, "mode": mode}


@pytest.mark.slow
def test_torch_compile_post_processing_conforms():
    record = check("cpu", settings={"compile": "default"})
    assert record["passed"], record["checks"]
    assert record["plugin"]["settings"]["compile"] == "default"


@pytest.mark.slow
def test_cuda_plugin_post_processing_conforms_on_the_cpu(register_backend):
    llmb_cuda = pytest.importorskip("llmb_cuda", reason="llmb-cuda (plugins/cuda) is not installed")

    class CudaPostProcessingOnCpu(CpuPlugin):
        """llmb-cuda's model and optimizer hooks on the CPU: no GPU here, but the same Python post-processing."""

        name = "cuda_on_cpu"
        cuda = llmb_cuda.CudaBackend()

        def settings(self):
            return self.cuda.settings()

        def optimizer_options(self, device, precision, settings):
            return self.cuda.optimizer_options(device, precision, settings)

        def process_model(self, model, optimizer, device, precision, settings):
            return self.cuda.process_model(model, optimizer, device, precision, settings)

    register_backend(CudaPostProcessingOnCpu())
    record = check("cuda_on_cpu", settings={"activation_checkpointing": "selective-ops", "fused_adamw": "true"})
    assert record["passed"], record["checks"]


def test_wrapper_segments_are_normalised_away():
    assert normalise_name("_orig_mod.layers.0.self_attn.q_proj.weight") == "layers.0.self_attn.q_proj.weight"
    assert normalise_name("module.layers.1._checkpoint_wrapped_module.mlp.up_proj.weight") == (
        "layers.1.mlp.up_proj.weight"
    )
    assert normalise_name("lm_head.weight") == "lm_head.weight"


def test_cli_writes_the_record_and_exits_by_the_verdict(tmp_path, register_backend):
    from click.testing import CliRunner

    from llmb.cli import cli

    out = tmp_path / "conformance.json"
    common = ["check-plugin", "--device", "cpu", "--steps", str(STEPS), "--out", str(out)]
    result = CliRunner().invoke(cli, [*common, "--plugin", "cpu"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    record = json.loads(out.read_text())
    assert record["schema"] == SCHEMA and record["passed"] is True
    for key in ("llmb_version", "created", "preset", "config", "seed", "steps", "model_fingerprint"):
        assert key in record, key
    assert set(record["plugin"]) == {"name", "version", "distribution", "settings", "defaults", "precisions"}
    assert set(record["device"]) == {"type", "spec", "name"}
    assert set(record["precision"]) == {"requested", "effective", "mode"}
    assert all(set(c) == {"name", "passed", "detail", "measured", "tolerance"} for c in record["checks"])
    assert "CONFORMS" in result.output and not list(tmp_path.glob(".*"))

    register_backend(FreezeNorm(), "freezer")
    result = CliRunner().invoke(cli, [*common, "--plugin", "freezer"], catch_exceptions=False)
    assert result.exit_code == 1, result.output
    assert "DOES NOT CONFORM: failed optimizer, gradients" in result.output
    assert json.loads(out.read_text())["passed"] is False


@pytest.mark.parametrize(
    "args, message",
    [(["--steps", "0"], "0 is not in the range 1<=x<=1000000"), (["--precision", "TF32"], "does not support TF32")],
)
def test_bad_input_is_one_line(args, message, tmp_path):
    from click.testing import CliRunner

    from llmb.cli import cli

    out = tmp_path / "conformance.json"
    result = CliRunner().invoke(cli, ["check-plugin", "--plugin", "cpu", "--out", str(out), *args])
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output
    assert not out.exists()
