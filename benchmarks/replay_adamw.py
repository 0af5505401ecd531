"""The judge's replay with each of torch's AdamW implementations: the per-tensor loop (what every FP32 replay used
before it took the run's own) against the fused kernel (what the cpu and cuda plugins' runs use), on the same window,
alternating in one process after a warm-up replay. Prints each one's seconds past the model's build, the ratio, and
how far apart their losses and AdamW moments end (the run's implementation is what the replay should follow).

    python benchmarks/replay_adamw.py --preset small --batch-size 1 --steps 6 --rounds 4
"""

from __future__ import annotations

import statistics

import click
from common import command_line, console, machine, print_machine, write_raw

from llmb.judge import replay
from llmb.judge.replay_checks import relative_error
from llmb.spec.presets import build_config
from llmb.terminal import console as term

IMPLEMENTATIONS = {"per-tensor": {"foreach": False}, "fused": {"fused": True}}


@click.command()
@click.option("--preset", default="small", show_default=True)
@click.option("--batch-size", default=1, show_default=True, type=int)
@click.option("--steps", default=6, show_default=True, type=int, help="The window's steps, all replayed.")
@click.option("--rounds", default=4, show_default=True, type=int)
def main(preset: str, batch_size: int, steps: int, rounds: int) -> None:
    info = machine()
    print_machine(info)
    config = build_config(preset)
    window = dict(config=config, seed=0, batch_size=batch_size, world_size=1, challenge=12345, losses=steps,
                  window_steps=steps)  # fmt: skip
    replay.replay(**window)  # warm-up: the process's first replay pays its cold start
    seconds: dict[str, list[float]] = {name: [] for name in IMPLEMENTATIONS}
    last = {}
    for _ in range(rounds):
        for name, options in IMPLEMENTATIONS.items():
            replayed = replay.replay(**window, optimizer_options=options)
            seconds[name].append(replayed.seconds - (replayed.build_seconds or 0.0))
            last[name] = replayed
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    table = term.table(f"Replay of a {steps}-step window, {preset} preset, batch {batch_size}, {rounds} rounds")
    for column in ("AdamW", "median s", "range s", "per step s"):
        term.column(table, column, numeric=column != "AdamW")
    for name, values in seconds.items():
        term.row(table, name, f"{medians[name]:.2f}", f"{min(values):.2f}-{max(values):.2f}",
                 f"{medians[name] / steps:.3f}")  # fmt: skip
    console.print(table)
    ratio = medians["fused"] / medians["per-tensor"]
    apart = {
        "losses": relative_error(last["fused"].losses, last["per-tensor"].losses),
        "moments": relative_error(sum(last["fused"].moments_end, []), sum(last["per-tensor"].moments_end, [])),
    }
    console.print(f"fused / per-tensor seconds: {ratio:.3f}; apart after {steps} steps: losses {apart['losses']:.2e}, "
                  f"moments {apart['moments']:.2e}")  # fmt: skip
    write_raw("replay_adamw", {"command": command_line(), "machine": info, "preset": preset, "batch_size": batch_size,
                               "steps": steps, "seconds": seconds, "ratio": ratio, "apart": apart})  # fmt: skip


if __name__ == "__main__":
    main()
