"""The cpu plugin's training features: per-operator selective checkpointing, FP8 (torchao, emulated), Thunder."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from llmb.conformance import check as conformance
from llmb.registry.plugins import get_backend
from llmb.run import roofline, runner
from llmb.spec.presets import PRESETS
from llmb.toolkit import compilers, fp8


def test_the_settings_are_declared():
    settings = {s.name: s for s in get_backend("cpu").backend.settings()}
    assert settings["activation_checkpointing"].choices == ("none", "selective-layers", "selective-ops", "full")
    assert "thunder" in settings["compile"].choices
    assert settings["fp8"].default == "none" and settings["fp8_emulate"].default is True


@pytest.mark.parametrize("mode", ["selective-ops", "selective-layers"])
def test_checkpointing_conforms(mode):
    record = conformance.check_plugin("cpu", "cpu", "FP32", settings={"activation_checkpointing": mode}, steps=3)
    assert record.passed, conformance.failed_checks(record)


@pytest.mark.skipif(fp8.torchao_unavailable() is not None, reason="torchao float8 cannot run here")
def test_fp8_run_through_the_plugin_is_labelled_fp8():
    options = runner.RunOptions(
        config=PRESETS["tiny"], preset="tiny", plugin="cpu", steps=2, warmup_steps=1, settings={"fp8": "rowwise"}
    )
    record = runner.run(options).to_dict()
    assert record["precision"]["effective"] == "FP8" and record["mfu"] is None
    # Efficiency against the float8 GEMM rate measured in the run (torch._scaled_mm), where torch has one for the CPU.
    if roofline.float8_gemm_unavailable(torch.device("cpu")) is None:
        assert record["measured_matmul_peak"] > 0 and record["matmul_peak_efficiency"] > 0
    facts = {f["name"]: f for f in record["precision"]["audit"]["backend"]}
    assert facts["llmb.fp8"]["value"] == "rowwise" and facts["llmb.fp8"]["implies"] == "FP8"


@pytest.mark.skipif(compilers.thunder_unavailable() is None, reason="Thunder runs here (see tests/test_thunder.py)")
def test_thunder_where_it_cannot_run_is_one_line_and_exit_2(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "llmb", "run", "--preset", "tiny", "-O", "compile=thunder", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "compile=thunder" in lines[0] and "torch 2.9" in lines[0]
    assert not list(tmp_path.iterdir())
