"""The replay's reference matmuls (llmb.judge.replay.reference_matmuls): IEEE FP32 everywhere, except on a CUDA
device for a window whose matmuls ran BF16 or lower, where they run TF32.

This host has no GPU. Where a test needs a replay "on CUDA", replay() is replaced by a stand-in that records how it
was called, or the meta device stands in for the accelerator; each test says which.
"""

from __future__ import annotations

import copy

import pytest
import torch

from llmb.judge import replay
from llmb.run import runner
from llmb.spec.presets import PRESETS

TINY = PRESETS["tiny"]
CUDA = torch.device("cuda", 0)


@pytest.mark.parametrize(
    "effective, device, expected",
    [
        ("BF16", CUDA, "TF32"),
        ("FP8", CUDA, "TF32"),
        ("FP16", CUDA, "FP32"),  # FP16 amp's first-loss row (1e-4) is only three times TF32's distance from IEEE
        ("TF32", CUDA, "FP32"),  # what an FP32 or TF32 window's replay must tell apart
        ("FP32", CUDA, "FP32"),
        ("BF16", torch.device("cpu"), "FP32"),
        ("BF16", torch.device("xpu", 0), "FP32"),  # no GPU has measured another device's TF32
        ("not a format", CUDA, "FP32"),
    ],
)
def test_only_a_bf16_or_lower_window_on_cuda_takes_the_tf32_reference(effective, device, expected):
    assert replay.reference_matmuls(effective, device) == expected


@pytest.fixture(scope="module")
def fp32_record() -> dict:
    return runner.run(
        runner.RunOptions(config=TINY, preset="tiny", plugin="cpu", device="cpu", steps=3, warmup_steps=1)
    ).to_dict()


def relabelled(record: dict, effective: str, mode: str, dtype: str) -> dict:
    """The record as if what ran were `effective` in `mode` over `dtype` weights (only the judge's inputs change)."""
    record = copy.deepcopy(record)
    precision = record["precision"]
    count = sum(precision["audit"]["parameter_dtypes"].values())
    precision.update(requested=effective, effective=effective, mode=mode)
    precision["audit"]["parameter_dtypes"] = {dtype: count}
    return record


def stand_in(calls: list):
    """replay() on "CUDA", stood in for (no GPU here): records its arguments and answers the window's own losses
    and digests, as an honest run's replay would."""

    def fake(**arguments):
        calls.append(arguments)
        return replay.Replayed(
            losses=list(arguments["_losses"][: arguments["losses"]]),
            digest_start=arguments["_digest_start"],
            digest_end=None,
            seconds=1.0,
            peak_rss_bytes=None,
            device="cuda:0",
            build_seconds=0.25,
            device_init_seconds=0.5,
            matmuls=arguments["matmuls"],  # as the replay on a CUDA device runs them
        )

    return fake


def on_stood_in_cuda(monkeypatch, record: dict) -> list[dict]:
    """Every replay of `record` "on CUDA" goes to the stand-in; the list it fills is returned."""
    window = record["evidence"]["windows"][record["evidence"]["headline_window"]]
    calls: list[dict] = []
    fake = stand_in(calls)
    monkeypatch.setattr(replay, "replay_device", lambda spec: CUDA)
    monkeypatch.setattr(
        replay, "replay", lambda **a: fake(**a, _losses=window["losses"], _digest_start=window["digest_start"])
    )
    return calls


@pytest.mark.parametrize(
    "effective, mode, dtype, fp32_matmuls",
    [("BF16", "amp", "float32", "TF32"), ("FP16", "amp", "float32", "FP32"), ("FP32", "pure", "float32", "FP32")],
)
def test_the_fp32_replay_on_cuda_takes_the_reference_and_the_record_says_which(
    fp32_record, monkeypatch, effective, mode, dtype, fp32_matmuls
):
    record = relabelled(fp32_record, effective, mode, dtype)
    calls = on_stood_in_cuda(monkeypatch, record)
    replayed = replay.replay_record(record, steps=2, device="cuda:0")
    assert [c["matmuls"] for c in calls] == [fp32_matmuls]
    assert replayed["matmuls"] == fp32_matmuls
    assert replayed["device_init_seconds"] == 0.5 and replayed["build_seconds"] == 0.25
    assert replayed["passed"], replayed["checks"]


def test_a_pure_bf16_windows_own_format_replay_keeps_ieee_and_its_fp32_prefix_takes_tf32(fp32_record, monkeypatch):
    """A pure BF16 window is replayed twice on "CUDA" (stood in for): its first losses in FP32 with the TF32
    reference, then in BF16 (no FP32 matmuls to speak of; IEEE, as calibrated); the record names the FP32 replay's."""
    record = relabelled(fp32_record, "BF16", "pure", "bfloat16")
    calls = on_stood_in_cuda(monkeypatch, record)
    replayed = replay.replay_record(record, steps=3, device="cuda:0")
    assert [(c.get("dtype"), c["matmuls"]) for c in calls] == [(None, "TF32"), (torch.bfloat16, "FP32")]
    assert replayed["matmuls"] == "TF32"


def test_the_cpu_replay_is_ieee_whatever_it_is_asked(fp32_record):
    """On the CPU the reference is IEEE: asked for TF32, the replay computes the very same losses, brings up no
    device, and leaves the process's switches as they were."""
    window = fp32_record["evidence"]["windows"][0]
    arguments = dict(config=TINY, seed=fp32_record["seed"], batch_size=fp32_record["batch_size"], world_size=1,
                     challenge=window["challenge"], losses=2, window_steps=3)  # fmt: skip
    ieee = replay.replay(**arguments)
    asked_tf32 = replay.replay(**arguments, matmuls="TF32")
    assert asked_tf32.losses == ieee.losses and asked_tf32.matmuls == ieee.matmuls == "FP32"
    assert asked_tf32.device_init_seconds == 0.0
    assert torch.get_float32_matmul_precision() == "highest"


def test_an_accelerator_replay_sets_its_reference_and_gives_the_process_back_ieee(monkeypatch):
    """The meta device stands in for an accelerator (no GPU here): while the replay runs on it the matmul switches
    are the reference's (TF32), and after it, returned or failed, the judge's process is IEEE again."""
    seen = []

    def bring_up(device, since):
        seen.append(torch.get_float32_matmul_precision())
        raise RuntimeError("the device failed")

    monkeypatch.setattr(replay, "_initialise", bring_up)
    with pytest.raises(RuntimeError):
        replay.replay(TINY, 0, 1, 1, 1, 2, 2, device=torch.device("meta"), matmuls="TF32")
    assert seen == ["high"]
    assert torch.get_float32_matmul_precision() == "highest"
