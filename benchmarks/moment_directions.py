"""How far a 16-bit window's AdamW first moments part from the judge's replay, three ways: the per-parameter sums
of squares (what the judge compared alone before 2026-11-27), the whole moments' relative L2 error (what no seal can
carry), and their projection onto random directions drawn from a key (llmb.audit.evidence.moment_seal, what the
judge compares now: `same-precision-moment-directions`).

Arms, each trained in-process from the same initial weights on one synthetic batch per draw, with torch's fused
AdamW in the run's 16-bit format: the eager reference, an eager twin (0 on the CPU), the same model compiled by
Inductor (an honest kernel change), and the red team's stale gradients (step 1's gradients reused for every later
step: tests/redteam/test_redteam_steps_at_risk.py). The honest compiled arm is the peer the stale arm is read
against, draw by draw. Nothing is timed.

`--mode amp`: FP32 weights and AdamW, each arm under autocast(dtype) (FP16's losses scaled, as the harness's loop),
read against an FP32 arm (the judge's FP32 replay) and, as the judge's `autocast-moment-directions` reads them, against
the eager autocast arm (its second replay) in yardsticks: the eager autocast arm's own distance from the FP32 one.

    python benchmarks/moment_directions.py --preset small --dtype bfloat16 --steps 20 --draws 4
    python benchmarks/moment_directions.py --preset tiny --mode amp --steps 5 --draws 4
"""

from __future__ import annotations

import math

import click
import torch
from common import command_line, console, machine, write_raw
from rich.table import Table

from llmb.audit import evidence
from llmb.model import LlamaModel
from llmb.spec.presets import ADAMW_HYPERPARAMETERS, PRESETS

ARMS = ("eager", "compiled", "stale")


def train(
    config, dtype: torch.dtype, arm: str, draw: int, steps: int, amp: bool = False
) -> tuple[list, torch.optim.Optimizer]:
    """One arm's window. `amp`: FP32 weights and AdamW, the steps under autocast(dtype); the "reference" arm is the
    judge's replay of such a run: FP32, no autocast."""
    torch.manual_seed(0)
    model = LlamaModel(config).to(torch.float32 if amp else dtype)
    optimizer = torch.optim.AdamW(model.parameters(), **ADAMW_HYPERPARAMETERS, fused=True)
    generator = torch.Generator().manual_seed(draw)
    batch = torch.randint(0, config.vocab_size, (1, config.sequence_length), generator=generator)
    forward = torch.compile(model) if arm == "compiled" else model
    autocast = amp and arm != "reference"
    # FP16 under autocast needs the harness's loss scaling (llmb.training.loop), or small gradients underflow.
    scaler = torch.amp.GradScaler("cpu") if autocast and dtype == torch.float16 else None
    first = None
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=dtype, enabled=autocast):
            loss, _ = forward(batch, batch)
        (scaler.scale(loss) if scaler else loss).backward()
        if arm == "stale":  # the backward ran for the loss; its gradients are replaced by step 1's
            if first is None:
                first = [p.grad.clone() for p in model.parameters()]
            for p, g in zip(model.parameters(), first, strict=True):
                p.grad = g.clone()
        if scaler:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
    return list(model.parameters()), optimizer


def errors(candidate, reference, key: int) -> dict[str, float]:
    """Squares, whole-tensor L2 and projection errors of one arm's moments against the reference's."""
    (params_a, opt_a), (params_b, opt_b) = candidate, reference
    a = [opt_a.state[p]["exp_avg"].double() for p in params_a]
    b = [opt_b.state[p]["exp_avg"].double() for p in params_b]
    squares_a, projection_a = evidence.moment_seal(params_a, opt_a, key)
    squares_b, projection_b = evidence.moment_seal(params_b, opt_b, key)

    def relative(x: torch.Tensor, y: torch.Tensor) -> float:
        return ((x - y).norm() / y.norm()).item()

    whole = (sum((x - y).square().sum() for x, y in zip(a, b, strict=True)).sqrt()
             / sum(y.square().sum() for y in b).sqrt()).item()  # fmt: skip
    return {
        "digest": relative(squares_a.flatten(), squares_b.flatten()),
        "squares": relative(squares_a[:, 1], squares_b[:, 1]),
        "whole": whole,
        "directions": relative(projection_a.flatten(), projection_b.flatten()),
    }


@click.command()
@click.option("--preset", type=click.Choice(["tiny", "small"]), default="small")
@click.option("--dtype", type=click.Choice(["bfloat16", "float16"]), default="bfloat16")
@click.option("--mode", type=click.Choice(["pure", "amp"]), default="pure",
              help="pure: 16-bit weights and AdamW against an eager twin; amp: FP32 weights under autocast against "
                   "the FP32 replay")  # fmt: skip
@click.option("--steps", type=click.IntRange(2, 1000), default=20)
@click.option("--draws", type=click.IntRange(1, 100), default=4)
@click.option("--threads", type=click.IntRange(1, 512), default=None)
def main(preset: str, dtype: str, mode: str, steps: int, draws: int, threads: int | None) -> None:
    if threads:
        torch.set_num_threads(threads)
    config, sixteen = PRESETS[preset], getattr(torch, dtype)
    amp = mode == "amp"
    against = "the FP32 replay" if amp else "the eager replay"
    table = Table(title=f"AdamW first moments against {against} ({preset}, {dtype} {mode}, {steps} steps)")
    columns = ["draw", "arm", "digest", "squares", "whole L2", "directions", "directions / honest compiled"]
    # amp: the judge's own statistic too (autocast_checks): the arm's projection against the eager autocast arm's (the
    # judge's second replay), in yardsticks (the eager autocast arm's own distance from the FP32 replay).
    columns += ["yardsticks from eager autocast"] if amp else []
    for name in columns:
        table.add_column(name, justify="right")
    rows = []
    for draw in range(1, draws + 1):
        reference = train(config, sixteen, "reference" if amp else "eager", draw, steps, amp)
        trained = {arm: train(config, sixteen, arm, draw, steps, amp) for arm in ARMS}
        measured = {arm: errors(run, reference, key=draw) for arm, run in trained.items()}
        for arm, error in measured.items():
            honest = measured["compiled"]["directions"]
            ratio = error["directions"] / honest if honest else 0.0
            cells = [f"{error[k]:.3g}" for k in ("digest", "squares", "whole", "directions")] + [f"{ratio:.3g}"]
            if amp:
                yardstick = measured["eager"]["directions"]
                error["yardsticks"] = errors(trained[arm], trained["eager"], key=draw)["directions"] / (
                    yardstick or math.inf
                )
                cells.append(f"{error['yardsticks']:.3g}")
            rows.append({"draw": draw, "arm": arm, **error})
            table.add_row(str(draw), arm, *cells)
    console.print(table)
    payload = {
        "command": command_line(),
        "machine": machine(),
        "preset": preset,
        "dtype": dtype,
        "mode": mode,
        "steps": steps,
    }
    write_raw("moment_directions", {**payload, "rows": rows})


if __name__ == "__main__":
    main()
