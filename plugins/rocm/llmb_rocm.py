"""llmb plugin for AMD GPUs through torch's ROCm (HIP) build, where AMD GPUs are torch "cuda" devices.

HIP mirrors the CUDA API in torch, so the device services and the post-processing are llmb_cuda's, imported below
(pluggy registers every hook implementation found on this module, imported ones included). What differs: hardware
detection, the peak table, ROCm's BLAS and TunableOp setup, and the facts recorded.

Settings (-O key=value): llmb_cuda's compile, fused_adamw and activation_checkpointing, plus tunableop and hipblaslt.
"""

from __future__ import annotations

import os

import llmb_cuda
import torch
from llmb_cuda import PeakEntry, device_index, match_peak, nccl_version

from llmb import PrecisionFact, Setting, hookimpl

# Re-exported on purpose: pluggy registers these as this plugin's hook implementations too.
device_types = llmb_cuda.device_types
supported_precisions = llmb_cuda.supported_precisions
process_model = llmb_cuda.process_model
optimizer_options = llmb_cuda.optimizer_options
synchronize = llmb_cuda.synchronize
device_event = llmb_cuda.device_event
reset_peak_memory = llmb_cuda.reset_peak_memory
peak_memory_bytes = llmb_cuda.peak_memory_bytes
device_name = llmb_cuda.device_name
device_count = llmb_cuda.device_count
distributed_backend = llmb_cuda.distributed_backend  # "nccl": RCCL serves torch's nccl backend on ROCm

SETTINGS = [
    *llmb_cuda.SETTINGS,
    Setting("tunableop", bool, False, "TunableOp: tune each GEMM shape on first use (PYTORCH_TUNABLEOP_ENABLED)"),
    Setting("hipblaslt", bool, True, "prefer hipBLASLt over rocBLAS for GEMMs (TORCH_BLAS_PREFER_HIPBLASLT)"),
]

# Peak dense FLOP/s per torch device. On MI250X each of the two GCDs is its own torch device, so the figures are
# the package's halved. MI250X has no TF32 rate: a run labelled TF32 there gets no peak and no MFU.
PEAKS: tuple[PeakEntry, ...] = (
    # MI250X (OAM, 2 GCDs): AMD datasheet, peak FP32 matrix 95.7, FP16/BF16 383.0 TFLOPS per package.
    # https://www.amd.com/content/dam/amd/en/documents/instinct-business-docs/product-briefs/instinct-mi250x-brochure.pdf
    # https://www.amd.com/en/products/accelerators/instinct/mi200/mi250x.html
    # A name that also says MI250 (rocm-smi's "MI250X / MI250") is ambiguous: MI250 is slower, so no peak.
    PeakEntry("MI250X", r"\bMI250X\b", r"\bMI250\b", {"FP32": 47.85e12, "FP16": 191.5e12, "BF16": 191.5e12}),
    # MI300X: AMD datasheet, peak FP32 matrix 163.4, TF32 653.7, FP16/BF16 1,307.4 TFLOPS (dense; 2x with sparsity).
    # https://www.amd.com/content/dam/amd/en/documents/instinct-tech-docs/data-sheets/amd-instinct-mi300x-data-sheet.pdf
    PeakEntry(
        "MI300X", r"\bMI300X\b", None, {"FP32": 163.4e12, "TF32": 653.7e12, "FP16": 1307.4e12, "BF16": 1307.4e12}
    ),
)


def env_for(settings: dict) -> dict[str, str]:
    """The environment variables ROCm's libraries read for these settings."""
    return {
        "PYTORCH_TUNABLEOP_ENABLED": "1" if settings.get("tunableop") else "0",
        "TORCH_BLAS_PREFER_HIPBLASLT": "1" if settings.get("hipblaslt", True) else "0",
    }


def amdgpu_driver_version() -> str | None:
    try:
        with open("/sys/module/amdgpu/version") as f:
            return f.read().strip() or None
    except OSError:
        return None


@hookimpl
def hardware_available():
    return torch.version.hip is not None and torch.cuda.is_available() and torch.cuda.device_count() > 0


@hookimpl
def plugin_settings():
    return SETTINGS


@hookimpl
def setup_backend(device, precision, settings):
    os.environ.update(env_for(settings))
    # The environment is read when the BLAS handles are created; the runtime switches cover a process that
    # already used the GPU.
    if torch.version.hip is not None and torch.cuda.is_available():
        torch.cuda.tunable.enable(bool(settings.get("tunableop")))
        torch.backends.cuda.preferred_blas_library("hipblaslt" if settings.get("hipblaslt", True) else "cublas")
        if device.index is not None:
            torch.cuda.set_device(device)


@hookimpl
def peak_flops(device, precision):
    return match_peak(torch.cuda.get_device_name(device_index(device)), precision, PEAKS)


@hookimpl
def precision_facts(device, precision, settings):
    # TunableOp and the BLAS choice pick among kernels of the same GEMM type; they do not lower its format, but a
    # reader should see them. HIPBLASLT_ALLOW_TF32 lets hipBLASLt run FP32 GEMMs as XF32 on MI300 when torch's TF32
    # switch is also on; the audit's TF32 flags and matmul probe judge what it did.
    facts = llmb_cuda.precision_facts(device=device, precision=precision, settings=settings)
    facts += [PrecisionFact(name, value) for name, value in env_for(settings).items()]
    facts.append(PrecisionFact("HIPBLASLT_ALLOW_TF32", os.environ.get("HIPBLASLT_ALLOW_TF32")))
    return facts


@hookimpl
def run_facts(device):
    props = torch.cuda.get_device_properties(device_index(device))
    return {
        "gpu": props.name,
        "gcn_arch": getattr(props, "gcnArchName", None),
        "compute_units": props.multi_processor_count,
        "memory_bytes": props.total_memory,
        "hip_runtime": torch.version.hip,
        "amdgpu_driver": amdgpu_driver_version(),
        "miopen": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "rccl": nccl_version(),
    }
