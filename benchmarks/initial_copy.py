"""The replay's initial model onto the accelerator: llmb's twin (llmb.judge.initial.twin, through a small ring of
pinned staging buffers since 2026-11-26) against each tensor copied straight from pageable host memory (its route
before) and against pinning the whole model first (its pinning timed apart).

Inside llmb's replay on one H100 the twin took 7.5-8.7 s for the official shape's 5.73 GB, where this script's warm
copies took 1.4 s (RESULTS.md section 29). So this also times what a fresh process pays first: the twin's first
allocation on the device (cold) against a later one (warm), and each arm's first copy. Each arm then copies the same
host model, alternating; every copy is checked equal to the host's.

    python benchmarks/initial_copy.py --device cuda --preset official --rounds 3
"""

from __future__ import annotations

import statistics
import time

import click
import torch
from common import command_line, console, machine, print_machine, write_raw

from llmb.judge import initial
from llmb.model import LlamaModel
from llmb.spec.presets import build_config
from llmb.terminal import console as term


def direct_copy(model: LlamaModel, device: torch.device) -> LlamaModel:
    """A twin of `model` on `device`, each tensor copied straight from pageable host memory (llmb's route until
    2026-11-26)."""
    copy = initial.empty_twin(model, device, torch.float32)
    with torch.no_grad():
        for target, source in zip(initial.tensors(copy), initial.tensors(model), strict=True):
            target.copy_(source)
    return copy


def pinned_whole_copy(pinned: list[torch.Tensor], model: LlamaModel, device: torch.device) -> LlamaModel:
    """A twin of `model` on `device` from host tensors pinned beforehand (`pinned`, in the model's order)."""
    copy = initial.empty_twin(model, device, torch.float32)
    with torch.no_grad():
        for target, source in zip(initial.tensors(copy), pinned, strict=True):
            target.copy_(source, non_blocking=True)
    return copy


def _equal(copy: LlamaModel, model: LlamaModel) -> bool:
    return all(torch.equal(a.cpu(), b) for a, b in zip(initial.tensors(copy), initial.tensors(model), strict=True))


@click.command()
@click.option("--device", "device_name", default="cuda", show_default=True)
@click.option("--preset", default="official", show_default=True)
@click.option("--rounds", default=3, show_default=True, type=int)
def main(device_name: str, preset: str, rounds: int) -> None:
    info = machine()
    print_machine(info)
    device = torch.device(device_name)
    if device.type == "cpu" or not getattr(torch, device.type).is_available():
        raise click.ClickException(f"needs an accelerator with pinned host memory: {device_name} is not one here")
    config = build_config(preset)
    began = time.perf_counter()
    model = initial.build(config, seed=0)
    build_seconds = time.perf_counter() - began
    gigabytes = sum(t.numel() * t.element_size() for t in initial.tensors(model)) / 1e9
    torch.empty(0, device=device)  # the device brought up, as the replay's _initialise does
    initial.synchronize(device)
    allocations = []
    for _ in range(2):  # the first allocation of the model's size in this process (cold), then one from the cache
        began = time.perf_counter()
        empty = initial.empty_twin(model, device, torch.float32)
        initial.synchronize(device)
        allocations.append(time.perf_counter() - began)
        del empty
    began = time.perf_counter()
    pinned = [t.detach().pin_memory() for t in initial.tensors(model)]
    pin_seconds = time.perf_counter() - began
    arms = {
        "twin (llmb: staged, pinned)": lambda: initial.twin(model, device, torch.float32)[0],
        "direct from pageable": lambda: direct_copy(model, device),
        "pinned beforehand": lambda: pinned_whole_copy(pinned, model, device),
    }
    equal, first = {}, {}
    for name, arm in arms.items():  # each arm's first copy, timed apart; each checked equal
        initial.synchronize(device)
        began = time.perf_counter()
        copy = arm()
        initial.synchronize(device)
        first[name] = time.perf_counter() - began
        equal[name] = _equal(copy, model)
        del copy
    seconds: dict[str, list[float]] = {name: [] for name in arms}
    for _ in range(rounds):
        for name, arm in arms.items():
            initial.synchronize(device)
            began = time.perf_counter()
            copy = arm()
            initial.synchronize(device)
            seconds[name].append(time.perf_counter() - began)
            del copy
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    base = medians["direct from pageable"]
    table = term.table(f"The initial model ({gigabytes:.2f} GB, {preset}) onto {device}, {rounds} rounds")
    for column in ("copy", "first s", "median s", "range s", "GB/s", "/ direct", "equal"):
        term.column(table, column, numeric=column != "copy")
    for name, values in seconds.items():
        term.row(table, name, f"{first[name]:.3f}", f"{medians[name]:.3f}", f"{min(values):.3f}-{max(values):.3f}",
                 f"{gigabytes / medians[name]:.1f}", f"{medians[name] / base:.3f}", str(equal[name]))  # fmt: skip
    console.print(table)
    console.print(f"host build {build_seconds:.1f} s; pinning the whole model beforehand {pin_seconds:.2f} s; "
                  f"the twin's allocation on {device}: first {allocations[0]:.3f} s, then {allocations[1]:.3f} s",
                  highlight=False)  # fmt: skip
    write_raw("initial_copy", {"command": command_line(), "machine": info, "preset": preset, "gigabytes": gigabytes,
                               "seconds": seconds, "first_seconds": first, "allocation_seconds": allocations,
                               "equal": equal, "pin_seconds": pin_seconds, "build_seconds": build_seconds})  # fmt: skip


if __name__ == "__main__":
    main()
