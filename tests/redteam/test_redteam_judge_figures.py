"""Red team, class 1 of the second round: the judge takes the worker's word for what ran. A plugin that rewrites what
the worker's end of the link sends (here through multiprocessing's Connection.send, which no identity guard watches)
claims more steps, a larger batch or a job it never ran, a peak of its own, a device it never had, or digests that cover
less than the model. The judge's figures are its own: what it asked for, the peak llmb's table gives, the scope the
job's layout gives, the accelerators torch shows it. Stage: run; reason: "judge: the worker's record says <field> ...;
the judge asked for ..." (the peak: "...; llmb's table and the plugin's declaration give ..."; the seal: "judge: window
N's seal says its digests cover ..."; a device this host lacks: "device: the worker's record says it ran on ...")."""

import json

import pytest
import torch
from redteam_kit import install, llmb, reasons, run
from test_redteam_precision_in_step import FP16_MLP_FROM_STEP
from test_redteam_precision_in_step import WARMUP as PRECISION_WARMUP
from test_redteam_steps_at_risk import attack

from llmb.spec.flops import model_flops_per_token, parameter_count
from llmb.spec.shape import ModelConfig


def flops_per_token(config: dict) -> int:
    return model_flops_per_token(ModelConfig(**config))


FORGE_THE_LINK = """
import multiprocessing.connection as _connection

_send = _connection.Connection.send


# FORGERY


def _forged_send(self, message):
    if isinstance(message, tuple) and len(message) == 2 and message[0] == "result" and isinstance(message[1], dict):
        message = ("result", _forge_record(dict(message[1])))
    elif isinstance(message, tuple) and len(message) == 2 and message[0] == "close" and isinstance(message[1], dict):
        message = ("close", _forge_answer(dict(message[1])))
    return _send(self, message)


_connection.Connection.send = _forged_send
"""

# Ten times the steps: the record says 30, every window's answer carries 30 losses (the last one repeated).
TEN_TIMES_THE_STEPS = """
def _forge_record(record):
    record["steps"] = record["steps"] * 10
    return record


def _forge_answer(answer):
    losses = list(answer["losses"])
    answer["losses"] = losses + [losses[-1]] * (9 * len(losses))
    return answer
"""
TWICE_THE_BATCH = """
def _forge_record(record):
    record["batch_size"] *= 2
    record["global_batch_size"] *= 2
    return record
"""
A_JOB_IT_NEVER_RAN = """
def _forge_record(record):
    record["world_size"] = 2
    record["global_batch_size"] *= 2
    record["parallel"] = "ddp"
    record["layout"] = {**record["layout"], "dp": 2, "dp_replicate": 2}
    return record
"""

# The FLOPs a token costs, ten times: TFLOP/s, MFU and the matmul-peak efficiency would follow it.
TEN_TIMES_THE_FLOPS = """
def _forge_record(record):
    record["model_flops_per_token"] *= 10
    return record
"""
# The official shape's parameter count on a debug shape: every table labels the shape by it.
THE_OFFICIAL_PARAMETERS = """
def _forge_record(record):
    record["parameters"] = 1_433_680_000
    return record
"""
# A job of two nodes where one process ran on one.
TWO_NODES = """
def _forge_record(record):
    record["nodes"] = 2
    return record
"""
# The peak behind the MFU: a device the table knows (one row), its figure replaced by one a fiftieth of the
# achieved rate's order and still called the table's, with the worker's own peak reasons dropped.
A_PEAK_OF_ITS_OWN = """
def _device_name(device):
    return "NVIDIA H100 80GB HBM3"


def _forge_record(record):
    record["peak"] = {**record["peak"], "flops": 2e10, "source": "a datasheet", "origin": "llmb table"}
    record["invalid_reasons"] = [r for r in record["invalid_reasons"] if not r.startswith(("peak", "MFU"))]
    return record
"""
# The device the run names: its type picks the replay's moment tolerance (2e-6 for a run made on the CPU, 1e-3 on an
# accelerator no GPU has measured yet: llmb.judge.replay_checks), so a CPU run that calls itself a GPU run would take
# the looser one, and the FP16 MLP of test_redteam_precision_in_step.py (8e-6 to 8e-5 in the moments) would pass.
A_DEVICE_IT_NEVER_HAD = """
def _forge_record(record):
    record["device"] = {**record["device"], "type": "cuda", "spec": "cuda:0"}
    return record
"""


@pytest.mark.parametrize(
    "name, forge, field",
    [
        ("steps", TEN_TIMES_THE_STEPS, "steps"),
        ("batch", TWICE_THE_BATCH, "batch_size"),
        ("job", A_JOB_IT_NEVER_RAN, "world_size"),
        ("flops", TEN_TIMES_THE_FLOPS, "model_flops_per_token"),
        ("nodes", TWO_NODES, "nodes"),
        ("peak", A_PEAK_OF_ITS_OWN, "peak"),
        ("device", A_DEVICE_IT_NEVER_HAD, "device type"),
        ("parameters", THE_OFFICIAL_PARAMETERS, "parameters"),
    ],
)
def test_a_record_rewritten_on_the_link_is_judged_on_the_judges_figures(tmp_path, name, forge, field):
    keep_answers = "\n\ndef _forge_answer(answer):\n    return answer\n" if "_forge_answer" not in forge else ""
    code = FORGE_THE_LINK.replace("# FORGERY\n", forge + keep_answers)
    proc, record = run(install(tmp_path / "site", f"forge{name}", code), tmp_path, "--plugin", f"forge{name}")
    assert record is not None, proc.stderr[-2000:]
    assert record["valid"] is False
    assert reasons(record, f"judge: the worker's record says {field} "), record["invalid_reasons"]
    # The headline is made of what the judge asked for (3 steps of batch 1 in one process), over its own clock.
    tokens = 1 * record["config"]["sequence_length"] * 3 / record["timing"]["window_seconds"]
    assert record["steps"] == 3 and record["batch_size"] == 1 and record["world_size"] == 1
    assert record["tokens_per_second"] == pytest.approx(tokens, rel=1e-9)
    # Its FLOPs too: the shape's count, whatever the worker said.
    flops = flops_per_token(record["config"])
    assert record["model_flops_per_token"] == flops and record["nodes"] == 1
    assert record["parameters"] == parameter_count(ModelConfig(**record["config"]))
    assert record["tflops"] == pytest.approx(record["tokens_per_second"] * flops / 1e12, rel=1e-9)
    # The peak is llmb's table's for the device name the record gives (the H100's FP32 row for the forged peak).
    if name == "peak":
        assert record["peak"]["flops"] == 66.9e12 and record["peak"]["origin"] == "llmb table", record["peak"]
        assert record["mfu"] == pytest.approx(record["tflops"] * 1e12 / 66.9e12, rel=1e-9)


# What the sealed digests cover is the job's layout's to say: a one-process run whose seal calls its digests "rank 0's
# part" (as a tensor-parallel job's are) would have the whole-window replay compare neither the parameter digest nor
# AdamW's moments, so a pure BF16 plugin that stops computing after step 1 (losses inside the bracket) would pass.
NARROWED_SEAL = """
    if isinstance(message, tuple) and len(message) == 2 and message[0] == "seal" and isinstance(message[1], dict):
        message = ("seal", {**message[1], "digest_scope": "rank 0's part"})
    return _send(self, message)"""
NO_FORGERY = "def _forge_record(record):\n    return record\n\n\ndef _forge_answer(answer):\n    return answer\n"
FORGE_THE_SEAL = FORGE_THE_LINK.replace("\n    return _send(self, message)", NARROWED_SEAL)
FORGE_THE_SEAL = FORGE_THE_SEAL.replace("# FORGERY\n", NO_FORGERY)


def test_a_seal_that_narrows_what_its_digests_cover_is_judged_on_the_layout(tmp_path):
    site = install(tmp_path / "site", "forgescope", FORGE_THE_SEAL + attack(2))
    args = ["--plugin", "forgescope", "--precision", "BF16", "--steps", "5", "--replay-whole", "1"]
    proc, record = run(site, tmp_path, *args)
    assert record is not None, proc.stderr[-2000:]
    assert reasons(record, "judge: window 1's seal says its digests cover \"rank 0's part\""), record["invalid_reasons"]
    assert record["evidence"]["windows"][0]["digest_scope"] == "model"
    assert reasons(record, "replay: AdamW's first-moment digest"), record["invalid_reasons"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this host has the device the forgery names")
def test_a_run_that_names_an_accelerator_the_host_lacks_is_invalid(tmp_path):
    """Without --device the plugin's default device is the worker's to resolve, so the judge cannot compare the
    record's with what it asked; a type torch drives alone it can still look for itself. A CPU run running every MLP
    in FP16 from step 3 on names itself cuda:0 for the looser moment tolerance: the judge sees no CUDA device."""
    keep_answers = "\n\ndef _forge_answer(answer):\n    return answer\n"
    code = FORGE_THE_LINK.replace("# FORGERY\n", A_DEVICE_IT_NEVER_HAD + keep_answers)
    code += FP16_MLP_FROM_STEP.replace("FIRST_CHANGED", str(PRECISION_WARMUP + 3))
    site = install(tmp_path / "site", "forgedevice", code)
    out = tmp_path / "out"
    args = ["run", "--preset", "tiny", "--steps", "5", "--warmup-steps", str(PRECISION_WARMUP), "--plugin"]
    proc = llmb(site, [*args, "forgedevice", "--precision", "FP32", "--replay-whole", "1", "--out", str(out)], tmp_path)
    records = sorted(out.glob("*.json")) if out.exists() else []
    assert records, proc.stderr[-2000:]
    record = json.loads(records[0].read_text())
    assert record["valid"] is False and record["device"]["spec"] == "cuda:0"
    said = "device: the worker's record says it ran on 'cuda:0'; torch sees no cuda device on this host"
    assert reasons(record, said), record["invalid_reasons"]
