"""Devices a command runs on: the plugin's (--device parsed by llmb.registry.device_spec), checked present before any
work, their memory given back after it."""

from __future__ import annotations

import gc

import torch

from llmb.api.errors import UsageError, message
from llmb.registry.device_spec import parse_device
from llmb.registry.plugins import Registration, call


def plugin_device(selected: Registration, given: str | None, asked_for: str | None) -> torch.device:
    """The device a command runs on: --device as given, else the plugin's first device type (the CPU for a plugin
    that names none); a usage error for one the plugin does not serve, saying so where the plugin was auto-selected
    (`asked_for`, the --plugin given, is None)."""
    types = list(call(selected.backend.device_types))
    device = parse_device(given or (types[0] if types else "cpu"))
    if types and device.type not in types:
        chosen = "" if asked_for else AUTO_SELECTED
        raise UsageError(f"plugin {selected.name!r} serves {', '.join(types)}, not {device.type!r}{chosen}")
    return device


AUTO_SELECTED = " (auto-selected: no installed plugin with its hardware present serves it; name one with --plugin)"


def check_device_present(device: torch.device) -> None:
    """Allocate one element on the device, so an absent device fails before any work is done. The host's CPU is one
    device, `cpu` or `cpu:0`: torch takes any index there and ignores it, so another is refused here."""
    if device.type == "cpu" and device.index not in (None, 0):
        raise UsageError(f"device {str(device)!r} is not available: the host's CPU is one device, 'cpu' (or 'cpu:0')")
    try:
        torch.empty(1, device=device)
    except Exception as exc:
        raise UsageError(f"device {str(device)!r} is not available: {str(exc).splitlines()[0]}") from None


def release_device_memory(device: torch.device) -> None:
    """After a run, give its device memory back: compiled graphs (they hold the model's weights), then the caching
    allocator's blocks. The judge replays the run on the same accelerator while the worker waits for its verdict
    (llmb.judge.replay.replay_device); on one H100 an AMP run at batch 64 kept 60.6 GB reserved, the replay beside it
    ran out of memory and fell back to the host CPU (minutes at the official shape)."""
    torch.compiler.reset()
    free_cached_memory(device)


def free_cached_memory(device: torch.device) -> None:
    """Collect what Python no longer holds, then give the caching allocator's free blocks back to the device."""
    gc.collect()
    module = getattr(torch, device.type, None)
    if device.type != "cpu" and module is not None and hasattr(module, "empty_cache"):
        module.empty_cache()


def is_out_of_memory(exc: BaseException | None) -> bool:
    """Whether `exc`, or an exception it was raised from, says a device or the host ran out of memory."""
    while exc is not None:
        if isinstance(exc, torch.OutOfMemoryError):
            return True
        text = message(exc).lower()
        if isinstance(exc, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text):
            return True
        exc = exc.__cause__
    return False
