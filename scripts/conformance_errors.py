"""Measure the errors behind llmb.conformance.check.TOLERANCES on this machine's CPU.

For each preset and seed: FP32 against a float64 copy of the reference (what a second FP32 implementation may
differ by), and the cpu plugin's FP16/BF16, pure and amp, against the FP32 reference. Prints the worst error per
row and metric over every preset and seed, and ten times it, the margin the tolerances use.

    python scripts/conformance_errors.py [--presets tiny,small] [--seeds 0,1] [--steps 5] [--batch-size 2]
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import torch

from llmb.conformance.check import TOLERANCES, compare, reference_options, reference_session, trace
from llmb.registry.plugins import get_backend, resolve_settings
from llmb.run.runner import RunOptions, prepare
from llmb.spec.presets import PRESETS

METRICS = {
    "forward-loss": "loss",
    "forward-logits": "logits",
    "gradients": "gradients",
    "loss-curve": "loss_curve",
    "trained-parameters": "trained",
}
CANDIDATES = [("FP32", "pure"), ("FP16", "pure"), ("FP16", "amp"), ("BF16", "pure"), ("BF16", "amp")]


def measure(preset: str, seed: int, steps: int, batch_size: int) -> dict:
    options = RunOptions(config=PRESETS[preset], preset=preset, batch_size=batch_size, steps=steps, seed=seed)
    reference = trace(reference_session(options), steps)
    session = reference_session(options)
    session.model.to(torch.float64)  # in place: the optimizer keeps the same parameters
    float64 = trace(session, steps)
    cpu = get_backend("cpu")
    cpu_settings = resolve_settings(cpu.backend, {})
    errors = {}
    for precision, mode in CANDIDATES:
        candidate_options = replace(reference_options(options), precision=precision, mode=mode)
        candidate = trace(prepare(candidate_options, cpu, torch.device("cpu"), cpu_settings), steps)
        against = float64 if precision == "FP32" else reference
        checks = {c.name: c for c in compare(candidate, against, precision, mode)}
        errors[(precision, mode)] = {metric: checks[name].measured for name, metric in METRICS.items()}
        print(preset, seed, precision, mode, errors[(precision, mode)], flush=True)
    return errors


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--presets", default="tiny,small")
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=2)
    args = parser.parse_args()
    worst: dict = {}
    for preset in args.presets.split(","):
        for seed in map(int, args.seeds.split(",")):
            for row, values in measure(preset, seed, args.steps, args.batch_size).items():
                for metric, value in values.items():
                    worst[row, metric] = max(worst.get((row, metric), 0.0), value)
    print("\n| precision, mode | " + " | ".join(METRICS) + " |")
    print("|---|" + "---|" * len(METRICS))
    for row in CANDIDATES:
        cells = [
            f"{worst[row, m]:.2g} (x10: {10 * worst[row, m]:.2g}; set {getattr(TOLERANCES[row], m):g})"
            for m in METRICS.values()
        ]
        print(f"| {row[0]} {row[1]} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
