"""Multi-process runs on torch.distributed: the launch (torchrun's own), the process group, the parallel wrapper.

A run with several processes is the single-device run on every rank, plus four things done here: each rank gets
its device and the process group (backend from the plugin), the harness wraps the plugin's post-processed model in
DDP or FSDP2, the timer's window edges wait for every rank (device sync, then a barrier), and rank 0 gathers what
every rank measured and audited.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import re
import signal
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from llmb.errors import LlmbError, UsageError

PARALLEL = ("ddp", "fsdp")
# How long a collective may wait for a peer before the group fails it: long enough for a slow first step (compile),
# short enough that a rank lost without its process dying (a hung device, a lost node) fails the run, not hangs it.
DEFAULT_TIMEOUT_SECONDS = 600
DEFAULT_MASTER_PORT = 29500  # torchrun's default
_LLMB_ERROR = re.compile(r"^(LlmbError|UsageError|PluginError): (rank \d+: )?")
_FOREIGN = re.compile(r"^[\w.]+(Error|Exception): ")


@dataclass(frozen=True)
class World:
    """This process's place in the job, as torchrun's environment says."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int

    @property
    def nodes(self) -> int:
        return max(1, self.world_size // max(1, self.local_world_size))


def current_world() -> World | None:
    """The job this process belongs to (torchrun sets RANK, WORLD_SIZE, LOCAL_RANK...), or None for a plain run."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return None
    world_size = int(os.environ["WORLD_SIZE"])
    return World(
        rank=int(os.environ["RANK"]),
        local_rank=int(os.environ.get("LOCAL_RANK", 0)),
        world_size=world_size,
        local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", world_size)),
    )


def rank_device(device: torch.device, world: World) -> torch.device:
    """Each process its own device, by LOCAL_RANK; the host CPU is one device that every rank shares."""
    if device.type == "cpu":
        return device
    return torch.device(device.type, world.local_rank)


@contextlib.contextmanager
def errors_name_the_rank():
    """In a job, any error leaves as one llmb error line that starts with the rank (a usage error stays one); the
    traceback stays in the rank's error file. Outside a job, errors pass unchanged."""
    world = current_world()
    try:
        yield
    except Exception as exc:
        if world is None:
            raise
        if isinstance(exc, LlmbError):
            kind, text = (UsageError if isinstance(exc, UsageError) else LlmbError), str(exc)
        else:
            kind, text = LlmbError, f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc) else ''}"
        raise kind(f"rank {world.rank}: {text}") from exc


# The launch


@dataclass(frozen=True)
class LaunchSpec:
    nproc_per_node: int
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str | None = None
    master_port: int | None = None

    def check(self) -> None:
        if self.nproc_per_node < 1:
            raise UsageError(f"--nproc-per-node must be at least 1, got {self.nproc_per_node}")
        if self.nnodes < 1:
            raise UsageError(f"--nnodes must be at least 1, got {self.nnodes}")
        if not 0 <= self.node_rank < self.nnodes:
            raise UsageError(f"--node-rank must be in 0..{self.nnodes - 1}, got {self.node_rank}")
        if self.nnodes > 1 and not self.master_addr:
            raise UsageError("--nnodes > 1 needs --master-addr (the address of node rank 0)")
        if current_world() is not None:
            raise UsageError("already inside a torch.distributed job (RANK is set): drop --nproc-per-node")


def torchrun_arguments(spec: LaunchSpec) -> list[str]:
    """torchrun's own command line for the spec: a local rendezvous on one node, torchrun's static one across nodes."""
    args = [f"--nproc-per-node={spec.nproc_per_node}", f"--nnodes={spec.nnodes}", "--max-restarts=0"]
    if spec.nnodes == 1 and spec.master_addr is None and spec.master_port is None:
        # What `torchrun --standalone` does: a c10d store on a free local port, so parallel jobs never collide.
        return args + ["--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0", f"--rdzv-id={uuid.uuid4().hex}"]
    return args + [
        "--rdzv-backend=static",
        f"--node-rank={spec.node_rank}",
        f"--master-addr={spec.master_addr or '127.0.0.1'}",
        f"--master-port={spec.master_port or DEFAULT_MASTER_PORT}",
    ]


def launch(spec: LaunchSpec, entrypoint: Callable, *args: Any) -> dict[int, Any]:
    """Run entrypoint(*args) on every local rank through torch's elastic launcher (what torchrun runs), configured
    from torchrun's own argument parser. Returns each local rank's return value; a failed rank raises LlmbError
    naming it (the launcher stops the other ranks, so nothing waits on the failed one)."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch
    from torch.distributed.run import config_from_args, parse_args

    spec.check()
    # torch's launcher narrates every phase and logs each failed rank's traceback; llmb prints its result or one
    # line naming the failed rank (the traceback stays in that rank's error file). Its OMP_NUM_THREADS=1 per process
    # (when unset) still applies, for the job only; the cpu plugin records the threads a run used.
    loggers = [
        logging.getLogger(name)
        for name in ("torch.distributed.elastic", "torch.distributed.run", "torch.multiprocessing")
    ]
    levels = [logger.level for logger in loggers]
    environment = dict(os.environ)
    # The launcher takes over these signals to stop its workers; give them back afterwards (llmb is a library too).
    handlers = _signal_handlers()
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    try:
        # The training script is a placeholder: the entrypoint is the function, started with the spawn method.
        config, _, _ = config_from_args(parse_args([*torchrun_arguments(spec), "-m", "llmb"]))
        return elastic_launch(config, entrypoint)(*args)
    except ChildFailedError as exc:
        raise failure_error(exc.failures) from None
    except SignalException as exc:
        raise LlmbError(f"stopped by {exc.sigval.name}: every rank was stopped") from None
    finally:
        for number, handler in handlers.items():
            signal.signal(number, handler)
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)
        os.environ.clear()
        os.environ.update(environment)


def _signal_handlers() -> dict:
    if threading.current_thread() is not threading.main_thread():
        return {}
    names = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")
    return {sig: signal.getsignal(sig) for sig in (getattr(signal, n) for n in names if hasattr(signal, n))}


def failure_error(failures: dict) -> LlmbError:
    """One line for a failed job: the root-cause rank and its error (a usage error stays one). A rank's own llmb
    error comes before a peer's consequence of it (a collective that lost its partner fails at once too), then the
    earliest, then the lowest rank."""

    def text(failure) -> str:
        # torch keeps an error file's {"message": ..., "extraInfo": {traceback}} as a dict, a signal's as a string
        message = failure.message.get("message", "") if isinstance(failure.message, dict) else failure.message
        return (message or "").strip()

    def own(failure) -> bool:
        # llmb's own errors (plugin, device, memory...) read as sentences; an exception from elsewhere, such as a
        # collective whose peer died, keeps its class name in front (see errors_name_the_rank).
        return bool(_LLMB_ERROR.match(text(failure))) and not _FOREIGN.match(_LLMB_ERROR.sub("", text(failure)))

    def key(item):
        rank, failure = item
        return (not own(failure), failure.timestamp, rank)

    rank, failure = sorted(failures.items(), key=key)[0]
    message = _LLMB_ERROR.sub("", text(failure)).splitlines()[0] if text(failure) else ""
    if not message or message.startswith("To enable traceback"):
        message = f"exited with code {failure.exitcode}"
    others = sorted(r for r in failures if r != rank)
    also = f" (also failed: rank {', '.join(map(str, others))})" if others else ""
    error = UsageError if text(failure).startswith("UsageError: ") else LlmbError
    return error(f"rank {rank} failed: {message}{also}")


# The process group and the parallel wrapper


def init_process_group(plugin, device: torch.device, world: World, timeout_seconds: float) -> str:
    """Join the job's process group (once per process) with the plugin's backend; returns the backend's name."""
    if dist.is_initialized():
        return dist.get_backend()
    backend = plugin.call("distributed_backend", device=device)
    if not backend:
        try:
            backend = dist.get_default_backend_for_device(device)
        except (RuntimeError, ValueError) as exc:
            raise LlmbError(f"no torch.distributed backend for device {str(device)!r}: {exc}") from None
    accelerator = getattr(torch, "accelerator", None)
    current = accelerator.current_accelerator() if accelerator and accelerator.is_available() else None
    if current is not None and current.type == device.type and device.index is not None:
        accelerator.set_device_index(device.index)  # collectives run on this rank's device, not device 0
    dist.init_process_group(
        backend=backend,
        rank=world.rank,
        world_size=world.world_size,
        timeout=dt.timedelta(seconds=timeout_seconds),
    )
    return backend


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def barrier() -> None:
    dist.barrier()


def parallelize(model: torch.nn.Module, parallel: str, device: torch.device, world: World) -> torch.nn.Module:
    """torch's own data parallelism around the (post-processed) model: DDP, or FSDP2 with each decoder layer a
    unit and then the root. FSDP2 replaces the parameters with sharded ones, so build the optimizer afterwards."""
    if parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        # device_ids=None: the module sits on one device (or the CPU) and DDP uses it where it is.
        return DistributedDataParallel(model, device_ids=None)
    if parallel == "fsdp":
        from llmb.model import DecoderLayer, LlamaModel

        try:
            from torch.distributed.fsdp import fully_shard
        except ImportError:
            raise UsageError(
                f"--parallel fsdp needs FSDP2 (fully_shard), which torch {torch.__version__} lacks"
            ) from None
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(device.type, (world.world_size,))
        # Found by type, so a plugin's wrapper (e.g. torch.compile's) around the model is sharded inside.
        for module in model.modules():
            if isinstance(module, DecoderLayer):
                fully_shard(module, mesh=mesh)
        roots = [m for m in model.modules() if isinstance(m, LlamaModel)]
        fully_shard(roots[0] if roots else model, mesh=mesh)
        return model
    raise UsageError(f"unknown --parallel {parallel!r} (choose from {', '.join(PARALLEL)})")


def grad_scaler(parallel: str, device: torch.device):
    """FSDP's loss scaler for FP16: each rank holds a shard of the gradients, so whether they overflowed is agreed
    across ranks (or one rank would skip a step the others take). DDP's gradients are whole, None keeps torch.amp's."""
    if parallel != "fsdp":
        return None
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    return ShardedGradScaler(device.type)


def full_gradients(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter's whole gradient on this rank (FSDP's shards gathered: a collective, so call it on every
    rank), named as in the unwrapped model."""
    grads = {}
    for name, p in model.named_parameters():
        grad = p.grad
        if grad is not None and hasattr(grad, "full_tensor"):
            grad = grad.full_tensor()
        grads[name.removeprefix("module.").replace("_orig_mod.", "")] = None if grad is None else grad.detach().cpu()
    return grads


def gather(value: Any, world: World) -> list[Any] | None:
    """Every rank's value, in rank order, on rank 0 (None elsewhere)."""
    gathered = [None] * world.world_size if world.rank == 0 else None
    dist.gather_object(value, gathered, dst=0)
    return gathered


# The run on every rank


def run_job(runs: list) -> list[dict]:
    """Each rank's entrypoint: the runs (one per precision) in this process's group; rank 0 returns the records."""
    from llmb import runner

    try:
        return [record for record in (runner.run(options) for options in runs) if record is not None]
    finally:
        shutdown()


def launch_runs(spec: LaunchSpec, runs: list) -> list[dict]:
    """Launch the runs on every rank; the records come back from rank 0 (none on the other nodes)."""
    return launch(spec, run_job, runs).get(0) or []


def gradients_after_one_step(runs: list) -> list[dict[str, torch.Tensor]]:
    """Each rank's entrypoint for the equivalence check: prepare each run exactly as `llmb run` does (its own seeded
    batch per rank, the parallel wrapper), take one harness step, and return rank 0's view of the whole gradients.
    With the same global batch, one process must get the same gradients: that is what data parallelism promises."""
    from llmb import runner

    gathered = []
    try:
        for options in runs:
            plugin, device, settings = runner.resolve(options)
            session = runner.prepare(options, plugin, device, settings)
            session.trainer.step()
            grads = full_gradients(session.model)
            if session.world.rank == 0:
                gathered.append(grads)
    finally:
        shutdown()
    return gathered
