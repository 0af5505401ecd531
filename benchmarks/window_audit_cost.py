"""What the whole-window audit costs an honest run: `python benchmarks/window_audit_cost.py --preset small`.

In one process, llmb's model and AdamW stepped by the harness's own `Trainer.step`, alternating step by step:
- plain: a step as the window times it;
- recorded: the same step under the dispatch recorder (one step of the first window runs so);
- checked: a step followed by the backend-state read the window audit makes after every step.
Outside the window (not in the headline, but in the run's wall time): the identity comparison (llmb.audit.guard) and the
parameter digests at each edge. The implied window overhead for a window of N steps is
(recorded - plain + N x (checked - plain)) / (N x plain): one recorded step and N state reads.
"""

from __future__ import annotations

import statistics
import time

import click
import torch
from common import console, load, machine, write_raw

from llmb.audit import guard, precision
from llmb.audit.dispatch import DtypeRecorder
from llmb.audit.evidence import synthetic_batch
from llmb.audit.window import parameter_digests
from llmb.model import LlamaModel
from llmb.spec.presets import PRESETS
from llmb.training.loop import build_optimizer


class _NoDevice:
    device = torch.device("cpu")

    def step_end(self) -> None:
        pass


def _trainer(preset: str, batch_size: int):
    from llmb.training.loop import Trainer

    config = PRESETS[preset]
    torch.manual_seed(0)
    model = LlamaModel(config)
    optimizer = build_optimizer(model, {"fused": True})
    batch = synthetic_batch(config, batch_size, 0, torch.device("cpu"))
    return Trainer(model, optimizer, batch, precision.recipe("FP32", "pure"), _NoDevice()), model, optimizer


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


@click.command()
@click.option("--preset", default="small", show_default=True)
@click.option("--batch-size", default=1, show_default=True)
@click.option("--rounds", default=10, show_default=True, help="Steps of each arm, alternated.")
@click.option("--threads", default=1, show_default=True, help="torch threads (1 is steadier on a loaded machine).")
@click.option("--window-steps", default=50, show_default=True, help="N, the window the overhead is stated for.")
def main(preset: str, batch_size: int, rounds: int, threads: int, window_steps: int) -> None:
    torch.set_num_threads(threads)
    info = machine()
    baseline = guard.capture()
    trainer, model, optimizer = _trainer(preset, batch_size)
    trainer.step()
    trainer.step()  # warm: allocator, kernels, AdamW state

    def recorded() -> None:
        with DtypeRecorder():
            trainer.step()

    def checked() -> None:
        trainer.step()
        precision.backend_state("cpu")

    arms = {"plain": trainer.step, "recorded": recorded, "checked": checked}
    times: dict[str, list[float]] = {name: [] for name in arms}
    for _ in range(rounds):
        for name, fn in arms.items():
            times[name].append(_timed(fn))
    state_read = statistics.median(_timed(lambda: precision.backend_state("cpu")) for _ in range(200))
    compare = statistics.median(_timed(lambda: guard.compare(baseline)) for _ in range(3))
    digests = statistics.median(_timed(lambda: parameter_digests(model, optimizer)) for _ in range(3))

    med = {name: statistics.median(values) for name, values in times.items()}
    n = window_steps
    overhead = (med["recorded"] - med["plain"] + n * state_read) / (n * med["plain"])
    result = {
        "machine": info,
        "preset": preset,
        "batch_size": batch_size,
        "threads": threads,
        "rounds": rounds,
        "step_seconds": times,
        "median_step_seconds": med,
        "recorded_over_plain": med["recorded"] / med["plain"],
        "backend_state_read_seconds": state_read,
        "guard_compare_seconds": compare,
        "parameter_digests_seconds": digests,
        "window_steps": n,
        "implied_window_overhead": overhead,
        "load_at_end": load(),
    }
    path = write_raw("window_audit_cost", result)
    console.print(
        f"{preset} b{batch_size}, {threads} thread(s), {rounds} rounds: plain step {med['plain']:.3f} s, recorded "
        f"{med['recorded']:.3f} s ({med['recorded'] / med['plain']:.2f}x), state read {state_read * 1e6:.0f} us; "
        f"outside the window: guard compare {compare:.2f} s, digests {digests:.3f} s; implied overhead of a "
        f"{n}-step window {overhead:.2%}  -> {path}",
        highlight=False,
    )


if __name__ == "__main__":
    main()
