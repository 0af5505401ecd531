"""Red team, class 4 of the second round: precision that changes inside a step. From a chosen step of the window on,
the plugin's forward runs under `autocast(bfloat16)` and leaves it before the step ends, so every read of the backend
state between steps sees FP32, and it runs plain FP32 whenever a dispatch mode is pushed, so the audit's recorded
step sees FP32 too. The run is labelled FP32; its loss moves by
~1e-3 against the 1e-6..3.5e-5 FP32 replay tolerances. Stage: run; reason: "replay: step N: recorded loss". The
judge picks the whole window to replay after the worker answered for every step (probability --replay-whole), and
otherwise replays past the prefix as far as --replay-budget of the run's wall time affords, so any step is at risk;
a draw on the prefix with no budget does not see it (docs/integrity.md states the probability per run)."""

import pytest
from redteam_kit import install, reasons, run

AUTOCAST_FROM_STEP = """
import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

_calls = [0]


def _process_model(model, optimizer, device, precision, settings):
    forward = model.forward

    def bf16_inside(input_ids, labels=None):
        _calls[0] += labels is not None  # training steps only (the audit's census forward has no labels)
        # Plain FP32 on the warmup, the first window steps, and whenever a dispatch mode (the audit's recorder) is
        # pushed: the audit step after the window labels the run FP32.
        if _calls[0] < FIRST_CHANGED or labels is None or _get_current_dispatch_mode() is not None:
            return forward(input_ids, labels)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss, logits = forward(input_ids, labels)
        return loss.float(), logits

    model.forward = bf16_inside
    return model
"""
WARMUP = 2  # redteam_kit.TINY's --warmup-steps: the window's step k is the (WARMUP + k)-th training forward


def replayed_steps_failed(record: dict) -> list[int]:
    """The window's steps whose replayed loss failed, from the reasons "replay: step N: recorded loss ..."."""
    return [int(r.split()[2].rstrip(":")) for r in reasons(record, "replay: step ")]


@pytest.mark.parametrize(
    "whole, budget, caught",
    [
        ("1", "0", True),
        # The prefix drawn, and a budget past it that a tiny window's steps fit in: the replay goes on to the whole.
        # Half the run's wall time, not the default tenth: a tiny 5-step run is mostly the worker's start, and the
        # replay's first step (its estimate of the rest) is slow on a loaded host, so a tenth is on the edge there
        # (what a tenth affords per preset: benchmarks/replay_depth.py, RESULTS.md section 23).
        ("0", "0.5", True),
        ("0", "0", False),
    ],
)
def test_bf16_entered_inside_the_step_fails_the_fp32_replay_of_that_step(tmp_path, whole, budget, caught):
    name = f"autocastinside{whole}{budget.replace('.', '')}"
    site = install(tmp_path / "site", name, AUTOCAST_FROM_STEP.replace("FIRST_CHANGED", str(WARMUP + 3)))
    args = ["--plugin", name, "--precision", "FP32", "--steps", "5", "--replay-whole", whole, "--replay-budget", budget]
    proc, record = run(site, tmp_path, *args)
    assert record is not None, proc.stderr[-2000:]
    replay = record["evidence"]["replay"]
    assert replay["drawn"]["whole"] is (whole == "1")
    if not caught:  # the prefix (steps 1-2), and no budget past it: nothing replayed ran under the autocast
        assert replay["passed"] is True, replay
        return
    assert replay["passed"] is False, replay
    # At the tiny preset, at the initial weights, BF16 moves a step's loss by only 1e-6 to 2e-5 (2.8e-6 to 1.6e-5 at
    # step 3 over three runs of this attack, 2026-11-25), against the FP32 tolerance of 1e-6: a changed step's loss
    # can fall inside it on a draw of the window's batch (the full suite saw step 4 named first, and once step 5:
    # steps 3 and 4 at 8.3e-7 and 0, step 5 at 2.3e-5). So the steps named are changed ones, never one before, and
    # AdamW's moments after the window, a tenth of every gradient, differ by 1e-3 (2.6e-3 in that run) against a
    # tolerance of 1e-5, whatever the draw: the window fails.
    failed = replayed_steps_failed(record)
    assert failed and min(failed) >= 3, record["invalid_reasons"]
    assert reasons(record, "replay: AdamW's first-moment digest"), record["invalid_reasons"]


# Class 4 with a lighter touch: every MLP (two thirds of the matmuls) under autocast(float16) from step 3 on, plain
# FP32 whenever a dispatch mode is pushed. At the tiny shape its losses stay within the FP32 tolerance (4e-7 against
# 1e-6); AdamW's moments, a tenth of every gradient, differ by 8.1e-6 to 7.8e-5 by the draw, where an honest CPU
# window differs by 5.2e-7 at most (llmb.judge.replay.CPU_MOMENT_TOLERANCES, 2e-6; at 1e-5 one draw in eight passed).
FP16_MLP_FROM_STEP = """
import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

_calls = [0]


def _process_model(model, optimizer, device, precision, settings):
    forward = model.forward

    def counting(input_ids, labels=None):
        _calls[0] += labels is not None
        return forward(input_ids, labels)

    for layer in model.layers:
        def fp16(x, inner=layer.mlp.forward):
            if _calls[0] < FIRST_CHANGED or _get_current_dispatch_mode() is not None:
                return inner(x)
            with torch.autocast("cpu", dtype=torch.float16):
                return inner(x).float()

        layer.mlp.forward = fp16
    model.forward = counting
    return model
"""


def test_fp16_inside_one_module_fails_the_fp32_replay_of_the_window(tmp_path):
    site = install(tmp_path / "site", "fp16mlp", FP16_MLP_FROM_STEP.replace("FIRST_CHANGED", str(WARMUP + 3)))
    args = ["--plugin", "fp16mlp", "--precision", "FP32", "--steps", "5", "--replay-whole", "1"]
    proc, record = run(site, tmp_path, *args)
    assert record is not None, proc.stderr[-2000:]
    assert record["precision"]["effective"] == "FP32"  # the audit's recorded step saw FP32: the label is FP32
    assert reasons(record, "replay: AdamW's first-moment digest"), record["invalid_reasons"]
