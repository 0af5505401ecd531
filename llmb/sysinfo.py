"""The system description of a submission, collected automatically (MLPerf's field names where they fit)."""

from __future__ import annotations

import os
import platform
from importlib import metadata
from pathlib import Path

import torch

from llmb import __version__

# Only variables that can change how a run behaves; a name holding one of the secret words never has its value kept.
ENV_PREFIXES = ("CUDA_", "PYTORCH_", "XLA_", "PJRT_", "HIP_", "ROCM_", "ONEAPI_", "ZE_", "OMP_", "KMP_", "TORCH_")
SECRET_WORDS = ("TOKEN", "KEY", "SECRET", "PASSWORD")
REDACTED = "<redacted>"
# Fields the user completes with --system-file where the machine cannot say.
TO_COMPLETE = ("status", "accelerator_interconnect", "cooling", "hw_notes")


def is_secret(name: str) -> bool:
    return any(word in name.upper() for word in SECRET_WORDS)


def run_environment(environ: dict[str, str] | None = None) -> dict[str, str]:
    """Environment variables from the allow-list of prefixes, with secret-looking ones redacted."""
    environ = os.environ if environ is None else environ
    return {
        name: REDACTED if is_secret(name) else value
        for name, value in sorted(environ.items())
        if name.upper().startswith(ENV_PREFIXES)
    }


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


def _accelerator_memory(device_type: str) -> int | None:
    backend = getattr(torch, device_type, None)
    try:
        if backend is not None and backend.is_available():
            return int(backend.get_device_properties(0).total_memory)
    except Exception:  # a backend without properties says nothing; the user completes the field
        return None
    return None


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
    device_type, device_name, count = sorted(devices)[0] if devices else ("cpu", "", 1)
    accelerated = device_type != "cpu"
    # A multi-process job records its world size and nodes; a single process its device count.
    nodes = max((r.get("nodes", 1) for r in records), default=1)
    world = max((r.get("world_size", 1) for r in records), default=1)
    count = max(count, world // nodes)
    dependencies = sorted({"torch", "pluggy", "llmb", *(p["distribution"] for p in plugins)})
    return {
        "number_of_nodes": nodes,
        "host_processors_per_node": int(cpu.get("sockets", 1)),
        "host_processor_model_name": cpu.get("model name") or platform.processor() or "unknown",
        "host_processor_core_count": cores,
        "host_processor_threads": os.cpu_count(),
        "host_memory_capacity": _gib(_memory_bytes()),
        "accelerators_per_node": count if accelerated else 0,
        "accelerator_model_name": device_name if accelerated else "N/A (host CPU)",
        "accelerator_memory_capacity": _gib(_accelerator_memory(device_type)) if accelerated else "N/A",
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
    merged = {**system, **given}
    if isinstance(merged.get("environment"), dict):  # a user file does not get to record secrets either
        merged["environment"] = {k: REDACTED if is_secret(k) else v for k, v in merged["environment"].items()}
    merged["fields_to_complete"] = [name for name in TO_COMPLETE if merged.get(name) in ("", None)]
    return merged
