"""What the judge reads of the run's hardware itself, through torch's public device APIs in its own process (which
imported no plugin): the names of this host's devices of a type torch drives alone. A plugin names its device in
the worker, and that name picks the row of llmb's peak table (the MFU's denominator); where the judge can read the
names itself, the plugin's word is held to them."""

from __future__ import annotations

import torch

from llmb.judge.replay import NATIVE_REPLAY_DEVICE_TYPES, replay_device


def device_names(spec: str | None) -> list[str] | None:
    """The names of this host's devices of the run's device type (index order), as torch gives them to this process;
    None where it cannot say. Where the judge could replay on the run's own device (llmb.judge.replay.replay_device:
    a type torch drives alone, seen here) it can read the names; elsewhere it cannot: a type only a plugin's library
    drives (xla, a vendor's own), the CPU (whose rows the table has none of, and whose name the cpu plugin reads from
    the OS as the judge would), none visible here. A driver that fails to answer says nothing either."""
    device = replay_device(spec)
    if device.type == "cpu":
        return None
    module = getattr(torch, device.type)
    try:
        names = [str(module.get_device_name(index)) for index in range(int(module.device_count()))]
    except Exception:  # a driver that fails to answer (or a torch without the call) says nothing
        return None
    return names or None


def device_type(spec: object) -> str | None:
    """The type of a device string as torch parses it ("cuda" of "cuda:1"); None for no string or one torch refuses."""
    if not isinstance(spec, str) or not spec:
        return None
    try:
        return torch.device(spec).type
    except (RuntimeError, ValueError, TypeError):
        return None


def unseen_device_problems(spec: object) -> list[str]:
    """A run that says it ran on a type of device torch drives alone (cuda, xpu, mps) where torch in the judge's
    process, which imported no plugin, sees none of that type: a worker's record cannot name an accelerator this host
    does not have (its device type picks the replay's moment tolerance, looser on accelerators than on the CPU)."""
    kind = device_type(spec)
    if kind not in NATIVE_REPLAY_DEVICE_TYPES or replay_device(str(spec)).type == kind:
        return []
    return [f"device: the worker's record says it ran on {str(spec)!r}; torch sees no {kind} device on this host"]


def judged_device_name(spec: str | None, said: str) -> tuple[str | None, list[str]]:
    """The device name the peak is chosen by, and what is wrong with the plugin's: the plugin's own where the judge
    cannot read the host's devices or where it names one of them; otherwise the judge's reading (the device at the
    run's index, or the one name every device here has), with a problem naming both. None: the judge cannot tell
    which of this host's devices ran, so no peak is used."""
    seen = device_names(spec)
    if not seen or said in seen:
        return said, []
    device = torch.device(spec)  # a device torch parsed already (device_names read its type's names)
    index = device.index or 0
    judged = seen[index] if index < len(seen) else (seen[0] if len(set(seen)) == 1 else None)
    named = ", ".join(repr(name) for name in dict.fromkeys(seen))
    return judged, [
        f"device: the plugin names its device {said!r}, which is none of this host's {device.type} devices as torch "
        f"names them to the judge ({named}); the peak is chosen for "
        + (repr(judged) if judged is not None else "none of them (no peak is used)")
    ]
