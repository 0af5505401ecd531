"""What the benchmark scripts share: the machine, alternating rounds of arms in fresh processes, medians, tables
and the raw JSON under benchmarks/raw/."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import click
import torch
from rich.console import Console
from rich.table import Table

from llmb import CpuBackend
from llmb.audit.precision import MODES, PRECISIONS
from llmb.records.result_files import write_json_atomic
from llmb.spec.presets import PRESETS

HERE = Path(__file__).resolve().parent
RAW = HERE / "raw"
ARMS_SCRIPT = HERE / "arms.py"
console = Console(width=None if sys.stdout.isatty() else 150)  # logs and pipes get the whole table


def load() -> list[float]:
    """The 1, 5 and 15 minute load averages: other work on the machine disturbs every timing taken here."""
    return [round(x, 2) for x in os.getloadavg()]


def machine() -> dict:
    info = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "cpu": CpuBackend().device_name(torch.device("cpu")),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_at_start": load(),
    }
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:
        info["transformers"] = None
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["cuda"] = torch.version.cuda
    return info


def print_machine(info: dict, prefix: str = "") -> None:
    gpu = f", {info['gpu']}" if "gpu" in info else ""
    console.print(
        f"{prefix}{info['cpu']} ({info['cpu_count']} cores), torch {info['torch']}, transformers "
        f"{info['transformers']}{gpu}, load {info['load_at_start']}",
        highlight=False,
    )


def interleave_option(default: int, help: str) -> Callable:
    """--interleave-steps: after the rounds, the arms again in one process, alternating step by step."""
    return click.option("--interleave-steps", default=default, show_default=True, type=int, help=help)


def run_arm(spec: dict, timeout: float | None = None, env: dict[str, str] | None = None) -> dict:
    """Run one arm in a fresh interpreter (``env`` added to this process's environment); return its measurement with
    the load before and after."""
    before, started = load(), time.perf_counter()
    out = {"spec": spec, "load_before": before}
    # Its own process group: an arm that times out goes with every process it started (`llmb run`'s worker and judge
    # kept 78 GB of an H100 after their arm timed out, and the next arms ran out of memory beside them).
    with subprocess.Popen(
        [sys.executable, str(ARMS_SCRIPT), json.dumps(spec)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, **env} if env else None,
    ) as child:
        try:
            stdout, stderr = child.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.communicate()
            out.update(load_after=load(), error=f"timed out after {timeout:.0f} s")
            return out
    proc = subprocess.CompletedProcess(child.args, child.returncode, stdout, stderr)
    out.update(load_after=load(), process_seconds=time.perf_counter() - started)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("LLMB_BENCH_RESULT ")]
    if proc.returncode or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        out["error"] = f"exit {proc.returncode}: {tail}"
        return out
    out.update(json.loads(lines[-1].removeprefix("LLMB_BENCH_RESULT ")))
    return out


def alternate(arms: dict[str, dict], rounds: int, timeout: float | None = None) -> list[dict]:
    """Rounds of A B C ... A B C ...: slow drift in the machine's load hits every arm alike."""
    measurements = []
    for index in range(rounds):
        for label, spec in arms.items():
            result = run_arm(spec, timeout)
            result.update(label=label, round=index)
            measurements.append(result)
            if "error" in result:
                console.print(f"round {index + 1}/{rounds} {label}: [red]{result['error']}[/]", highlight=False)
            else:
                console.print(
                    f"round {index + 1}/{rounds} {label}: {result['tokens_per_second']:,.1f} tokens/s, "
                    f"peak {fmt_bytes(result['peak_memory_bytes'])}, load {result['load_before'][0]:.2f}",
                    highlight=False,
                )
    return measurements


def summarise(measurements: list[dict]) -> dict[str, dict]:
    """Per arm: medians over the rounds that ran, and the load they ran under."""
    summary: dict[str, dict] = {}
    for label in dict.fromkeys(m["label"] for m in measurements):
        ok = [m for m in measurements if m["label"] == label and "error" not in m]
        errors = [m["error"] for m in measurements if m["label"] == label and "error" in m]
        if not ok:
            summary[label] = {"runs": 0, "errors": errors}
            continue
        loads = [m["load_before"][0] for m in ok] + [m["load_after"][0] for m in ok]
        summary[label] = {
            "runs": len(ok),
            "errors": errors,
            "tokens_per_second": _median(ok, "tokens_per_second"),
            "median_step_tokens_per_second": _median(ok, "median_step_tokens_per_second"),
            "step_seconds": statistics.median(m["window_seconds"] / m["spec"]["steps"] for m in ok),
            "peak_memory_bytes": _median(ok, "peak_memory_bytes"),
            "training_memory_bytes": _median(ok, "training_memory_bytes"),
            "load_1min_range": [min(loads), max(loads)],
        }
    return summary


def paired_ratio(measurements: list[dict], a: str, b: str, key: str = "tokens_per_second") -> float | None:
    """Median over rounds of a/b measured in the same round: steadier than a ratio of medians under drift."""
    by_round: dict[int, dict[str, float]] = {}
    for m in measurements:
        if "error" not in m and m.get(key):
            by_round.setdefault(m["round"], {})[m["label"]] = m[key]
    ratios = [r[a] / r[b] for r in by_round.values() if a in r and b in r]
    return statistics.median(ratios) if ratios else None


def ratio(summary: dict[str, dict], a: str, b: str, key: str = "tokens_per_second") -> float | None:
    """Arm a's median over arm b's median."""
    x, y = summary[a].get(key), summary[b].get(key)
    return x / y if x and y else None


def _median(items: list[dict], key: str) -> float | None:
    values = [m[key] for m in items if m.get(key) is not None]
    return statistics.median(values) if values else None


def fmt_bytes(value: float | None) -> str:
    return f"{value / 2**30:.2f} GiB" if value else "n/a"


def fmt_ratio(value: float | None) -> str:
    return f"{value:.3f}" if value is not None else "n/a"


def arms_table(title: str, summary: dict[str, dict], extra: dict[str, Callable[[str, dict], str]] | None = None):
    """The per-arm medians a side-by-side benchmark prints: throughput, the median step's, step time and peak memory,
    then the script's own columns (each cell a function of the arm's label and summary)."""
    extra = extra or {}
    table = Table(title=title)
    for column in ("arm", "tokens/s", "tokens/s (median step)", "step", "peak memory", *extra):
        table.add_column(column, justify="left" if column == "arm" else "right")
    for label, s in summary.items():
        if not s["runs"]:
            table.add_row(label, "failed: " + s["errors"][0], *[""] * (3 + len(extra)))
            continue
        table.add_row(
            label,
            f"{s['tokens_per_second']:,.1f}",
            f"{s['median_step_tokens_per_second']:,.1f}" if s["median_step_tokens_per_second"] else "n/a",
            f"{s['step_seconds']:.3f} s",
            fmt_bytes(s["peak_memory_bytes"]),
            *(cell(label, s) for cell in extra.values()),
        )
    return table


def write_raw(name: str, payload: dict) -> Path:
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    path = write_json_atomic(RAW / f"{name}-{stamp}.json", payload)
    console.print(f"raw results: {path.relative_to(HERE.parent)}", highlight=False)
    return path


def run_options(steps: int, warmup_steps: int, rounds: int) -> Callable:
    """The options every benchmark script takes (defaults sized for a few minutes at the small preset)."""

    def decorate(func):
        for option in reversed(
            [
                click.option("--preset", default="small", show_default=True, type=click.Choice(list(PRESETS))),
                click.option("--batch-size", default=1, show_default=True, type=int),
                click.option("--precision", default="FP32", show_default=True, type=click.Choice(PRECISIONS)),
                click.option("--mode", default="pure", show_default=True, type=click.Choice(MODES)),
                click.option("--device", default="cpu", show_default=True),
                click.option("--plugin", default=None, help="llmb plugin (default: the one for the device)."),
                click.option("--rounds", default=rounds, show_default=True, type=int, help="Alternating rounds."),
                click.option("--steps", default=steps, show_default=True, type=int, help="Timed steps per run."),
                click.option("--warmup-steps", default=warmup_steps, show_default=True, type=int),
                click.option("--seed", default=0, show_default=True, type=int),
                click.option(
                    "--threads",
                    default=0,
                    show_default=True,
                    type=int,
                    help="torch threads, every arm (0: torch's default).",
                ),
            ]
        ):
            func = option(func)
        return func

    return decorate


def base_spec(**options) -> dict:
    """The part of an arm's spec every arm shares; the cpu plugin for the CPU, else llmb picks the device's."""
    keys = ("preset", "batch_size", "precision", "mode", "device", "steps", "warmup_steps", "seed", "threads")
    spec = {k: options[k] for k in keys}
    spec["plugin"] = options.get("plugin") or ("cpu" if torch.device(options["device"]).type == "cpu" else None)
    return spec


def plugin_optimizer_options(spec: dict, settings: dict | None = None) -> dict:
    """The AdamW implementation options (foreach/fused) the llmb plugin picks for this spec and settings."""
    from llmb.run import runner
    from llmb.spec.presets import build_config

    options = runner.RunOptions(
        config=build_config(spec["preset"]),
        plugin=spec["plugin"],
        device=spec["device"],
        precision=spec["precision"],
        settings=dict(settings or {}),
    )
    plugin, device, resolved = runner.resolve(options)
    return dict(plugin.backend.optimizer_options(device, spec["precision"], resolved) or {})


def command_line() -> str:
    return shlex.join(["python", os.path.relpath(sys.argv[0], HERE.parent), *sys.argv[1:]])


def print_interleaved(result: dict) -> None:
    """The table of an interleaved arm (llmb's harness step against steps by hand in one process)."""
    if "error" in result:
        console.print(f"interleaved in one process: [red]{result['error']}[/]", highlight=False)
        return
    table = Table(title=f"in one process, step by step ({len(result['step_seconds'])} steps per arm)")
    for column in ("arm", "median step", "llmb / arm (tokens/s, median of step pairs)"):
        table.add_column(column, justify="left" if column == "arm" else "right")
    for label, seconds in result["median_step_seconds_by_arm"].items():
        paired = result["llmb_over_arm_paired"].get(label)
        table.add_row(label, f"{seconds:.3f} s", "1.000" if label == "llmb" else fmt_ratio(paired))
    console.print(table)
    console.print(f"load {result['load_before']} before, {result['load_after']} after", highlight=False)
