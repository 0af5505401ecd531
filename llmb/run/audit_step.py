"""The untimed audit step after the last window, within the device's memory.

The audit step (llmb.audit.window) runs the harness's step eager under the dispatch recorder, which needs more
device memory than the compiled loop it follows: on one H200 at the official shape, FP8 batch 64 peaked at 42.1 GB
against the loop's 27.0 (benchmarks/RESULTS.md section 25). At the largest batch a compiled loop fits, that step can
run out of memory after every window was measured, and the run would end with nothing. So where it does, the step is
audited again on the first half of the window's rows, halved until it fits, and the record says how many rows it ran
(precision.audit.window.audit_rows). The census it takes is of the formats the operators received, which no row
count changes for a model that does not look (one that looks can see the recorder itself; the replay, not this
census, is the function check: docs/integrity.md). Where not even one row fits, the run keeps its measured windows
and is invalid, saying why.

One process only: the ranks of a job step together through collectives, and one rank cannot step again alone, so
an out-of-memory there still ends the job.
"""

from __future__ import annotations

import torch

from llmb.api.errors import first_line
from llmb.audit.window import WindowAudit
from llmb.run.device import free_cached_memory, is_out_of_memory
from llmb.training.loop import Trainer


def audit_within_memory(window: WindowAudit, trainer: Trainer, device: torch.device, alone: bool) -> None:
    """Run `window`'s audit step on `trainer`'s step at the window's batch, or, where the device runs out of memory
    and this process is the whole run (`alone`), on the first half of its rows, halved again until it fits."""
    rows = full = int(trainer.batch.shape[0])
    while True:
        try:
            window.audit_step(trainer.step, rows if rows < full else None)
            return
        except Exception as exc:
            if not alone or not is_out_of_memory(exc):
                raise
            what = first_line(exc) or type(exc).__name__
        free_cached_memory(device)  # the failed step's tensors went with the exception
        if rows == 1:
            window.problems.append(
                f"window: the audit step ran out of memory on {device} at every row count from {full} down to 1 "
                f"({what[:200]}); the formats the operators received are unrecorded"
            )
            return
        rows //= 2
        trainer.batch = trainer.batch[:rows]
