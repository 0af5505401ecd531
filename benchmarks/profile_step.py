"""Operator profile of one training step (forward, backward, AdamW) of llmb's model and its peers, side by side.

Each model is built at the same shape, gets the same AdamW (fused unless --adamw says otherwise) and the same
batch; after warmup steps, `torch.profiler` records --steps steps of each and the table lists the operators by
self CPU time, with each peer's time for the same operator. This is what says where a model definition spends
its step, so that changes to `llmb/model.py` follow a measured cause.

    python benchmarks/profile_step.py --preset small --batch-sizes 1,4,8 --threads 1
"""

from __future__ import annotations

import click
import torch
from common import command_line, console, load, machine, print_machine, write_raw
from rich.table import Table

PEERS = ("llmb", "hf", "torchtitan")


def profile_arm(
    label: str, preset: str, shape: dict, batch_size: int, adamw: str, warmup: int, steps: int
) -> dict[str, float]:
    """Self CPU milliseconds per step for each operator over `steps` profiled steps."""
    import arms

    spec = {"preset": preset, "shape": shape, "batch_size": batch_size, "precision": "FP32", "seed": 0}
    spec["optimizer_options"] = {"fused": True} if adamw == "fused" else {}
    step = arms.hand_setup(spec, *arms.MODELS[label])[0]
    for _ in range(warmup):
        step()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    return {e.key: e.self_cpu_time_total / 1e3 / steps for e in prof.key_averages()}


@click.command()
@click.option("--preset", default="small", show_default=True)
@click.option("--hidden-size", type=int, default=None, help="Shape overrides (as llmb run's).")
@click.option("--intermediate-size", type=int, default=None)
@click.option("--num-hidden-layers", type=int, default=None)
@click.option("--num-attention-heads", type=int, default=None)
@click.option("--sequence-length", type=int, default=None)
@click.option("--batch-sizes", default="1,4,8", show_default=True)
@click.option("--peers", default=",".join(PEERS), show_default=True)
@click.option("--adamw", default="fused", type=click.Choice(["fused", "default"]), show_default=True)
@click.option("--warmup-steps", default=1, show_default=True)
@click.option("--steps", default=2, show_default=True)
@click.option("--threads", default=1, show_default=True)
@click.option("--top", default=15, show_default=True)
def main(
    batch_sizes: str, peers: str, adamw: str, warmup_steps: int, steps: int, threads: int, top: int, preset, **shape
) -> None:
    from llmb.spec.presets import build_config

    torch.set_num_threads(threads)
    config = build_config(preset, **shape)
    info = machine()
    print_machine(info)
    labels = peers.split(",")
    results = {}
    for batch in (int(b) for b in batch_sizes.split(",")):
        load_before = load()
        per = {label: profile_arm(label, preset, shape, batch, adamw, warmup_steps, steps) for label in labels}
        results[batch] = {"load_before": load_before, "load_after": load(), "self_cpu_ms_per_step": per}
        totals = {label: sum(ops.values()) for label, ops in per.items()}
        table = Table(
            title=f"batch {batch}: self CPU ms per step, top {top} operators of llmb (load "
            f"{load_before[0]} -> {load()[0]})"
        )
        table.add_column("operator")
        for label in labels:
            table.add_column(label, justify="right")
        ranked = sorted(set().union(*per.values()), key=lambda k: -per[labels[0]].get(k, 0.0))
        for key in ranked[:top]:
            table.add_row(key, *[f"{per[label].get(key, 0.0):.1f}" for label in labels])
        table.add_row("total", *[f"{totals[label]:.1f}" for label in labels])
        console.print(table)
        for label in labels[1:]:
            only = sorted((k for k in per[label] if k not in per[labels[0]]), key=lambda k: -per[label][k])[:5]
            console.print(
                f"{label}'s own operators (not in {labels[0]}): " + ", ".join(f"{k} {per[label][k]:.1f}" for k in only),
                highlight=False,
            )
    write_raw(
        "profile_step",
        {
            "benchmark": "profile_step",
            "command": command_line(),
            "machine": info,
            "config": config.to_dict(),
            "adamw": adamw,
            "steps": steps,
            "results": results,
        },
    )


if __name__ == "__main__":
    main()
