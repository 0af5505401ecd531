"""All-reduce bandwidth over message sizes through the plugin's process-group backend (nccl-tests' figures).

algbw = bytes / time per all-reduce; busbw = algbw x 2 (n - 1) / n, the nccl-tests formula that makes a ring
all-reduce comparable with the link bandwidth whatever the rank count. Every timed loop is closed by the plugin's
device synchronisation, and a loop's time is the slowest rank's.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from llmb.api.errors import LlmbError, PluginError, UsageError
from llmb.distributed import job as distributed
from llmb.records import Commbench, CommRow, DeviceRef, PluginRef
from llmb.registry import plugins
from llmb.registry.plugins import call, resolve_settings, select_backend
from llmb.run.device import check_device_present, plugin_device
from llmb.run.plugin_returns import PluginReturns
from llmb.spec.vocab import DEFAULT_TIMEOUT_SECONDS, MAX_PROCESSES_PER_NODE
from llmb.terminal import console as term

if TYPE_CHECKING:
    from rich.table import Table

# 1 KiB to 64 MiB by x16: latency-bound to bandwidth-bound (nccl-tests sweeps 8 B to 128 MiB by x2).
DEFAULT_SIZES = tuple(2**k for k in range(10, 27, 4))
_UNITS = {"": 1, "B": 1, "K": 2**10, "KB": 2**10, "KIB": 2**10, "M": 2**20, "MB": 2**20, "MIB": 2**20}
_UNITS |= {"G": 2**30, "GB": 2**30, "GIB": 2**30}


@dataclass
class CommOptions:
    plugin: str | None = None
    device: str | None = None
    sizes: tuple[int, ...] = DEFAULT_SIZES
    iters: int = 20
    warmup: int = 5
    dtype: str = "float32"
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS


def parse_sizes(text: str) -> tuple[int, ...]:
    """ "1K,1M,64M" -> bytes (binary units)."""
    sizes = []
    for item in text.split(","):
        # At most 18 digits: past them no message fits any memory (and Python refuses to read 4,300 or more).
        match = re.fullmatch(r"\s*(\d{1,18})\s*([A-Za-z]*)\s*", item)
        if not match or match.group(2).upper() not in _UNITS:
            raise UsageError(f"--sizes: cannot read {item.strip()[:40]!r} (use e.g. 1K,1M,64M)")
        sizes.append(int(match.group(1)) * _UNITS[match.group(2).upper()])
    if any(size < 1 for size in sizes):
        raise UsageError("--sizes must be at least 1 byte each")
    return tuple(sizes)


def bus_bandwidth(algbw: float, ranks: int) -> float:
    """nccl-tests' all-reduce bus bandwidth: algbw x 2 (n - 1) / n."""
    return algbw * 2 * (ranks - 1) / ranks


def check(options: CommOptions) -> None:
    if options.iters < 1 or options.warmup < 0:
        raise UsageError("--iters must be at least 1 and --warmup at least 0")
    if not hasattr(torch, options.dtype) or not isinstance(getattr(torch, options.dtype), torch.dtype):
        raise UsageError(f"unknown dtype {options.dtype!r}")


def run(options: CommOptions) -> Commbench | None:
    """On every rank of a torch.distributed job: the all-reduce sweep. Rank 0 returns the record, others None."""
    check(options)
    world = distributed.current_world()
    if world is None:
        raise UsageError("llmb commbench needs several processes: --nproc-per-node N, or torchrun")
    with distributed.errors_name_the_rank():
        return _sweep(options, world)


def _sweep(options: CommOptions, world: distributed.World) -> Commbench | None:
    plugin = select_backend(options.plugin, options.device)
    devices = plugin.backend
    device = distributed.rank_device(plugin_device(plugin, options.device, options.plugin), world)
    settings = resolve_settings(devices, {})
    plugins.setup(devices, device, "FP32", settings)
    check_device_present(device)
    backend = distributed.init_process_group(devices, device, world, options.timeout_seconds)
    dtype = getattr(torch, options.dtype)
    element = torch.empty((), dtype=dtype).element_size()
    n = world.world_size
    rows = []
    for size in options.sizes:
        count = max(1, size // element)
        buffer = torch.full((count,), float(world.rank + 1), dtype=dtype, device=device)
        dist.all_reduce(buffer)  # one checked reduction: the backend really sums every rank's data
        devices.synchronize(device)
        if not bool((buffer == n * (n + 1) / 2).all()):
            raise LlmbError(f"all-reduce of {count * element} bytes returned a wrong sum on rank {world.rank}")
        buffer.zero_()  # zeros stay finite however many times they are summed
        for _ in range(options.warmup):
            dist.all_reduce(buffer)
        devices.synchronize(device)
        distributed.barrier()
        start = time.perf_counter()
        for _ in range(options.iters):
            dist.all_reduce(buffer)
        devices.synchronize(device)
        elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64, device=device)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank's loop
        seconds = float(elapsed.item()) / options.iters
        nbytes = count * element
        algbw = nbytes / seconds
        rows.append(
            CommRow(
                bytes=nbytes,
                elements=count,
                seconds=seconds,
                algbw_bytes_per_second=algbw,
                busbw_bytes_per_second=bus_bandwidth(algbw, n),
            )
        )
    if world.rank != 0:
        return None
    return Commbench(
        operation="all_reduce",
        plugin=PluginRef(
            name=plugin.name,
            version=plugin.version,
            distribution=plugin.distribution,
            settings=settings,
            defaults=settings,
        ),
        device=DeviceRef(
            type=device.type, name=PluginReturns(plugin.name).name("device_name", call(devices.device_name, device))
        ),
        backend=backend,
        world_size=n,
        nodes=world.nodes,
        dtype=options.dtype,
        iters=options.iters,
        warmup=options.warmup,
        timing="host clock around the loop, closed by the plugin's device synchronisation; the slowest rank's",
        results=rows,
        torch=torch.__version__,
    )


def run_job(options: CommOptions) -> Commbench | None:
    """Each rank's entrypoint under llmb's launcher."""
    try:
        return run(options)
    finally:
        distributed.shutdown()


def launch(spec: distributed.LaunchSpec, options: CommOptions) -> Commbench | None:
    check(options)
    return distributed.launch(spec, run_job, options).get(0)


def default_nproc(options: CommOptions) -> int:
    """The host's devices for the plugin's device type, at least two (one process per device; the CPU is shared)."""
    selected = select_backend(options.plugin, options.device)
    backend = selected.backend
    device = plugin_device(selected, options.device, options.plugin)
    count = PluginReturns(backend.name).count("device_count", call(backend.device_count, device)) or 1
    if count > MAX_PROCESSES_PER_NODE:
        # Once taken as it was: 10**6 started processes until the host ran out of file descriptors ("error: Too many
        # open files"), naming neither the plugin nor the option that sets the count.
        raise PluginError(
            backend.name,
            "device_count",
            ValueError(
                f"returned {count}, more than one node starts (at most {MAX_PROCESSES_PER_NODE}); give --nproc-per-node"
            ),
        )
    return max(2, count)


def table(record: Commbench) -> Table:
    """The sweep as nccl-tests prints it: size, time, algbw, busbw (GB/s = 1e9 bytes/s)."""
    title = f"all-reduce, {record.backend} on {record.world_size} x {record.device.name} ({record.dtype})"
    out = term.table(title)
    for column in ("size (B)", "elements", "time (us)", "algbw (GB/s)", "busbw (GB/s)"):
        term.column(out, column, numeric=True)
    for row in record.results:
        out.add_row(
            f"{row.bytes:,}",
            f"{row.elements:,}",
            f"{row.seconds * 1e6:,.1f}",
            f"{row.algbw_bytes_per_second / 1e9:.4g}",
            f"{row.busbw_bytes_per_second / 1e9:.4g}",
        )
    return out
