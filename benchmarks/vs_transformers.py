"""llmb's eager reference path against HF transformers' LlamaForCausalLM + torch.optim.AdamW, side by side.

Same shape, precision, batch, device and AdamW hyperparameters; each run in a fresh process; rounds alternate
(llmb, HF, llmb, HF, ...); medians of each arm and the llmb/HF ratio. Goal: ratio >= 1.0.

    python benchmarks/vs_transformers.py --preset small --rounds 5
"""

from __future__ import annotations

import click
from common import (
    alternate,
    arms_table,
    base_spec,
    command_line,
    console,
    fmt_bytes,
    fmt_ratio,
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


@click.command()
@run_options(steps=5, warmup_steps=2, rounds=3)
@interleave_option(6, "Then all arms in one process, step by step, this many each (0: skip; all models in memory).")
def main(interleave_steps: int, **options) -> None:
    """llmb (harness, plugin defaults) vs HF LlamaForCausalLM + AdamW; prints medians and ratios."""
    base = base_spec(**options)
    llmb_adamw = plugin_optimizer_options(base)
    arms = {
        "llmb": {**base, "arm": "llmb", "settings": {}},
        "hf": {**base, "arm": "hf", "optimizer_options": {}},
    }
    if llmb_adamw:
        # The plugin picked an AdamW implementation (e.g. fused): also give HF the same one, so the model and
        # the loop are compared apart from that choice.
        arms["hf+same-adamw"] = {**base, "arm": "hf", "optimizer_options": llmb_adamw}
    info = machine()
    print_machine(info)
    measurements = alternate(arms, options["rounds"])
    interleaved = None
    if interleave_steps:
        by_hand = {
            label: {"model": "hf", "optimizer_options": spec["optimizer_options"]}
            for label, spec in arms.items()
            if spec["arm"] == "hf"
        }
        spec = {**base, "arm": "interleaved", "settings": {}, "by_hand": by_hand, "steps": interleave_steps}
        interleaved = run_arm(spec)
    summary = summarise(measurements)
    ratios = {
        f"llmb/{label}": {
            "tokens_per_second_median_ratio": ratio(summary, "llmb", label, "tokens_per_second"),
            "tokens_per_second_paired_ratio": paired_ratio(measurements, "llmb", label),
            "median_step_tokens_per_second_ratio": ratio(summary, "llmb", label, "median_step_tokens_per_second"),
            "peak_memory_ratio": ratio(summary, "llmb", label, "peak_memory_bytes"),
            "training_memory_ratio": ratio(summary, "llmb", label, "training_memory_bytes"),
        }
        for label in arms
        if label != "llmb"
    }

    title = (
        f"llmb vs HF transformers: {options['preset']}, {options['precision']}, batch "
        f"{options['batch_size']}, {options['device']}, medians of {options['rounds']} rounds"
    )
    extra = {
        "training memory": lambda label, s: fmt_bytes(s["training_memory_bytes"]),
        "llmb / arm (tokens/s)": lambda label, s: (
            "1.000" if label == "llmb" else fmt_ratio(ratios[f"llmb/{label}"]["tokens_per_second_median_ratio"])
        ),
    }
    console.print(arms_table(title, summary, extra))
    for name, r in ratios.items():
        console.print(
            f"{name}: tokens/s {fmt_ratio(r['tokens_per_second_median_ratio'])} (ratio of medians), "
            f"{fmt_ratio(r['tokens_per_second_paired_ratio'])} (median of same-round ratios); "
            f"peak memory {fmt_ratio(r['peak_memory_ratio'])}, training memory {fmt_ratio(r['training_memory_ratio'])}",
            highlight=False,
        )
    if interleaved is not None:
        print_interleaved(interleaved)
    write_raw(
        "vs_transformers",
        {
            "benchmark": "vs_transformers",
            "command": command_line(),
            "machine": info,
            "load_at_end": load(),
            "options": options,
            "arms": arms,
            "measurements": measurements,
            "summary": summary,
            "ratios": ratios,
            "interleaved": interleaved,
        },
    )


if __name__ == "__main__":
    main()
