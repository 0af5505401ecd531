"""llmb's model and reference path against HF transformers' and torchtitan's Llama, at several batch sizes.

Two comparisons, both at every batch size:
- model vs model: each model by hand in the same loop with the same AdamW (fused, the cpu plugin's choice), so only
  the model definition differs: llmb's `LlamaModel`, HF's `LlamaForCausalLM`, torchtitan's `Llama3Model`;
- end to end, as users run them: `llmb run` (the harness, cpu plugin defaults), HF + `torch.optim.AdamW` (torch's
  default implementation, what HF users write), torchtitan + fused AdamW (its trainer's default implementation).

First all arms in one process, alternating step by step (the order flips every pair): each ratio is the median of
step-pair ratios, with their interquartile range as the noise. Then each arm in its own fresh process, in
alternating rounds: tokens/s over the whole window, and peak memory (max RSS, every arm having imported transformers
and torchtitan first so that it is like for like; training memory = peak minus the RSS after those imports). Between
them, in one process, each model's tensor peak over one step (the profiler's allocation events, plus the parameters,
gradients, AdamW state and model buffers held between steps), which allocator noise cannot move. Every figure comes
with the 1-minute load average around it.

    python benchmarks/vs_peers.py --preset small --batch-sizes 1,4,8 --threads 1 --rounds 2
    python benchmarks/vs_peers.py --preset tiny --hidden-size 256 --intermediate-size 512 --num-hidden-layers 2 \
        --num-attention-heads 4 --sequence-length 128 --batch-sizes 1,4,8 --threads 1 --rounds 2
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
    plugin_optimizer_options,
    print_machine,
    run_arm,
    run_options,
    summarise,
    write_raw,
)
from rich.table import Table

SHAPE = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "sequence_length")
# (ours, peer) pairs: model vs model with one AdamW, and end to end as each is run by its users.
MODEL_PAIRS = {"HF": ("llmb-model", "hf-model"), "torchtitan": ("llmb-model", "torchtitan-model")}
MEMORY_ARMS = ("llmb-model", "hf-model", "torchtitan-model")
END_TO_END_PAIRS = {"HF": ("llmb", "hf-user"), "torchtitan": ("llmb", "torchtitan-model")}


def pair_ratios(ours: list[float], theirs: list[float]) -> dict:
    """ours/theirs in tokens/s (their step time over ours), step pair by step pair: median and quartiles."""
    ratios = sorted(b / a for a, b in zip(ours, theirs, strict=True))
    q1, _, q3 = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else (ratios[0],) * 3
    return {"median": statistics.median(ratios), "q1": q1, "q3": q3, "min": ratios[0], "max": ratios[-1]}


def same_round_ratios(measurements: list[dict], ours: str, theirs: str) -> list[float]:
    by_round: dict[int, dict[str, float]] = {}
    for m in measurements:
        if "error" not in m:
            by_round.setdefault(m["round"], {})[m["label"]] = m["tokens_per_second"]
    return [r[ours] / r[theirs] for r in by_round.values() if ours in r and theirs in r]


def fmt_spread(r: dict | None) -> str:
    return f"{r['median']:.3f} [{r['q1']:.3f}, {r['q3']:.3f}]" if r else "n/a"


def measure_batch(base: dict, fused: dict, rounds: int, interleave_steps: int) -> dict:
    hand = {
        "llmb-model": {"model": "llmb", "optimizer_options": fused},
        "hf-model": {"model": "hf", "optimizer_options": fused},
        "torchtitan-model": {"model": "torchtitan", "optimizer_options": fused},
        "hf-user": {"model": "hf", "optimizer_options": {}},
    }
    spec = {**base, "arm": "interleaved", "settings": {}, "by_hand": hand, "steps": interleave_steps}
    interleaved = run_arm(spec) if interleave_steps else {"error": "skipped (--interleave-steps 0)"}
    ratios: dict[str, dict] = {f"{kind}/{peer}": {} for kind in ("model", "end_to_end") for peer in MODEL_PAIRS}
    if "error" in interleaved:
        console.print(f"interleaved: [red]{interleaved['error']}[/]", highlight=False)
    else:
        seconds = interleaved["step_seconds_by_arm"]
        for kind, pairs in (("model", MODEL_PAIRS), ("end_to_end", END_TO_END_PAIRS)):
            for peer, (ours, theirs) in pairs.items():
                ratios[f"{kind}/{peer}"] = {"interleaved": pair_ratios(seconds[ours], seconds[theirs])}
    memory = run_arm({**base, "arm": "step_memory", "by_hand": {k: hand[k] for k in MEMORY_ARMS}, "steps": 1})
    if "error" in memory:
        console.print(f"step memory: [red]{memory['error']}[/]", highlight=False)
    else:
        for peer, (ours, theirs) in MODEL_PAIRS.items():
            total = {k: memory["step_peak_bytes"][k] + memory["held_bytes"][k] for k in (ours, theirs)}
            ratios[f"model/{peer}"]["tensor_peak_ratio"] = total[ours] / total[theirs]
    arms = {
        "llmb": {**base, "arm": "llmb", "settings": {}},
        "llmb-model": {**base, "arm": "bare", "optimizer_options": fused},
        "hf-model": {**base, "arm": "hf", "optimizer_options": fused},
        "torchtitan-model": {**base, "arm": "torchtitan", "optimizer_options": fused},
        "hf-user": {**base, "arm": "hf", "optimizer_options": {}},
    }
    measurements = alternate(arms, rounds) if rounds else []
    summary = summarise(measurements) if measurements else {}
    for kind, pairs in (("model", MODEL_PAIRS), ("end_to_end", END_TO_END_PAIRS)):
        for peer, (ours, theirs) in pairs.items():
            entry = ratios.setdefault(f"{kind}/{peer}", {})
            same = same_round_ratios(measurements, ours, theirs)
            entry["separate_same_round"] = same
            a, b = summary.get(ours, {}), summary.get(theirs, {})
            for key in ("peak_memory_bytes", "training_memory_bytes"):
                if a.get(key) and b.get(key):
                    entry[key.replace("_bytes", "_ratio")] = a[key] / b[key]
    return {
        "interleaved": interleaved,
        "step_memory": memory,
        "measurements": measurements,
        "summary": summary,
        "ratios": ratios,
    }


def print_batch(batch: int, result: dict) -> None:
    table = Table(title=f"batch {batch}: llmb / peer in tokens/s (>1: llmb faster); memory: llmb / peer (<1: less)")
    for column in (
        "comparison",
        "interleaved: median [IQR] of step pairs",
        "separate processes, per round",
        "peak memory (RSS)",
        "training memory (RSS)",
        "tensor peak",
    ):
        table.add_column(column, justify="left" if column == "comparison" else "right")
    for name, r in result["ratios"].items():
        table.add_row(
            name,
            fmt_spread(r.get("interleaved")),
            ", ".join(f"{x:.3f}" for x in r.get("separate_same_round", [])) or "n/a",
            f"{r['peak_memory_ratio']:.3f}" if "peak_memory_ratio" in r else "n/a",
            f"{r['training_memory_ratio']:.3f}" if "training_memory_ratio" in r else "n/a",
            f"{r['tensor_peak_ratio']:.4f}" if "tensor_peak_ratio" in r else "n/a",
        )
    console.print(table)
    inter = result["interleaved"]
    if "error" not in inter:
        steps = ", ".join(f"{k} {v:.3f} s" for k, v in inter["median_step_seconds_by_arm"].items())
        console.print(
            f"median steps (one process): {steps}; load {inter['load_before']} -> {inter['load_after']}",
            highlight=False,
        )
    for label, s in result["summary"].items():
        if s.get("runs"):
            console.print(
                f"{label}: {s['tokens_per_second']:,.1f} tokens/s, peak {fmt_bytes(s['peak_memory_bytes'])}"
                f", training {fmt_bytes(s['training_memory_bytes'])}, load {s['load_1min_range']}",
                highlight=False,
            )


@click.command()
@run_options(steps=3, warmup_steps=1, rounds=2)
@click.option("--batch-sizes", default="1,4,8", show_default=True)
@click.option("--interleave-steps", default=6, show_default=True, type=int, help="Steps per arm in one process.")
@click.option("--hidden-size", type=int, default=None, help="Shape overrides of the preset (as llmb run's).")
@click.option("--intermediate-size", type=int, default=None)
@click.option("--num-hidden-layers", type=int, default=None)
@click.option("--num-attention-heads", type=int, default=None)
@click.option("--sequence-length", type=int, default=None)
def main(batch_sizes: str, interleave_steps: int, **options) -> None:
    """llmb vs HF and torchtitan, model vs model and end to end, at each batch size."""
    shape = {k: options.pop(k) for k in SHAPE if options.get(k) is not None}
    for k in SHAPE:
        options.pop(k, None)
    info = machine()
    print_machine(info)
    results = {}
    for batch in (int(b) for b in batch_sizes.split(",")):
        base = {**base_spec(**{**options, "batch_size": batch}), "shape": shape, "import_peers": True}
        fused = plugin_optimizer_options(base)
        console.print(f"batch {batch}: shape {options['preset']} {shape}, llmb's AdamW {fused}", highlight=False)
        results[batch] = measure_batch(base, fused, options["rounds"], interleave_steps)
        print_batch(batch, results[batch])
    write_raw(
        "vs_peers",
        {
            "benchmark": "vs_peers",
            "command": command_line(),
            "machine": info,
            "load_at_end": load(),
            "options": options,
            "shape": shape,
            "results": results,
        },
    )


if __name__ == "__main__":
    main()
