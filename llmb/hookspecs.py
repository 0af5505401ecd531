"""The hooks a hardware plugin may implement. The harness owns the model, the loop, the timer and the records.

Every hook is called on the selected plugin only. Hooks that take ``settings`` get the plugin's validated settings
as a dict. ``device`` is a ``torch.device``; ``precision`` one of FP32, TF32, FP16, BF16.
"""

from __future__ import annotations

from pluggy import HookimplMarker, HookspecMarker

hookspec = HookspecMarker("llmb")
hookimpl = HookimplMarker("llmb")


# Identity and capability


@hookspec(firstresult=True)
def device_types():
    """Return the torch device types this plugin serves, the default first (e.g. ["cuda"])."""


@hookspec(firstresult=True)
def supported_precisions():
    """Return the precisions this plugin can run, a subset of FP32, TF32, FP16, BF16."""


@hookspec(firstresult=True)
def hardware_available():
    """Return True when this plugin's hardware is present (used for auto-selection)."""


@hookspec(firstresult=True)
def plugin_settings():
    """Return the list of llmb.Setting this plugin accepts through -O key=value."""


# Backend setup and model post-processing


@hookspec
def setup_backend(device, precision, settings):
    """Configure the framework before the model exists: torch.backends flags, environment, libraries."""


@hookspec(firstresult=True)
def process_model(model, optimizer, device, precision, settings):
    """Return the post-processed model (compile, fused kernels, wrappers); never build a new model."""


@hookspec(firstresult=True)
def optimizer_options(device, precision, settings):
    """Return AdamW implementation options only: a dict with any of foreach, fused, capturable."""


@hookspec(firstresult=True)
def step_end(device):
    """Finish one training step where the device needs it (e.g. torch_xla.sync()); return True if handled."""


# Device services for the timer and the records


@hookspec(firstresult=True)
def synchronize(device):
    """Block until all queued work on the device is done; return True if handled."""


@hookspec(firstresult=True)
def device_event(device):
    """Return a new timing event (record(), synchronize(), elapsed_time(other) in ms), or None if none exist."""


@hookspec(firstresult=True)
def reset_peak_memory(device):
    """Reset the device's peak-memory counter; return True if handled."""


@hookspec(firstresult=True)
def peak_memory_bytes(device):
    """Return the device's peak allocated memory in bytes since the last reset, or None if unknown."""


@hookspec(firstresult=True)
def device_name(device):
    """Return the device's marketing name (e.g. "NVIDIA H100 80GB HBM3")."""


@hookspec(firstresult=True)
def device_count(device):
    """Return how many devices of this type the host has."""


@hookspec(firstresult=True)
def peak_flops(device, precision):
    """Return the device's dense peak FLOP/s for the precision, or None when not known (never guess)."""


@hookspec
def precision_facts(device, precision, settings):
    """Return a list of llmb.PrecisionFact about backend state that decides the numeric format that runs."""


@hookspec
def run_facts(device):
    """Return a dict of facts to record with the run: vendor library versions, driver, runtime."""


@hookspec(firstresult=True)
def distributed_backend(device):
    """Return the torch.distributed process-group backend for the device (e.g. "nccl", "gloo")."""
