"""One benchmark run, end to end: plugin, backend, model, post-processing, audit, measurement, record."""

from __future__ import annotations

import datetime as dt
import gc
import math
import platform
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from llmb import __version__, census, distributed, flops, precision
from llmb.config import official_reasons
from llmb.device import Device, check_device_present, parse_device
from llmb.errors import LlmbError, UsageError
from llmb.fingerprint import RELEASED_MODEL_FINGERPRINT, model_fingerprint
from llmb.model import LlamaModel, ModelConfig, count_parameters
from llmb.plugins import Plugin, select_plugin
from llmb.results import SCHEMA, median_index
from llmb.train import Trainer, build_optimizer, median_measurement, optimizer_problems, synthetic_batch

# A freshly initialised model predicts near-uniformly: its first loss sits near ln(vocab). Measured here: tiny
# preset 10.38, small 10.40, official ~11.0 (logit std 0.02 x sqrt(hidden)); a scaled or broken model leaves the band.
LOSS_BAND = (0.8, 1.3)


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
    timeout_seconds: float = distributed.DEFAULT_TIMEOUT_SECONDS


class Progress:
    """What a run reports while it works; the CLI draws it, tests ignore it."""

    def phase(self, name: str, total: int) -> None: ...

    def advance(self) -> None: ...


def loss_band(vocab_size: int) -> tuple[float, float]:
    return LOSS_BAND[0] * math.log(vocab_size), LOSS_BAND[1] * math.log(vocab_size)


def is_out_of_memory(exc: BaseException) -> bool:
    while exc is not None:
        if isinstance(exc, torch.OutOfMemoryError):
            return True
        text = str(exc).lower()
        if isinstance(exc, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text):
            return True
        exc = exc.__cause__
    return False


def resolve(options: RunOptions) -> tuple[Plugin, torch.device, dict]:
    """Check the request before any work: plugin, settings, device, precision, sizes."""
    if options.precision not in precision.PRECISIONS:
        raise UsageError(f"unknown precision {options.precision!r} (choose from {', '.join(precision.PRECISIONS)})")
    if options.mode not in precision.MODES:
        raise UsageError(f"unknown precision mode {options.mode!r} (choose from pure, amp)")
    for name in ("batch_size", "steps", "warmup_steps", "repeats"):
        if getattr(options, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(options, name)}")
    plugin = select_plugin(options.plugin)
    settings = plugin.resolve_settings(options.settings)
    if options.precision not in plugin.precisions():
        raise UsageError(
            f"plugin {plugin.name!r} does not support {options.precision} (supports {', '.join(plugin.precisions())})"
        )
    types = plugin.device_types()
    device = parse_device(options.device or (types[0] if types else "cpu"))
    if types and device.type not in types:
        raise UsageError(f"plugin {plugin.name!r} serves {', '.join(types)}, not {device.type!r}")
    world = distributed.current_world()
    if world is None and options.parallel not in (None, "none"):
        raise UsageError(f"--parallel {options.parallel} needs several processes: add --nproc-per-node N, or torchrun")
    if world is not None:
        if parallel_strategy(options) not in distributed.PARALLEL:
            raise UsageError(f"--parallel must be one of {', '.join(distributed.PARALLEL)} under torch.distributed")
        device = distributed.rank_device(device, world)
    return plugin, device, settings


def parallel_strategy(options: RunOptions) -> str:
    """ddp or fsdp in a torch.distributed job (ddp unless asked), none in a single process."""
    if distributed.current_world() is None:
        return "none"
    return options.parallel if options.parallel not in (None, "none") else "ddp"


def run(options: RunOptions, progress: Progress | None = None) -> dict | None:
    """Run the benchmark once for one precision and return its result record (None on ranks other than 0)."""
    progress = progress or Progress()
    with distributed.errors_name_the_rank():
        plugin, device, settings = resolve(options)
        try:
            return _run(options, plugin, device, settings, progress)
        except LlmbError:
            raise
        except Exception as exc:
            if is_out_of_memory(exc):
                raise LlmbError(
                    f"out of memory at batch size {options.batch_size} on {device}: {str(exc).splitlines()[0]}"
                ) from exc
            raise
        finally:
            gc.collect()


@dataclass
class Session:
    """A model prepared for training the way a run prepares it: backend, placement, recipe, plugin, optimizer."""

    plugin: Plugin
    device: torch.device
    settings: dict
    services: Device
    recipe: precision.Recipe
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    trainer: Trainer
    parameters: int
    invalid: list[str]
    world: distributed.World | None = None


def prepare(options: RunOptions, plugin: Plugin, device: torch.device, settings: dict) -> Session:
    """Everything before the first step: the precision recipe, the plugin's backend setup, the model built from the
    seed on the CPU and moved to the device, AdamW, the plugin's post-processing, and the checks on its output."""
    config = options.config
    recipe = precision.recipe(options.precision, options.mode)
    precision.apply_backend_recipe(options.precision)
    plugin.call("setup_backend", device=device, precision=options.precision, settings=settings)
    check_device_present(device)
    services = Device(plugin, device)
    world = distributed.current_world()
    if world is not None:
        distributed.init_process_group(plugin, device, world, options.timeout_seconds)

    torch.manual_seed(options.seed)
    model = LlamaModel(config)  # built on the CPU from the seed, so every device starts from the same weights
    parameters = count_parameters(model)
    model.to(device=device, dtype=recipe.param_dtype)
    model.train()
    optimizer_options = plugin.call("optimizer_options", device=device, precision=options.precision, settings=settings)
    try:
        optimizer = build_optimizer(model, optimizer_options)
    except ValueError as exc:
        raise LlmbError(f"plugin {plugin.name!r}: {exc}") from None
    processed = plugin.call(
        "process_model",
        model=model,
        optimizer=optimizer,
        device=device,
        precision=options.precision,
        settings=settings,
    )
    model = processed if processed is not None else model
    processed_parameters = count_parameters(model)
    if world is not None:
        # The harness's parallel wrapper goes on after the plugin's post-processing: the plugin sees the whole model,
        # as in a single-device run, and what communicates is torch's own DDP/FSDP, outside the plugin's reach.
        # FSDP2 swaps the parameters for sharded ones, so AdamW is built again over them with the same options.
        model = distributed.parallelize(model, parallel_strategy(options), device, world)
        if parallel_strategy(options) == "fsdp":
            optimizer = build_optimizer(model, optimizer_options)
    invalid: list[str] = [f"optimizer: {p}" for p in optimizer_problems(optimizer, model)]
    if processed_parameters != parameters:
        invalid.append(f"post-processing changed the parameter count from {parameters} to {processed_parameters}")
    # Data parallelism: each rank its own batch (seed + rank); the global batch is all of them.
    rank = world.rank if world is not None else 0
    batch = synthetic_batch(config, options.batch_size, options.seed + rank, device)
    trainer = Trainer(model, optimizer, batch, recipe, services, barrier=distributed.barrier if world else None)
    if world is not None and trainer.scaler is not None:
        trainer.scaler = distributed.grad_scaler(parallel_strategy(options), device) or trainer.scaler
    return Session(plugin, device, settings, services, recipe, model, optimizer, trainer, parameters, invalid, world)


def audit_session(session: Session) -> dict:
    """The precision audit in the run's real state (call it after the first step, so gradients exist)."""
    facts = session.plugin.call(
        "precision_facts", device=session.device, precision=session.recipe.precision, settings=session.settings
    )
    audit = precision.audit(
        model=session.model,
        optimizer=session.optimizer,
        device=session.device,
        recipe=session.recipe,
        plugin_facts=_flatten(facts),
        sync=session.services.synchronize,
    )
    # What the operators produce: a format that lives only inside the GEMMs (float8) shows up only here.
    counts = census.forward_dtypes(session.model, session.trainer.batch, session.recipe.autocast_dtype)
    return census.add_evidence(audit, counts)


def _run(options: RunOptions, plugin: Plugin, device: torch.device, settings: dict, progress: Progress) -> dict:
    session = prepare(options, plugin, device, settings)
    trainer, services, invalid = session.trainer, session.services, session.invalid

    progress.phase("warmup", options.warmup_steps)
    services.reset_peak_memory()
    initial_loss = float(trainer.step())  # a freshly initialised model's loss, for the band guard
    progress.advance()
    audit = audit_session(session)
    for _ in range(options.warmup_steps - 1):
        trainer.step()
        progress.advance()

    measurements = []
    for repeat in range(options.repeats):
        progress.phase(f"measure {repeat + 1}/{options.repeats}", options.steps)
        measurements.append(trainer.measure(options.steps, on_step=progress.advance))
    peak_memory = services.peak_memory_bytes()
    chosen = median_measurement(measurements)

    invalid += loss_problems(options.config, initial_loss, measurements)
    if trainer.scaler is None and trainer.optimizer_steps != trainer.harness_steps:
        invalid.append(
            f"optimizer.step() ran {trainer.optimizer_steps} times for {trainer.harness_steps} harness steps"
        )
    fingerprint = model_fingerprint()
    if fingerprint != RELEASED_MODEL_FINGERPRINT:
        invalid.append("model definition changed")
    effective = audit["effective"]
    if effective not in precision.PRECISIONS:
        invalid.append(f"effective precision {effective} is not a benchmark precision")
    if precision.RANK[effective] > precision.RANK[options.precision] and options.strict_precision:
        invalid.append(f"--strict-precision: requested {options.precision}, ran {effective}")

    job = None
    if session.world is not None:
        merged = _merge_ranks(session.world, audit, invalid, measurements)
        if merged is None:
            return None  # only rank 0 writes the run's record
        audit, invalid, measurements, per_rank = merged
        index = median_index([m.window_seconds for m in measurements])
        chosen = measurements[index]
        job = {
            "world_size": session.world.world_size,
            "nodes": session.world.nodes,
            "parallel": parallel_strategy(options),
            "per_rank": [windows[index] for windows in per_rank],
        }

    return build_record(
        options=options,
        plugin=plugin,
        settings=settings,
        services=services,
        parameters=session.parameters,
        audit=audit,
        measurements=measurements,
        chosen=chosen,
        initial_loss=initial_loss,
        peak_memory=peak_memory,
        invalid=invalid,
        fingerprint=fingerprint,
        trainer=trainer,
        job=job,
    )


def _merge_ranks(world, audit: dict, invalid: list[str], measurements: list):
    """On rank 0: every rank's audit, problems and windows in one. The label is the lowest format any rank ran;
    another rank's problems join the record with its rank named; a repeat's window is the slowest rank's (all
    waited at the barrier, so they differ by the barrier's skew); per rank, each rank's own window per repeat."""
    mine = {
        "effective": audit["effective"],
        "invalid": invalid,
        "windows": [m.window_seconds for m in measurements],
        "own": [m.rank_window_seconds for m in measurements],
    }
    ranks = distributed.gather(mine, world)
    if ranks is None:
        return None
    merged_invalid = list(invalid)
    for rank, theirs in enumerate(ranks[1:], start=1):
        merged_invalid += [f"rank {rank}: {reason}" for reason in theirs["invalid"] if reason not in invalid]
    effective = precision.lowest([r["effective"] for r in ranks])
    audit = {**audit, "effective": effective, "rank_effective": [r["effective"] for r in ranks]}
    windows = [max(r["windows"][k] for r in ranks) for k in range(len(measurements))]
    measurements = [replace(m, window_seconds=w) for m, w in zip(measurements, windows, strict=True)]
    return audit, merged_invalid, measurements, [r["own"] for r in ranks]


def loss_problems(config: ModelConfig, initial_loss: float, measurements: list) -> list[str]:
    """The cheap loss guard of every run: finite, first loss near ln(vocab), and moving over the run."""
    low, high = loss_band(config.vocab_size)
    losses = [initial_loss] + [v for m in measurements for v in (m.loss_first, m.loss_last)]
    if not all(math.isfinite(v) for v in losses):
        return ["non-finite loss"]
    if not low <= initial_loss <= high:
        return [f"first loss {initial_loss:.4f} outside the band [{low:.2f}, {high:.2f}] around ln(vocab)"]
    if all(m.loss_last == initial_loss for m in measurements):
        return ["loss did not move over the run"]
    return []


def _flatten(lists) -> list:
    return [item for items in (lists or []) for item in (items or [])]


def build_record(
    *,
    options,
    plugin,
    settings,
    services,
    parameters,
    audit,
    measurements,
    chosen,
    initial_loss,
    peak_memory,
    invalid,
    fingerprint,
    trainer,
    job=None,
) -> dict:
    config = options.config
    effective = audit["effective"]
    # A single process is a job of one; in a multi-process job the batch size is per device.
    job = job or {"world_size": 1, "nodes": 1, "parallel": "none", "per_rank": [chosen.window_seconds]}
    global_batch = options.batch_size * job["world_size"]
    tokens = global_batch * config.sequence_length * options.steps
    tokens_per_second = tokens / chosen.window_seconds
    flops_per_token = flops.model_flops_per_token(config, parameters)
    tflops = flops.achieved_tflops(tokens_per_second / job["world_size"], flops_per_token)
    peak = services.peak_flops(effective) if effective in precision.PRECISIONS else None
    debug = official_reasons(config)
    return {
        "schema": SCHEMA,
        "llmb_version": __version__,
        "run_id": uuid.uuid4().hex[:8],
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "official": not debug,
        "valid": not debug and not invalid,
        "debug_reasons": debug,
        "invalid_reasons": invalid,
        "model_fingerprint": fingerprint,
        "preset": options.preset,
        "config": config.to_dict(),
        "parameters": parameters,
        "batch_size": options.batch_size,
        "sequence_length": config.sequence_length,
        "warmup_steps": options.warmup_steps,
        "steps": options.steps,
        "repeats": options.repeats,
        "seed": options.seed,
        "plugin": {
            "name": plugin.name,
            "version": plugin.version,
            "distribution": plugin.distribution,
            "settings": settings,
        },
        "device": {
            "type": services.device.type,
            "spec": str(services.device),
            "name": services.name(),
            "count": services.count(),
        },
        "software": {"python": platform.python_version(), "torch": torch.__version__, "platform": platform.platform()},
        "facts": _merge(plugin.call("run_facts", device=services.device)),
        "optimizer": {
            "class": f"{type(trainer.optimizer).__module__}.{type(trainer.optimizer).__qualname__}",
            "defaults": {
                k: trainer.optimizer.defaults.get(k)
                for k in ("lr", "betas", "eps", "weight_decay", "foreach", "fused", "capturable")
            },
            "harness_steps": trainer.harness_steps,
            "optimizer_steps": trainer.optimizer_steps,
        },
        "precision": {
            "requested": options.precision,
            "effective": effective,
            "mode": trainer.recipe.mode,
            "audit": audit,
        },
        "timing": {
            "window_seconds": chosen.window_seconds,
            "step_seconds": chosen.step_seconds,
            "method": chosen.method,
            "repeat_window_seconds": [m.window_seconds for m in measurements],
        },
        "world_size": job["world_size"],
        "nodes": job["nodes"],
        "parallel": job["parallel"],
        "global_batch_size": global_batch,
        "per_rank": job["per_rank"],
        "tokens_per_second": tokens_per_second,
        "tokens_per_second_per_device": tokens_per_second / job["world_size"],
        "samples_per_second": global_batch * options.steps / chosen.window_seconds,
        "model_flops_per_token": flops_per_token,
        "tflops": tflops,
        "peak_flops": peak,
        "mfu": flops.mfu(tflops, peak),
        "fom": flops.fom(config, global_batch, chosen.window_seconds / options.steps),
        "peak_memory_bytes": peak_memory,
        "loss": {"initial": initial_loss, "first": chosen.loss_first, "last": chosen.loss_last},
    }


def _merge(dicts) -> dict:
    merged: dict = {}
    for item in dicts or []:
        merged.update(item or {})
    return {
        k: (v if isinstance(v, (bool, int, float, str, type(None), list, dict)) else str(v)) for k, v in merged.items()
    }


def write(record: dict, out_dir: Path) -> Path:
    from llmb.results import write_result

    return write_result(record, out_dir)
