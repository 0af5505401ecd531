"""How far a pure 16-bit window's AdamW first moments part from an eager replay's, three ways: the per-parameter sums
of squares (what the judge compared alone before 2026-11-27), the whole moments' relative L2 error (what no seal can
carry), and their projection onto random directions drawn from a key (llmb.audit.evidence.moment_seal, what the
judge compares now: `same-precision-moment-directions`).

Arms, each trained in-process from the same initial weights on one synthetic batch per draw, with torch's fused
AdamW in the run's 16-bit format: the eager reference, an eager twin (0 on the CPU), the same model compiled by
Inductor (an honest kernel change), and the red team's stale gradients (step 1's gradients reused for every later
step: tests/redteam/test_redteam_steps_at_risk.py). The honest compiled arm is the peer the stale arm is read
against, draw by draw. Nothing is timed.

    python benchmarks/moment_directions.py --preset small --dtype bfloat16 --steps 20 --draws 4
"""

from __future__ import annotations

import click
import torch
from common import command_line, console, machine, write_raw
from rich.table import Table

from llmb.audit import evidence
from llmb.model import LlamaModel
from llmb.spec.presets import ADAMW_HYPERPARAMETERS, PRESETS

ARMS = ("eager", "compiled", "stale")


def train(config, dtype: torch.dtype, arm: str, draw: int, steps: int) -> tuple[list, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = LlamaModel(config).to(dtype)
    optimizer = torch.optim.AdamW(model.parameters(), **ADAMW_HYPERPARAMETERS, fused=True)
    generator = torch.Generator().manual_seed(draw)
    batch = torch.randint(0, config.vocab_size, (1, config.sequence_length), generator=generator)
    forward = torch.compile(model) if arm == "compiled" else model
    first = None
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        loss, _ = forward(batch, batch)
        loss.backward()
        if arm == "stale":  # the backward ran for the loss; its gradients are replaced by step 1's
            if first is None:
                first = [p.grad.clone() for p in model.parameters()]
            for p, g in zip(model.parameters(), first, strict=True):
                p.grad = g.clone()
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
        "squares": relative(squares_a[:, 1], squares_b[:, 1]),
        "whole": whole,
        "directions": relative(projection_a.flatten(), projection_b.flatten()),
    }


@click.command()
@click.option("--preset", type=click.Choice(["tiny", "small"]), default="small")
@click.option("--dtype", type=click.Choice(["bfloat16", "float16"]), default="bfloat16")
@click.option("--steps", type=click.IntRange(2, 1000), default=20)
@click.option("--draws", type=click.IntRange(1, 100), default=4)
@click.option("--threads", type=click.IntRange(1, 512), default=None)
def main(preset: str, dtype: str, steps: int, draws: int, threads: int | None) -> None:
    if threads:
        torch.set_num_threads(threads)
    config, sixteen = PRESETS[preset], getattr(torch, dtype)
    table = Table(title=f"AdamW first moments against the eager replay ({preset}, {dtype}, {steps} steps)")
    for name in ("draw", "arm", "squares", "whole L2", "directions", "directions / honest compiled"):
        table.add_column(name, justify="right")
    rows = []
    for draw in range(1, draws + 1):
        reference = train(config, sixteen, "eager", draw, steps)
        measured = {arm: errors(train(config, sixteen, arm, draw, steps), reference, key=draw) for arm in ARMS}
        for arm, error in measured.items():
            honest = measured["compiled"]["directions"]
            ratio = error["directions"] / honest if honest else 0.0
            rows.append({"draw": draw, "arm": arm, **error})
            table.add_row(str(draw), arm, f"{error['squares']:.3g}", f"{error['whole']:.3g}",
                          f"{error['directions']:.3g}", f"{ratio:.3g}")  # fmt: skip
    console.print(table)
    payload = {"command": command_line(), "machine": machine(), "preset": preset, "dtype": dtype, "steps": steps}
    write_raw("moment_directions", {**payload, "rows": rows})


if __name__ == "__main__":
    main()
