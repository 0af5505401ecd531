"""The roofline (`llmb peak`): the model's GEMM shapes, device-synchronised timing, the CLI's output and errors."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from llmb import CpuBackend
from llmb.cli import cli
from llmb.run import roofline
from llmb.spec.flops import model_flops_per_token
from llmb.spec.presets import PRESETS

TINY = PRESETS["tiny"]


def test_model_gemms_are_the_models_linear_layers():
    gemms = {g.name: g for g in roofline.model_gemms(TINY, batch_size=3)}
    tokens = 3 * TINY.sequence_length
    assert gemms["q/k/v_proj"] == roofline.Gemm("q/k/v_proj", tokens, 64, 64)
    assert gemms["gate/up_proj"] == roofline.Gemm("gate/up_proj", tokens, 128, 64)
    assert gemms["down_proj"] == roofline.Gemm("down_proj", tokens, 64, 128)
    assert gemms["lm_head"] == roofline.Gemm("lm_head", tokens, TINY.vocab_size, 64)
    # o_proj has q_proj's shape at the tiny preset (width == hidden): listed once.
    assert "o_proj" not in gemms
    # The forward GEMMs of one layer and the head, x3 for the backward, are the model's FLOPs less attention.
    layer = 4 * gemms["q/k/v_proj"].flops + 2 * gemms["gate/up_proj"].flops + gemms["down_proj"].flops
    total = 3 * (TINY.num_hidden_layers * layer + gemms["lm_head"].flops)
    attention = 12 * TINY.num_hidden_layers * TINY.hidden_size * TINY.sequence_length * tokens
    norms = 6 * (2 * TINY.num_hidden_layers + 1) * TINY.hidden_size * tokens  # 6N counts the norm weights too
    assert total + attention + norms == model_flops_per_token(TINY) * tokens


def test_measure_synchronises_around_every_timed_batch(monkeypatch):
    calls = []

    class LazyCpu(CpuBackend):
        """The CPU with a lazy device's step_end, counting the harness's calls."""

        def synchronize(self, device):
            calls.append("sync")

        def step_end(self, device):
            calls.append("step")

    gemm = roofline.Gemm("square", 64, 64, 64)
    rate = roofline.measure_gemm(LazyCpu(), torch.device("cpu"), gemm, torch.float32, repeats=3)
    assert len(rate.seconds) == 3 and all(s > 0 for s in rate.seconds)
    # warmup (2 matmuls), sizing (1, 2, 4, ... up to iters), then 3 repeats of `iters`: each batch opens and closes
    # with a sync, and each matmul ends with step_end.
    powers = [2**i for i in range(rate.iters.bit_length())]
    assert powers[-1] == rate.iters  # doubled from 1
    sizing = powers if rate.iters < roofline.MAX_ITERS else powers[:-1]
    batches = 1 + len(sizing) + 3
    assert calls.count("sync") == 2 * batches
    assert calls.count("step") == 2 + sum(sizing) + 3 * rate.iters
    assert rate.flops_per_second == pytest.approx(gemm.flops * rate.iters / sorted(rate.seconds)[1])


@pytest.mark.parametrize("repeats", [2, 3, 5])
def test_the_searched_square_side_is_measured_by_the_searchs_own_samples(monkeypatch, repeats):
    """Where one matmul already lasts SQUARE_SECONDS (here any: 0 s), the search's warmup and three timed matmuls at
    that side are the measurement's first repeats: no second warmup or sizing, random operands, median of repeats."""
    timed = []
    original = roofline._timed

    def counting(backend, device, a, b, iters):
        timed.append((a.shape[0], iters, bool((a == a.flatten()[0]).all())))
        return original(backend, device, a, b, iters)

    monkeypatch.setattr(roofline, "_timed", counting)
    monkeypatch.setattr(roofline, "SQUARE_SECONDS", 0.0)
    rate = roofline.square_rate(CpuBackend(), torch.device("cpu"), torch.float32, repeats)
    side = roofline.MIN_SQUARE
    assert rate.gemm == roofline.Gemm("square", side, side, side) and rate.iters == 1
    assert len(rate.seconds) == repeats
    assert timed == [(side, 1, False)] * (1 + max(3, repeats))  # one warmup, then the samples; never ones
    assert rate.flops_per_second == pytest.approx(rate.gemm.flops / sorted(rate.seconds)[(repeats - 1) // 2])


def test_a_square_side_the_search_never_timed_is_measured_in_full(monkeypatch):
    """A device fast enough to pass MAX_SQUARE below SQUARE_SECONDS (a datacenter GPU) gets the full measurement
    at MAX_SQUARE, as does a side given (`llmb peak --square`)."""
    monkeypatch.setattr(roofline, "SQUARE_SECONDS", float("inf"))
    monkeypatch.setattr(roofline, "MAX_SQUARE", 2 * roofline.MIN_SQUARE)
    measured = []
    monkeypatch.setattr(roofline, "measure_gemm", lambda backend, device, gemm, dtype, repeats: measured.append(gemm))
    roofline.square_rate(CpuBackend(), torch.device("cpu"), torch.float32, 3)
    roofline.square_rate(CpuBackend(), torch.device("cpu"), torch.float32, 3, side=96)
    assert measured == [roofline.Gemm("square", side, side, side) for side in (roofline.MAX_SQUARE, 96)]


def test_measure_reports_the_best_rate_and_the_models_weighted_rate():
    gemms = roofline.model_gemms(TINY, 1) + [roofline.Gemm("square", 128, 128, 128)]
    result = roofline.measure(CpuBackend(), torch.device("cpu"), "FP32", gemms, repeats=3)
    rates = [r.flops_per_second for r in result.rates]
    assert result.peak_flops == max(rates)
    own = [r.flops_per_second for r in result.rates if r.gemm.name != "square"]
    assert min(own) <= result.model_gemm_flops <= max(own)
    data = result.to_dict()
    assert data["schema"] == roofline.SCHEMA and data["precision"] == "FP32" and len(data["gemms"]) == len(gemms)


def test_efficiency_against_the_measured_peak():
    assert roofline.efficiency(0.5, 1e12) == pytest.approx(0.5)
    assert roofline.efficiency(0.5, None) is None


def test_peak_command_json(tmp_path):
    out = tmp_path / "peak.json"
    result = CliRunner().invoke(
        cli,
        [
            "peak",
            "--preset",
            "tiny",
            "--precision",
            "FP32",
            "--square",
            "128",
            "--repeats",
            "2",
            "--json",
            "--out",
            out,
        ],
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data == json.loads(out.read_text())
    (fp32,) = data["rooflines"]
    assert fp32["precision"] == "FP32" and fp32["device"] == "cpu" and fp32["peak_flops"] > 0
    assert [g["name"] for g in fp32["gemms"]][-1] == "square"


def test_peak_command_table():
    result = CliRunner().invoke(
        cli, ["peak", "--preset", "tiny", "--precision", "FP32", "--square", "64", "--repeats", "1"]
    )
    assert result.exit_code == 0, result.output
    assert "measured matmul peak" in result.output and "lm_head" in result.output


@pytest.mark.parametrize(
    "args, message",
    [
        (["--precision", "TF32"], "does not support TF32"),
        (["--batch-size", "0"], "not in the range"),
        (["--square", "0"], "not in the range"),
        (["--device", "cuda"], "serves cpu"),
    ],
)
def test_peak_command_refuses_bad_input_in_one_line(args, message):
    result = CliRunner().invoke(cli, ["peak", "--preset", "tiny", *args])
    assert result.exit_code != 0
    assert message in result.output and "Traceback" not in result.output


def test_compile_seconds_is_the_warmups_excess_over_steady_steps():
    assert roofline.compile_seconds([5.0, 1.5, 1.0], 1.0) == pytest.approx(4.5)
    assert roofline.compile_seconds([0.9, 1.0], 1.0) == 0.0  # faster warmup than the window: no negative cost


def test_for_run_measures_the_runs_precision_fp8_included():
    cpu, device = CpuBackend(), torch.device("cpu")
    result = roofline.for_run(cpu, device, "FP32", TINY, 1, repeats=1)
    assert result.precision == "FP32" and result.rates[-1].gemm.name == "square" and result.peak_flops > 0
    # An FP8 run's GEMMs are float8 ones through torch._scaled_mm, as torchao's float8 Linear computes them.
    fp8 = roofline.for_run(cpu, device, "FP8", TINY, 1, repeats=1)
    if roofline.float8_gemm_unavailable(device) is None:
        assert fp8.precision == "FP8" and fp8.peak_flops > 0
    else:
        assert fp8 is None


def test_an_fp8_roofline_on_a_device_without_float8_gemms_is_none(monkeypatch):
    def no_kernel(*args, **kwargs):
        raise NotImplementedError("_scaled_mm: no kernel for this device")  # an older GPU, as torch says it

    monkeypatch.setattr(roofline.torch, "_scaled_mm", no_kernel)
    assert roofline.for_run(CpuBackend(), torch.device("cpu"), "FP8", TINY, 1, repeats=1) is None


def test_every_run_records_its_compile_cost_and_the_measured_matmul_peak():
    from llmb.run import runner

    options = runner.RunOptions(config=TINY, preset="tiny", plugin="cpu", steps=2, warmup_steps=3)
    record = runner.run(options).to_dict()
    timing = record["timing"]
    assert len(timing["warmup_step_seconds"]) == 3 and all(s > 0 for s in timing["warmup_step_seconds"])
    steady = timing["window_seconds"] / 2
    assert timing["compile_seconds"] == pytest.approx(max(0.0, sum(timing["warmup_step_seconds"]) - 3 * steady))
    assert record["measured_matmul_peak"] > 0 and record["measured_model_gemm_flops"] > 0
    assert record["matmul_peak_efficiency"] == pytest.approx(record["tflops"] * 1e12 / record["measured_matmul_peak"])
