"""llmb-xpu: Intel GPUs through upstream torch.xpu, with optional IPEX post-processing.

Everything device-side uses upstream ``torch.xpu`` (events, memory statistics, synchronisation, name and count), so
the plugin works without Intel Extension for PyTorch (IPEX). Intel stopped IPEX development in 2025 and its last
release (2.8.0) refuses any torch but 2.8.*; it is an opt-in (``-O ipex=true``) and never needed.

"cpu" is a secondary device type for one reason: IPEX's PyPI build is CPU-only, so ``--device cpu -O ipex=true`` is
the only place this plugin's IPEX path can run without an Intel GPU (llmb's tests use it). The device services for
"cpu" are the built-in cpu plugin's.
"""

from __future__ import annotations

import functools
from importlib.metadata import PackageNotFoundError, version

import torch

from llmb import PrecisionFact, Setting, hookimpl
from llmb.default_plugins import cpu as cpu_plugin
from llmb.errors import LlmbError

# Dense peak FLOP/s per torch device, only for figures confirmed against a vendor datasheet. None so far: Intel
# publishes no per-precision matrix peak for the Data Center GPU Max series that we could confirm (torchtitan
# derives 512 x compute units x 1.3 GHz per stack, an estimate). No entry means no MFU, never a guess.
PEAK_TFLOPS: dict[str, dict[str, float]] = {}

IPEX_DTYPES = {"FP32": None, "FP16": torch.float16, "BF16": torch.bfloat16}


def _import_ipex():
    """IPEX, or a one-line error saying why it cannot be used (absent, or built for another torch)."""
    try:
        import intel_extension_for_pytorch as ipex
    except BaseException as exc:  # IPEX exits (SystemExit/AttributeError) when torch's version does not match
        raise LlmbError(
            f"-O ipex=true needs intel_extension_for_pytorch, which did not import: {type(exc).__name__}: {exc} "
            "(IPEX 2.8.0 needs torch 2.8.*; or drop -O ipex=true)"
        ) from None
    return ipex


@hookimpl
def device_types():
    return ["xpu", "cpu"]


@hookimpl
def supported_precisions():
    # TF32 is left out: we could not check which switch makes torch's XPU matmuls use TF32 on this torch.
    return ["FP32", "FP16", "BF16"]


@hookimpl
def hardware_available():
    return torch.xpu.is_available()


@hookimpl
def plugin_settings():
    return [Setting("ipex", bool, False, "post-process the model with intel_extension_for_pytorch.optimize")]


@hookimpl
def setup_backend(device, precision, settings):
    if settings.get("ipex"):
        _import_ipex()  # fail before the model is built, not after
    if device.type == "xpu" and device.index is not None:
        torch.xpu.set_device(device.index)


@hookimpl
def process_model(model, optimizer, device, precision, settings):
    if not settings.get("ipex"):
        return model
    ipex = _import_ipex()
    dtype = IPEX_DTYPES[precision]
    if dtype is not None and any(p.dtype == torch.float32 for p in model.parameters()):
        # Mixed precision (--precision-mode amp): IPEX would cast the model to `dtype` and move FP32 master weights
        # into the optimizer, so AdamW no longer steps the model's parameters; the harness refuses that run anyway.
        raise LlmbError("-O ipex=true supports pure FP16/BF16 only: IPEX's mixed precision moves the master weights")
    # inplace=True: IPEX changes this model and the harness's own AdamW (measured: the same objects come back; its
    # default deep-copies both, and the harness would go on stepping the copy's optimizer-less original).
    # weights_prepack=False: prepacking swaps each Linear weight for a blocked-layout copy and registers a frozen,
    # empty placeholder parameter that AdamW never steps (measured on the tiny preset: 15 such parameters), so the
    # model's parameters would no longer be the model's.
    optimized, returned = ipex.optimize(model, optimizer=optimizer, dtype=dtype, inplace=True, weights_prepack=False)
    if returned is not optimizer:
        raise LlmbError("intel_extension_for_pytorch.optimize returned a new optimizer; llmb keeps its own AdamW")
    return optimized


@hookimpl
def precision_facts(device, precision, settings):
    if not settings.get("ipex"):
        return []
    dtype = IPEX_DTYPES[precision]
    fmt = {torch.float16: "FP16", torch.bfloat16: "BF16"}.get(dtype)
    return [PrecisionFact("ipex.dtype", str(dtype).replace("torch.", "") if dtype else "float32", fmt)]


def _cpu_plugin_on_cpu(hook):
    """On device "cpu" (the IPEX test device), answer with the built-in cpu plugin's hook of the same name."""

    @functools.wraps(hook)  # keeps the signature: pluggy passes arguments by the hook's parameter names
    def serve(device, *args):
        if device.type == "cpu":
            cpu_hook = getattr(cpu_plugin, hook.__name__, None)
            return cpu_hook(device, *args) if cpu_hook else None
        return hook(device, *args)

    return serve


@hookimpl
@_cpu_plugin_on_cpu
def synchronize(device):
    torch.xpu.synchronize(device)
    return True


@hookimpl
@_cpu_plugin_on_cpu
def device_event(device):
    return torch.xpu.Event(enable_timing=True)


@hookimpl
@_cpu_plugin_on_cpu
def reset_peak_memory(device):
    torch.xpu.reset_peak_memory_stats(device)
    return True


@hookimpl
@_cpu_plugin_on_cpu
def peak_memory_bytes(device):
    return torch.xpu.max_memory_allocated(device)


@hookimpl
@_cpu_plugin_on_cpu
def device_name(device):
    return torch.xpu.get_device_name(device)


@hookimpl
@_cpu_plugin_on_cpu
def device_count(device):
    return torch.xpu.device_count()


@hookimpl
@_cpu_plugin_on_cpu
def peak_flops(device, precision):
    name = torch.xpu.get_device_name(device)
    table = next((t for model, t in PEAK_TFLOPS.items() if model in name), {})
    return table[precision] * 1e12 if precision in table else None


@hookimpl
def run_facts(device):
    facts = {"torch_xpu": getattr(torch.version, "xpu", None)}
    if device.type == "xpu":
        props = torch.xpu.get_device_properties(device)
        facts["xpu_driver"] = getattr(props, "driver_version", None)
        facts["xpu_total_memory"] = getattr(props, "total_memory", None)
    try:  # from the metadata: importing IPEX next to another torch prints an error and exits
        facts["ipex"] = version("intel-extension-for-pytorch")
    except PackageNotFoundError:
        pass
    return facts


@hookimpl
@_cpu_plugin_on_cpu
def distributed_backend(device):
    # xccl is upstream torch's XPU collective backend (torch >= 2.8 XPU builds); older stacks used oneCCL's "ccl".
    available = getattr(torch.distributed, "is_xccl_available", None)
    return "xccl" if available and available() else "ccl"
