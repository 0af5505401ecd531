"""Make the records `llmb features` renders: for each feature and each pair of features, a tiny-preset run on one
process, with DDP and with FSDP (2 processes, gloo), and a conformance check of the same settings; a run or check
that fails leaves an attempt record with its one-line error, so the matrix can say "fails" and why.

    python scripts/feature_records.py --out benchmarks/features              # torch 2.13: every combination
    <thunder env>/bin/python scripts/feature_records.py --only thunder --out benchmarks/features   # torch 2.9

Every command is `python -m llmb run|check-plugin` in a fresh process; nothing here measures speed.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
from pathlib import Path

import click

from llmb.records.result_files import write_json_atomic
from llmb.run.feature_matrix import ATTEMPT_SCHEMA, EXCLUSIVE, FEATURES, features_of, load_records, parallel_of
from llmb.toolkit.compilers import thunder_unavailable

RUN = ["--preset", "tiny", "--batch-size", "2", "--steps", "3", "--warmup-steps", "2"]
PARALLEL = {"none": [], "ddp": ["--nproc-per-node", "2", "--parallel", "ddp"]}
PARALLEL["fsdp"] = ["--nproc-per-node", "2", "--parallel", "fsdp"]


def arguments(combo: frozenset[str]) -> list[str]:
    """The cpu plugin's settings and the precision flags for a combination of features."""
    args = ["--plugin", "cpu", "-O", "fused_adamw=false"]
    args += ["--precision", "BF16", "--precision-mode", "amp"] if "amp" in combo else ["--precision", "FP32"]
    if "compile" in combo:
        args += ["-O", "compile=default"]
    if "thunder" in combo:
        args += ["-O", "compile=thunder"]
    if "sac" in combo:
        args += ["-O", "activation_checkpointing=selective-ops"]
    if "fp8" in combo:
        args += ["-O", "fp8=tensorwise"]
    return args


def combinations(only: str | None) -> list[frozenset[str]]:
    keys = list(FEATURES)
    combos = [frozenset({k}) for k in keys] + [frozenset(p) for p in itertools.combinations(keys, 2)]
    combos = [c for c in combos if not any(pair <= c for pair in EXCLUSIVE)]
    if thunder_unavailable():  # Thunder's combinations come from its own env (torch 2.9), run with --only thunder
        combos = [c for c in combos if "thunder" not in c]
    return [c for c in combos if only is None or only in c]


def attempt(out: Path, combo: frozenset[str], parallel: str, command: list[str], error: str) -> None:
    name = f"attempt-{'-'.join(sorted(combo))}-{parallel}-{command[3]}.json"
    record = {
        "schema": ATTEMPT_SCHEMA,
        "features": sorted(combo),
        "parallel": parallel,
        "command": " ".join(["llmb", *command[3:]]),
        "error": error,
        "torch": __import__("torch").__version__,
    }
    write_json_atomic(out / "attempts" / name, record)


def run(command: list[str], timeout: float) -> tuple[bool, str]:
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False, f"timed out after {timeout:.0f} s"
    if proc.returncode == 0:
        return True, ""
    lines = [line.strip() for line in proc.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:") or "Error" in line]
    return False, (errors or lines or [f"exit {proc.returncode}"])[-1].removeprefix("error: ")[:300]


@click.command()
@click.option("--out", default="benchmarks/features", show_default=True, type=click.Path(path_type=Path))
@click.option("--only", default=None, type=click.Choice(list(FEATURES)), help="Only combinations with this feature.")
@click.option("--timeout", default=900, show_default=True, type=float, help="Seconds allowed for one command.")
@click.option("--no-conformance", is_flag=True, help="Runs only.")
@click.option("--parallel", "parallels", default="none,ddp,fsdp", show_default=True, help="Parallel modes to run.")
@click.option("--pairs/--no-pairs", default=True, show_default=True, help="Pairs of features too.")
def main(out: Path, only: str | None, timeout: float, no_conformance: bool, parallels: str, pairs: bool) -> None:
    python = [sys.executable, "-m", "llmb"]
    wanted = [p for p in parallels.split(",") if p]
    done = load_records([out]) if out.exists() else None  # resume: what is recorded already is not run again

    def recorded(combo: frozenset[str], parallel: str | None) -> bool:
        if done is None:
            return False
        if parallel is None:
            return any(features_of(c) == combo for c in done.conformance) or any(
                features_of(a) == combo and "check-plugin" in a.get("command", "") for a in done.attempts
            )
        return any(features_of(r) == combo and parallel_of(r) == parallel for r in done.results) or any(
            features_of(a) == combo and a["parallel"] == parallel and " run " in a.get("command", "")
            for a in done.attempts
        )

    for combo in combinations(only):
        if len(combo) > 1 and not pairs:
            continue
        label = "+".join(sorted(combo))
        args = arguments(combo)
        if not no_conformance and "none" in wanted and not recorded(combo, None):
            conformance = out / "conformance" / f"{label}.json"
            command = [*python, "check-plugin", *args, "--steps", "3", "--out", str(conformance)]
            started = time.perf_counter()
            ok, error = run(command, timeout)
            # check-plugin exits 1 when the plugin does not conform but still writes its record: that record says why.
            if not conformance.exists():
                attempt(out, combo, "none", command, error)
            click.echo(f"{label} check-plugin: {'ok' if ok else error} ({time.perf_counter() - started:.0f} s)")
        for parallel, extra in PARALLEL.items():
            if parallel not in wanted or recorded(combo, parallel):
                continue
            command = [*python, "run", *args, *RUN, *extra, "--out", str(out / "results")]
            started = time.perf_counter()
            ok, error = run(command, timeout)
            if not ok:
                attempt(out, combo, parallel, command, error)
            click.echo(f"{label} {parallel}: {'ok' if ok else error} ({time.perf_counter() - started:.0f} s)")
    (out / "README.md").write_text(
        "Records behind the feature matrix in benchmarks/RESULTS.md (`llmb features benchmarks/features`), made by\n"
        "`scripts/feature_records.py`: tiny preset, cpu plugin, 2 processes for DDP/FSDP.\n"
    )
    click.echo(json.dumps({"out": str(out)}))


if __name__ == "__main__":
    main()
