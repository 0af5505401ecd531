"""A test backend, never part of llmb: the host CPU with a simulated device-memory limit, so the out-of-memory paths
of runs and sweeps can be exercised on a CPU (which has no memory limit to hit).

In-process tests register it through conftest's `register_backend` fixture; subprocesses (sweeps) find it through
the entry point that conftest's `oomtest_site` writes, the way any installed plugin is found.
"""

from __future__ import annotations

import functools

import torch

from llmb import CpuBackend, Setting, hookimpl


class OomTestBackend(CpuBackend):
    name = "oomtest"

    def available(self) -> bool:
        return False  # never auto-selected: a test names it

    def settings(self) -> list[Setting]:
        return [Setting("oom_above_batch_size", int, 0, "raise torch.OutOfMemoryError above this batch (0: off)")]

    def optimizer_options(self, device, precision, settings) -> dict:
        # The cpu backend's default AdamW (its settings, fused_adamw among them, are not offered here): pure FP16
        # needs its FP32 arithmetic to follow the reference (llmb/spec/tolerances.py, REPLAY_TOLERANCES).
        return {"fused": True}

    def process_model(self, model, optimizer, device, precision, settings):
        limit = settings.get("oom_above_batch_size", 0)
        if limit:
            model.register_forward_pre_hook(functools.partial(_simulated_memory_limit, limit))
        return model


def _simulated_memory_limit(limit, module, args):
    # What a device raises when a batch does not fit.
    batch = args[0].shape[0]
    if batch > limit:
        raise torch.OutOfMemoryError(f"simulated: batch {batch} is above oom_above_batch_size={limit}")


@hookimpl
def register_backends(register):
    register(OomTestBackend())
