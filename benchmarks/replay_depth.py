"""How deep the judge's replay goes on its budget, and what it costs: `llmb run` with the whole window never drawn
(`--replay-whole 0`), so the depth past the first `--replay-steps` is what `--replay-budget` of the run's wall time
affords (llmb.judge.replay.replay). Per configuration: the steps replayed of the window's, whether that was the whole
window, the replay's seconds against its budget and the run's, and the replay's share of the whole `llmb run`'s
wall time as the user waits for it.

    python benchmarks/replay_depth.py --configs tiny:FP32:50,tiny:BF16:50,small:FP32:10,small:FP32:50
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import click
from common import command_line, console, machine, print_machine, write_raw

from llmb.terminal import console as term


def parse_configs(text: str) -> list[dict]:
    """`preset:PRECISION:steps` items, comma-separated."""
    configs = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        try:
            preset, precision, steps = item.split(":")
            configs.append({"preset": preset, "precision": precision.upper(), "steps": int(steps)})
        except ValueError:
            raise click.BadParameter(f"{item!r} is not preset:PRECISION:steps") from None
    return configs


def measure(config: dict, batch_size: int, device: str, budget: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="llmb-replay-depth-") as out:
        command = [
            sys.executable, "-m", "llmb", "run", "--device", device, "--preset", config["preset"],
            "--precision", config["precision"], "--batch-size", str(batch_size), "--steps", str(config["steps"]),
            "--replay-whole", "0", "--replay-budget", str(budget), "--out", out,
        ]  # fmt: skip
        started = time.perf_counter()
        proc = subprocess.run(command, capture_output=True, text=True)
        wall = time.perf_counter() - started
        files = sorted(Path(out).glob("*.json"))
        if proc.returncode or not files:
            return {**config, "error": f"exit {proc.returncode}: {(proc.stderr.strip().splitlines() or [''])[-1]}"}
        record = json.loads(files[-1].read_text())
    replay = record["evidence"]["replay"]
    return {
        **config,
        "batch_size": batch_size,
        "tokens_per_second": record["tokens_per_second"],
        "replayed_steps": replay["steps"],
        "whole_window": replay["whole_window"],
        "replay_seconds": replay["seconds"],
        "budget_seconds": replay.get("budget_seconds"),
        "run_seconds": replay["drawn"]["run_seconds"],
        "llmb_wall_seconds": wall,
        "replay_passed": replay["passed"],
    }


@click.command()
@click.option("--configs", default="tiny:FP32:50,tiny:BF16:50,small:FP32:10,small:FP32:50", show_default=True)
@click.option("--batch-size", default=1, show_default=True, type=int)
@click.option("--device", default="cpu", show_default=True)
@click.option("--budget", default=0.10, show_default=True, type=float, help="--replay-budget for every run.")
def main(configs: str, batch_size: int, device: str, budget: float) -> None:
    info = machine()
    print_machine(info)
    rows = [measure(config, batch_size, device, budget) for config in parse_configs(configs)]
    table = term.table(f"The replay's depth on a budget of {budget:.0%} of the run's wall time (--replay-whole 0)")
    for column in ("preset", "precision", "steps", "replayed", "whole", "replay s", "budget s", "run s", "share"):
        term.column(table, column, numeric=column not in ("preset", "precision", "whole"))
    for row in rows:
        if "error" in row:
            term.row(table, row["preset"], row["precision"], str(row["steps"]), row["error"], "", "", "", "", "")
            continue
        term.row(
            table,
            row["preset"],
            row["precision"],
            str(row["steps"]),
            str(row["replayed_steps"]),
            "yes" if row["whole_window"] else "no",
            f"{row['replay_seconds']:.2f}",
            f"{row['budget_seconds'] or 0:.2f}",
            f"{row['run_seconds']:.1f}",
            f"{row['replay_seconds'] / row['llmb_wall_seconds']:.1%}",
        )
    console.print(table)
    write_raw("replay_depth", {"command": command_line(), "machine": info, "budget": budget, "rows": rows})


if __name__ == "__main__":
    main()
