"""The untimed audit step out of memory: nothing measured is lost (llmb.run.audit_step).

The audit step runs eager under the dispatch recorder after the last window, and needs more device memory than the
compiled loop it follows (one H200, official shape, FP8 batch 64: 42.1 GB against 27.0). A CPU has no device memory
to exhaust, so the out-of-memory here is simulated by the test backend oomtest (tests/llmb_oomtest.py): its
`oom_in_audit_above_rows` raises torch.OutOfMemoryError, as a GPU would, in a training step under a dispatch mode
above that many rows, and nowhere else.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from conftest import TINY, only_record, oomtest_env
from llmb_oomtest import OomTestBackend

from llmb.run import runner
from llmb.run.audit_step import audit_within_memory
from llmb.spec.presets import PRESETS


def oom_run(register_backend, audit_limit: int, batch_size: int = 4) -> dict:
    register_backend(OomTestBackend())
    options = runner.RunOptions(
        config=PRESETS["tiny"], preset="tiny", plugin="oomtest", device="cpu", batch_size=batch_size, steps=2,
        warmup_steps=1, repeats=2, settings={"oom_in_audit_above_rows": str(audit_limit)},
    )  # fmt: skip
    return runner.run(options).to_dict()


def test_an_audit_step_out_of_memory_is_audited_on_fewer_rows_and_the_windows_are_kept(register_backend):
    """At batch 4 with room for 1 row under the recorder: the audit step is retried on 2 rows, then 1, and the run
    keeps both measured windows, its figure, and the dispatch census, with the rows the census saw. Before
    llmb.run.audit_step, this run ended in an out-of-memory error and wrote nothing."""
    record = oom_run(register_backend, audit_limit=1)
    window = record["precision"]["audit"]["window"]
    assert window["audit_rows"] == 1
    assert record["precision"]["audit"]["dispatch"]["matmul_calls"] > 0  # the census of the 1-row step
    assert len(record["timing"]["repeat_window_seconds"]) == 2
    assert record["tokens_per_second"] > 0
    assert not [r for r in record["invalid_reasons"] if "audit step" in r], record["invalid_reasons"]


def test_the_audit_step_at_the_windows_rows_says_nothing_of_rows(register_backend):
    """Where the window's rows fit (the limit at the batch), the record carries no audit_rows."""
    record = oom_run(register_backend, audit_limit=4)
    assert "audit_rows" not in record["precision"]["audit"]["window"]
    assert record["precision"]["audit"]["dispatch"]["matmul_calls"] > 0


def test_an_audit_step_that_never_fits_keeps_the_measurement_and_is_invalid(register_backend):
    """Where not even one row fits under the recorder, the record is still written with its windows, and is invalid
    with the reason named; the census it could not take is absent, not faked."""
    record = oom_run(register_backend, audit_limit=0)
    assert len(record["timing"]["repeat_window_seconds"]) == 2
    assert record["tokens_per_second"] > 0
    assert record["valid"] is False
    reasons = [r for r in record["invalid_reasons"] if "the audit step ran out of memory" in r]
    assert reasons and "from 4 down to 1" in reasons[0], record["invalid_reasons"]
    assert "dispatch" not in record["precision"]["audit"]


class _Window:
    """A stand-in WindowAudit whose audit step raises what it is given (the retry logic alone)."""

    def __init__(self, error: BaseException) -> None:
        self.error, self.problems, self.calls = error, [], []

    def audit_step(self, step, rows=None) -> None:
        self.calls.append(rows)
        raise self.error


class _Trainer:
    def __init__(self, rows: int) -> None:
        self.batch = torch.zeros(rows, 8, dtype=torch.long)

    def step(self) -> None:  # never called: the stand-in window raises first
        raise AssertionError


def test_other_errors_and_multi_process_runs_are_not_retried():
    """Only an out-of-memory is retried, and only where this process is the whole run: the ranks of a job step
    together through collectives, so one rank cannot step again alone."""
    window = _Window(ValueError("not memory"))
    with pytest.raises(ValueError):
        audit_within_memory(window, _Trainer(8), torch.device("cpu"), alone=True)
    assert window.calls == [None]
    window = _Window(torch.OutOfMemoryError("simulated"))
    with pytest.raises(torch.OutOfMemoryError):
        audit_within_memory(window, _Trainer(8), torch.device("cpu"), alone=False)
    assert window.calls == [None]
    window = _Window(torch.OutOfMemoryError("simulated"))
    trainer = _Trainer(8)
    audit_within_memory(window, trainer, torch.device("cpu"), alone=True)
    assert window.calls == [None, 4, 2, 1]  # halved to one row, then given up and said
    assert trainer.batch.shape[0] == 1 and len(window.problems) == 1


def test_llmb_run_with_the_judge_keeps_a_run_whose_audit_step_ran_out_of_memory(tmp_path, oomtest_site):
    """The same through `llmb run` in a subprocess, with the clean room's judge: exit 0, the record judged (its
    replay passed) and the audit's rows said."""
    command = [sys.executable, "-m", "llmb", "run", *TINY, "--device", "cpu", "--batch-size", "4", "--plugin",
               "oomtest", "-O", "oom_in_audit_above_rows=1", "--out", str(tmp_path)]  # fmt: skip
    done = subprocess.run(command, env=oomtest_env(oomtest_site), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    record = only_record(tmp_path)
    assert record["precision"]["audit"]["window"]["audit_rows"] == 1
    assert record["evidence"]["replay"]["passed"] is True
