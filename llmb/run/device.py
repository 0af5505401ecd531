"""Device strings: parsed as torch parses them, and checked present before any work."""

from __future__ import annotations

import torch

from llmb.api.errors import UsageError


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
