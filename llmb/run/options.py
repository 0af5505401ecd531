"""A run's request: its options (RunOptions), the progress it reports, and the checks made on the request before
any work (which plugin, device and layout it resolves to)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import torch

from llmb.api.errors import UsageError
from llmb.audit import precision
from llmb.distributed import job as distributed
from llmb.distributed import mesh
from llmb.model import ModelConfig
from llmb.registry.plugins import Registration, call, resolve_settings, select_backend
from llmb.run.device import plugin_device
from llmb.spec.vocab import DEFAULT_TIMEOUT_SECONDS


@dataclass
class RunOptions:
    config: ModelConfig
    preset: str = "official"
    plugin: str | None = None
    device: str | None = None
    precision: str = "FP32"
    mode: str = "pure"
    batch_size: int = 1
    steps: int = 50
    warmup_steps: int = 5
    repeats: int = 1
    seed: int = 0
    settings: dict[str, str] = field(default_factory=dict)
    strict_precision: bool = False
    # Under torchrun (or `--nproc-per-node`): ddp or fsdp (default ddp); "none" for a single process.
    parallel: str | None = None
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS
    # The layout on the job's DeviceMesh (llmb.distributed.mesh): tensor and pipeline parallel sizes, the pipeline's
    # schedule and microbatches, gradient accumulation (also in one process), sequence parallel with tensor parallel.
    tp: int = 1
    pp: int = 1
    microbatches: int | None = None
    pp_schedule: str = "gpipe"
    grad_accum: int = 1
    sequence_parallel: bool = False


class Progress:
    """What a run reports while it works; the CLI draws it, tests ignore it."""

    def phase(self, name: str, total: int) -> None: ...

    def advance(self) -> None: ...

    def note(self, text: str) -> None:
        """A line worth the console's attention (a straggler); the record holds it too."""


def check_request(options: RunOptions, allow_all: bool = False) -> None:
    """The checks that need no plugin (the clean process makes them before any worker starts)."""
    if options.precision not in precision.PRECISIONS and not (allow_all and options.precision == "ALL"):
        raise UsageError(f"unknown precision {options.precision!r} (choose from {', '.join(precision.PRECISIONS)})")
    if options.mode not in precision.MODES:
        raise UsageError(f"unknown precision mode {options.mode!r} (choose from pure, amp)")
    for name in ("batch_size", "steps", "warmup_steps", "repeats"):
        if getattr(options, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(options, name)}")
    if distributed.current_world() is None and options.parallel not in (None, "none"):
        raise UsageError(f"--parallel {options.parallel} needs several processes: add --nproc-per-node N, or torchrun")


def resolve(options: RunOptions) -> tuple[Registration, torch.device, dict]:
    """Check the request before any work: plugin, settings, device, precision, sizes."""
    check_request(options)
    plugin = select_backend(options.plugin, options.device)
    backend = plugin.backend
    settings = resolve_settings(backend, options.settings)
    supported = list(call(backend.precisions))
    if options.precision not in supported:
        raise UsageError(
            f"plugin {plugin.name!r} does not support {options.precision} (supports {', '.join(supported)})"
        )
    device = plugin_device(plugin, options.device, options.plugin)
    world = distributed.current_world()
    if world is None and options.parallel not in (None, "none"):
        raise UsageError(f"--parallel {options.parallel} needs several processes: add --nproc-per-node N, or torchrun")
    if world is None and (options.tp > 1 or options.pp > 1):
        raise UsageError("--tp and --pp need several processes: add --nproc-per-node N, or torchrun")
    if world is not None:
        if parallel_strategy(options) not in distributed.PARALLEL:
            raise UsageError(f"--parallel must be one of {', '.join(distributed.PARALLEL)} under torch.distributed")
        device = distributed.rank_device(device, world)
    mesh.check(layout(options), options.config, options.batch_size)
    return plugin, device, settings


def check_launch(options: RunOptions, world_size: int, nodes: int) -> None:
    """Before any process starts: the request as one process would resolve it, and the layout on the job's size."""
    resolve(replace(options, parallel=None, tp=1, pp=1, microbatches=None))
    check_layout(options, world_size, nodes)


def check_layout(options: RunOptions, world_size: int, nodes: int) -> None:
    """The layout on the job's size, checked without any plugin (the clean process checks it before a launch)."""
    single = replace(options, parallel=None, tp=1, pp=1, microbatches=None)
    plan = replace(layout(single), world_size=world_size, nodes=nodes, tp=options.tp, pp=options.pp)
    plan = replace(
        plan,
        strategy=options.parallel or "ddp",
        microbatches=options.microbatches or math.gcd(options.pp, options.batch_size),
    )
    mesh.check(plan, options.config, options.batch_size)


def layout(options: RunOptions) -> mesh.Layout:
    """The run's layout on the job's mesh (a single process is a layout of one)."""
    world = distributed.current_world()
    return mesh.Layout(
        world_size=world.world_size if world else 1,
        tp=options.tp,
        pp=options.pp,
        strategy=parallel_strategy(options),
        nodes=world.nodes if world else 1,
        microbatches=options.microbatches or math.gcd(options.pp, options.batch_size),
        schedule=options.pp_schedule,
        grad_accum=options.grad_accum,
        sequence_parallel=options.sequence_parallel,
    )


def parallel_strategy(options: RunOptions) -> str:
    """ddp or fsdp in a torch.distributed job (ddp unless asked), none in a single process."""
    if distributed.current_world() is None:
        return "none"
    return options.parallel if options.parallel not in (None, "none") else "ddp"
