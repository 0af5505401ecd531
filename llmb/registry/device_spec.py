"""A --device string as torch reads it: the one parser, for auto-selection (llmb.registry.plugins picks a plugin by
the device's type) and for every command that runs on it (llmb.run.device)."""

from __future__ import annotations

import torch

from llmb.api.errors import LONGEST_SHOWN, UsageError, first_line, shown


def parse_device(spec: str) -> torch.device:
    """A torch device from any string torch accepts; a usage error otherwise."""
    try:
        device = torch.device(spec)
    except (RuntimeError, ValueError) as exc:
        # torch's message repeats the string it could not parse: one too long to repeat whole is said once, by shown.
        reason = first_line(exc) if len(spec) <= LONGEST_SHOWN else first_line(exc).replace(spec, "(the value given)")
        raise UsageError(f"torch cannot parse device {shown(spec)}: {reason}") from None
    given = spec.rpartition(":")[2].strip()
    if device.index is not None and given.isdigit() and int(given) != device.index:
        # torch keeps a device index in 8 bits: 'cpu:999' is cpu:-25, 'cuda:256' cuda:0, a device never asked for.
        raise UsageError(f"device {shown(spec)}: index {shown(int(given))} is out of range (torch takes 0 to 127)")
    return device
