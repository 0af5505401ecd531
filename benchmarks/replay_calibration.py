"""The run replay's tolerances, measured where results are made: each precision and mode against FP32 on one device.

Each arm trains a copy of the same initial model for --steps steps on one batch (a measured window's semantics), and
llmb.judge.replay.compare judges its losses and parameter digest against the FP32 arm's, exactly as the clean room
judges a window against its FP32 CPU replay (on the GPU the FP32 arm matched the CPU replay exactly); a pure 16-bit
arm is also judged against the judge's replay in its own format (replay.same_precision_checks). One JSON line per
arm goes to --out; `llmb/spec/tolerances.py` (REPLAY_TOLERANCES) cites what this printed on an H100 on 2026-11-22
(raw/h100-20261122/replay_calibration.jsonl).

    python benchmarks/replay_calibration.py --device cuda --preset official --seeds 0,1 --batch-sizes 1,8,16
    python benchmarks/replay_calibration.py --device cpu --preset tiny --batch-sizes 1,8
"""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path

import click
import torch
from arms import hand_step  # benchmarks/ is on the path when a script here runs

from llmb.audit import evidence, precision
from llmb.judge import replay
from llmb.model import LlamaModel
from llmb.spec.presets import PRESETS
from llmb.training.loop import build_optimizer

# (precision, mode, fused AdamW): the FP32 arm first, the reference of the others.
ARMS = [
    ("FP32", "pure", None),
    ("TF32", "pure", None),
    ("BF16", "pure", True),
    ("BF16", "pure", False),
    ("BF16", "amp", True),
    ("FP16", "pure", True),
    ("FP16", "pure", False),
    ("FP16", "amp", True),
]


def train(base: LlamaModel, name: str, mode: str, fused: bool | None, batch: torch.Tensor, steps: int) -> tuple:
    """The losses of `steps` steps on one batch, the parameter digest before and after, and AdamW's first-moment
    digest after, as a run records them."""
    device = batch.device
    precision.apply_backend_recipe(name)
    recipe = precision.recipe(name, mode)
    model = copy.deepcopy(base).to(device=device, dtype=recipe.param_dtype)
    model.train()
    optimizer = build_optimizer(model, {"fused": True} if fused else None)
    step = hand_step(model, optimizer, batch, recipe, device, lambda m, b: m(b, labels=b)[0])
    parameters = list(model.parameters())
    start = evidence.as_list(evidence.digest(parameters))
    losses = [float(step()) for _ in range(steps)]
    moments = evidence.as_list(evidence.moment_digest(parameters, optimizer))
    return losses, start, evidence.as_list(evidence.digest(parameters)), moments


@click.command()
@click.option("--device", default="cpu")
@click.option("--preset", type=click.Choice(sorted(PRESETS)), default="tiny")
@click.option("--seeds", default="0", help="Comma-separated model seeds.")
@click.option("--batch-sizes", default="1,8")
@click.option("--steps", default=3, show_default=True)
@click.option("--out", type=click.Path(path_type=Path), default=Path("replay_calibration.jsonl"))
def main(device: str, preset: str, seeds: str, batch_sizes: str, steps: int, out: Path) -> None:
    config, where = PRESETS[preset], torch.device(device)
    began = time.perf_counter()
    with out.open("a") as lines:
        for seed in (int(s) for s in seeds.split(",")):
            torch.manual_seed(seed)
            base = LlamaModel(config)
            for batch_size in (int(b) for b in batch_sizes.split(",")):
                # The batch of a window opened with challenge 1000 + seed: what the judge's own replay draws.
                batch = evidence.global_batch(config, batch_size, 1000 + seed, 1).to(where)
                reference = None
                for name, mode, fused in ARMS:
                    losses, start, end, moments = train(base, name, mode, fused, batch, steps)
                    if reference is None:
                        reference = replay.Replayed(losses, start, end, 0.0, None, moments)
                    row = {"seed": seed, "batch": batch_size, "precision": name, "mode": mode, "fused": fused}
                    row["losses"] = losses
                    fp32_master = mode == "amp" or name in ("FP32", "TF32")
                    window = {"losses": losses, "digest_start": start, "digest_end": end, "moments_end": moments}
                    # The default replay (2 losses, no digest) and a whole-window one (every loss, the digest and
                    # AdamW's first moments: replay.MOMENT_TOLERANCES).
                    for replayed_steps in (2, steps):
                        whole = replayed_steps == steps
                        replayed = replay.Replayed(
                            reference.losses[:replayed_steps], reference.digest_start,
                            reference.digest_end if whole else None, 0.0, None,
                            reference.moments_end if whole else None,
                        )  # fmt: skip
                        checks = replay.compare(window, replayed, name, mode, fp32_master, fused)
                        row[f"checks_{replayed_steps}"] = {c.name: [c.measured, c.tolerance, c.passed] for c in checks}
                    if mode == "pure" and name in replay.SIXTEEN_BIT_DTYPES:
                        # The judge's replay in the run's own format (its kernels, micro-batches, AdamW
                        # implementation): what a whole pure 16-bit window is held to (SAME_PRECISION_TOLERANCES).
                        same = replay.replay(
                            config, seed, batch_size, 1, 1000 + seed, steps, steps, where,
                            replay.SIXTEEN_BIT_DTYPES[name], {"fused": True} if fused else {"foreach": False},
                        )  # fmt: skip
                        checks = replay.same_precision_checks(window, same, name, mode, fused=fused)
                        row["same_precision"] = {c.name: [c.measured, c.tolerance, c.passed] for c in checks}
                    lines.write(json.dumps(row) + "\n")
                    lines.flush()
                    shown = {**row[f"checks_{steps}"], **row.get("same_precision", {})}
                    last = ("-1", f"-{steps}")  # the first and last losses of the window, every other check
                    kept = {k: v for k, v in shown.items() if "loss-" not in k or k.endswith(last)}
                    summary = {k: f"{v[0]:.3g}/{v[1]:g}" for k, v in kept.items()}
                    click.echo(f"seed {seed} batch {batch_size} {name} {mode} fused={fused}: {summary} "
                               f"({time.perf_counter() - began:.0f} s)")  # fmt: skip


if __name__ == "__main__":
    main()
