"""llmb-xla: torch-xla devices (TPU, and any PJRT device) for llmb.

XLA traces each step lazily and runs it as one compiled graph: the plugin cuts the graph at every step end
(``torch_xla.sync()``), waits for the device before the harness reads a clock (``xm.wait_device_ops()``), and sets
XLA's matmul precision per requested precision, because XLA's ``default`` on TPU multiplies FP32 matrices in BF16.
The first steps compile (the first two differ: AdamW's state appears in the second), so warmup must cover them.

The CPU PJRT device (``PJRT_DEVICE=CPU``) runs everything on the host for testing; it never counts as XLA hardware
for auto-selection. torch_xla is imported only inside methods: ``llmb plugins`` stays fast and works without it.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version

import torch

from llmb import Backend, CpuBackend, LlmbError, Peak, PluginSettings, PrecisionFact, UsageError, hookimpl, option

MATMUL_PRECISIONS = ("auto", "default", "high", "highest")
# What "auto" asks XLA for: FP32 needs "highest" (six BF16 passes on TPU, ~22 bits); BF16 runs BF16 matmuls anyway.
AUTO_MATMUL_PRECISION = {"FP32": "highest", "BF16": "default"}
# Which numeric format each XLA matmul precision lets an FP32 matmul run in, per PJRT hardware (torch_xla.backends'
# docstring: on TPU "default" downcasts to BF16, "high" is three BF16 passes, ~14 bits, below FP32, labelled TF32
# here as the nearest benchmark format below FP32). XLA:GPU's default FP32 dot uses TF32 on Ampere and later.
# XLA:CPU ignores the setting (measured: 2.9e-7 relative error at all three). Unknown hardware: the probe decides.
MATMUL_FORMAT = {
    "TPU": {"default": "BF16", "high": "TF32", "highest": None},
    "CUDA": {"default": "TF32", "high": "TF32", "highest": None},
    "CPU": {"default": None, "high": None, "highest": None},
}
# Environment switches that make torch_xla store FP32 tensors as BF16 on the device while torch still says float32.
BF16_ENV = ("XLA_USE_BF16", "XLA_DOWNCAST_BF16")

# Dense BF16 peak per chip for TPUs llmb's table (llmb/spec/peak_table.py) lacks, keyed by PJRT device kind, with the
# page that publishes it. Empty: the table has TPU v4, v5e and v5p, and it wins for any device it has
# (tests/test_peaks.py
# keeps this so).
PEAK_BF16_TFLOPS: dict[str, tuple[float, str]] = {}


@dataclass(frozen=True, eq=False)
class XlaSettings(PluginSettings):
    pjrt_device: str = option("", "PJRT device type (TPU, CUDA, CPU); empty: PJRT_DEVICE or torch_xla's pick")
    matmul_precision: str = option(
        "auto",
        "XLA matmul precision for FP32 inputs; auto: highest for FP32, default for BF16",
        choices=MATMUL_PRECISIONS,
    )


@dataclass(frozen=True)
class _RunState:
    """What one run's setup saw, for the later hooks of the same run (so two runs in a process never share it)."""

    #: Graphs compiled in this process and seconds spent compiling them before the run (run_facts reports its share).
    compiled_before: tuple[int, float]


def _indexed(device: torch.device) -> torch.device:
    """torch_xla's queries need an ordinal; a bare "xla" means the default device, where tensors land."""
    import torch_xla

    return torch_xla.device(device.index)


def _hardware(device: torch.device) -> str:
    """The PJRT hardware behind an XLA device: TPU, CUDA, CPU, NEURON..."""
    import torch_xla.core.xla_model as xm

    return xm.xla_device_hw(_indexed(device))


def _kind(device: torch.device) -> str:
    import torch_xla.core.xla_model as xm

    return xm.xla_device_kind(_indexed(device))


def _matmul_precision(precision: str, settings: XlaSettings) -> str:
    chosen = settings.matmul_precision
    return AUTO_MATMUL_PRECISION[precision] if chosen == "auto" else chosen


def _compilations() -> tuple[int, float]:
    """Graphs compiled in this process so far, and the seconds spent compiling them."""
    import torch_xla.debug.metrics as met

    data = met.metric_data("CompileTime")
    return (int(data[0]), data[1] / 1e9) if data else (0, 0.0)


def _check_autograd(device) -> None:
    """Fail with one line when autograd started before torch_xla registered its device (a CPU backward ran first)."""
    probe = torch.zeros(1, device=device, requires_grad=True)
    try:
        probe.sum().backward()
    except RuntimeError as exc:
        if "device_ready_queues_" not in str(exc):
            raise
        raise LlmbError(
            "a backward pass ran in this process before torch_xla initialised its device, so autograd cannot use "
            "XLA here; run the xla plugin first or in a fresh process"
        ) from None


class XlaBackend(Backend):
    name = "xla"

    Settings = XlaSettings

    def device_types(self) -> list[str]:
        return ["xla"]

    def precisions(self) -> list[str]:
        # No TF32 (TPUs have none; XLA's "high" is not TF32 either) and no FP16 (TPUs have no FP16 matrix unit).
        return ["FP32", "BF16"]

    def available(self) -> bool:
        if importlib.util.find_spec("torch_xla") is None:
            return False
        try:
            import torch_xla.runtime as xr  # importing torch_xla picks PJRT_DEVICE (TPU when libtpu finds chips)
        except Exception:  # a torch_xla built for another torch fails at import: not usable, so not available
            return False
        return (xr.device_type() or "CPU") != "CPU"

    def setup(self, device: torch.device, precision: str, settings: XlaSettings) -> _RunState:
        try:
            import torch_xla
            import torch_xla.backends
            import torch_xla.runtime as xr
        except Exception as exc:
            raise UsageError(
                f"the xla plugin needs torch_xla, which did not import: {type(exc).__name__}: {exc}"
            ) from None
        if settings.pjrt_device:
            try:
                xr.set_device_type(settings.pjrt_device.upper())
            except RuntimeError as exc:
                raise UsageError(f"-O pjrt_device={settings.pjrt_device}: {exc}") from None
        # Initialise the device before any backward pass: autograd sizes its per-device queues at its first backward.
        torch_xla.device()
        _check_autograd(device)
        # This run's state, returned: llmb hands it to the later methods that name `state` (run_facts).
        state = _RunState(compiled_before=_compilations())
        wanted = _matmul_precision(precision, settings)
        if torch_xla.backends.get_mat_mul_precision() != wanted:
            # torch_xla logs "setting it multiple times is not recommended" on every set, even the first; it is set
            # here once per run, before the model exists, so that warning only misleads.
            backends_logger = logging.getLogger(torch_xla.backends.__name__)
            level = backends_logger.level
            backends_logger.setLevel(logging.ERROR)
            try:
                torch_xla.backends.set_mat_mul_precision(wanted)
            finally:
                backends_logger.setLevel(level)
        return state

    def process_model(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        device: torch.device,
        precision: str,
        settings: XlaSettings,
    ) -> torch.nn.Module:
        if precision in ("FP16", "BF16") and any(p.dtype == torch.float32 for p in model.parameters()):
            # --precision-mode amp (FP32 weights under autocast). Measured with torch-xla 2.9: XLA's autocast does not
            # cast scaled_dot_product_attention's inputs, and the rotary-embedded q/k stay FP32 while v is BF16, so
            # SDPA fails on mixed dtypes. Refuse it up front with the way out instead of failing inside the loop.
            raise UsageError(
                "the xla plugin runs FP16/BF16 in --precision-mode pure only (XLA autocast leaves SDPA's "
                "inputs in mixed dtypes)"
            )
        return model

    def step_end(self, device: torch.device) -> None:
        import torch_xla

        torch_xla.sync()  # cut the traced graph here: one compiled graph per training step, dispatched now

    def synchronize(self, device: torch.device) -> None:
        import torch_xla
        import torch_xla.core.xla_model as xm

        torch_xla.sync()  # dispatch anything still traced, so the wait below covers all work issued so far
        xm.wait_device_ops()

    def peak_memory_bytes(self, device: torch.device) -> int | None:
        import torch_xla.core.xla_model as xm

        try:
            info = xm.get_memory_info(_indexed(device))
        except RuntimeError:  # XLA:CPU: "GetAllocatorStats is not supported"
            return None
        # A high-water mark since the runtime started: XLA has no call to reset it.
        return info.get("peak_bytes_used")

    def device_name(self, device: torch.device) -> str:
        kind = _kind(device)
        if _hardware(device) == "CPU":
            return f"XLA CPU ({CpuBackend().device_name(torch.device('cpu'))})"
        return kind

    def device_count(self, device: torch.device) -> int:
        import torch_xla.runtime as xr

        return xr.addressable_device_count()

    def peak_flops(self, device: torch.device, precision: str) -> Peak | None:
        if precision != "BF16" or _hardware(device) != "TPU":
            return None
        entry = PEAK_BF16_TFLOPS.get(_kind(device))
        return Peak(entry[0] * 1e12, entry[1]) if entry else None

    def peak_sources(self) -> dict[str, str]:
        return {f"{kind} (BF16)": source for kind, (_, source) in PEAK_BF16_TFLOPS.items()}

    def precision_facts(self, device: torch.device, precision: str, settings: XlaSettings) -> list[PrecisionFact]:
        import torch_xla.backends

        value = torch_xla.backends.get_mat_mul_precision()
        formats = MATMUL_FORMAT.get(_hardware(device), {})
        facts = [PrecisionFact("torch_xla.mat_mul_precision", value, formats.get(value))]
        for name in BF16_ENV:
            raw = os.environ.get(name)
            if raw is not None:
                facts.append(PrecisionFact(name, raw, "BF16" if raw not in ("", "0") else None))
        return facts

    def run_facts(self, device: torch.device, state: _RunState | None = None) -> dict:
        import torch_xla
        import torch_xla.runtime as xr

        facts = {
            "torch_xla": torch_xla.__version__,
            "pjrt_device": xr.device_type(),
            "xla_hardware": _hardware(device),
            "xla_device_kind": _kind(device),
        }
        try:
            facts["libtpu"] = version("libtpu")
        except PackageNotFoundError:
            pass
        # Graphs compiled during this run (the steps' and the precision probe's): a handful; one per step would mean
        # the step graph kept changing and the timed steps paid for compilation.
        count, seconds = _compilations()
        # Before any setup (`llmb plugins`) there is no run: the whole process's compilations.
        count_before, seconds_before = state.compiled_before if state is not None else (0, 0.0)
        facts["xla_compilations"] = count - count_before
        facts["xla_compile_seconds"] = round(seconds - seconds_before, 3)
        return facts

    def distributed_backend(self, device: torch.device) -> str | None:
        return "xla"


@hookimpl
def register_backends(register: Callable[[Backend], None]) -> None:
    register(XlaBackend())
