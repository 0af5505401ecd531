"""The system description of a submission, collected automatically (MLPerf's field names where they fit)."""

from __future__ import annotations

import os
import platform
import time
from importlib import metadata
from pathlib import Path

import torch

from llmb.spec.redact import REDACTED, is_secret, scrub, value_for_record
from llmb.spec.version import __version__

__all__ = ["ENV_NAMES", "REDACTED", "collect", "complete", "is_secret", "run_environment"]

# Only variables that can change how a run behaves, by exact name (a prefix would take XLA_PASSWD or TORCH_DSN too);
# a credential-like name is never kept, and values lose URL passwords, secret pairs and home folders
# (llmb.spec.redact).
ENV_NAMES = (
    # threads and affinity
    "OMP_NUM_THREADS", "OMP_PROC_BIND", "OMP_PLACES", "OMP_SCHEDULE", "OMP_DYNAMIC", "OMP_WAIT_POLICY",
    "KMP_AFFINITY", "KMP_BLOCKTIME", "KMP_HW_SUBSET", "MKL_NUM_THREADS", "MKL_ENABLE_INSTRUCTIONS",
    "OPENBLAS_NUM_THREADS", "DNNL_MAX_CPU_ISA", "ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY",
    # NVIDIA
    "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "CUDA_LAUNCH_BLOCKING", "CUDA_DEVICE_MAX_CONNECTIONS",
    "CUDA_MODULE_LOADING", "CUBLAS_WORKSPACE_CONFIG", "CUBLASLT_WORKSPACE_SIZE", "NVIDIA_TF32_OVERRIDE",
    "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "TORCH_CUDNN_V8_API_ENABLED", "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_NO_CUDA_MEMORY_CACHING", "PYTORCH_NVML_BASED_CUDA_CHECK",
    # AMD
    "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HSA_OVERRIDE_GFX_VERSION", "HIP_FORCE_DEV_KERNARG",
    "PYTORCH_HIP_ALLOC_CONF", "PYTORCH_TUNABLEOP_ENABLED", "PYTORCH_TUNABLEOP_TUNING", "TORCH_BLAS_PREFER_HIPBLASLT",
    "MIOPEN_FIND_MODE", "ROCBLAS_LAYER",
    # Intel
    "ZE_AFFINITY_MASK", "ZE_FLAT_DEVICE_HIERARCHY", "ONEAPI_DEVICE_SELECTOR", "SYCL_CACHE_PERSISTENT",
    "PYTORCH_XPU_ALLOC_CONF", "IPEX_FP32_MATH_MODE",
    # XLA / TPU
    "PJRT_DEVICE", "XLA_FLAGS", "XLA_USE_BF16", "XLA_DOWNCAST_BF16", "XLA_USE_32BIT_LONG", "LIBTPU_INIT_ARGS",
    "TPU_VISIBLE_CHIPS", "TPU_PROCESS_BOUNDS", "TPU_CHIPS_PER_PROCESS_BOUNDS", "TPU_NUM_DEVICES",
    # collectives and torch itself
    "NCCL_ALGO", "NCCL_PROTO", "NCCL_P2P_DISABLE", "NCCL_IB_DISABLE", "NCCL_NET_GDR_LEVEL", "NCCL_NVLS_ENABLE",
    "NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS", "NCCL_BUFFSIZE", "NCCL_SOCKET_IFNAME", "NCCL_IB_HCA",
    "NCCL_CROSS_NIC", "RCCL_MSCCL_ENABLE", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_AVOID_RECORD_STREAMS",
    "TORCH_NCCL_BLOCKING_WAIT", "TORCHINDUCTOR_MAX_AUTOTUNE", "TORCHINDUCTOR_FREEZING", "TORCHDYNAMO_DISABLE",
    "TORCH_COMPILE_DISABLE", "PYTORCH_JIT", "PYTORCH_ENABLE_MPS_FALLBACK",
)  # fmt: skip
TO_COMPLETE = ("status", "accelerator_interconnect", "cooling", "hw_notes")


def run_environment(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The listed environment variables that are set, values scrubbed of anything credential-like."""
    environ = os.environ if environ is None else environ
    return {name: value_for_record(name, environ[name]) for name in sorted(ENV_NAMES) if name in environ}


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields from /proc/cpuinfo, plus the number of sockets."""
    info: dict[str, str] = {}
    sockets = set()
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return info
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "physical id":
            sockets.add(value)
        info.setdefault(key, value)
    info["sockets"] = str(len(sockets) or 1)
    return info


def _memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _gib(value: int | None) -> str:
    return f"{value / 2**30:.1f} GiB" if value else "unknown"


def _operating_system() -> str:
    try:
        release = platform.freedesktop_os_release()
        return f"{release.get('PRETTY_NAME', release.get('NAME', ''))} (kernel {platform.release()})"
    except OSError:
        return platform.platform()


def _recorded_memory(records: list[dict]) -> str:
    """The runs' device memory as their backends recorded it (device.memory_bytes), not the packaging host's: the
    bundle may be packaged on another machine. Several sizes are listed; none recorded is left to the user."""
    sizes = sorted(
        {
            m
            for r in records
            if r["device"]["type"] != "cpu"
            and isinstance(m := r["device"].get("memory_bytes"), int)
            and not isinstance(m, bool)
            and m > 0
        }
    )
    return "; ".join(_gib(m) for m in sizes) or "unknown"


def _versions(names: list[str]) -> dict[str, str]:
    found = {}
    for name in names:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def _runtime_versions() -> dict[str, str | None]:
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    driver = None
    nvidia = Path("/proc/driver/nvidia/version")
    if nvidia.exists():
        driver = nvidia.read_text().splitlines()[0].strip()
    return {
        "cuda": torch.version.cuda,
        "hip": torch.version.hip,
        "xpu": getattr(torch.version, "xpu", None),
        "cudnn": str(cudnn) if cudnn else None,
        "nvidia_driver": driver,
    }


def collect(records: list[dict], plugins: list[dict]) -> dict:
    """What the machine says about itself and about the runs' devices; the user completes the rest."""
    cpu = _cpuinfo()
    cores = int(cpu.get("cpu cores", 0)) or os.cpu_count() or 0
    devices = {(r["device"]["type"], r["device"]["name"], r["device"]["count"]) for r in records}
    # The accelerator is the device the runs measured, as the backend's device services named and counted it in
    # the records (device.name, device.count): the host CPU too, where the cpu plugin ran on it. Nothing here asks a
    # plugin, and the packaging host's torch is asked only for a device type that is not the CPU.
    types = sorted({t for t, _, _ in devices})
    names = sorted({n for _, n, _ in devices if n})
    count = max((c or 1 for _, _, c in devices), default=0)
    # A multi-process job records its world size and nodes; a single process its device count.
    nodes = max((r.get("nodes", 1) for r in records), default=1)
    world = max((r.get("world_size", 1) for r in records), default=1)
    count = max(count, world // nodes) if devices else 0
    on_host = types == ["cpu"]
    accelerated = bool(types) and not on_host
    dependencies = sorted({"torch", "pluggy", "llmb", *(p["distribution"] for p in plugins)})
    return {
        "number_of_nodes": nodes,
        "host_processors_per_node": int(cpu.get("sockets", 1)),
        "host_processor_model_name": cpu.get("model name") or platform.processor() or "unknown",
        "host_processor_core_count": cores,
        "host_processor_threads": os.cpu_count(),
        "host_memory_capacity": _gib(_memory_bytes()),
        "accelerators_per_node": count,
        "accelerator_model_name": "; ".join(names) or "unknown",
        "accelerator_type": "; ".join(types) or "unknown",
        "accelerator_memory_capacity": (
            _recorded_memory(records) if accelerated else "N/A (the host CPU: host_memory_capacity)"
        ),
        "accelerator_interconnect": "",
        "devices": [{"type": t, "name": n, "count": c} for t, n, c in sorted(devices)],
        "framework": f"PyTorch {torch.__version__}",
        "operating_system": _operating_system(),
        "python": platform.python_version(),
        "runtime_versions": _runtime_versions(),
        "software_versions": _versions(dependencies),
        "llmb_version": __version__,
        "plugins": [{k: p[k] for k in ("name", "distribution", "version")} for p in plugins],
        "environment": run_environment(),
        "status": "",
        "cooling": "",
        "hw_notes": "",
    }


def complete(system: dict, given: dict) -> dict:
    """Merge the user's --system-file over what was collected, then list what is still empty."""
    merged = _scrubbed({**system, **given})  # a user file does not get to record secrets or home folders either
    if isinstance(merged.get("environment"), dict):
        merged["environment"] = {k: value_for_record(k, v) for k, v in merged["environment"].items()}
    merged["fields_to_complete"] = [name for name in TO_COMPLETE if merged.get(name) in ("", None)]
    return merged


def _scrubbed(value):
    """Every string in a JSON value scrubbed (llmb.spec.redact.scrub), and every value under a credential's name
    (``{"bmc": {"password": "hunter2"}}``) redacted whatever it is: system.json is published."""
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, dict):
        return {k: REDACTED if is_secret(str(k)) and v not in (None, "") else _scrubbed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_scrubbed(v) for v in value]
    return value


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages ([] where the OS has none)."""
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except (AttributeError, OSError):
        return []


# CPU flags of native 16-bit matmuls; without them torch emulates the format, several times slower than FP32.
NATIVE_16BIT_FLAGS = {"BF16": ("avx512_bf16", "amx_bf16"), "FP16": ("avx512_fp16", "amx_fp16")}


def cpu_emulated_precisions() -> list[str]:
    """The 16-bit precisions this CPU has no native matmul for (from /proc/cpuinfo's flags; none where unreadable)."""
    flags = set(_cpuinfo().get("flags", "").split())
    if not flags:
        return []
    return [name for name, native in NATIVE_16BIT_FLAGS.items() if not flags.intersection(native)]


def running_elsewhere(samples: int = 10, interval: float = 0.02) -> float | None:
    """The threads running or ready to run on the host now besides the one reading: /proc/stat's procs_running less
    one, averaged over `samples` readings `interval` seconds apart (Linux; None where the OS does not say)."""
    counts = []
    for index in range(samples):
        try:
            with open("/proc/stat") as stat:
                line = next((line for line in stat if line.startswith("procs_running ")), None)
        except OSError:
            return None
        if line is None:
            return None
        counts.append(max(0, int(line.split()[1]) - 1))
        if index + 1 < samples:
            time.sleep(interval)
    return sum(counts) / len(counts)


def host_load() -> float:
    """The other work that competes for the CPUs as a run starts: the threads running elsewhere now where the OS
    says it, else the 1-minute load average. Not the load average where there is a choice: it remembers the last
    minute, and so llmb's own work before the run (under `--precision all`, the previous precision's run and the
    judge's replay of it; a sweep's previous trial): on 2 idle cores it left 1.0, and the cpu plugin gave BF16 one
    thread where FP32 had two."""
    now = running_elsewhere()
    return now if now is not None else (load_average() or [0.0])[0]


def free_cores() -> tuple[int, float, int]:
    """(the CPUs this process may run on, the other work on the host (host_load), the CPUs it leaves free: at least
    1). Read before a run, so its thread count can leave room for the work already on the host."""
    cpus = usable_cpus()
    load = host_load()
    return cpus, load, max(1, min(cpus, int(cpus - load + 0.5)))


def threads_advice(settings: dict, threads: int) -> str:
    """What gives torch fewer threads with the plugin in use (its resolved settings), judged by the `threads` torch
    really ran (a `threads=0` setting may already have given it one): its threads setting where it has one and torch
    ran more than one, else the environment torch reads at start."""
    if "threads" not in settings:
        return "rerun on an idle host (this plugin has no threads setting; OMP_NUM_THREADS=1 limits torch's threads)"
    if threads <= 1:
        return "rerun on an idle host (torch already runs one thread)"
    return "rerun on an idle host, or give torch fewer threads (-O threads=1)"


def busy_before_run(threads: int, settings: dict) -> str | None:
    """Why the host is too busy for a CPU run about to start on `threads` threads (its load and those threads are
    more than its CPUs), with advice for the plugin in use; None when there is room."""
    cpus, load, _ = free_cores()
    if load + threads <= cpus + 0.5:
        return None
    return (
        f"{load:.1f} other threads running on {cpus} CPUs before the run, torch on {threads} thread(s): other work "
        f"competes for the cores, so the figure will be low; {threads_advice(settings, threads)}"
    )


def usable_cpus() -> int:
    """How many CPUs this process may run on: its affinity where the OS says it, else the host's count (at least 1)."""
    return len(cpu_affinity() or ()) or os.cpu_count() or 1


def cpu_affinity() -> list[int] | None:
    """The CPUs this process may run on (None where the OS does not say)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None
