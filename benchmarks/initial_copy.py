"""The replay's initial model onto the accelerator: llmb's copy (llmb.judge.initial.twin, each tensor straight from
pageable host memory) against the same copy through a small ring of pinned staging buffers, and against pinning the
whole model first (its pinning timed apart, since the judge would pin beside the worker's setup).

On one H200 the twin took 4.6-5.7 s for the official shape's 5.7 GB (about 1.1 GB/s, RESULTS.md section 27), the
largest fixed cost left in the replay. This measures what a pinned path would save before llmb takes one. Each arm
copies the same host model, alternating, after a warm-up copy; every copy is checked equal to the host's.

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


def staged_copy(model: LlamaModel, device: torch.device, chunk_bytes: int, buffers: int = 2, pin: bool = True):
    """A twin of `model` on `device`, each tensor copied through `buffers` staging buffers of `chunk_bytes` (pinned
    where `pin`): a host memcpy into a free buffer, then an asynchronous copy from it, the buffer reused once the copy
    that read it has finished (an event per buffer)."""
    copy = initial.empty_twin(model, device, torch.float32)
    elements = max(1, chunk_bytes // 4)  # FP32
    ring = [torch.empty(elements, dtype=torch.float32, pin_memory=pin) for _ in range(buffers)]
    accelerator = device.type != "cpu"
    done: list[torch.Event | None] = [None] * buffers
    turn = 0
    with torch.no_grad():
        for target, source in zip(initial.tensors(copy), initial.tensors(model), strict=True):
            flat_source, flat_target = source.reshape(-1), target.view(-1)
            for start in range(0, flat_source.numel(), elements):
                count = min(elements, flat_source.numel() - start)
                slot = turn % buffers
                if done[slot] is not None:
                    done[slot].synchronize()  # the copy that read this buffer last has finished
                staging = ring[slot][:count]
                staging.copy_(flat_source[start : start + count])
                flat_target[start : start + count].copy_(staging, non_blocking=accelerator)
                if accelerator:
                    done[slot] = torch.Event(device=device)
                    done[slot].record()
                turn += 1
    return copy


def pinned_whole_copy(pinned: list[torch.Tensor], model: LlamaModel, device: torch.device) -> LlamaModel:
    """A twin of `model` on `device` from host tensors pinned beforehand (`pinned`, in the model's order)."""
    copy = initial.empty_twin(model, device, torch.float32)
    with torch.no_grad():
        for target, source in zip(initial.tensors(copy), pinned, strict=True):
            target.copy_(source, non_blocking=True)
    return copy


def _synchronize(device: torch.device) -> None:
    module = getattr(torch, device.type, None)
    if module is not None and hasattr(module, "synchronize"):
        module.synchronize(device)


def _equal(copy: LlamaModel, model: LlamaModel) -> bool:
    return all(torch.equal(a.cpu(), b) for a, b in zip(initial.tensors(copy), initial.tensors(model), strict=True))


@click.command()
@click.option("--device", "device_name", default="cuda", show_default=True)
@click.option("--preset", default="official", show_default=True)
@click.option("--rounds", default=3, show_default=True, type=int)
@click.option("--chunk-mb", default=64, show_default=True, type=int, help="Each pinned staging buffer's size.")
def main(device_name: str, preset: str, rounds: int, chunk_mb: int) -> None:
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
    began = time.perf_counter()
    pinned = [t.detach().pin_memory() for t in initial.tensors(model)]
    pin_seconds = time.perf_counter() - began
    arms = {
        "twin (llmb)": lambda: initial.twin(model, device, torch.float32),
        f"staged, 2 x {chunk_mb} MB pinned": lambda: staged_copy(model, device, chunk_mb << 20),
        "pinned beforehand": lambda: pinned_whole_copy(pinned, model, device),
    }
    equal = {}
    for name, arm in arms.items():  # warm-up: the device's first copies pay its cold start; each checked equal
        copy = arm()
        _synchronize(device)
        equal[name] = _equal(copy, model)
        del copy
    seconds: dict[str, list[float]] = {name: [] for name in arms}
    for _ in range(rounds):
        for name, arm in arms.items():
            _synchronize(device)
            began = time.perf_counter()
            copy = arm()
            _synchronize(device)
            seconds[name].append(time.perf_counter() - began)
            del copy
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    base = medians["twin (llmb)"]
    table = term.table(f"The initial model ({gigabytes:.2f} GB, {preset}) onto {device}, {rounds} rounds")
    for column in ("copy", "median s", "range s", "GB/s", "/ twin", "equal"):
        term.column(table, column, numeric=column != "copy")
    for name, values in seconds.items():
        term.row(table, name, f"{medians[name]:.3f}", f"{min(values):.3f}-{max(values):.3f}",
                 f"{gigabytes / medians[name]:.1f}", f"{medians[name] / base:.3f}", str(equal[name]))  # fmt: skip
    console.print(table)
    console.print(f"host build {build_seconds:.1f} s; pinning the whole model beforehand {pin_seconds:.2f} s "
                  "(beside the worker's setup, untimed by the run)", highlight=False)  # fmt: skip
    write_raw("initial_copy", {"command": command_line(), "machine": info, "preset": preset, "gigabytes": gigabytes,
                               "chunk_mb": chunk_mb, "seconds": seconds, "equal": equal, "pin_seconds": pin_seconds,
                               "build_seconds": build_seconds})  # fmt: skip


if __name__ == "__main__":
    main()
