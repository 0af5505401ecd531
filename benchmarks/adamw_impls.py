"""AdamW's three torch implementations on the model's real parameters: the per-tensor loop, foreach and fused.

Only optimizer.step() is timed (gradients are random and fixed), in one process, the implementations alternating
step by step so that load on the machine hits each alike. This is the measurement behind the plugins' AdamW
defaults; the end-to-end effect is the "fused AdamW" row of compile_modes.py.

    python benchmarks/adamw_impls.py --preset small --rounds 10
"""

from __future__ import annotations

import statistics
import time

import click
import torch
from arms import synchronize
from common import command_line, console, load, machine, write_raw
from rich.table import Table

from llmb.audit import precision
from llmb.model import LlamaModel
from llmb.spec.presets import PRESETS, build_config
from llmb.training.loop import build_optimizer

IMPLEMENTATIONS = {"for-loop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}


@click.command()
@click.option("--preset", default="small", show_default=True, type=click.Choice(list(PRESETS)))
@click.option("--precision", "precision_name", default="FP32", show_default=True, type=click.Choice(["FP32", "BF16"]))
@click.option("--device", default="cpu", show_default=True)
@click.option("--rounds", default=10, show_default=True, type=int)
def main(preset: str, precision_name: str, device: str, rounds: int) -> None:
    """Median optimizer.step() time per AdamW implementation."""
    target = torch.device(device)
    torch.manual_seed(0)
    model = LlamaModel(build_config(preset)).to(target, precision.recipe(precision_name, "pure").param_dtype)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    optimizers = {name: build_optimizer(model, options) for name, options in IMPLEMENTATIONS.items()}
    info = machine()
    times: dict[str, list[float]] = {name: [] for name in optimizers}
    loads = []
    for index in range(rounds + 1):  # round 0 creates the optimizer state and is not kept
        loads.append(load())
        for name, optimizer in optimizers.items():
            synchronize(target)
            start = time.perf_counter()
            optimizer.step()
            synchronize(target)
            if index:
                times[name].append(time.perf_counter() - start)
    medians = {name: statistics.median(values) for name, values in times.items()}
    table = Table(
        title=f"AdamW step, {preset} preset ({sum(p.numel() for p in model.parameters()):,} parameters), "
        f"{precision_name}, {device}, medians of {rounds}"
    )
    for column in ("implementation", "step ↓", "speed-up vs for-loop ↑"):
        table.add_column(column, justify="left" if column == "implementation" else "right")
    for name, value in sorted(medians.items(), key=lambda item: item[1]):
        table.add_row(name, f"{value * 1000:.1f} ms", f"{medians['for-loop'] / value:.2f}x")
    console.print(table)
    console.print(f"load (1 min) during the rounds: {min(x[0] for x in loads)} to {max(x[0] for x in loads)}")
    write_raw(
        "adamw_impls",
        {
            "benchmark": "adamw_impls",
            "command": command_line(),
            "machine": info,
            "load_per_round": loads,
            "load_at_end": load(),
            "options": {"preset": preset, "precision": precision_name, "device": device, "rounds": rounds},
            "step_seconds": times,
            "median_step_seconds": medians,
            "speedup_vs_for_loop": {name: medians["for-loop"] / value for name, value in medians.items()},
        },
    )


if __name__ == "__main__":
    main()
