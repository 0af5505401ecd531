"""Which job this process belongs to, from the launcher's own variables: torchrun, Slurm's srun, Open MPI, PMI.

torch's env:// rendezvous reads RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT; torchrun sets them, the other
launchers set their own. `detect` reads whichever is there (torchrun's first: a torchrun inside an allocation sets
its own), and `export` writes the job back in torch's names, so everything downstream reads one set.

srun sets SLURM_STEP_NUM_TASKS only inside a job step; a process started straight from the batch script (where
SLURM_PROCID is 0 and SLURM_NTASKS the allocation's) is a plain run, not rank 0 of a job that will never gather.
"""

from __future__ import annotations

import functools
import re
import socket
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass

from llmb.api.errors import UsageError
from llmb.api.settings import env_flag

DEFAULT_MASTER_PORT = 29500  # torchrun's default


@dataclass(frozen=True)
class JobEnv:
    """One process's place in a job as its launcher described it."""

    launcher: str  # torchrun, slurm, openmpi, pmi
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    nodes: int
    master_addr: str | None
    master_port: int | None
    master_from: str = "MASTER_ADDR"  # where master_addr came from, to name in an error: a variable of the job's


def _int(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    value = env.get(name)
    if value is None:
        if default is None:
            raise UsageError(f"the job's environment lacks {name}")
        return default
    try:
        return int(value)
    except ValueError:
        raise UsageError(f"the job's environment has {name}={value!r}, not a number") from None


def first_host(nodelist: str) -> str:
    """The first host of a Slurm node list: "gpu[003-005,9],cpu1" -> "gpu003" (what `scontrol show hostnames`
    lists first; the first node runs task 0 with srun's default block distribution)."""
    match = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist.strip())
    if not match:
        raise UsageError(f"cannot read the Slurm node list {nodelist!r}")
    prefix, ranges = match.group(1), match.group(2)
    if not ranges:
        return prefix
    return prefix + ranges.split(",")[0].split("-")[0]


def _slurm_tasks_per_node(text: str) -> int:
    """SLURM_STEP_TASKS_PER_NODE is "4(x2),3": the first node's count."""
    match = re.match(r"(\d+)", text or "")
    return int(match.group(1)) if match else 1


def detect(env: Mapping[str, str]) -> JobEnv | None:
    """The job described by env, or None for a plain (single-process) run."""
    if "RANK" in env and "WORLD_SIZE" in env:
        world = _int(env, "WORLD_SIZE")
        local_world = _int(env, "LOCAL_WORLD_SIZE", world)
        port = env.get("MASTER_PORT")
        return JobEnv(
            env.get("LLMB_LAUNCHER", "torchrun"),
            _int(env, "RANK"),
            world,
            _int(env, "LOCAL_RANK", 0),
            local_world,
            _int(env, "GROUP_WORLD_SIZE", max(1, world // max(1, local_world))),
            env.get("MASTER_ADDR"),
            _int(env, "MASTER_PORT") if port else None,
            env.get("LLMB_MASTER_FROM") or "MASTER_ADDR",
        )
    if "SLURM_PROCID" in env and "SLURM_STEP_NUM_TASKS" in env:
        world = _int(env, "SLURM_STEP_NUM_TASKS")
        nodes = _int(env, "SLURM_STEP_NUM_NODES", _int(env, "SLURM_NNODES", 1))
        listed = next((n for n in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST") if env.get(n)), "")
        nodelist = env.get(listed)
        master = env.get("MASTER_ADDR") or (first_host(nodelist) if nodelist else None)
        master_from = "MASTER_ADDR" if env.get("MASTER_ADDR") else f"the first host of {listed}"
        # One port per job, so two jobs sharing a node do not collide; MASTER_PORT overrides it.
        job_id = _int(env, "SLURM_JOB_ID", 0)
        port = _int(env, "MASTER_PORT", DEFAULT_MASTER_PORT + job_id % 10000)
        local_world = _slurm_tasks_per_node(env.get("SLURM_STEP_TASKS_PER_NODE", env.get("SLURM_TASKS_PER_NODE", "")))
        return JobEnv(
            "slurm",
            _int(env, "SLURM_PROCID"),
            world,
            _int(env, "SLURM_LOCALID", 0),
            local_world,
            nodes,
            master,
            port,
            master_from,
        )
    for launcher, rank, size, local, local_size in (
        ("openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
         "OMPI_COMM_WORLD_LOCAL_SIZE"),
        ("pmi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    ):  # fmt: skip
        if rank in env and size in env:
            world = _int(env, size)
            local_world = _int(env, local_size, world)
            port = env.get("MASTER_PORT")
            # MPI launchers name no rendezvous host: the job gives MASTER_ADDR (or runs on one node).
            return JobEnv(
                launcher,
                _int(env, rank),
                world,
                _int(env, local, 0),
                local_world,
                max(1, -(-world // max(1, local_world))),
                env.get("MASTER_ADDR") or (None if local_world < world else "127.0.0.1"),
                _int(env, "MASTER_PORT") if port else DEFAULT_MASTER_PORT,
            )
    return None


def check(job: JobEnv) -> None:
    if not 0 <= job.rank < job.world_size:
        raise UsageError(f"{job.launcher}: rank {job.rank} is outside a world of {job.world_size}")
    if job.world_size > 1 and not job.master_addr:
        raise UsageError(f"{job.launcher}: a job over several nodes needs MASTER_ADDR (the address of rank 0's node)")


def torch_variables(job: JobEnv) -> dict[str, str]:
    """The job in the names torch's env:// rendezvous and llmb read."""
    values = {
        "RANK": job.rank,
        "WORLD_SIZE": job.world_size,
        "LOCAL_RANK": job.local_rank,
        "LOCAL_WORLD_SIZE": job.local_world_size,
        "GROUP_WORLD_SIZE": job.nodes,
        "MASTER_ADDR": job.master_addr or "127.0.0.1",
        "MASTER_PORT": job.master_port or DEFAULT_MASTER_PORT,
        "LLMB_LAUNCHER": job.launcher,
        "LLMB_MASTER_FROM": job.master_from,
    }
    return {k: str(v) for k, v in values.items()}


def export(env: dict) -> JobEnv | None:
    """Detect the job in env (os.environ) and write it back in torch's names; None for a plain run."""
    job = detect(env)
    if job is None or "RANK" in env:
        return job
    check(job)
    env.update(torch_variables(job))
    return job


@functools.lru_cache(maxsize=8)  # asked on every look at the job; a failure raises, and so is never cached
def check_rendezvous_host(host: str, source: str) -> None:
    """Refuse, in one line naming the host and where it came from, a rendezvous host that does not resolve: c10d's
    store would retry it until the timeout, printing IPv6 warnings that never say which variable or flag to fix."""
    try:
        socket.getaddrinfo(host, None)
    except (OSError, UnicodeError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        raise UsageError(f"the rendezvous host {host!r} (from {source}) does not resolve: {reason}") from None


def quiet_native_logs(env: MutableMapping[str, str]) -> None:
    """torch's C++ side (c10d's store, gloo, NCCL's watchdog) logs its warnings and errors straight to stderr, C++
    stack frames included, before llmb's own line names the failure. Its threshold, TORCH_CPP_LOG_LEVEL, is read when
    torch loads: set it to FATAL before the first import (the ranks a launch starts inherit it), unless LLMB_DEBUG=1
    asks for everything or the user chose a level."""
    if not env_flag("LLMB_DEBUG", env) and "TORCH_CPP_LOG_LEVEL" not in env:
        env["TORCH_CPP_LOG_LEVEL"] = "FATAL"
