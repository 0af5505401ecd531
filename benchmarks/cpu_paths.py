"""The cpu plugin's eager path against its faster paths, each against the measured matmul peak, and where the time
goes by operator class.

1. The roofline (`llmb.run.roofline`, as `llmb peak` measures it) at the preset's GEMM shapes, in this process.
2. Arms, each `llmb.run.runner.run` in a fresh process, rounds alternating: eager (no compile, torch's default AdamW,
   no recomputation) and the paths that change one thing or several; tokens/s, ratio against eager from the same
   run, and efficiency = achieved model FLOP/s over the measured matmul peak.
3. A profile (torch.profiler, self CPU time of each aten op over a few harness steps) of eager and of the best arm,
   by operator class: matmul, attention, elementwise (norms, rotary, activations, loss, copies), optimizer.

    python benchmarks/cpu_paths.py --preset small --rounds 2 --threads 1
"""

from __future__ import annotations

import click
from common import (
    alternate,
    base_spec,
    command_line,
    console,
    load,
    machine,
    paired_ratio,
    print_machine,
    summarise,
    write_raw,
)
from compile_modes import METHODS, method_settings
from rich.table import Table

from llmb.api.errors import UsageError
from llmb.registry.plugins import get_backend
from llmb.run import roofline, runner
from llmb.spec.flops import model_flops_per_token
from llmb.spec.presets import build_config

# compile_modes.py's methods are the one table of settings; these are the cpu plugin's fast paths among them.
PATHS = (
    "eager",
    "fused AdamW",
    "compile default",
    "checkpointing selective-ops",
    "compile default + fused AdamW",
    "compile default + fused AdamW + checkpointing selective-ops",
)
CLASSES = ("matmul", "attention", "elementwise", "optimizer", "other")
MATMUL = ("mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "_scaled_mm", "mkldnn", "onednn")
OPTIMIZER = ("adam", "_foreach_")


def op_class(name: str) -> str:
    """The class of an op (aten name or a compiled kernel's name)."""
    bare = name.removeprefix("aten::").lower()
    if "scaled_dot_product" in bare or "flash_attention" in bare:
        return "attention"
    if any(bare == m or bare.startswith(m + "_") or bare.startswith(m) and m in ("mkldnn", "onednn") for m in MATMUL):
        return "matmul"
    if any(o in bare for o in OPTIMIZER):
        return "optimizer"
    if bare in ("embedding", "embedding_backward", "embedding_dense_backward", "randint"):
        return "other"
    return "elementwise"


def event_class(event) -> str:
    node = event
    while node is not None:
        if node.name.startswith("Optimizer."):
            return "optimizer"
        node = node.cpu_parent
    return op_class(event.name)


def profile(spec: dict, settings: dict, steps: int = 3) -> dict[str, float]:
    """Self CPU seconds per op class over `steps` harness steps (after two warmup steps), in this process."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    options = runner.RunOptions(
        config=build_config(spec["preset"]),
        preset=spec["preset"],
        plugin="cpu",
        precision=spec["precision"],
        mode=spec["mode"],
        batch_size=spec["batch_size"],
        settings={**({"threads": str(spec["threads"])} if spec["threads"] else {}), **settings},
    )
    session = runner.prepare(options, *runner.resolve(options))
    for _ in range(2):
        session.trainer.step()
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            session.trainer.step()
    seconds = dict.fromkeys(CLASSES, 0.0)
    for event in prof.events():
        # Self time only, so nothing is counted twice; whatever runs inside AdamW's step (its own Python included)
        # is the optimizer's, whatever its op name (the per-tensor loop runs plain sqrt, div, lerp).
        if event.self_cpu_time_total <= 0 or event.name.startswith("ProfilerStep"):
            continue
        seconds[event_class(event)] += event.self_cpu_time_total / 1e6 / steps
    return seconds


@click.command()
@click.option("--preset", default="small", show_default=True)
@click.option("--batch-size", default=1, show_default=True, type=int)
@click.option("--precision", default="FP32", show_default=True)
@click.option("--mode", default="pure", show_default=True)
@click.option("--rounds", default=2, show_default=True, type=int)
@click.option("--steps", default=4, show_default=True, type=int)
@click.option("--warmup-steps", default=2, show_default=True, type=int)
@click.option("--threads", default=0, show_default=True, type=int, help="torch threads, every arm (0: default).")
@click.option(
    "--paths", default=",".join(PATHS), show_default=True, help="Comma-separated paths to run (compile_modes' methods)."
)
@click.option("--timeout", default=1800, show_default=True, type=float)
def main(preset, batch_size, precision, mode, rounds, steps, warmup_steps, threads, paths, timeout) -> None:
    """Eager vs the fast paths of the cpu plugin, with efficiency against the measured matmul peak."""
    import torch

    # Before any measuring: a path name that is not a method is a usage error.
    wanted = [p.strip() for p in paths.split(",") if p.strip()]
    unknown = [p for p in wanted if p not in METHODS]
    if unknown:
        raise click.BadParameter(f"unknown paths {unknown} (choose from {list(METHODS)})", param_hint="--paths")
    cpu = get_backend("cpu").backend
    try:
        settings = {name: method_settings(cpu, METHODS[name]) for name in wanted}
    except UsageError as exc:
        raise click.BadParameter(str(exc), param_hint="--paths") from None
    if threads:
        torch.set_num_threads(threads)
    options = dict(
        preset=preset,
        batch_size=batch_size,
        precision=precision,
        mode=mode,
        device="cpu",
        plugin="cpu",
        steps=steps,
        warmup_steps=warmup_steps,
        seed=0,
        threads=threads,
    )
    base = base_spec(**options)
    info = machine()
    print_machine(info, prefix="plugin cpu: ")
    config = build_config(preset)
    (peak,) = roofline.peak(
        plugin="cpu",
        device="cpu",
        precisions_wanted=[precision],
        config=config,
        batch_size=batch_size,
        settings={"threads": str(threads)} if threads else {},
    )
    console.print(
        f"measured matmul peak ({precision}): {peak.peak_flops / 1e9:.1f} GFLOP/s; the model's GEMMs together "
        f"{peak.model_gemm_flops / 1e9:.1f} GFLOP/s",
        highlight=False,
    )
    arms = {name: {**base, "arm": "llmb", "settings": settings[name]} for name in wanted}
    measurements = alternate(arms, rounds, timeout=timeout)
    summary = summarise(measurements)
    flops_per_token = model_flops_per_token(config)

    table = Table(
        title=f"cpu plugin: {preset}, {precision} {mode}, batch {batch_size}, {steps} steps, medians of {rounds} "
        f"rounds, threads {threads or torch.get_num_threads()}"
    )
    for column in ("path", "tokens/s", "vs eager (same rounds)", "GFLOP/s", "of measured matmul peak"):
        table.add_column(column, justify="left" if column == "path" else "right")
    rows = {}
    for name in wanted:
        s = summary[name]
        if not s.get("runs"):
            table.add_row(name, "failed", (s["errors"] or [""])[0], "", "")
            continue
        achieved = s["tokens_per_second"] * flops_per_token
        rows[name] = {
            "tokens_per_second": s["tokens_per_second"],
            "vs_eager": paired_ratio(measurements, name, "eager") if "eager" in wanted else None,
            "flops_per_second": achieved,
            "efficiency": achieved / peak.peak_flops,
        }
        r = rows[name]
        table.add_row(
            name,
            f"{r['tokens_per_second']:,.1f}",
            f"{r['vs_eager']:.2f}x" if r["vs_eager"] else "n/a",
            f"{achieved / 1e9:.2f}",
            f"{r['efficiency']:.1%}",
        )
    console.print(table)

    best = max(rows, key=lambda n: rows[n]["tokens_per_second"]) if rows else None
    profiles = {}
    for name in dict.fromkeys(["eager", best]):
        if name:
            profiles[name] = profile(base, settings[name])
    prof_table = Table(title="where a step's time goes (self CPU seconds per step, torch.profiler)")
    prof_table.add_column("class")
    for name in profiles:
        prof_table.add_column(name, justify="right")
    for cls in CLASSES:
        cells = []
        for seconds in profiles.values():
            total = sum(seconds.values())
            cells.append(f"{seconds[cls]:.3f} s ({seconds[cls] / total:.0%})" if total else "")
        prof_table.add_row(cls, *cells)
    console.print(prof_table)
    write_raw(
        "cpu_paths",
        {
            "benchmark": "cpu_paths",
            "command": command_line(),
            "machine": info,
            "load_at_end": load(),
            "roofline": peak.to_dict(),
            "model_flops_per_token": flops_per_token,
            "arms": arms,
            "measurements": measurements,
            "summary": summary,
            "rows": rows,
            "profiles": profiles,
        },
    )


if __name__ == "__main__":
    main()
