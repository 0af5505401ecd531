"""What the harness costs: `llmb run` (llmb.run.runner.run) against a bare loop of the same model and optimizer.

The bare loop is llmb's model and the benchmark's AdamW (with the implementation options the plugin picks), stepped
with no hooks, no per-step sync and no bookkeeping, synchronised once before and once after the timed steps. Each run
in a fresh process, rounds alternate (llmb, bare, llmb, bare, ...). Goal: overhead <= 1% at the small preset.

    python benchmarks/harness_overhead.py --preset small --rounds 5
"""

from __future__ import annotations

import time

import click
import torch
from common import (
    alternate,
    arms_table,
    base_spec,
    command_line,
    console,
    interleave_option,
    load,
    machine,
    paired_ratio,
    plugin_optimizer_options,
    print_interleaved,
    print_machine,
    ratio,
    run_arm,
    run_options,
    summarise,
    write_raw,
)

GOAL = 0.01


@click.command()
@run_options(steps=5, warmup_steps=2, rounds=5)
@interleave_option(8, "Then the harness's step and bare steps in one process, alternating, this many each (0: skip).")
def main(interleave_steps: int, **options) -> None:
    """llmb run vs a bare loop; prints medians and the overhead."""
    base = base_spec(**options)
    arms = {
        "llmb run": {**base, "arm": "llmb", "settings": {}},
        "bare loop": {**base, "arm": "bare", "optimizer_options": plugin_optimizer_options(base)},
    }
    info = machine()
    print_machine(info)
    hooks = per_step_hook_seconds(base)
    measurements = alternate(arms, options["rounds"])
    interleaved = None
    if interleave_steps:
        # Two references: a second model instance stepped by hand (as the bare loop), and the harness's own model
        # and optimizer stepped by hand (only the loop differs; two instances of one model can differ by placement).
        by_hand = {
            "bare loop": {"model": "llmb", "optimizer_options": arms["bare loop"]["optimizer_options"]},
            "same model by hand": {"model": "same"},
        }
        spec = {**base, "arm": "interleaved", "settings": {}, "by_hand": by_hand, "steps": interleave_steps}
        interleaved = run_arm(spec)
    summary = summarise(measurements)
    # Overhead: how much faster the bare loop is than the harness (positive: the harness costs time).
    overhead = {
        "ratio_of_medians": _overhead(ratio(summary, "bare loop", "llmb run")),
        "median_of_same_round_ratios": _overhead(paired_ratio(measurements, "bare loop", "llmb run")),
        "median_step_ratio_of_medians": _overhead(
            ratio(summary, "bare loop", "llmb run", "median_step_tokens_per_second")
        ),
    }

    title = (
        f"llmb run vs bare loop: {options['preset']}, {options['precision']}, batch {options['batch_size']}, "
        f"{options['device']}, medians of {options['rounds']} rounds"
    )
    console.print(arms_table(title, summary))
    if interleaved is not None:
        print_interleaved(interleaved)
        if "error" not in interleaved:
            for label, paired in interleaved["llmb_over_arm_paired"].items():
                overhead[f"interleaved vs {label}"] = _overhead(1 / paired)
    step = summary["llmb run"].get("step_seconds")
    hooks_share = hooks / step if step else None
    console.print(
        f"the harness's per-step plugin calls (synchronize, step_end): {hooks * 1e6:.1f} us per step"
        + (f" = {hooks_share:.4%} of a step" if hooks_share is not None else ""),
        highlight=False,
    )
    for name, value in overhead.items():
        verdict = "n/a" if value is None else ("within" if value <= GOAL else "over") + f" the {GOAL:.0%} goal"
        shown = "n/a" if value is None else f"{value:+.2%}"
        console.print(f"harness overhead ({name.replace('_', ' ')}): {shown} ({verdict})", highlight=False)
    write_raw(
        "harness_overhead",
        {
            "benchmark": "harness_overhead",
            "command": command_line(),
            "machine": info,
            "load_at_end": load(),
            "options": options,
            "arms": arms,
            "measurements": measurements,
            "summary": summary,
            "overhead": overhead,
            "interleaved": interleaved,
            "per_step_hook_seconds": hooks,
            "per_step_hook_share": hooks_share,
            "goal": GOAL,
        },
    )


def per_step_hook_seconds(spec: dict, calls: int = 2000) -> float:
    """What the harness adds to every timed step besides the step itself, timed directly (immune to load drift
    over minutes, unlike whole runs): the plugin calls its timer makes per step."""
    from llmb.registry.plugins import select_backend

    backend, device = select_backend(spec["plugin"]).backend, torch.device(spec["device"])
    backend.synchronize(device)
    start = time.perf_counter()
    for _ in range(calls):
        backend.step_end(device)
        backend.synchronize(device)
    return (time.perf_counter() - start) / calls


def _overhead(bare_over_llmb: float | None) -> float | None:
    return None if bare_over_llmb is None else bare_over_llmb - 1.0


if __name__ == "__main__":
    main()
