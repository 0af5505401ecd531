"""Data-parallel scaling on the CPU (1, 2, 4 processes, one thread per rank) and `llmb project` held against it.

Each point is `llmb run --nproc-per-node N` (N = 1 is a one-process job too, so all points run through the same
launcher and the same gloo group; every rank `-O threads=1`, so the baseline ran the threads the ranks ran). Points
alternate over `--rounds`; the medians are reported. Then an `llmb commbench` per rank count and, for each N > 1
and for a 2-way tensor-parallel run, `llmb project --check`: the one-process result and the commbench projected
onto the measured layout, measured step time next to projected, with the error. The seed's model leaves the DP
all-reduce out (it overlaps on a GPU); here nothing overlaps it, so DP projections are expected to be optimistic.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import click

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RAW, console, load, machine, print_machine  # noqa: E402

from llmb.records.result_files import write_json_atomic  # noqa: E402


def llmb(*args: str, timeout: float = 1800) -> None:
    done = subprocess.run([sys.executable, "-m", "llmb", *args], capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise click.ClickException(f"llmb {' '.join(args)} failed: {done.stderr.strip().splitlines()[-1:]}")


def one_record(folder: Path) -> dict:
    (path,) = folder.glob("*.json")
    return json.loads(path.read_text())


def run_point(nproc: int, common: list[str], extra: list[str], out: Path) -> dict:
    before = load()
    llmb("run", *common, "--nproc-per-node", str(nproc), *extra, "--out", str(out))
    record = one_record(out)
    record["_load"] = [before, load()]
    return record


@click.command()
@click.option("--preset", default="small", show_default=True)
@click.option("--steps", default=6, show_default=True)
@click.option("--warmup-steps", default=2, show_default=True)
@click.option("--batch-size", default=1, show_default=True)
@click.option("--rounds", default=2, show_default=True)
@click.option("--sizes", default="64K,256K,1M,4M", show_default=True, help="commbench message sizes")
def main(preset, steps, warmup_steps, batch_size, rounds, sizes):
    info = machine()
    print_machine(info)
    common = ["--device", "cpu", "--preset", preset, "--steps", str(steps), "--warmup-steps", str(warmup_steps),
              "--batch-size", str(batch_size), "-O", "threads=1"]  # fmt: skip
    arms = {"1": (1, []), "2 ddp": (2, []), "4 ddp": (4, []), "2 tp": (2, ["--tp", "2"])}
    runs: dict[str, list[dict]] = {name: [] for name in arms}
    comms: dict[int, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for round_index in range(rounds):
            for name, (nproc, extra) in arms.items():
                out = Path(tmp) / f"{name.replace(' ', '-')}-{round_index}"
                runs[name].append(run_point(nproc, common, extra, out))
                console.print(f"round {round_index + 1} {name}: {runs[name][-1]['tokens_per_second']:.1f} tokens/s")
        for nproc in (2, 4):
            path = Path(tmp) / f"comm-{nproc}.json"
            llmb("commbench", "--device", "cpu", "--nproc-per-node", str(nproc), "--sizes", sizes, "--out", str(path))
            comms[nproc] = json.loads(path.read_text())
        medians = {
            name: sorted(rs, key=lambda r: r["tokens_per_second"])[(len(rs) - 1) // 2] for name, rs in runs.items()
        }
        base_path = Path(tmp) / "base.json"
        base_path.write_text(json.dumps(medians["1"]))
        checks = {}
        for name, record in medians.items():
            # The one-process run projected onto itself: how far the seed's FLOP count is from the model's.
            measured = Path(tmp) / f"measured-{name.replace(' ', '-')}.json"
            measured.write_text(json.dumps(record))
            done = subprocess.run(
                [sys.executable, "-m", "llmb", "project", "--from", str(base_path), "--comm",
                 str(Path(tmp) / f"comm-{max(2, record['world_size'])}.json"), "--check", str(measured), "--json"],
                capture_output=True, text=True, check=True,
            )  # fmt: skip
            checks[name] = json.loads(done.stdout)
    base = medians["1"]["tokens_per_second_per_device"]
    rows = []
    for name, record in medians.items():
        check = checks.get(name, {})
        rows.append(
            {
                "arm": name,
                "processes": record["world_size"],
                "layout": {k: record["layout"][k] for k in ("tp", "pp", "dp")} | {"strategy": record["parallel"]},
                "threads_per_rank": record["threads_per_rank"],
                "global_batch": record["global_batch_size"],
                "tokens_per_second": record["tokens_per_second"],
                "tokens_per_second_rounds": [r["tokens_per_second"] for r in runs[name]],
                "tokens_per_second_per_device": record["tokens_per_second_per_device"],
                "efficiency": record["tokens_per_second_per_device"] / base,
                "step_seconds": record["timing"]["window_seconds"] / record["steps"],
                "projected_step_seconds": check.get("step_seconds"),
                "projection_error": check.get("projection_error"),
                "alpha_term_seconds": check.get("alpha_term_seconds"),
                "beta_term_seconds": check.get("beta_term_seconds"),
                "stragglers": record["stragglers"],
                "load": [r["_load"] for r in runs[name]],
            }
        )
    from rich.table import Table

    table = Table(title=f"DP/TP scaling on the CPU, preset {preset}, 1 thread per rank, batch {batch_size}/dp rank")
    for column in ("arm", "tokens/s", "per device", "efficiency", "step (s)", "projected (s)", "error", "threads"):
        table.add_column(column, justify="right")
    for row in rows:
        error = row["projection_error"]
        table.add_row(
            row["arm"],
            f"{row['tokens_per_second']:.1f}",
            f"{row['tokens_per_second_per_device']:.1f}",
            f"{row['efficiency']:.0%}",
            f"{row['step_seconds']:.3f}",
            "" if row["projected_step_seconds"] is None else f"{row['projected_step_seconds']:.3f}",
            "" if error is None else f"{error:+.0%}",
            ",".join(map(str, row["threads_per_rank"])),
        )
    console.print(table)
    out = {"machine": info, "preset": preset, "steps": steps, "rounds": rounds, "rows": rows,
           "commbench": comms, "load_at_end": load()}  # fmt: skip
    path = RAW / f"scaling-{info['date'].replace(':', '')}.json"
    write_json_atomic(path, out)
    console.print(f"raw: {path}", highlight=False)


if __name__ == "__main__":
    main()
