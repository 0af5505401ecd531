"""Host noise: can this machine resolve a 2% difference between two training loops, and does running them side by
side help?

One copy of the hand loop (benchmarks/arms.py's hand step: llmb's model, fused AdamW, eager, one thread) per CPU,
each pinned to its own CPU, all stepping at once for the same wall-clock interval; every step's end is stamped on the
system's monotonic clock, so the copies' rates compare window by window over the interval they share. The copies
are the same program: any difference between them is the host's. It prints, per window length, how far one copy's
rate moves from window to window (its noise), how far the copies' ratio moves (what a side-by-side pairing of two
arms would still see), and the correlation of their rates (near +1: the noise is the host's as a whole, and pairing
in time cancels it; near 0 or below: each CPU's own, or the copies competing for one resource).

    python benchmarks/host_noise.py --preset small --batch-size 1 --seconds 90 \\
        --preload /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4
"""

from __future__ import annotations

import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import time

import click
import numpy as np
from common import RAW, command_line, console, machine, print_machine
from rich.table import Table

from llmb.records.result_files import write_json_atomic

MARKER = "LLMB_HOST_NOISE "


def stamped_loop(spec: dict) -> list[float]:
    """The hand loop pinned to one CPU for spec["seconds"] after three warmup steps: each step's end time."""
    import torch

    os.sched_setaffinity(0, {spec["cpu"]})
    torch.set_num_threads(1)
    import arms

    hand = {**spec, "precision": "FP32", "mode": "pure", "device": "cpu", "steps": 1, "warmup_steps": 1, "seed": 0}
    hand["optimizer_options"] = {"fused": True}
    step = arms.hand_setup(hand, arms.llmb_model, arms.llmb_loss)[0]
    for _ in range(3):
        step()
    stamps = [time.perf_counter()]  # CLOCK_MONOTONIC on Linux: one clock for every process of the host
    deadline = stamps[0] + spec["seconds"]
    while stamps[-1] < deadline:
        step()
        stamps.append(time.perf_counter())
    return stamps


def window_rates(stamps: list[list[float]], window: float) -> np.ndarray:
    """Steps per second of each copy (rows) in consecutive windows (columns) of the interval all copies stepped."""
    start, end = max(s[0] for s in stamps), min(s[-1] for s in stamps)
    edges = np.arange(start, end - window + 1e-9, window)
    if not len(edges):
        return np.empty((len(stamps), 0))
    rates = []
    for s in stamps:
        done = np.interp(np.append(edges, edges[-1] + window), s, np.arange(len(s)))  # steps finished by each edge
        rates.append(np.diff(done) / window)
    return np.array(rates)


def summary(stamps: list[list[float]], windows: list[float]) -> list[dict]:
    rows = []
    for window in windows:
        rates = window_rates(stamps, window)
        if rates.shape[1] < 3:
            continue
        ratio = rates[1] / rates[0]
        spread = [float(np.std(r) / np.mean(r)) for r in rates]
        rows.append(
            {
                "window_seconds": window,
                "windows": int(rates.shape[1]),
                "copy_spread": spread,  # coefficient of variation of each copy's window rates
                "ratio_range": [float(ratio.min()), float(ratio.max())],
                "ratio_spread": float(np.std(ratio) / np.mean(ratio)),
                # None where a copy's rate never moved: nothing to correlate
                "correlation": float(np.corrcoef(rates[0], rates[1])[0, 1]) if min(np.ptp(rates[:2], 1)) else None,
            }
        )
    return rows


def table(rows: list[dict], whole: float) -> Table:
    title = f"copies side by side, one per CPU (copy 2 / copy 1 over the whole shared interval: {whole:.3f})"
    out = Table(title=title)
    for column in ("window s", "windows", "one copy's spread", "copy 2 / copy 1", "ratio's spread", "correlation"):
        out.add_column(column, justify="right")
    for r in rows:
        out.add_row(
            f"{r['window_seconds']:g}",
            str(r["windows"]),
            ", ".join(f"{s:.1%}" for s in r["copy_spread"]),
            f"{r['ratio_range'][0]:.3f}-{r['ratio_range'][1]:.3f}",
            f"{r['ratio_spread']:.1%}",
            "n/a" if r["correlation"] is None else f"{r['correlation']:+.2f}",
        )
    return out


@click.command()
@click.option("--preset", default="small", show_default=True)
@click.option("--batch-size", default=1, show_default=True, type=int)
@click.option("--seconds", default=90.0, show_default=True, type=float, help="how long every copy steps")
@click.option("--windows", default="5,10,20", show_default=True, help="window lengths to compare the copies over")
@click.option("--preload", default=None, help="a malloc library to LD_PRELOAD into every copy (tcmalloc)")
@click.option("--copies", default=2, show_default=True, type=click.IntRange(2), help="copies, one per CPU")
@click.option("--child", default=None, hidden=True)
def main(
    preset: str, batch_size: int, seconds: float, windows: str, preload: str | None, copies: int, child: str | None
) -> None:
    if child is not None:  # one copy, started by the parent below
        print(MARKER + json.dumps(stamped_loop(json.loads(child))), flush=True)
        return
    cpus = sorted(os.sched_getaffinity(0))[:copies]
    if len(cpus) < copies:
        raise click.UsageError(f"{copies} copies need {copies} CPUs, one each; this process may use {len(cpus)}")
    info = machine()
    print_machine(info)
    env = {**os.environ, **({"LD_PRELOAD": os.path.realpath(preload)} if preload else {})}
    spec = {"preset": preset, "batch_size": batch_size, "seconds": seconds, "plugin": "cpu", "threads": 1}
    children = [
        subprocess.Popen(
            [sys.executable, __file__, "--child", json.dumps({**spec, "cpu": cpu})],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for cpu in cpus
    ]
    stamps = []
    for proc in children:
        out, _ = proc.communicate()
        lines = [line for line in out.splitlines() if line.startswith(MARKER)]
        if proc.returncode or not lines:
            raise click.ClickException(f"a copy exited with code {proc.returncode}")
        stamps.append(json.loads(lines[-1].removeprefix(MARKER)))
    start, end = max(s[0] for s in stamps), min(s[-1] for s in stamps)
    steps = [float(np.interp(end, s, np.arange(len(s))) - np.interp(start, s, np.arange(len(s)))) for s in stamps]
    rows = summary(stamps, [float(w) for w in windows.split(",")])
    console.print(table(rows, steps[1] / steps[0]))
    medians = [statistics.median(np.diff(s)) for s in stamps]
    console.print(f"median step, s: {', '.join(f'{m:.3f}' for m in medians)}", highlight=False)
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = RAW / f"host_noise-{stamp}.json"
    info["preload"] = env.get("LD_PRELOAD")
    payload = {"command": command_line(), "machine": info, "cpus": cpus, "rows": rows, "stamps": stamps}
    write_json_atomic(out, {**payload, "whole_ratio": steps[1] / steps[0]})
    console.print(f"raw results: {out}", highlight=False)


if __name__ == "__main__":
    main()
