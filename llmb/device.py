"""Device services for the timer and the records, served by the selected plugin with honest fallbacks."""

from __future__ import annotations

import platform

import torch

from llmb.errors import UsageError
from llmb.plugins import Plugin


def parse_device(spec: str) -> torch.device:
    """A torch device from any string torch accepts; a usage error otherwise."""
    try:
        return torch.device(spec)
    except (RuntimeError, ValueError) as exc:
        raise UsageError(f"torch cannot parse device {spec!r}: {str(exc).splitlines()[0]}") from None


def check_device_present(device: torch.device) -> None:
    """Allocate one element on the device, so an absent device fails before any work is done."""
    try:
        torch.empty(1, device=device)
    except Exception as exc:
        raise UsageError(f"device {str(device)!r} is not available: {str(exc).splitlines()[0]}") from None


class Device:
    """The run's device and the plugin's services for it."""

    def __init__(self, plugin: Plugin, device: torch.device) -> None:
        self.plugin = plugin
        self.device = device
        # Ask once whether the plugin has device events; None means host timing with a sync each step.
        self.has_events = plugin.call("device_event", device=device) is not None

    def synchronize(self) -> None:
        """Wait for the device; a device with no synchronisation cannot be timed, so that is an error."""
        if self.plugin.call("synchronize", device=self.device):
            return
        if self.device.type == "cpu":
            return  # eager CPU ops finish before they return
        accelerator = getattr(torch, "accelerator", None)
        current = accelerator.current_accelerator() if accelerator and accelerator.is_available() else None
        if current is not None and current.type == self.device.type:
            accelerator.synchronize(self.device)
            return
        raise UsageError(
            f"plugin {self.plugin.name!r} cannot synchronise device {str(self.device)!r}; llmb will not time "
            "an asynchronous device without it"
        )

    def new_event(self):
        return self.plugin.call("device_event", device=self.device)

    def step_end(self) -> None:
        self.plugin.call("step_end", device=self.device)

    def reset_peak_memory(self) -> None:
        self.plugin.call("reset_peak_memory", device=self.device)

    def peak_memory_bytes(self) -> int | None:
        value = self.plugin.call("peak_memory_bytes", device=self.device)
        return int(value) if value is not None else None

    def name(self) -> str:
        return self.plugin.call("device_name", device=self.device) or platform.processor() or self.device.type

    def count(self) -> int:
        return int(self.plugin.call("device_count", device=self.device) or 1)

    def peak_flops(self, precision: str) -> float | None:
        value = self.plugin.call("peak_flops", device=self.device, precision=precision)
        return value or None  # a float, or (Backend API) a Peak with its source
