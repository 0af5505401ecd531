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
import math
import os
import re
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from llmb.api.errors import LlmbError, UsageError, describe, first_line, message
from llmb.distributed import cluster
from llmb.registry.plugins import call
from llmb.spec.vocab import DEFAULT_TIMEOUT_SECONDS, PARALLEL  # noqa: F401  (PARALLEL: re-exported, the CLI's vocabulary)

if TYPE_CHECKING:
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    from llmb.api.backend import Backend

DEFAULT_MASTER_PORT = 29500  # torchrun's default
_LLMB_ERROR = re.compile(r"^(LlmbError|UsageError|PluginError): (rank \d+: )?")
# What a collective says when its peer went away (gloo, NCCL, the store): worth asking which peer fell silent.
_PEER_LOST = re.compile(r"(?i)connection|peer|gloo|nccl|timed? ?out|socket|broken pipe|store")
_FOREIGN = re.compile(r"^[\w.]+(Error|Exception): ")


@dataclass(frozen=True)
class World:
    """This process's place in the job, as its launcher's environment says (llmb.distributed.cluster)."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_count: int = 0  # the launcher's count of nodes; 0: derive it from the local world size
    launcher: str = "torchrun"

    @property
    def nodes(self) -> int:
        if self.node_count:
            return self.node_count
        return max(1, self.world_size // max(1, self.local_world_size))

    @property
    def node(self) -> int:
        """This rank's node, counting ranks in blocks of the local world size (torchrun's and srun's layout)."""
        return self.rank // max(1, self.local_world_size)


def current_world() -> World | None:
    """The job this process belongs to (torchrun's RANK, WORLD_SIZE...; Slurm's srun, Open MPI's or PMI's own
    variables, exported once in torch's names), or None for a plain run. A rendezvous host that does not resolve
    is a usage error here, before anything waits on it."""
    job = cluster.export(os.environ)
    if job is None:
        return None
    if job.master_addr:
        cluster.check_rendezvous_host(job.master_addr, job.master_from)
    return World(
        rank=job.rank,
        local_rank=job.local_rank,
        world_size=job.world_size,
        local_world_size=job.local_world_size,
        node_count=job.nodes,
        launcher=job.launcher,
    )


def rank_device(device: torch.device, world: World) -> torch.device:
    """Each process its own device, by LOCAL_RANK; the host CPU is one device that every rank shares."""
    if device.type == "cpu":
        return device
    return torch.device(device.type, world.local_rank)


@contextlib.contextmanager
def errors_name_the_rank() -> Iterator[None]:
    """In a job, any error leaves as one llmb error line that starts with the rank (a usage error stays one); the
    traceback stays in the rank's error file. Outside a job, errors pass unchanged."""
    world = current_world()
    try:
        yield
    except Exception as exc:
        if world is None:
            raise
        if not isinstance(exc, LlmbError):
            lost = peer_loss(world, exc)
            if lost is not None:
                raise lost from exc
        if isinstance(exc, LlmbError):
            kind, text = (UsageError if isinstance(exc, UsageError) else LlmbError), message(exc)
        else:
            kind, text = LlmbError, describe(exc)
        raise kind(f"rank {world.rank}: {text}") from exc


# The launch


@dataclass(frozen=True)
class LaunchSpec:
    nproc_per_node: int
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str | None = None
    master_port: int | None = None
    # The rendezvous waits this long for the other nodes (torch's static rendezvous otherwise waits 600-900 s).
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS

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
        if self.master_addr:
            cluster.check_rendezvous_host(self.master_addr, "--master-addr")


def torchrun_arguments(spec: LaunchSpec) -> list[str]:
    """torchrun's own command line for the spec: a local rendezvous on one node, torchrun's static one across nodes."""
    args = [f"--nproc-per-node={spec.nproc_per_node}", f"--nnodes={spec.nnodes}", "--max-restarts=0"]
    wait = max(1, math.ceil(spec.timeout_seconds))
    if spec.nnodes == 1 and spec.master_addr is None and spec.master_port is None:
        # What `torchrun --standalone` does: a c10d store on a free local port, so parallel jobs never collide.
        return args + [
            "--rdzv-backend=c10d",
            "--rdzv-endpoint=localhost:0",
            f"--rdzv-id={uuid.uuid4().hex}",
            f"--rdzv-conf=join_timeout={wait}",
        ]
    return args + [
        f"--rdzv-conf=timeout={wait}",
        "--rdzv-backend=static",
        f"--node-rank={spec.node_rank}",
        f"--master-addr={spec.master_addr or '127.0.0.1'}",
        f"--master-port={spec.master_port or DEFAULT_MASTER_PORT}",
    ]


def launch(spec: LaunchSpec, entrypoint: Callable, *args: Any) -> dict[int, Any]:
    """Run entrypoint(*args) on every local rank through torch's elastic launcher (what torchrun runs), configured
    from torchrun's own argument parser. Returns each local rank's return value; a failed rank raises LlmbError
    naming it (the launcher stops the other ranks, so nothing waits on the failed one). The return values come back
    pickled, and unpickling runs whatever a pickle names: only for a launching process that imports the plugin
    anyway (the clean room's judge uses launch_module)."""
    # The training script is a placeholder: the entrypoint is the function, started with the spawn method.
    return _launch(spec, ["-m", "llmb"], lambda config, _cmd, _args: _elastic_launch(config, entrypoint)(*args))


def launch_module(spec: LaunchSpec, module: str, *args: str) -> None:
    """Run `python -m module args` on every local rank, as torchrun does: fresh interpreters whose only way back
    to this process is their exit code and torch's JSON error file (the module's main wraps itself in torch's
    `record`), so nothing a rank's process writes is ever unpickled here. A failed rank raises LlmbError naming
    it, as launch does."""
    _launch(spec, ["-m", module, *args], lambda config, cmd, cmd_args: _elastic_launch(config, cmd)(*cmd_args))


def _elastic_launch(config, entrypoint):
    # Lazy: torch's elastic launcher, loaded only when a job launches.
    from torch.distributed.launcher.api import elastic_launch

    return elastic_launch(config, entrypoint)


def _launch(spec: LaunchSpec, script: list[str], start: Callable) -> Any:
    # Lazy: torch's elastic launcher, loaded only when a job launches.
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousError
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
        return start(*config_from_args(parse_args([*torchrun_arguments(spec), *script])))
    except ChildFailedError as exc:
        raise failure_error(exc.failures) from None
    except SignalException as exc:
        raise LlmbError(f"stopped by {exc.sigval.name}: every rank was stopped") from None
    except (dist.DistError, RendezvousError, TimeoutError) as exc:
        # The nodes never met: name where this node waited and for how long, in one line.
        where = f"{spec.master_addr or '127.0.0.1'}:{spec.master_port or DEFAULT_MASTER_PORT}"
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise LlmbError(
            f"node {spec.node_rank}: the job's {spec.nnodes} nodes did not all join within "
            f"{spec.timeout_seconds:g} s (rendezvous at {where}): {first}"
        ) from None
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
    message = _headline(_LLMB_ERROR.sub("", text(failure)))
    if message.startswith("ranks disagree:") or " stopped answering" in message:
        # Every rank says the same thing about the job (which rank disagrees, which peer died): say it once.
        return (UsageError if text(failure).startswith("UsageError: ") else LlmbError)(message)
    if not message or message.startswith("To enable traceback"):
        message = f"exited with code {failure.exitcode}"
    others = sorted(r for r in failures if r != rank)
    also = f" (also failed: rank {', '.join(map(str, others))})" if others else ""
    error = UsageError if text(failure).startswith("UsageError: ") else LlmbError
    return error(f"rank {rank} failed: {message}{also}")


def _headline(text: str) -> str:
    """An error's first line that says something: some of torch's messages (the pipeline stage's) leave the class
    name alone on the first line and say what failed below, so a bare class name takes the next line with it."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) > 1 and re.fullmatch(r"[\w.]+(Error|Exception):", lines[0]):
        return f"{lines[0]} {lines[1]}"
    return lines[0] if lines else ""


# The process group and the parallel wrapper


def init_process_group(plugin: Backend, device: torch.device, world: World, timeout_seconds: float) -> str:
    """Join the job's process group (once per process) with the plugin's backend; returns the backend's name.
    `plugin` is the run's `llmb.Backend`."""
    if dist.is_initialized():
        return dist.get_backend()

    backend = call(plugin.distributed_backend, device)
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
    Heartbeat.start(world)
    return backend


def shutdown() -> None:
    Heartbeat.stop()
    if dist.is_initialized():
        dist.destroy_process_group()


class Heartbeat:
    """Each rank stamps the time in the job's store every second, so that when a collective fails because a peer
    went away, the survivor can name the peer that fell silent instead of blaming itself."""

    PERIOD = 1.0
    SILENT = 3.0  # seconds without a stamp: gone (three missed periods)
    STOP_WAIT = 10.0  # a stamp takes milliseconds; a store whose host went away fails its call within seconds
    _current: Heartbeat | None = None

    def __init__(self, world: World) -> None:
        self.world = world
        self.store = dist.distributed_c10d._get_default_store()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._beat, name="llmb-heartbeat", daemon=True)

    @classmethod
    def start(cls, world: World) -> None:
        cls.stop()
        try:
            cls._current = cls(world)
        except (RuntimeError, ValueError):
            return  # no store to stamp: failures are reported without the peer's name
        cls._current.thread.start()

    @classmethod
    def stop(cls) -> None:
        """Stop the stamps and wait for the thread (at most STOP_WAIT): one left inside the store's call into C++
        while the interpreter exits aborts the rank's process after its work is done ("terminate called without an
        active exception"), and the launcher then counts the rank as failed."""
        beat, cls._current = cls._current, None
        if beat is None:
            return
        beat.stopped.set()
        if beat.thread.is_alive() and beat.thread is not threading.current_thread():
            beat.thread.join(cls.STOP_WAIT)

    def _beat(self) -> None:
        while not self.stopped.is_set():
            try:
                self.store.set(f"llmb/alive/{self.world.rank}", repr(time.time()))
            except Exception:  # the store went away with its host: the main thread's collective will say so
                return
            self.stopped.wait(self.PERIOD)

    @classmethod
    def silent_peers(cls) -> list[int] | None:
        """The ranks whose stamps stopped (None when the store itself cannot be reached: its host is gone)."""
        beat = cls._current
        if beat is None:
            return []
        time.sleep(cls.SILENT)  # a peer that just died stamped at most one period ago
        silent = []
        try:
            now = time.time()
            for rank in range(beat.world.world_size):
                key = f"llmb/alive/{rank}"
                if rank == beat.world.rank or not beat.store.check([key]):
                    continue
                if now - float(beat.store.get(key).decode()) > cls.SILENT:
                    silent.append(rank)
        except Exception:
            return None
        return silent


def peer_loss(world: World, exc: BaseException) -> LlmbError | None:
    """When this rank's error came from a peer that stopped answering, an error naming that peer."""
    if not dist.is_initialized() or Heartbeat._current is None or not _PEER_LOST.search(message(exc)):
        return None
    silent = Heartbeat.silent_peers()
    first = first_line(exc) or type(exc).__name__
    if silent is None:
        node = 0
        return LlmbError(
            f"rank 0's node (node {node}, the job's store) stopped answering; rank {world.rank} saw: {first[:200]}"
        )
    if not silent:
        return None
    names = ", ".join(f"rank {r} on node {r // max(1, world.local_world_size)}" for r in silent)
    return LlmbError(f"{names} stopped answering (rank {world.rank} noticed: {first[:200]})")


def barrier() -> None:
    dist.barrier()


def grad_scaler(parallel: str, device: torch.device) -> ShardedGradScaler | None:
    """FSDP's loss scaler for FP16: each rank holds a shard of the gradients, so whether they overflowed is agreed
    across ranks (or one rank would skip a step the others take). DDP's gradients are whole, None keeps torch.amp's."""
    if parallel not in ("fsdp", "hsdp"):
        return None
    # Lazy: only a sharded job scales its gradients this way.
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


def full_parameters(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """This rank's parameters made whole (DTensor shards gathered: a collective on their mesh, so every rank of
    the mesh calls it), named as in the unwrapped model."""
    params = {}
    for name, p in model.named_parameters():
        value = p.detach()
        if hasattr(value, "full_tensor"):
            value = value.full_tensor()
        params[name.removeprefix("module.").replace("_orig_mod.", "")] = value.cpu().clone()
    return params
