"""What a run's roofline costs: `python benchmarks/roofline_cost.py --against ab99930`.

Every `llmb run` measures the matmul roofline after its window (`llmb.run.roofline.for_run`): the model's GEMMs at the
run's batch and a large square GEMM whose side is searched. That is wall time a user waits for and CI pays in every
run subprocess. This times `for_run` of this tree against the same function of a git revision (its
llmb/run/roofline.py, loaded beside this tree's), alternating call by call in one process, on the CPU backend, and
prints each preset's median seconds, their ratio, and the square GEMM's side and rate each measured (the figure must
not move, only its cost).
"""

from __future__ import annotations

import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import click
import torch
from common import HERE, console, load, machine, write_raw

from llmb import CpuBackend
from llmb.run import roofline
from llmb.spec.presets import PRESETS


def _at_revision(revision: str):
    """llmb/run/roofline.py as it was at `revision`, as a module of its own (it imports this tree's llmb)."""
    source = subprocess.run(
        ["git", "show", f"{revision}:llmb/run/roofline.py"], cwd=HERE.parent, capture_output=True, text=True, check=True
    ).stdout
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"roofline_{revision}.py"
        path.write_text(source)
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up
        spec.loader.exec_module(module)
    return module


def _square(result) -> tuple[int, float]:
    (square,) = [rate for rate in result.rates if rate.gemm.name == "square"]
    return square.gemm.m, square.flops_per_second


@click.command()
@click.option("--against", required=True, help="git revision whose for_run is the peer.")
@click.option("--presets", default="tiny,small", show_default=True)
@click.option("--precision", default="FP32", show_default=True)
@click.option("--batch-size", default=1, show_default=True)
@click.option("--rounds", default=4, show_default=True, help="calls of each, alternating (who goes first too).")
@click.option("--threads", default=0, show_default=True, help="torch threads (0: torch's default).")
def main(against, presets, precision, batch_size, rounds, threads):
    if threads:
        torch.set_num_threads(threads)
    info = machine()
    arms = {"tree": roofline, against: _at_revision(against)}
    device, backend = torch.device("cpu"), CpuBackend()
    result = {"machine": info, "against": against, "precision": precision, "batch_size": batch_size, "presets": {}}
    for preset in presets.split(","):
        seconds = {name: [] for name in arms}
        squares = {name: [] for name in arms}
        for i in range(rounds):
            for name in list(arms)[:: 1 if i % 2 == 0 else -1]:
                start = time.perf_counter()
                measured = arms[name].for_run(backend, device, precision, PRESETS[preset], batch_size)
                seconds[name].append(time.perf_counter() - start)
                squares[name].append(_square(measured))
        median = {name: statistics.median(values) for name, values in seconds.items()}
        result["presets"][preset] = {"seconds": seconds, "square_side_and_flops": squares, "median_seconds": median}
        for name in arms:
            rates = ", ".join(f"{side} {flops / 1e9:.1f}" for side, flops in squares[name])
            console.print(
                f"{preset} {name}: median {median[name]:.2f} s of {rounds}; square side GFLOP/s: {rates}",
                highlight=False,
            )
        console.print(f"{preset} tree / {against}: {median['tree'] / median[against]:.3f}", highlight=False)
    result["load_at_end"] = load()
    write_raw("roofline_cost", result)


if __name__ == "__main__":
    main()
