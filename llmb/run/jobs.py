"""The run on every rank of a multi-process job: the entry points torch's launcher starts in each process (the
benchmark's runs, and the equivalence checks' gradients and updates)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from llmb.distributed import job as distributed
from llmb.run.options import RunOptions, resolve
from llmb.run.runner import prepare, run

if TYPE_CHECKING:
    from llmb.records import Result


def run_job(runs: list[RunOptions]) -> list[Result]:
    """Each rank's entrypoint: the runs (one per precision) in this process's group; rank 0 returns the records."""
    try:
        return [record for record in (run(options) for options in runs) if record is not None]
    finally:
        distributed.shutdown()


def launch_runs(spec: distributed.LaunchSpec, runs: list[RunOptions]) -> list[Result]:
    """Launch the runs on every rank; the records come back from rank 0 (none on the other nodes)."""
    return distributed.launch(spec, run_job, runs).get(0) or []


def gradients_after_one_step(runs: list[RunOptions]) -> list[dict[str, torch.Tensor]]:
    """Each rank's entrypoint for the equivalence check: prepare each run exactly as `llmb run` does (its own seeded
    batch per rank, the parallel wrapper), take one harness step, and return rank 0's view of the whole gradients.
    With the same global batch, one process must get the same gradients: that is what data parallelism promises."""
    gathered = []
    try:
        for options in runs:
            plugin, device, settings = resolve(options)
            session = prepare(options, plugin, device, settings)
            session.trainer.step()
            grads = distributed.full_gradients(session.model)
            if session.world.rank == 0:
                gathered.append(grads)
    finally:
        distributed.shutdown()
    return gathered


def updates_after_steps(runs: list[RunOptions], steps: int) -> list[dict[str, torch.Tensor]]:
    """Each rank's entrypoint for the equivalence check: prepare each run exactly as `llmb run` does (its layout,
    its batches seeded by data-parallel rank), take `steps` harness steps, and return, on rank 0, every parameter's
    update (after minus before) over the whole model: the pipeline stages' parts gathered into one."""
    gathered = []
    try:
        for options in runs:
            plugin, device, settings = resolve(options)
            session = prepare(options, plugin, device, settings)
            before = distributed.full_parameters(session.model)
            for _ in range(steps):
                session.trainer.step()
            after = distributed.full_parameters(session.model)
            mine = {name: after[name] - before[name] for name in after}
            world = session.world
            parts = [None] * world.world_size
            torch.distributed.all_gather_object(parts, mine)
            if world.rank == 0:
                whole: dict = {}
                for part in parts:
                    for name, value in part.items():
                        whole.setdefault(name, value)
                gathered.append(whole)
    finally:
        distributed.shutdown()
    return gathered
