"""llmb-xpu: Intel GPUs through upstream torch.xpu, with optional IPEX post-processing.

Everything device-side uses upstream ``torch.xpu`` (events, memory statistics, synchronisation, name and count), so
the plugin works without Intel Extension for PyTorch (IPEX). Intel stopped IPEX development in 2025 and its last
release (2.8.0) refuses any torch but 2.8.*; it is an opt-in (``-O ipex=true``) and never needed.

"cpu" is a secondary device type for one reason: IPEX's PyPI build is CPU-only, so ``--device cpu -O ipex=true`` is
the only place this plugin's IPEX path can run without an Intel GPU (llmb's tests use it). `XpuBackend` subclasses
`llmb.CpuBackend`, so on "cpu" its device services are the cpu backend's, inherited.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version

import torch

from llmb import Backend, CpuBackend, EnergyCounter, LlmbError, Peak, PluginSettings, PrecisionFact, hookimpl, option

# Dense peak FLOP/s per torch device, only for figures confirmed against a vendor datasheet. None so far: Intel
# publishes no per-precision matrix peak for the Data Center GPU Max series that we could confirm (torchtitan
# derives 512 x compute units x 1.3 GHz per stack, an estimate). No entry means no MFU, never a guess.
# An entry: device-name substring -> ({precision: TFLOP/s}, public source).
PEAK_TFLOPS: dict[str, tuple[dict[str, float], str]] = {}

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


@dataclass(frozen=True, eq=False)
class XpuSettings(PluginSettings):
    ipex: bool = option(False, "post-process the model with intel_extension_for_pytorch.optimize")
    # torch's fused AdamW runs on XPU as on the CPU (torch.utils._foreach_utils lists both). The per-tensor loop keeps
    # g^2 in FP16 under pure FP16 weights, where it underflows and the weights run away: an honest pure FP16 run of
    # this plugin with it failed the judge's replay on every draw (tiny preset, `--device cpu -O ipex=true`, 50 steps:
    # step 2 outside the FP32 bracket, steps 5-13 off the FP16 replay; benchmarks/RESULTS.md section 28).
    fused_adamw: bool = option(True, "AdamW's fused kernel (fused=True); false: torch's per-tensor loop")


class XpuBackend(CpuBackend):
    """Intel GPUs (device "xpu"); on device "cpu" the cpu backend's services, for the IPEX path."""

    name = "xpu"
    Settings = XpuSettings

    def device_types(self) -> list[str]:
        return ["xpu", "cpu"]

    def precisions(self) -> list[str]:
        # TF32 is left out: we could not check which switch makes torch's XPU matmuls use TF32 on this torch.
        return ["FP32", "FP16", "BF16"]

    def available(self) -> bool:
        return torch.xpu.is_available()

    def vendor_libraries(self) -> list[str]:
        # ipex.optimize replaces torch functions and aten kernels process-wide; llmb holds the pins of its official
        # 2.8.0 wheels (llmb/audit/vendor_releases/), so the guard accepts what an unmodified release does.
        return ["intel-extension-for-pytorch"]

    def setup(self, device: torch.device, precision: str, settings: XpuSettings) -> None:
        if settings.ipex:
            _import_ipex()  # fail before the model is built, not after
        self._services(device).select(device)

    def process_model(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        device: torch.device,
        precision: str,
        settings: XpuSettings,
    ) -> torch.nn.Module:
        if not settings.ipex:
            return model
        ipex = _import_ipex()
        dtype = IPEX_DTYPES[precision]
        if dtype is not None and any(p.dtype == torch.float32 for p in model.parameters()):
            # Mixed precision (--precision-mode amp): IPEX would cast the model to `dtype` and move FP32 master weights
            # into the optimizer, so AdamW no longer steps the model's parameters; the harness refuses that run anyway.
            raise LlmbError(
                "-O ipex=true supports pure FP16/BF16 only: IPEX's mixed precision moves the master weights"
            )
        # inplace=True: IPEX changes this model and the harness's own AdamW (measured: the same objects come back; its
        # default deep-copies both, and the harness would go on stepping the copy's optimizer-less original).
        # weights_prepack=False: prepacking swaps each Linear weight for a blocked-layout copy and registers a frozen,
        # empty placeholder parameter that AdamW never steps (measured on the tiny preset: 15 such parameters), so the
        # model's parameters would no longer be the model's.
        optimized, returned = ipex.optimize(
            model, optimizer=optimizer, dtype=dtype, inplace=True, weights_prepack=False
        )
        if returned is not optimizer:
            raise LlmbError("intel_extension_for_pytorch.optimize returned a new optimizer; llmb keeps its own AdamW")
        return optimized

    def optimizer_options(self, device: torch.device, precision: str, settings: XpuSettings) -> dict:
        return {"fused": True} if settings.fused_adamw else {}

    def precision_facts(self, device: torch.device, precision: str, settings: XpuSettings) -> list[PrecisionFact]:
        if not settings.ipex:
            return []
        dtype = IPEX_DTYPES[precision]
        fmt = {torch.float16: "FP16", torch.bfloat16: "BF16"}.get(dtype)
        return [PrecisionFact("ipex.dtype", str(dtype).replace("torch.", "") if dtype else "float32", fmt)]

    # Device services: each one asks `_services` for the device's kind, which holds the one branch on device type.

    def _services(self, device) -> _IntelGpu | _HostCpu:
        """torch.xpu's services on "xpu"; on "cpu" the cpu backend's, inherited (IPEX's CPU path)."""
        return _INTEL_GPU if device.type == "xpu" else _HostCpu(self)

    def synchronize(self, device: torch.device) -> None:
        self._services(device).synchronize(device)

    def new_event(self, device: torch.device) -> torch.xpu.Event | None:
        return self._services(device).new_event(device)

    def reset_peak_memory(self, device: torch.device) -> None:
        self._services(device).reset_peak_memory(device)

    def peak_memory_bytes(self, device: torch.device) -> int | None:
        return self._services(device).peak_memory_bytes(device)

    def energy_counter(self, device: torch.device) -> EnergyCounter | str:
        return self._services(device).energy_counter(device)

    def device_name(self, device: torch.device) -> str:
        return self._services(device).device_name(device)

    def device_count(self, device: torch.device) -> int:
        return self._services(device).device_count(device)

    def device_memory_bytes(self, device: torch.device) -> int | None:
        return self._services(device).device_memory_bytes(device)

    def peak_flops(self, device: torch.device, precision: str) -> Peak | None:
        return self._services(device).peak_flops(device, precision)

    def peak_sources(self) -> dict[str, str]:
        return {model: source for model, (_, source) in PEAK_TFLOPS.items()}

    def run_facts(self, device: torch.device) -> dict:
        facts = self._services(device).run_facts(device)
        try:  # from the metadata: importing IPEX next to another torch prints an error and exits
            facts["ipex"] = version("intel-extension-for-pytorch")
        except PackageNotFoundError:
            pass
        return facts

    def distributed_backend(self, device: torch.device) -> str | None:
        return self._services(device).distributed_backend(device)


class _IntelGpu:
    """The device services on an Intel GPU: upstream torch.xpu (no IPEX needed)."""

    def select(self, device) -> None:
        if device.index is not None:
            torch.xpu.set_device(device.index)

    def synchronize(self, device) -> None:
        torch.xpu.synchronize(device)

    def new_event(self, device):
        return torch.xpu.Event(enable_timing=True)

    def reset_peak_memory(self, device) -> None:
        torch.xpu.reset_peak_memory_stats(device)

    def peak_memory_bytes(self, device) -> int | None:
        return torch.xpu.max_memory_allocated(device)

    def energy_counter(self, device) -> EnergyCounter | str:
        # The host's RAPL would be the CPU's energy, not the GPU's: say there is none rather than misattribute it.
        return "no energy counter: torch.xpu exposes none for Intel GPUs (Level Zero Sysman is not read here)"

    def device_name(self, device) -> str:
        return torch.xpu.get_device_name(device)

    def device_count(self, device) -> int:
        return torch.xpu.device_count()

    def device_memory_bytes(self, device) -> int | None:
        return int(torch.xpu.get_device_properties(device).total_memory)

    def peak_flops(self, device, precision) -> Peak | None:
        name = torch.xpu.get_device_name(device)
        for model, (table, source) in PEAK_TFLOPS.items():
            if model in name and precision in table:
                return Peak(table[precision] * 1e12, source)
        return None

    def run_facts(self, device) -> dict:
        props = torch.xpu.get_device_properties(device)
        return {
            "torch_xpu": getattr(torch.version, "xpu", None),
            "xpu_driver": getattr(props, "driver_version", None),
            "xpu_total_memory": getattr(props, "total_memory", None),
        }

    def distributed_backend(self, device) -> str | None:
        # xccl is upstream torch's XPU collective backend (torch >= 2.8 XPU builds); older stacks used oneCCL's "ccl".
        available = getattr(torch.distributed, "is_xccl_available", None)
        return "xccl" if available and available() else "ccl"


_INTEL_GPU = _IntelGpu()


class _HostCpu:
    """The device services on "cpu": the cpu backend's, inherited by the backend (`XpuBackend` is a `CpuBackend`)."""

    def __init__(self, backend: XpuBackend) -> None:
        self._cpu = super(XpuBackend, backend)  # CpuBackend's methods bound to this backend, as super() gives them

    def select(self, device) -> None:
        pass  # one host: nothing to select

    def run_facts(self, device) -> dict:
        facts = self._cpu.run_facts(device)
        facts["torch_xpu"] = getattr(torch.version, "xpu", None)
        return facts

    def __getattr__(self, service: str):
        return getattr(self._cpu, service)  # every other service is the cpu backend's own


@hookimpl
def register_backends(register: Callable[[Backend], None]) -> None:
    register(XpuBackend())
