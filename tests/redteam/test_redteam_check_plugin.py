"""Red team, check-plugin's clean room: the candidate runs in a worker process, the FP32 reference and the comparison
in the process the user started, which imports no plugin. A plugin that patches torch globally at import therefore
patches only the candidate: check-plugin fails it on the numbers (forward-logits), not only on the guard's word.

`llmb check-plugin` runs here through click's CliRunner, in this test process, so the judging process is this one and
what it imported can be looked at directly. The attacks are installed distributions (tests/redteam/redteam_kit.py)
put on this process's path: the worker, started with spawn, inherits it.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from redteam_kit import install

from llmb.cli import cli
from llmb.spec.tolerances import tolerance_for

# Every Linear computes with BF16 inputs, what a BF16 matmul unit does, while every tensor and every kernel stays
# FP32: the inputs are rounded to BF16's 8-bit mantissa by integer arithmetic on their bits (no BF16 tensor is ever
# made). The dtype audit sees FP32 throughout, so the label says FP32; only the numbers show it (on a device whose
# kernels the dispatcher cannot see, a real BF16 kernel looks the same).
LINEAR_BF16 = """
import torch
import torch.nn.functional as F


def _bf16(x):
    bits = x.contiguous().view(torch.int32)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) & -65536).view(torch.float32)  # round to nearest even
    return x + (rounded - x).detach()  # the gradient passes straight through


def _forward(self, x):
    return F.linear(_bf16(x), _bf16(self.weight), self.bias)


torch.nn.Linear.forward = _forward
"""
# The same, with the in-process guard blinded (a residual risk of the worker: the plugin owns that process), so the
# only thing left to catch it is the clean reference.
BLIND_GUARD = """
import llmb.audit.guard

llmb.audit.guard.problems = lambda *args, **kwargs: []
"""


def marking(marks: Path) -> str:
    """Import-time code that leaves a file named after the importing process's id."""
    return f"import os\nimport pathlib\n\npathlib.Path({str(marks)!r}, str(os.getpid())).write_text('imported')\n"


@pytest.fixture
def installed(tmp_path, monkeypatch):
    """Install one attack on this process's path (and so the worker's); returns the folder of its import marks."""
    monkeypatch.delenv("LLMB_IN_PROCESS", raising=False)  # the real path: a worker judged from this process
    marks = tmp_path / "marks"
    marks.mkdir()

    def put(name: str, code: str) -> Path:
        site = install(tmp_path / "site", name, marking(marks) + code)
        monkeypatch.syspath_prepend(str(site))  # also what importlib.metadata searches for entry points
        return marks

    return put


def check(tmp_path: Path, plugin: str, *extra: str) -> tuple[int, str, dict | None]:
    out = tmp_path / "conformance.json"
    args = ["check-plugin", "--plugin", plugin, "--device", "cpu", "--steps", "2", *extra, "--out", str(out)]
    result = CliRunner().invoke(cli, args)
    return result.exit_code, result.output, (json.loads(out.read_text()) if out.exists() else None)


def failing(record: dict) -> dict[str, dict]:
    return {c["name"]: c for c in record["checks"] if not c["passed"]}


def imported_in(marks: Path) -> set[int]:
    return {int(p.name) for p in marks.iterdir()}


@pytest.mark.parametrize(
    "blind",
    [pytest.param(False, id="linear_bf16", marks=pytest.mark.slow), pytest.param(True, id="linear_bf16_blind_guard")],
)
def test_a_global_bf16_linear_fails_forward_logits_against_the_clean_reference(installed, tmp_path, blind):
    name = "cp_linear_bf16" + ("_blind" if blind else "")
    marks = installed(name, LINEAR_BF16 + (BLIND_GUARD if blind else ""))
    code, output, record = check(tmp_path, name)
    assert record is not None, output
    assert code == 1 and record["passed"] is False
    failed = failing(record)
    # The reference is FP32 (it ran where the patch never was): the logits differ by BF16's rounding, far above the
    # FP32 tolerance. Before the clean room the reference shared the patch and the error was 0.0.
    logits = failed["forward-logits"]
    assert logits["tolerance"] == tolerance_for("FP32", "pure").logits
    assert logits["measured"] > 100 * logits["tolerance"], logits
    assert record["precision"]["effective"] == "FP32" and "precision" not in failed  # the label says FP32
    assert ("identities" in failed) is not blind, failed  # blinded, the guard says nothing; the numbers still do
    # The plugin ran, and only in another process: this one, the judge, never imported it.
    assert imported_in(marks) and os.getpid() not in imported_in(marks)
    assert f"llmb_attack_{name}" not in sys.modules


def test_an_honest_plugin_conforms_and_an_unselected_one_is_imported_nowhere(installed, tmp_path):
    marks = installed("cp_bystander", LINEAR_BF16)
    code, output, record = check(tmp_path, "cpu")
    assert record is not None, output
    assert code == 0 and record["passed"] is True, failing(record)
    assert record["plugin"]["name"] == "cpu"
    assert not imported_in(marks), "an installed plugin that was not selected was imported"
