"""A test backend, never part of llmb: the host CPU with a simulated device-memory limit, so the out-of-memory paths
of runs and sweeps can be exercised on a CPU (which has no memory limit to hit).

In-process tests register it through conftest's `register_backend` fixture; subprocesses (sweeps) find it through
the entry point that conftest's `oomtest_site` writes, the way any installed plugin is found.
"""

from __future__ import annotations

import functools

import torch
from torch.utils._python_dispatch import is_in_torch_dispatch_mode

from llmb import CpuBackend, Setting, hookimpl


class OomTestBackend(CpuBackend):
    name = "oomtest"

    def available(self) -> bool:
        return False  # never auto-selected: a test names it

    def settings(self) -> list[Setting]:
        return [
            Setting("oom_above_batch_size", int, 0, "raise torch.OutOfMemoryError above this batch (0: off)"),
            Setting(
                "oom_in_audit_above_rows",
                int,
                -1,
                "raise torch.OutOfMemoryError above this many rows in a training step under a dispatch mode (-1: off)",
            ),
        ]

    def optimizer_options(self, device, precision, settings) -> dict:
        # The cpu backend's default AdamW (its settings, fused_adamw among them, are not offered here): pure FP16
        # needs its FP32 arithmetic to follow the reference (llmb/spec/tolerances.py, REPLAY_TOLERANCES).
        return {"fused": True}

    def process_model(self, model, optimizer, device, precision, settings):
        limit = settings.get("oom_above_batch_size", 0)
        if limit:
            model.register_forward_pre_hook(functools.partial(_simulated_memory_limit, limit))
        audit_limit = settings.get("oom_in_audit_above_rows", -1)
        if audit_limit >= 0:
            model.register_forward_pre_hook(functools.partial(_simulated_audit_memory_limit, audit_limit))
        return model


def _simulated_memory_limit(limit, module, args):
    # What a device raises when a batch does not fit.
    batch = args[0].shape[0]
    if batch > limit:
        raise torch.OutOfMemoryError(f"simulated: batch {batch} is above oom_above_batch_size={limit}")


@hookimpl
def register_backends(register):
    register(OomTestBackend())


def _simulated_audit_memory_limit(limit, module, args):
    # What a GPU raises where the compiled loop fits and the eager training step under llmb's dispatch recorder does
    # not (llmb.run.audit_step): the limit holds only for a forward that keeps its graph while a dispatch mode is
    # pushed (the census's forward before the windows keeps none, and fits).
    rows = args[0].shape[0]
    if is_in_torch_dispatch_mode() and torch.is_grad_enabled() and rows > limit:
        raise torch.OutOfMemoryError(f"simulated: {rows} rows under a dispatch mode, above oom_in_audit_above_rows")
