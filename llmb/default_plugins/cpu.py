"""The cpu reference backend: plain PyTorch on the host CPU, built into llmb (and public as `llmb.CpuBackend`, for
plugins whose hardware also runs on the host, e.g. xpu's IPEX path)."""

from __future__ import annotations

import os
import platform
import resource
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from llmb import Backend, EnergyCounter, PrecisionFact, UsageError, hookimpl, option
from llmb.records import energy
from llmb.run import sysinfo
from llmb.toolkit import compilers, features, host_memory

# No reduce-overhead on the CPU: it is CUDA graphs.
COMPILE_MODES = ("none", "default", "max-autotune", compilers.THUNDER)


@dataclass(frozen=True, eq=False)
class CpuSettings(features.FeatureSettings):
    """The cpu plugin's settings: the shared training features, then its own."""

    compile: str = option("none", compilers.HELP, choices=COMPILE_MODES)
    # On the CPU, float8 emulation by default: torch._scaled_mm's CPU kernel is a reference, not a fast path.
    fp8_emulate: bool = option(True, features.FP8_EMULATE_HELP)
    threads: int = option(
        0,
        "intra-op threads for torch, at most the CPUs this process may use (0: torch's default, fewer where the "
        "host's load leaves fewer cores free)",
        minimum=0,  # the greatest is the host's (thread_count)
    )
    # On by default: 4.9x to 6.1x faster per optimizer step than torch's per-tensor loop (benchmarks/RESULTS.md).
    fused_adamw: bool = option(True, "AdamW's fused CPU kernel (false: torch's per-tensor loop)")
    # Off by default. By hand it gave 1.05x-1.5x at batch 1-64 of the small preset for 1.3-1.6x the resident memory,
    # but in llmb's own loop the heap went on growing (batch 16: 3.6 -> 7.1 GB over 9 steps) and the fidelity
    # benchmark's eager batch 16 fell to 0.923 (llmb.toolkit.host_memory, benchmarks/RESULTS.md section 18).
    keep_freed_memory: bool = option(
        False,
        "keep the memory a step frees for the next step (glibc's mallopt) instead of handing it back to the OS and "
        "faulting it in again; costs resident memory",
    )


class CpuBackend(Backend):
    """The host CPU through plain PyTorch. Public (`llmb.CpuBackend`) for plugins whose hardware also runs on the
    host; its methods take ``settings: Any``, as `llmb.Backend`'s do, so such a subclass may name its own class."""

    name = "cpu"
    Settings = CpuSettings
    # What the host allocator does in this process (llmb.toolkit.host_memory), set by setup, stated in run_facts.
    host_allocator = host_memory.DEFAULT

    def device_types(self) -> list[str]:
        return ["cpu"]

    def precisions(self) -> list[str]:
        # No CPU computes TF32 matmuls; a TF32 label here would only be FP32 under another name.
        return ["FP32", "FP16", "BF16"]

    def available(self) -> bool:
        return True

    def setup(self, device: torch.device, precision: str, settings: Any) -> None:
        # Before the model exists: a compiler or FP8 that cannot run here is one line, not a traceback mid-run.
        features.check(settings)
        self.host_allocator = host_memory.keep_freed_memory(bool(settings.get("keep_freed_memory")))
        if settings.get("threads"):
            torch.set_num_threads(thread_count(settings["threads"]))
        else:  # chosen before the run with the host's load in view: threads beyond the free cores only contend
            torch.set_num_threads(min(torch.get_num_threads(), sysinfo.free_cores()[2]))

    def process_model(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        device: torch.device,
        precision: str,
        settings: Any,
    ) -> torch.nn.Module:
        return features.apply(model, settings)

    def precision_facts(self, device: torch.device, precision: str, settings: Any) -> list[PrecisionFact]:
        return features.facts(settings)

    def optimizer_options(self, device: torch.device, precision: str, settings: Any) -> dict:
        return {"fused": True} if settings.get("fused_adamw") else {}

    def synchronize(self, device: torch.device) -> None:
        pass  # eager CPU kernels have finished when they return

    def peak_memory_bytes(self, device: torch.device) -> int | None:
        # Process max RSS: an upper bound on the training memory (includes the interpreter and the libraries). It is
        # a high-water mark that cannot be reset, so reset_peak_memory keeps the base class's no-op.
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return rss if sys.platform == "darwin" else rss * 1024

    def energy_counter(self, device: torch.device) -> EnergyCounter | str:
        return energy.rapl_counter()

    def device_name(self, device: torch.device) -> str:
        try:
            with open("/proc/cpuinfo") as f:
                for line in f:
                    if line.startswith("model name"):
                        return line.split(":", 1)[1].strip()
        except OSError:
            pass
        return platform.processor() or "cpu"

    def run_facts(self, device: torch.device) -> dict:
        return {
            "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "mkldnn": torch.backends.mkldnn.is_available(),
            "host_allocator": self.host_allocator,
        }

    def distributed_backend(self, device: torch.device) -> str | None:
        return "gloo"


def thread_count(threads: int) -> int:
    """The threads setting checked against the CPUs this process may run on: more intra-op threads than CPUs only
    contend, and a count far beyond them ended the worker inside OpenMP (threads=10**9: libgomp's "Out of memory
    allocating 216000001344 bytes", exit 1, no word of why), as torch refuses one below 1 deep in setup."""
    cpus = sysinfo.usable_cpus()
    if not 1 <= threads <= cpus:
        raise UsageError(f"-O threads={threads}: 0 (torch's default) or 1 to {cpus}, the CPUs this process may use")
    return threads


@hookimpl
def register_backends(register: Callable[[Backend], None]) -> None:
    register(CpuBackend())
