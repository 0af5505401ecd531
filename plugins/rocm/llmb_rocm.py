"""llmb plugin for AMD GPUs through torch's ROCm (HIP) build, where AMD GPUs are torch "cuda" devices.

HIP mirrors the CUDA API in torch, so `RocmBackend` subclasses llmb_cuda's `CudaBackend`: the device services and
the post-processing are inherited. What differs: hardware detection, ROCm's BLAS and TunableOp setup, and the
facts recorded (peaks are llmb's table's: llmb/spec/peak_table.py has the MI250X and MI300X).

Settings (-O key=value): llmb_cuda's compile, fused_adamw, activation_checkpointing, fp8 and fp8_emulate, plus
tunableop and hipblaslt.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
from llmb_cuda import CudaBackend, CudaSettings, PeakEntry, device_index, nccl_version, smi_index

from llmb import Backend, EnergyCounter, PrecisionFact, hookimpl, option


@dataclass(frozen=True, eq=False)
class RocmSettings(CudaSettings):
    """The cuda plugin's settings, then ROCm's BLAS choices."""

    tunableop: bool = option(False, "TunableOp: tune each GEMM shape on first use (PYTORCH_TUNABLEOP_ENABLED)")
    hipblaslt: bool = option(True, "prefer hipBLASLt over rocBLAS for GEMMs (TORCH_BLAS_PREFER_HIPBLASLT)")


# Peaks for AMD GPUs llmb's table (llmb/spec/peak_table.py) lacks, in llmb_cuda's PeakEntry form; empty: the table has
# the MI250X (per GCD) and MI300X, and it wins for any GPU it has (tests/test_peaks.py keeps this so).
PEAKS: tuple[PeakEntry, ...] = ()


# GPU architectures whose float8 GEMMs torch._scaled_mm runs ("ROCm MI300+" in its check): MI300/MI325 (gfx942),
# MI350 (gfx950), RDNA4 (gfx12xx).
FP8_ARCHS = ("gfx94", "gfx95", "gfx12")


def env_for(settings: RocmSettings) -> dict[str, str]:
    """The environment variables ROCm's libraries read for these settings."""
    return {
        "PYTORCH_TUNABLEOP_ENABLED": "1" if settings.tunableop else "0",
        "TORCH_BLAS_PREFER_HIPBLASLT": "1" if settings.hipblaslt else "0",
    }


def amdgpu_driver_version() -> str | None:
    try:
        with open("/sys/module/amdgpu/version") as f:
            return f.read().strip() or None
    except OSError:
        return None


def amdsmi_energy_counter(device: torch.device) -> EnergyCounter | str:
    """The GPU's energy accumulator through amdsmi (counter x counter_resolution microjoules), or why it cannot be
    read."""
    try:
        import amdsmi
    except ImportError:
        return "no energy counter: amdsmi is not importable (it ships with ROCm: pip install amdsmi)"
    index = smi_index(device, "_get_amdsmi_device_index")
    try:
        amdsmi.amdsmi_init()
        handle = amdsmi.amdsmi_get_processor_handles()[index]
        amdsmi.amdsmi_get_energy_count(handle)
    except Exception as exc:  # no such GPU, a driver without the counter: the run goes on without energy
        return f"amdsmi has no energy counter for GPU {index}: {type(exc).__name__}: {exc}"
    try:
        limit = amdsmi.amdsmi_get_power_cap_info(handle)["power_cap"] / 1e6
    except Exception:
        limit = None

    def read() -> float:
        count = amdsmi.amdsmi_get_energy_count(handle)
        # "energy_accumulator" since ROCm 6.2; "power" before it (the same counter under a misleading name).
        value = count["energy_accumulator"] if "energy_accumulator" in count else count["power"]
        return value * count["counter_resolution"] / 1e6

    return EnergyCounter(read, f"amdsmi energy accumulator of GPU {index}", limit)


class RocmBackend(CudaBackend):
    name = "rocm"
    Settings = RocmSettings
    peaks = PEAKS

    def available(self) -> bool:
        return torch.version.hip is not None and torch.cuda.is_available() and torch.cuda.device_count() > 0

    def setup(self, device: torch.device, precision: str, settings: RocmSettings) -> None:
        os.environ.update(env_for(settings))
        # The environment is read when the BLAS handles are created; the runtime switches cover a process that
        # already used the GPU.
        if torch.version.hip is not None and torch.cuda.is_available():
            torch.cuda.tunable.enable(settings.tunableop)
            torch.backends.cuda.preferred_blas_library("hipblaslt" if settings.hipblaslt else "cublas")
        super().setup(device, precision, settings)  # the device, and the compiler and FP8 checks

    def energy_counter(self, device: torch.device) -> EnergyCounter | str:
        return amdsmi_energy_counter(device)

    def fp8_unsupported(self, device: torch.device) -> str | None:
        # HIP reports no CUDA compute capability that says float8 (MI250X answers 9.0): the GPU architecture does.
        if device.type != "cuda" or torch.version.hip is None or not torch.cuda.is_available():
            return None
        arch = (getattr(torch.cuda.get_device_properties(device_index(device)), "gcnArchName", "") or "").split(":")[0]
        if arch.startswith(FP8_ARCHS):
            return None
        return f"{arch or 'this GPU'} has no float8 GEMMs in torch._scaled_mm; they need MI300 (gfx942) or newer"

    def precision_facts(self, device: torch.device, precision: str, settings: RocmSettings) -> list[PrecisionFact]:
        # TunableOp and the BLAS choice pick among kernels of the same GEMM type; they do not lower its format, but
        # a reader should see them. HIPBLASLT_ALLOW_TF32 lets hipBLASLt run FP32 GEMMs as XF32 on MI300 when torch's
        # TF32 switch is also on; the audit's TF32 flags and matmul probe judge what it did.
        facts = super().precision_facts(device, precision, settings)
        facts += [PrecisionFact(name, value) for name, value in env_for(settings).items()]
        facts.append(PrecisionFact("HIPBLASLT_ALLOW_TF32", os.environ.get("HIPBLASLT_ALLOW_TF32")))
        return facts

    def run_facts(self, device: torch.device) -> dict:
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

    # distributed_backend stays "nccl": RCCL serves torch's nccl backend on ROCm.


@hookimpl
def register_backends(register: Callable[[Backend], None]) -> None:
    register(RocmBackend())
