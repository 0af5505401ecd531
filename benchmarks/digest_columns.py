"""Which column of a pure 16-bit window's digests parts from the judge's replay in its own format: for each llmb
result file given, the window is replayed again as the judge replays it (llmb.judge.replay.replay, the record's
16-bit format and AdamW implementation), and the relative error of the parameter and first-moment digests is printed
for both columns together (what the judge compared before 2026-11-26), the per-parameter signed sums alone and the
sums of squares alone (what it compares now, llmb.judge.replay_checks.same_precision_checks).

Results of any plugin serve, the red team's included: an honest compiled window and a window that skipped work show
which column separates them. Nothing is timed.

    llmb run --preset tiny --precision FP16 --steps 50 --batch-size 4 -O compile=default --replay-whole 1 --out r
    python benchmarks/digest_columns.py 'r/*.json'
"""

from __future__ import annotations

import glob
import json
import re
from pathlib import Path

import click
import torch
from common import command_line, console, machine, write_raw
from rich.table import Table

from llmb.judge import replay, replay_checks
from llmb.model import ModelConfig
from llmb.spec.tolerances import nats_fallen

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def columns(candidate: list, reference: list) -> dict[str, float]:
    """Relative error of a digest ([sum, sum of squares] per parameter), measured as the judge measures it
    (replay_checks.relative_error): both columns, the sums, the squares."""

    def column(rows: list, index: int) -> list[float]:
        return [float(row[index]) for row in rows]

    both = replay_checks.relative_error([float(x) for row in candidate for x in row],
                                        [float(x) for row in reference for x in row])  # fmt: skip
    sums = replay_checks.relative_error(column(candidate, 0), column(reference, 0))
    squares = replay_checks.relative_error(column(candidate, 1), column(reference, 1))
    return {"both": both, "sums": sums, "squares": squares}


def measure(path: Path) -> dict | None:
    """The record's headline window against a fresh replay in its own format (None: no pure 16-bit whole window)."""
    record = json.loads(path.read_text())
    evidence = record.get("evidence") or {}
    same = (evidence.get("replay") or {}).get("same_precision")
    windows = evidence.get("windows") or []
    if not same or not windows:
        return None
    window = windows[evidence.get("headline_window", 0)]
    steps = int(record["steps"])
    fused = bool(((record.get("optimizer") or {}).get("defaults") or {}).get("fused"))
    replayed = replay.replay(
        ModelConfig(**record["config"]), int(record["seed"]), int(record["batch_size"]), 1, int(window["challenge"]),
        steps, steps, dtype=DTYPES[same["dtype"]], optimizer_options={"fused": True} if fused else {"foreach": False},
    )  # fmt: skip
    losses = [abs(a - b) / abs(b) for a, b in zip(window["losses"], replayed.losses, strict=False)]
    return {
        "file": str(path),
        "plugin": (record.get("plugin") or {}).get("name"),
        "compile": ((record.get("plugin") or {}).get("settings") or {}).get("compile"),
        "precision": record["precision"]["effective"],
        "batch_size": record["batch_size"],
        "steps": steps,
        "nats_fallen": nats_fallen(replayed.losses[0], replayed.losses[-1]),
        "worst_loss": max(losses),
        "parameters": columns(window["digest_end"], replayed.digest_end),
        "moments": columns(window["moments_end"], replayed.moments_end),
    }


@click.command()
@click.argument("patterns", nargs=-1, required=True)
def main(patterns: tuple[str, ...]) -> None:
    paths = sorted({Path(p) for pattern in patterns for p in glob.glob(pattern)})
    if not paths:
        raise click.UsageError("no result files match")
    table = Table(title="digests against the replay in the run's own format (relative error)")
    for name in ("result", "format", "batch", "steps", "worst loss", "params both", "params squares",
                 "moments both", "moments sums", "moments squares"):  # fmt: skip
        table.add_column(name, justify="left" if name == "result" else "right")
    rows = []
    for path in paths:
        try:
            row = measure(path)
        except (OSError, ValueError, KeyError, TypeError, IndexError) as error:  # not an llmb result: say so, go on
            console.print(f"skipped: {path} ({type(error).__name__}: {error})", markup=False, highlight=False)
            continue
        if row is None:
            console.print(f"skipped: {path} (no pure 16-bit whole window)", markup=False, highlight=False)
            continue
        rows.append(row)
        label = re.sub(r"[^\w.+=-]", "_", f"{row['plugin']} compile={row['compile']} {path.parent.name}")
        p, m = row["parameters"], row["moments"]
        table.add_row(label, row["precision"], str(row["batch_size"]), str(row["steps"]), f"{row['worst_loss']:.2g}",
                      f"{p['both']:.2g}", f"{p['squares']:.2g}", f"{m['both']:.3g}", f"{m['sums']:.3g}",
                      f"{m['squares']:.3g}")  # fmt: skip
    if not rows:
        raise click.ClickException("no pure 16-bit whole window among the files given")
    console.print(table)
    write_raw("digest_columns", {"command": command_line(), "machine": machine(), "rows": rows})


if __name__ == "__main__":
    main()
