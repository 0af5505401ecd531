"""llmb plugin for NVIDIA GPUs through torch.cuda: events, memory stats, peaks for GPUs llmb's table lacks, and the
training features llmb shares with every plugin (llmb.toolkit.checkpointing, llmb.toolkit.compilers, llmb.toolkit.fp8:
the cpu plugin's too).

Settings (-O key=value): compile, fused_adamw, activation_checkpointing, fp8, fp8_emulate. See README.md.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from llmb import Backend, EnergyCounter, Peak, PrecisionFact, hookimpl, option
from llmb.api.errors import UsageError
from llmb.toolkit import compilers, features

# float8 GEMMs (torch._scaled_mm) need Ada or Hopper tensor cores or newer: compute capability 8.9.
FP8_CAPABILITY = (8, 9)


# The defaults are the path a performance engineer takes on a datacentre GPU: Inductor and AdamW's fused kernel. On
# one H100 at the official shape (BF16, issue 24) the per-tensor eager defaults this plugin had trained 27.4k
# tokens/s at batch 8 where the compiled, fused loop trained 60.8-63.8k at batch 32-64. compile=none and
# fused_adamw=false remain one -O away (compiling the official shape takes a minute or two of the warmup).
@dataclass(frozen=True, eq=False)
class CudaSettings(features.FeatureSettings):
    """llmb's shared features (compile, activation_checkpointing, fp8, fp8_emulate), compiled by default, and the
    fused AdamW."""

    compile: str = option("default", compilers.HELP, choices=features.COMPILE_MODES)
    fused_adamw: bool = option(True, "use AdamW's fused CUDA kernel (fused=True); false: torch's per-tensor loop")


# Peaks are llmb's (llmb/spec/peak_table.py: every GPU this plugin was written for, each with its public source); a
# plugin declares one only for a GPU that table lacks (llmb/spec/peak_table.py's rules: the table wins for any GPU it
# has). PEAKS below is where such a GPU goes: dense figures by the precision that really ran (sparse 2:4 figures are
# twice these and never used), FP32 the non-tensor-core rate, TF32/FP16/BF16 the tensor-core rates.


@dataclass(frozen=True)
class PeakEntry:
    """One GPU model: a regex on torch's device name, names that look alike but differ, its dense peaks, and the
    public document they come from."""

    label: str
    pattern: str
    exclude: str | None
    peaks: dict[str, float]
    source: str

    def matches(self, name: str) -> bool:
        if not re.search(self.pattern, name, re.IGNORECASE):
            return False
        return not (self.exclude and re.search(self.exclude, name, re.IGNORECASE))


# Empty: llmb's table has every GPU this plugin knows (tests/test_peaks.py keeps it so).
PEAKS: tuple[PeakEntry, ...] = ()


def match_entry(name: str, table: tuple[PeakEntry, ...] = PEAKS) -> PeakEntry | None:
    """The table entry for a device name; None when no entry or more than one matches (never guess)."""
    found = [entry for entry in table if entry.matches(name)]
    return found[0] if len(found) == 1 else None


def match_peak(name: str, precision: str, table: tuple[PeakEntry, ...] = PEAKS) -> Peak | None:
    """The dense peak FLOP/s for a device name and precision with its source, or None."""
    entry = match_entry(name, table)
    if entry is None or precision not in entry.peaks:
        return None
    return Peak(entry.peaks[precision], f"{entry.label}: {entry.source}")


def driver_version() -> str | None:
    """The NVIDIA kernel driver version from /proc (Linux); torch exposes only the CUDA driver API level."""
    try:
        with open("/proc/driver/nvidia/version") as f:
            match = re.search(r"Kernel Module\s+(?:for \S+\s+)?([\d.]+)", f.read())
    except OSError:
        return None
    return match.group(1) if match else None


def device_index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def smi_index(device: torch.device, mapping: str) -> int:
    """The GPU's index in the vendor's management library (NVML, amdsmi), which numbers every GPU of the host where
    torch numbers the visible ones (CUDA_/HIP_VISIBLE_DEVICES): torch's own ``torch.cuda.<mapping>``."""
    try:
        return getattr(torch.cuda, mapping)(device_index(device))
    except Exception:  # no such mapping in this torch, or the visible list names UUIDs it cannot resolve
        return device_index(device)


def nvml_energy_counter(device: torch.device) -> EnergyCounter | str:
    """The GPU's total energy since the driver loaded (NVML, millijoules, Volta and later) through nvidia-ml-py's
    `pynvml`, the binding torch's own power and utilisation queries use; or why it cannot be read."""
    try:
        import pynvml
    except ImportError:
        return "no energy counter: nvidia-ml-py is not installed (pip install nvidia-ml-py)"
    index = smi_index(device, "_get_nvml_device_index")
    try:
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)  # refused on GPUs without the counter: say so now
    except Exception as exc:  # NVMLError_NotSupported, a missing driver: the run goes on without energy
        return f"NVML has no energy counter for GPU {index}: {type(exc).__name__}: {exc}"
    try:
        limit = pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0
    except Exception:
        limit = None

    def read() -> float:
        return pynvml.nvmlDeviceGetTotalEnergyConsumption(handle) / 1000.0

    return EnergyCounter(read, f"NVML total energy of GPU {index}", limit)


def nccl_version() -> str | None:
    """NCCL's version (RCCL's on ROCm), or None for a torch built without it."""
    try:
        version = torch.cuda.nccl.version()
    except Exception:
        return None
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


class CudaBackend(Backend):
    """NVIDIA GPUs through torch.cuda. The rocm plugin's backend subclasses this one (HIP is torch's "cuda"), with
    settings of its own: the methods take ``settings: Any``, as `llmb.Backend`'s do."""

    name = "cuda"
    Settings = CudaSettings
    peaks: tuple[PeakEntry, ...] = PEAKS

    # Identity and capability

    def device_types(self) -> list[str]:
        return ["cuda"]

    def precisions(self) -> list[str]:
        return ["FP32", "TF32", "FP16", "BF16"]

    def available(self) -> bool:
        # A ROCm build of torch also answers torch.cuda.is_available(); those GPUs belong to the rocm plugin.
        return torch.version.hip is None and torch.cuda.is_available() and torch.cuda.device_count() > 0

    # Backend setup and model post-processing

    def setup(self, device: torch.device, precision: str, settings: Any) -> None:
        # The harness has set the TF32 switches for the precision; here the current device is chosen, and a compiler
        # or FP8 that cannot run here is one line before the model exists, not a traceback mid-run.
        if device.index is not None and torch.cuda.is_available():
            torch.cuda.set_device(device)
        features.check(settings)
        recipe = features.value(settings, "fp8")
        if recipe != "none" and not features.value(settings, "fp8_emulate"):
            reason = self.fp8_unsupported(device)
            if reason:
                raise UsageError(f"fp8={recipe}: {reason} (fp8_emulate=true checks the numerics without them)")

    def fp8_unsupported(self, device: torch.device) -> str | None:
        """Why this device has no float8 GEMMs (one line), or None."""
        if device.type != "cuda" or not torch.cuda.is_available():
            return None  # no GPU to ask (a test on the CPU device): torchao's own checks decide
        capability = torch.cuda.get_device_capability(device_index(device))
        if capability < FP8_CAPABILITY:
            name = torch.cuda.get_device_name(device_index(device))
            return (
                f"{name} (compute capability {capability[0]}.{capability[1]}) has no float8 GEMMs; they need "
                f"{FP8_CAPABILITY[0]}.{FP8_CAPABILITY[1]} (Ada, Hopper) or newer"
            )
        return None

    def process_model(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        device: torch.device,
        precision: str,
        settings: Any,
    ) -> torch.nn.Module:
        return features.apply(model, settings)

    def optimizer_options(self, device: torch.device, precision: str, settings: Any) -> dict:
        return {"fused": True} if settings.get("fused_adamw") else {}

    # Device services

    def synchronize(self, device: torch.device) -> None:
        torch.cuda.synchronize(device)

    def new_event(self, device: torch.device) -> torch.cuda.Event:
        return torch.cuda.Event(enable_timing=True)

    def reset_peak_memory(self, device: torch.device) -> None:
        torch.cuda.reset_peak_memory_stats(device)

    def peak_memory_bytes(self, device: torch.device) -> int | None:
        return torch.cuda.max_memory_allocated(device)

    def energy_counter(self, device: torch.device) -> EnergyCounter | str:
        return nvml_energy_counter(device)

    def device_name(self, device: torch.device) -> str:
        return torch.cuda.get_device_name(device_index(device))

    def device_count(self, device: torch.device) -> int:
        return torch.cuda.device_count()

    def device_memory_bytes(self, device: torch.device) -> int | None:
        return int(torch.cuda.get_device_properties(device_index(device)).total_memory)

    def peak_flops(self, device: torch.device, precision: str) -> Peak | None:
        return match_peak(self.device_name(device), precision, self.peaks)

    def peak_sources(self) -> dict[str, str]:
        return {entry.label: entry.source for entry in self.peaks}

    def precision_facts(self, device: torch.device, precision: str, settings: Any) -> list[PrecisionFact]:
        # None of the others lowers FP32 math by itself (inductor's GEMMs follow the TF32 switches the audit already
        # reads); they are recorded so a reader sees what else ran. Fused AdamW keeps FP32 math for FP32 parameters.
        # FP8 does (the cpu plugin's fact, so both plugins' records say it alike); the audit's dtype census finds
        # the float8 tensors too.
        facts = [
            *features.facts(settings),
            PrecisionFact("llmb_cuda.fp8_emulate", bool(features.value(settings, "fp8_emulate"))),
            PrecisionFact("llmb_cuda.compile", features.value(settings, "compile")),
            PrecisionFact("llmb_cuda.fused_adamw", bool(settings.get("fused_adamw"))),
            PrecisionFact("torch.backends.cuda.flash_sdp_enabled", torch.backends.cuda.flash_sdp_enabled()),
            PrecisionFact(
                "torch.backends.cuda.mem_efficient_sdp_enabled", torch.backends.cuda.mem_efficient_sdp_enabled()
            ),
            PrecisionFact("torch.backends.cuda.math_sdp_enabled", torch.backends.cuda.math_sdp_enabled()),
        ]
        if hasattr(torch.backends.cuda, "cudnn_sdp_enabled"):
            facts.append(
                PrecisionFact("torch.backends.cuda.cudnn_sdp_enabled", torch.backends.cuda.cudnn_sdp_enabled())
            )
        return facts

    def run_facts(self, device: torch.device) -> dict:
        props = torch.cuda.get_device_properties(device_index(device))
        return {
            "gpu": props.name,
            "compute_capability": f"{props.major}.{props.minor}",
            "multiprocessors": props.multi_processor_count,
            "memory_bytes": props.total_memory,
            "driver": driver_version(),
            "cuda_runtime": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
            "nccl": nccl_version(),
        }

    def distributed_backend(self, device: torch.device) -> str | None:
        return "nccl"


@hookimpl
def register_backends(register: Callable[[Backend], None]) -> None:
    register(CudaBackend())
