"""llmb project: the ALCF time-to-solution formula on small numbers worked out by hand."""

import json
from dataclasses import replace

import pytest
from click.testing import CliRunner
from records_factory import make_result

from llmb.cli import cli
from llmb.records import Commbench, CommRow, DeviceRef, PluginRef
from llmb.report import time_to_solution as project

RESULT = {"tflops": 1e-6}  # 1e6 FLOP/s per device
COMM = {
    "operation": "all_reduce",
    "world_size": 2,
    "results": [
        {"bytes": 32, "algbw_bytes_per_second": 1e3},
        {"bytes": 1024, "algbw_bytes_per_second": 1e4},
    ],
}
SHAPE = project.Shape(layers=2, hidden=4, ffn=16, seq=8, global_batch=4, tp=2, pp=2, dp=2, bytes_per_element=2)


def test_projection_reproduces_the_hand_arithmetic():
    p = project.project(SHAPE, RESULT, COMM)
    # b = 4 / DP 2 = 2; compute = b L (36 s d^2 + 6 s^2 d) = 2*2*(36*8*16 + 6*64*4) = 4 * (4608 + 1536) = 24576
    assert p["batch_per_replica"] == 2
    assert p["compute_multiply_adds"] == 24576
    # The formula counts multiply-adds; 1e6 FLOP/s is 5e5 multiply-adds/s: alpha = 2 / 1e6 s per multiply-add.
    # alpha-term = 24576 / (PP 2 x TP 2) x 2e-6 s = 0.012288 s
    assert p["alpha_seconds_per_multiply_add"] == pytest.approx(2e-6)
    assert p["alpha_term_seconds"] == pytest.approx(0.012288)
    # one [s, d] activation: 8*4*2 B = 64 B, nearest measured size (log scale) 32 B at 1e3 B/s
    assert p["message_bytes"] == 64 and p["bandwidth_message_bytes"] == 32
    # commbench on 2 ranks: busbw = 1e3 x 2 (2-1)/2 = 1e3; TP group of 2: algbw = 1e3 x 2 / (2 (2-1)) = 1e3 B/s
    assert p["allreduce_algbw_bytes_per_second"] == pytest.approx(1e3) and p["warnings"] == []
    # beta-term = 4 b L s d x 2 B / PP = 4*2*2*8*4*2/2 = 512 B over 1e3 B/s = 0.512 s
    assert p["comm_bytes"] == 512
    assert p["beta_term_seconds"] == pytest.approx(0.512)
    assert p["step_seconds"] == pytest.approx(0.524288)
    # The seed's FOM = (6 s d^2 + s^2 d) B L / T = (768 + 256) * 4 * 2 / 0.524288
    assert p["seed_fom"] == pytest.approx(8192 / 0.524288)
    assert p["devices"] == 8


def test_beta_comes_from_the_tp_groups_size_and_warns_on_another_rank_count():
    four = project.project(replace(SHAPE, tp=4), RESULT, COMM)
    # A ring on 4 ranks moves 2 (4-1)/4 of the message per rank: algbw = busbw 4 / 6 = 1e3 x 2/3 B/s.
    assert four["allreduce_algbw_bytes_per_second"] == pytest.approx(1e3 * 4 / 6)
    assert four["beta_term_seconds"] == pytest.approx(512 / (1e3 * 4 / 6))
    assert "commbench ran on 2 ranks, the TP group has 4" in four["warnings"][0]
    alone = project.project(replace(SHAPE, tp=1), RESULT, COMM)
    assert alone["beta_term_seconds"] == 0 and alone["comm_bytes"] == 0 and alone["warnings"] == []


def test_check_puts_a_measured_run_next_to_its_projection():
    measured = {
        "config": {"num_hidden_layers": 2, "hidden_size": 4, "intermediate_size": 16, "sequence_length": 8,
                   "num_attention_heads": 2},
        "global_batch_size": 4,
        "layout": {"tp": 2, "pp": 2, "dp": 2},
        "precision": {"effective": "BF16"},
        "timing": {"window_seconds": 2.0},
        "steps": 4,
    }  # fmt: skip
    p = project.check_against(measured, RESULT, COMM)
    assert p["step_seconds"] == pytest.approx(0.524288) and p["measured_step_seconds"] == 0.5
    assert p["projection_error"] == pytest.approx(0.524288 / 0.5 - 1)
    fp32 = project.check_against({**measured, "precision": {"effective": "FP32"}}, RESULT, COMM)
    assert fp32["shape"]["bytes_per_element"] == 4


def test_a_message_beyond_the_largest_measured_takes_the_largest():
    big = project.Shape(layers=1, hidden=64, ffn=256, seq=64, global_batch=1)
    p = project.project(big, RESULT, COMM)
    assert p["message_bytes"] == 64 * 64 * 2 and p["bandwidth_message_bytes"] == 1024


def full_records() -> tuple[dict, dict]:
    """RESULT and COMM as whole records: the CLI reads its files strictly (llmb.records)."""
    result = make_result(tflops=RESULT["tflops"]).to_dict()
    rows = [
        CommRow(
            bytes=r["bytes"],
            elements=r["bytes"] // 4,
            seconds=r["bytes"] / r["algbw_bytes_per_second"],
            algbw_bytes_per_second=r["algbw_bytes_per_second"],
            busbw_bytes_per_second=r["algbw_bytes_per_second"],
        )
        for r in COMM["results"]
    ]
    comm = Commbench(
        operation="all_reduce",
        plugin=PluginRef(name="cpu", version="0", distribution="llmb", settings={}),
        device=DeviceRef(type="cpu", name="test"),
        backend="gloo",
        world_size=2,
        nodes=1,
        dtype="float32",
        iters=1,
        warmup=0,
        timing="test",
        results=rows,
        torch="test",
    ).to_dict()
    return result, comm


def test_cli_prints_the_terms_and_json(tmp_path):
    result, comm = full_records()
    (tmp_path / "r.json").write_text(json.dumps(result))
    (tmp_path / "c.json").write_text(json.dumps(comm))
    common = ["project", "--layers", "2", "--hidden", "4", "--ffn", "16", "--seq", "8", "--global-batch", "4"]
    common += [
        "--tp",
        "2",
        "--pp",
        "2",
        "--dp",
        "2",
        "--from",
        str(tmp_path / "r.json"),
        "--comm",
        str(tmp_path / "c.json"),
    ]
    shown = CliRunner().invoke(cli, common)
    assert shown.exit_code == 0, shown.output
    assert "alpha-term" in shown.output and "beta-term" in shown.output and "0.524288 s" in shown.output
    assert "multiply-adds" in shown.output and "seed FOM" in shown.output and "not a FLOP/s" in shown.output
    as_json = CliRunner().invoke(cli, [*common, "--json"])
    assert json.loads(as_json.output)["step_seconds"] == pytest.approx(0.524288)
    bad = CliRunner().invoke(
        cli, [*common[:-4], "--dp", "3", "--from", str(tmp_path / "r.json"), "--comm", str(tmp_path / "c.json")]
    )
    assert bad.exit_code == 2 and "does not divide" in bad.output


def test_cli_names_the_bad_field_of_a_file_that_is_not_a_record(tmp_path):
    result, comm = full_records()
    del comm["results"][0]["seconds"]
    (tmp_path / "r.json").write_text(json.dumps(result))
    (tmp_path / "c.json").write_text(json.dumps(comm))
    args = ["project", "--layers", "2", "--hidden", "4", "--ffn", "16", "--seq", "8", "--global-batch", "4"]
    out = CliRunner().invoke(cli, [*args, "--from", str(tmp_path / "r.json"), "--comm", str(tmp_path / "c.json")])
    assert out.exit_code == 1 and "results[0].seconds: missing" in out.output and "Traceback" not in out.output
