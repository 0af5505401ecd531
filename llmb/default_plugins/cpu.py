"""The cpu reference plugin: plain PyTorch on the host CPU, built into llmb."""

from __future__ import annotations

import functools
import os
import platform
import resource
import sys

import torch

from llmb import PrecisionFact, Setting, checkpointing, compilers, fp8, hookimpl

COMPILE_MODES = ("none", "default", "max-autotune", compilers.THUNDER)


@hookimpl
def device_types():
    return ["cpu"]


@hookimpl
def supported_precisions():
    # No CPU computes TF32 matmuls; a TF32 label here would only be FP32 under another name.
    return ["FP32", "FP16", "BF16"]


@hookimpl
def hardware_available():
    return True


@hookimpl
def plugin_settings():
    return [
        Setting(
            "compile",
            str,
            "none",
            "torch.compile the model with this mode, or thunder: Lightning Thunder's thunder.jit (needs torch 2.9)",
            COMPILE_MODES,
        ),
        Setting("activation_checkpointing", str, "none", checkpointing.HELP, checkpointing.MODES),
        Setting("fp8", str, "none", "train the Linear layers in float8 with this torchao recipe", fp8.RECIPES),
        Setting("fp8_emulate", bool, True, "torchao's float8 emulation (false: torch._scaled_mm's CPU kernel)"),
        Setting("threads", int, 0, "intra-op threads for torch (0: torch's default)"),
        # On by default: 4.9x to 6.1x faster per optimizer step than torch's per-tensor loop (benchmarks/RESULTS.md).
        Setting("fused_adamw", bool, True, "AdamW's fused CPU kernel (false: torch's default per-tensor loop)"),
        Setting(
            "oom_above_batch_size",
            int,
            0,
            "test aid: raise torch.OutOfMemoryError for a batch larger than this, since the CPU has no device "
            "memory limit to hit (0: off)",
        ),
    ]


@hookimpl
def setup_backend(device, precision, settings):
    # Before the model exists: a compiler or FP8 that cannot run here is one line, not a traceback mid-run.
    compilers.check_compiler(settings.get("compile", "none"))
    fp8.check_fp8(settings.get("fp8", "none"))
    if settings.get("threads"):
        torch.set_num_threads(settings["threads"])


@hookimpl
def process_model(model, optimizer, device, precision, settings):
    limit = settings.get("oom_above_batch_size", 0)
    if limit:
        model.register_forward_pre_hook(functools.partial(_simulated_memory_limit, limit))
    # torchtitan's order: float8 swaps the Linear modules, checkpointing wraps the layers, the compiler sees all.
    model = fp8.convert(model, settings.get("fp8", "none"), emulate=settings.get("fp8_emulate", True))
    model = checkpointing.apply_activation_checkpointing(model, settings.get("activation_checkpointing", "none"))
    return compilers.compile_model(model, settings.get("compile", "none"))


@hookimpl
def precision_facts(device, precision, settings):
    recipe = settings.get("fp8", "none")
    return [PrecisionFact("llmb.fp8", recipe, "FP8" if recipe != "none" else None)]


def _simulated_memory_limit(limit, module, args):
    # Simulated: what a device raises when a batch does not fit, so sweeps can exercise their OOM path on the CPU.
    batch = args[0].shape[0]
    if batch > limit:
        raise torch.OutOfMemoryError(f"simulated: batch {batch} is above oom_above_batch_size={limit}")


@hookimpl
def optimizer_options(device, precision, settings):
    return {"fused": True} if settings.get("fused_adamw") else None


@hookimpl
def synchronize(device):
    return True  # eager CPU kernels have finished when they return


@hookimpl
def reset_peak_memory(device):
    return True  # the process high-water mark below cannot be reset; it only grows


@hookimpl
def peak_memory_bytes(device):
    # Process max RSS: an upper bound on the training memory (includes the interpreter and the libraries).
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if sys.platform == "darwin" else rss * 1024


@hookimpl
def device_name(device):
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


@hookimpl
def device_count(device):
    return 1


@hookimpl
def run_facts(device):
    return {
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "mkldnn": torch.backends.mkldnn.is_available(),
    }


@hookimpl
def distributed_backend(device):
    return "gloo"
