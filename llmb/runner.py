"""One benchmark run, end to end: plugin, backend, model, post-processing, audit, measurement, record."""

from __future__ import annotations

import gc
import math
import os
import platform
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from llmb import (
    __version__,
    census,
    distributed,
    energy,
    evidence,
    flops,
    guard,
    mesh,
    peaks,
    precision,
    ranks,
    records,
    roofline,
    sysinfo,
)
from llmb.backend import Peak
from llmb.config import official_reasons
from llmb.device import check_device_present, parse_device
from llmb.errors import LlmbError, UsageError
from llmb.fingerprint import RELEASED_MODEL_FINGERPRINT, model_fingerprint
from llmb.model import LlamaModel, ModelConfig, count_parameters
from llmb.names import DEFAULT_TIMEOUT_SECONDS
from llmb.plugins import Registration, call, resolve_settings, select_backend
from llmb.records import Result, loss_band
from llmb.settings import recorded
from llmb.train import Trainer, build_optimizer, median_measurement, optimizer_problems, synthetic_batch
from llmb.window_audit import WindowAudit


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
    # The layout on the job's DeviceMesh (llmb.mesh): tensor and pipeline parallel sizes, the pipeline's schedule
    # and microbatches, gradient accumulation (also in one process), sequence parallel with tensor parallel.
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


def is_out_of_memory(exc: BaseException) -> bool:
    while exc is not None:
        if isinstance(exc, torch.OutOfMemoryError):
            return True
        text = str(exc).lower()
        if isinstance(exc, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text):
            return True
        exc = exc.__cause__
    return False


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
    plugin = select_backend(options.plugin)
    backend = plugin.backend
    settings = resolve_settings(backend, options.settings)
    supported = list(call(backend.precisions))
    if options.precision not in supported:
        raise UsageError(
            f"plugin {plugin.name!r} does not support {options.precision} (supports {', '.join(supported)})"
        )
    types = list(call(backend.device_types))
    device = parse_device(options.device or (types[0] if types else "cpu"))
    if types and device.type not in types:
        raise UsageError(f"plugin {plugin.name!r} serves {', '.join(types)}, not {device.type!r}")
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


def run(options: RunOptions, progress: Progress | None = None, judge=None) -> Result | None:
    """Run the benchmark once for one precision and return its result record (None on ranks other than 0).

    `judge` opens and closes each measured window (llmb.cleanroom's link to the clean process); without one the
    run judges itself (train.LocalJudge) and its record says so."""
    progress = progress or Progress()
    with distributed.errors_name_the_rank():
        plugin, device, settings = resolve(options)
        try:
            return _run(options, plugin, device, settings, progress, judge)
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

    plugin: Registration
    device: torch.device
    settings: dict
    recipe: precision.Recipe
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    trainer: Trainer
    parameters: int
    invalid: list[str]
    world: distributed.World | None = None
    layout: mesh.Layout | None = None
    rows: int = 0  # samples of the global batch this rank contributes per step (0 on a tensor/pipeline peer)

    @property
    def backend(self):
        return self.plugin.backend


def prepare(options: RunOptions, plugin: Registration, device: torch.device, settings: dict, judge=None) -> Session:
    """Everything before the first step: the precision recipe, the plugin's backend setup, the model built from the
    seed on the CPU and moved to the device, AdamW, the plugin's post-processing, and the checks on its output."""
    config = options.config
    recipe = precision.recipe(options.precision, options.mode)
    precision.apply_backend_recipe(options.precision)
    backend = plugin.backend
    call(backend.setup, device, options.precision, settings)
    check_device_present(device)
    world = distributed.current_world()
    if world is not None:
        distributed.init_process_group(backend, device, world, options.timeout_seconds)
        ranks.check_agreement(agreement_facts(options, plugin, settings))

    torch.manual_seed(options.seed)
    model = LlamaModel(config)  # built on the CPU from the seed, so every device starts from the same weights
    parameters = count_parameters(model)
    model.to(device=device, dtype=recipe.param_dtype)
    model.train()
    optimizer_options = call(backend.optimizer_options, device, options.precision, settings)
    try:
        optimizer = build_optimizer(model, optimizer_options)
    except ValueError as exc:
        raise LlmbError(f"plugin {plugin.name!r}: {exc}") from None
    processed = call(backend.process_model, model, optimizer, device, options.precision, settings)
    model = processed if processed is not None else model
    processed_parameters = count_parameters(model)
    plan = layout(options)
    coords = mesh.Coordinates(0, 0, 0)
    if world is not None:
        # The harness's layout goes on after the plugin's post-processing: the plugin sees the whole model, as in a
        # single-device run, and what communicates is torch's own DDP/FSDP/TP/pipelining, outside the plugin's reach.
        # Sharding, tensor plans and pipeline cuts replace or drop parameters, so AdamW is built again over what the
        # mesh made of them, with the same options (less any the DTensors refuse, recorded).
        device_mesh = mesh.build_mesh(plan, device.type)
        coords = mesh.coordinates(plan, world.rank)
        model = mesh.parallelize(model, plan, device_mesh, coords)
        if plan.strategy != "ddp" or plan.tp > 1 or plan.pp > 1:
            usable, dropped = mesh.optimizer_options(model, dict(optimizer_options or {}))
            optimizer = build_optimizer(model, usable)
            if dropped:
                settings = {**settings, "optimizer_fallback": dropped}
    invalid: list[str] = [f"optimizer: {p}" for p in optimizer_problems(optimizer, model)]
    invalid += guard.problems("after post-processing")
    if processed_parameters != parameters:
        invalid.append(f"post-processing changed the parameter count from {parameters} to {processed_parameters}")
    # Data parallelism: each data-parallel rank its own batch (seed + dp rank), the ranks of a tensor or pipeline
    # group the same one; with accumulation, K slices of it per step. The global batch is all the dp ranks'.
    rows = options.batch_size * plan.grad_accum
    batch = synthetic_batch(config, rows, options.seed + coords.dp, device)
    barrier = distributed.barrier if world else None
    if world is not None:
        judge = distributed.JobJudge(judge, world, plan)

    def window_batch(challenge: int) -> torch.Tensor:
        # A measured window's batch: drawn from the judge's challenge, per data-parallel rank as the warmup's.
        return evidence.window_batch(config, rows, challenge, coords.dp, device)

    common = (model, optimizer, batch, recipe, backend, device)
    judged = {"barrier": barrier, "window_batch": window_batch, "judge": judge}
    if plan.pp > 1:
        schedule = mesh.pipeline_schedule(model, plan, coords, device, device_mesh)
        first, last = coords.pp == 0, coords.pp == plan.pp - 1
        pp_group = device_mesh["pp"].get_group()
        trainer = mesh.PipelineTrainer(*common, **judged, schedule=schedule, first=first, last=last,
                                       pp_group=pp_group)  # fmt: skip
    elif plan.grad_accum > 1:
        trainer = mesh.AccumulatingTrainer(*common, **judged, accumulation=plan.grad_accum)
    else:
        trainer = Trainer(*common, **judged)
    if world is not None and trainer.scaler is not None:
        trainer.scaler = distributed.grad_scaler(parallel_strategy(options), device) or trainer.scaler
    contributes = coords.tp == 0 and coords.pp == 0
    return Session(
        plugin,
        device,
        settings,
        recipe,
        model,
        optimizer,
        trainer,
        parameters,
        invalid,
        world,
        plan,
        rows if contributes else 0,
    )


def agreement_facts(options: RunOptions, plugin: Registration, settings: dict) -> dict:
    """What every rank of a job must have the same of: its options (bar the device's index, which is per rank),
    the model, and the versions of llmb, torch and the plugin."""
    facts = {f"option {k}": v for k, v in options.__dict__.items() if k not in ("config",)}
    facts |= {f"shape {k}": v for k, v in options.config.to_dict().items()}
    facts |= {
        "model fingerprint": model_fingerprint(),
        "llmb version": __version__,
        "torch version": torch.__version__,
        "plugin": f"{plugin.name} {plugin.version} ({plugin.distribution})",
        "plugin settings": settings,
    }
    return facts


def probe_shape(session: Session) -> tuple[int, int, int] | None:
    """The matmul probe's model-sized product: the batch's tokens (at most 512) times the first Linear's weight."""
    linear = next((m for m in session.model.modules() if isinstance(m, torch.nn.Linear)), None)
    if linear is None:
        return None
    return (min(session.trainer.batch.numel(), 512), linear.in_features, linear.out_features)


def audit_session(session: Session) -> dict:
    """The precision audit in the run's real state (call it after the first step, so gradients exist)."""
    facts = call(session.backend.precision_facts, session.device, session.recipe.precision, session.settings)
    audit = precision.audit(
        model=session.model,
        optimizer=session.optimizer,
        device=session.device,
        recipe=session.recipe,
        plugin_facts=list(facts or []),
        sync=lambda: session.backend.synchronize(session.device),
        probe_shape=probe_shape(session),
    )
    # What the operators produce: a format that lives only inside the GEMMs (float8) shows up only here.
    probe = mesh.stage_input(session.model, session.trainer.batch)  # a later pipeline stage takes hidden states
    counts = census.forward_dtypes(session.model, probe, session.recipe.autocast_dtype)
    return census.add_evidence(audit, counts)


def _run(
    options: RunOptions, plugin: Registration, device: torch.device, settings: dict, progress: Progress, judge=None
) -> Result:
    session = prepare(options, plugin, device, settings, judge)
    trainer, backend, invalid = session.trainer, session.backend, session.invalid
    # Every window starts from the initial weights and a fresh AdamW state, so it replays from the seed alone.
    initial_state = evidence.InitialState(session.model)

    if device.type == "cpu":  # said before the first step, not after the figure is made
        busy = sysinfo.busy_before_run(torch.get_num_threads(), settings)
        if busy:
            progress.note(f"BUSY HOST: {busy}")
    progress.phase("warmup", options.warmup_steps)
    call(backend.reset_peak_memory, device)
    # Each warmup step between syncs: compilers trace and compile here, and the record keeps that cost apart.
    loss, seconds = trainer.timed_step()
    initial_loss, warmup_seconds = float(loss), [seconds]  # a fresh model's loss, for the band guard
    progress.advance()
    audit = audit_session(session)
    audited_state = precision.backend_state(device.type)
    window = WindowAudit(session.model, session.optimizer, device.type, audited_state, options.steps)
    for _ in range(options.warmup_steps - 1):
        warmup_seconds.append(trainer.timed_step()[1])
        progress.advance()

    measurements, busy = [], []
    load_start = sysinfo.load_average()
    for repeat in range(options.repeats):
        progress.phase(f"measure {repeat + 1}/{options.repeats}", options.steps)

        def after_step() -> None:
            window.after_step()
            progress.advance()

        before = ranks.busy_seconds()
        initial_state.restore(session.optimizer)
        window.open()  # after the restore: the window's parameters change from the initial weights
        measurements.append(trainer.measure(options.steps, on_step=after_step))
        after = ranks.busy_seconds()
        busy.append(after - before if before is not None and after is not None else None)
    host = records.Host(
        load_average_start=load_start,
        load_average_end=sysinfo.load_average(),
        cpu_affinity=sysinfo.cpu_affinity(),
        cpu_count=os.cpu_count(),
    )
    window.close()
    window.audit_step(trainer.step)  # untimed, after the last window: a dispatch mode de-optimises compiled graphs
    invalid += window.problems
    if window.dispatch() is not None:
        audit = precision.with_dispatch(audit, window.dispatch())
    audit["window"] = window.record()
    peak_memory = call(backend.peak_memory_bytes, device)
    peak_memory = int(peak_memory) if peak_memory is not None else None
    chosen = median_measurement(measurements)
    # The roofline in the run's own backend state, at its own GEMM shapes, after the measured window; on rank 0
    # alone, since the ranks of one host would share its time.
    matmul = None
    if session.world is None or session.world.rank == 0:
        progress.phase("matmul roofline", 1)
        matmul = roofline.for_run(backend, device, audit["effective"], options.config, options.batch_size)
        progress.advance()

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
        report = ranks.RankReport(
            effective=audit["effective"],
            invalid=invalid,
            windows=[m.window_seconds for m in measurements],
            own=[m.rank_window_seconds for m in measurements],
            steps=[m.step_seconds for m in measurements],
            busy=busy,
            losses={"initial": initial_loss}
            | {
                f"{end}:{k}": getattr(m, f"loss_{end}") for k, m in enumerate(measurements) for end in ("first", "last")
            },
            rows=session.rows,
            threads=ranks.intra_op_threads(),
            node=session.world.node,
            stage=mesh.coordinates(session.layout, session.world.rank).pp,
        )
        merged = _merge_ranks(session.world, report, measurements)
        if merged is None:
            return None  # only rank 0 writes the run's record
        audit_ranks, invalid, measurements, reports = merged
        audit = {**audit, **audit_ranks}
        index = records.median_index([1 / m.window_seconds for m in measurements])  # by throughput, as run
        chosen = measurements[index]
        losses = ranks.global_losses(reports)
        initial_loss = losses["initial"]
        chosen = replace(chosen, loss_first=losses[f"first:{index}"], loss_last=losses[f"last:{index}"])
        threads = [r.threads for r in reports]
        notes = ranks.stragglers(reports, index)
        if ranks.threads_note(threads):
            notes.append(ranks.threads_note(threads))
        job = {
            "world_size": session.world.world_size,
            "nodes": session.world.nodes,
            "parallel": parallel_strategy(options),
            "per_rank": [r.windows[index] for r in reports],
            "layout": session.layout.to_dict(),
            "global_batch": sum(r.rows for r in reports),
            "threads_per_rank": threads,
            "per_rank_busy_seconds": [r.busy[index] for r in reports],
            "per_rank_step_seconds": [r.steps[index] for r in reports],
            "stragglers": notes,
            "launcher": session.world.launcher,
        }
        for note in notes:
            progress.note(f"STRAGGLER: {note}" if not note.startswith("ranks ran") else note)

    record = build_record(
        options=options,
        plugin=plugin,
        settings=settings,
        device=device,
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
        host=host,
        warmup_seconds=warmup_seconds,
        matmul=matmul,
    )
    record.evidence = {
        "schema": evidence.SCHEMA,
        "windows": [
            evidence.Window(
                m.challenge,
                m.window_seconds,
                m.losses,
                m.digest_start,
                m.digest_end,
                m.rank_window_seconds,
                m.moments_end,
            ).to_dict()
            for m in measurements
        ],
        "headline_window": records.median_index([1 / m.window_seconds for m in measurements]),
    }
    tokens = record.global_batch_size * options.config.sequence_length * options.steps / record.world_size
    section, problems = energy.summarise(
        trainer.energy.describe(),
        [m.energy_joules for m in measurements],
        [m.window_seconds for m in measurements],
        tokens,
    )
    record.energy = records.Energy.from_dict(section)
    if not getattr(trainer.judge, "clean", False):
        # Judged by the plugin's own process: the figures stand on that process's word alone.
        record.invalid_reasons += problems  # under the clean room the judge checks them on its own clock
        record.judge = {"clean_room": False}
        record.valid = False
    return record


def _merge_ranks(world, report: ranks.RankReport, measurements: list):
    """On rank 0: every rank's report in one. The label is the lowest format any rank ran; another rank's problems
    join the record with its rank named; a repeat's window is the slowest rank's (all waited at the barrier, so they
    differ by the barrier's skew). Returns None on the other ranks."""
    reports = distributed.gather(report, world)
    if reports is None:
        return None
    merged_invalid = list(report.invalid)
    for rank, theirs in enumerate(reports[1:], start=1):
        merged_invalid += [f"rank {rank}: {reason}" for reason in theirs.invalid if reason not in report.invalid]
    effective = precision.lowest([r.effective for r in reports])
    audit = {"effective": effective, "rank_effective": [r.effective for r in reports]}
    windows = [max(r.windows[k] for r in reports) for k in range(len(measurements))]
    measurements = [replace(m, window_seconds=w) for m, w in zip(measurements, windows, strict=True)]
    return audit, merged_invalid, measurements, reports


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


def build_record(
    *,
    options,
    plugin,
    settings,
    device,
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
    host=None,
    warmup_seconds: list[float] | None = None,
    matmul: roofline.Roofline | None = None,
) -> Result:
    config = options.config
    effective = audit["effective"]
    # A single process is a job of one; in a multi-process job the batch size is per device.
    job = job or {
        "world_size": 1,
        "nodes": 1,
        "parallel": "none",
        "per_rank": [chosen.window_seconds],
        "layout": layout(options).to_dict(),
        "global_batch": options.batch_size * options.grad_accum,
        "threads_per_rank": [torch.get_num_threads()],
        "stragglers": [],
        "launcher": None,
    }
    # What the data-parallel ranks really ran (ranks.RankReport.rows), not the options times the world size.
    global_batch = job["global_batch"]
    tokens = global_batch * config.sequence_length * options.steps
    tokens_per_second = tokens / chosen.window_seconds
    flops_per_token = flops.model_flops_per_token(config, parameters)
    tflops = flops.achieved_tflops(tokens_per_second / job["world_size"], flops_per_token)
    backend = plugin.backend
    device_name = str(call(backend.device_name, device))
    peak = choose_peak(plugin.name, backend, device, device_name, effective)
    mfu = flops.mfu(tflops, peak.flops)
    invalid = [*invalid, *peak.problems, *peaks.mfu_problems(mfu)]
    debug = official_reasons(config)
    optimizer = trainer.optimizer
    return Result(
        run_id=uuid.uuid4().hex[:8],
        official=not debug,
        valid=not debug and not invalid,
        debug_reasons=debug,
        invalid_reasons=invalid,
        model_fingerprint=fingerprint,
        preset=options.preset,
        config=config,
        parameters=parameters,
        batch_size=options.batch_size,
        sequence_length=config.sequence_length,
        warmup_steps=options.warmup_steps,
        steps=options.steps,
        repeats=options.repeats,
        seed=options.seed,
        plugin=records.PluginRef(
            name=plugin.name,
            version=plugin.version,
            distribution=plugin.distribution,
            settings=recorded(settings),  # a secret setting's value is never recorded
            defaults=recorded(resolve_settings(backend, {})),
            precisions=list(call(backend.precisions)),
        ),
        device=records.DeviceRef(
            type=device.type,
            spec=str(device),
            name=device_name,
            count=int(call(backend.device_count, device)),
            memory_bytes=_memory_bytes(call(backend.device_memory_bytes, device)),
        ),
        software=records.Software(
            python=platform.python_version(), torch=torch.__version__, platform=platform.platform()
        ),
        facts=_facts(call(backend.run_facts, device)) | _vendor_facts(),
        optimizer=records.OptimizerInfo(
            class_name=f"{type(optimizer).__module__}.{type(optimizer).__qualname__}",
            defaults={
                k: _jsonable(optimizer.defaults.get(k))
                for k in ("lr", "betas", "eps", "weight_decay", "foreach", "fused", "capturable")
            },
            harness_steps=trainer.harness_steps,
            optimizer_steps=trainer.optimizer_steps,
        ),
        precision=records.Precision(
            requested=options.precision,
            effective=effective,
            mode=trainer.recipe.mode,
            audit=records.Audit.from_dict(audit),
        ),
        timing=records.Timing(
            window_seconds=chosen.window_seconds,
            step_seconds=chosen.step_seconds,
            method=chosen.method,
            repeat_window_seconds=[m.window_seconds for m in measurements],
            warmup_step_seconds=list(warmup_seconds or []),
            compile_seconds=roofline.compile_seconds(warmup_seconds or [], chosen.window_seconds / options.steps),
        ),
        world_size=job["world_size"],
        nodes=job["nodes"],
        parallel=job["parallel"],
        global_batch_size=global_batch,
        per_rank=job["per_rank"],
        layout=records.JobLayout.from_dict(job["layout"]),
        tp=job["layout"]["tp"],
        pp=job["layout"]["pp"],
        dp=job["layout"]["dp"],
        microbatches=job["layout"]["microbatches"],
        grad_accum=job["layout"]["grad_accum"],
        threads_per_rank=job["threads_per_rank"],
        per_rank_busy_seconds=job.get("per_rank_busy_seconds"),
        per_rank_step_seconds=job.get("per_rank_step_seconds"),
        stragglers=job["stragglers"],
        launcher=job["launcher"],
        tokens_per_second=tokens_per_second,
        tokens_per_second_per_device=tokens_per_second / job["world_size"],
        samples_per_second=global_batch * options.steps / chosen.window_seconds,
        model_flops_per_token=flops_per_token,
        tflops=tflops,
        peak_flops=peak.flops,
        peak=records.PeakInfo.from_dict(peak.to_dict()),
        mfu=mfu,
        fom=flops.fom(config, global_batch, chosen.window_seconds / options.steps),
        peak_memory_bytes=peak_memory,
        loss=records.Loss(initial=initial_loss, first=chosen.loss_first, last=chosen.loss_last),
        host=host,
        measured_matmul_peak=matmul.peak_flops if matmul else None,
        measured_model_gemm_flops=matmul.model_gemm_flops if matmul else None,
        matmul_peak_efficiency=roofline.efficiency(tflops, matmul.peak_flops if matmul else None),
    )


def _jsonable(value):
    """What JSON holds: tuples as lists (AdamW's betas), so a record reads back equal to what was built."""
    return list(value) if isinstance(value, tuple) else value


def choose_peak(name: str, backend, device: torch.device, device_name: str, effective: str) -> peaks.PeakChoice:
    """llmb's table peak for the device and the label; the backend's declared llmb.Peak only where the table lacks
    the device (llmb.peaks.choose)."""
    declared = call(backend.peak_flops, device, effective) if effective in precision.PRECISIONS else None
    if declared is not None and not isinstance(declared, Peak):
        raise LlmbError(f"backend {name!r}: peak_flops must return llmb.Peak(flops, source) or None")
    if declared is None:
        return peaks.choose(device_name, effective)
    return peaks.choose(device_name, effective, declared.flops, declared.source)


def _memory_bytes(value) -> int | None:
    """A backend's device memory as a positive int of bytes; anything else is unknown."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return None
    return value


def _vendor_facts() -> dict:
    """The process-wide replacements the guard accepted from known vendor libraries (llmb/vendor_libraries.py), by
    library: the harness's fact, written over any plugin fact of the same name."""
    accepted = guard.vendor_changes()
    return {"vendor_library_replacements": accepted} if accepted else {}


def _facts(facts: dict | None) -> dict:
    """A backend's run facts as JSON values (anything else as its text)."""
    return {
        str(k): (v if isinstance(v, (bool, int, float, str, type(None), list, dict)) else str(v))
        for k, v in (facts or {}).items()
    }


def write(record: Result, out_dir: Path) -> Path:
    from llmb.results import write_result

    return write_result(record, out_dir)


# The run on every rank of a multi-process job (torch's launcher starts these functions in each process)


def run_job(runs: list[RunOptions]) -> list[dict]:
    """Each rank's entrypoint: the runs (one per precision) in this process's group; rank 0 returns the records."""
    try:
        return [record for record in (run(options) for options in runs) if record is not None]
    finally:
        distributed.shutdown()


def launch_runs(spec: distributed.LaunchSpec, runs: list[RunOptions]) -> list[dict]:
    """Launch the runs on every rank; the records come back from rank 0 (none on the other nodes)."""
    return distributed.launch(spec, run_job, runs).get(0) or []


def gradients_after_one_step(runs: list[RunOptions]) -> list[dict[str, torch.Tensor]]:
    """Each rank's entrypoint for the equivalence check: prepare each run exactly as `llmb run` does (its own seeded
    batch per rank, the parallel wrapper), take one harness step, and return rank 0's view of the whole gradients.
    With the same global batch, one process must get the same gradients: that is what data parallelism promises."""
    gathered = []
    try:
        for options in runs:
            plugin, device, settings = resolve(options)
            session = prepare(options, plugin, device, settings)
            session.trainer.step()
            grads = distributed.full_gradients(session.model)
            if session.world.rank == 0:
                gathered.append(grads)
    finally:
        distributed.shutdown()
    return gathered


def updates_after_steps(runs: list[RunOptions], steps: int) -> list[dict[str, torch.Tensor]]:
    """Each rank's entrypoint for the equivalence check: prepare each run exactly as `llmb run` does (its layout,
    its batches seeded by data-parallel rank), take `steps` harness steps, and return, on rank 0, every parameter's
    update (after minus before) over the whole model: the pipeline stages' parts gathered into one."""
    gathered = []
    try:
        for options in runs:
            plugin, device, settings = resolve(options)
            session = prepare(options, plugin, device, settings)
            before = distributed.full_parameters(session.model)
            for _ in range(steps):
                session.trainer.step()
            after = distributed.full_parameters(session.model)
            mine = {name: after[name] - before[name] for name in after}
            world = session.world
            parts = [None] * world.world_size
            torch.distributed.all_gather_object(parts, mine)
            if world.rank == 0:
                whole: dict = {}
                for part in parts:
                    for name, value in part.items():
                        whole.setdefault(name, value)
                gathered.append(whole)
    finally:
        distributed.shutdown()
    return gathered
