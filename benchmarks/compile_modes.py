"""Eager vs torch.compile modes vs fused AdamW vs activation checkpointing, per plugin, lit-gpt style.

Every method is `llmb run` with plugin settings (-O key=value through llmb.run.runner.RunOptions.settings), in a fresh
process, rounds alternating over the methods. A method whose settings the plugin does not declare is listed as not
offered. Compiled methods compile during the warmup steps, so give them at least two.

    python benchmarks/compile_modes.py --preset small --rounds 2                  # the cpu plugin
    python benchmarks/compile_modes.py --device cuda --preset official --batch-size 8 --precision BF16
"""

from __future__ import annotations

import statistics

import click
from common import (
    alternate,
    base_spec,
    command_line,
    console,
    fmt_bytes,
    load,
    machine,
    paired_ratio,
    print_machine,
    ratio,
    run_options,
    summarise,
    write_raw,
)
from rich.table import Table

from llmb.api.errors import UsageError
from llmb.registry.plugins import resolve_settings, select_backend

# The reference: no compile, torch's default AdamW, no recomputation, the C library's malloc as it comes. Each method
# changes only its own settings. The one table of methods: benchmarks/cpu_paths.py runs a selection of these by name.
EAGER = {"compile": "none", "fused_adamw": "false", "activation_checkpointing": "none", "keep_freed_memory": "false"}
METHODS = {
    "eager": {},
    "compile default": {"compile": "default"},
    "compile reduce-overhead": {"compile": "reduce-overhead"},
    "compile max-autotune": {"compile": "max-autotune"},
    "fused AdamW": {"fused_adamw": "true"},
    "freed memory kept": {"keep_freed_memory": "true"},
    "compile default + fused AdamW": {"compile": "default", "fused_adamw": "true"},
    "compile default + fused AdamW + checkpointing selective-ops": {
        "compile": "default",
        "fused_adamw": "true",
        "activation_checkpointing": "selective-ops",
    },
    "thunder": {"compile": "thunder"},
    "checkpointing selective-layers": {"activation_checkpointing": "selective-layers"},
    "checkpointing selective-ops": {"activation_checkpointing": "selective-ops"},
    "checkpointing full": {"activation_checkpointing": "full"},
    "eager 1 thread": {"threads": "1"},
}


def method_settings(plugin, changes: dict[str, str]) -> dict[str, str]:
    """The eager reference's settings (those the plugin declares) with the method's changes; UsageError when the
    plugin does not offer the method."""
    declared = {s.name for s in plugin.settings()}  # plugin: the llmb.Backend
    settings = {k: v for k, v in EAGER.items() if k in declared}
    missing = sorted(set(changes) - declared)
    if missing:
        raise UsageError(f"the {plugin.name} plugin has no {', '.join(missing)} setting")
    settings.update(changes)
    resolve_settings(plugin, settings)  # a value outside the plugin's choices is not offered either
    return settings


@click.command()
@run_options(steps=4, warmup_steps=2, rounds=2)
@click.option(
    "--methods",
    default=",".join(METHODS),
    show_default=True,
    help="Comma-separated methods to run (those the plugin does not offer are listed, not run).",
)
@click.option("--timeout", default=1800, show_default=True, type=float, help="Seconds allowed for one run.")
def main(methods: str, timeout: float, **options) -> None:
    """Time and memory per method for one plugin; speed-up against eager."""
    base = base_spec(**options)
    plugin = select_backend(base["plugin"]).backend
    base["plugin"] = plugin.name
    wanted = [m.strip() for m in methods.split(",") if m.strip()]
    unknown = [m for m in wanted if m not in METHODS]
    if unknown:
        raise click.BadParameter(f"unknown methods {unknown} (choose from {list(METHODS)})", param_hint="--methods")
    if "eager" not in wanted:
        wanted.insert(0, "eager")  # the reference every speed-up is measured against
    arms, not_offered = {}, {}
    for name in wanted:
        try:
            arms[name] = {**base, "arm": "llmb", "settings": method_settings(plugin, METHODS[name])}
        except UsageError as exc:
            not_offered[name] = str(exc)
    info = machine()
    print_machine(info, prefix=f"plugin {plugin.name}: ")
    measurements = alternate(arms, options["rounds"], timeout=timeout)
    summary = summarise(measurements)
    speedups = {
        name: {
            "ratio_of_medians": ratio(summary, name, "eager"),
            "median_of_same_round_ratios": paired_ratio(measurements, name, "eager"),
        }
        for name in arms
    }

    table = Table(
        title=f"{plugin.name} plugin: {options['preset']}, {options['precision']}, batch {options['batch_size']}, "
        f"{options['steps']} timed steps, medians of {options['rounds']} rounds"
    )
    # lit-gpt's table: the measured window, the compile cost apart from it (the warmup steps' time beyond
    # steady-state steps, recorded by every run), peak memory; ratios against eager from the same rounds.
    for column in ("Method", "Time (window) ↓", "Compile time ↓", "Memory ↓", "Tokens/s ↑", "vs eager ↑", "Settings"):
        table.add_column(column, justify="left" if column in ("Method", "Settings") else "right")
    ranked = sorted(arms, key=lambda n: -(summary[n].get("tokens_per_second") or 0))
    for name in ranked:
        s = summary[name]
        settings = " ".join(f"{k}={v}" for k, v in METHODS[name].items()) or "(reference)"
        if not s["runs"]:
            table.add_row(name, "failed", "", "", "", "", f"{settings}: {s['errors'][0]}")
            continue
        ran = [m for m in measurements if m["label"] == name and "error" not in m]
        window = statistics.median(m["window_seconds"] for m in ran)
        compiles = [m["compile_seconds"] for m in ran if m.get("compile_seconds") is not None]
        speedup = speedups[name]["median_of_same_round_ratios"]
        table.add_row(
            name,
            f"{window:.2f} s",
            f"{statistics.median(compiles):.2f} s" if compiles else "n/a",
            fmt_bytes(s["peak_memory_bytes"]),
            f"{s['tokens_per_second']:,.1f}",
            f"{speedup:.2f}x" if speedup else "n/a",
            settings,
        )
    for name, reason in not_offered.items():
        table.add_row(name, "-", "-", "-", "-", "-", f"not offered: {reason}")
    console.print(table)
    write_raw(
        f"compile_modes-{plugin.name}",
        {
            "benchmark": "compile_modes",
            "command": command_line(),
            "machine": info,
            "load_at_end": load(),
            "options": {**options, "methods": wanted, "timeout": timeout},
            "plugin": plugin.name,
            "arms": arms,
            "not_offered": not_offered,
            "measurements": measurements,
            "summary": summary,
            "speedups": speedups,
        },
    )


if __name__ == "__main__":
    main()
