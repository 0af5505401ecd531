"""One benchmark run, end to end: plugin, backend, model, post-processing, audit, measurement, record.

The request and its checks are llmb.run.options's, the record llmb.run.record's, the entry points of a
multi-process job llmb.run.jobs's; the request's names stay importable from here, where every caller looks.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from llmb import __version__, records
from llmb.api.errors import LlmbError, first_line
from llmb.api.protocols import RunProgress, WindowJudge
from llmb.audit import census, evidence, guard, precision
from llmb.audit.evidence import synthetic_batch
from llmb.audit.window import WindowAudit
from llmb.distributed import job as distributed
from llmb.distributed import mesh, ranks
from llmb.distributed.job_judge import JobJudge
from llmb.model import LlamaModel, count_parameters
from llmb.records import Result, energy
from llmb.records.result_files import write_result
from llmb.registry import plugins
from llmb.registry.plugins import Registration, call
from llmb.run import roofline, sysinfo
from llmb.run.audit_step import audit_within_memory
from llmb.run.device import check_device_present, is_out_of_memory, release_device_memory
from llmb.run.options import (  # noqa: F401  (check_*: the request's checks, importable from the runner as before)
    Progress,
    RunOptions,
    check_launch,
    check_layout,
    check_request,
    layout,
    parallel_strategy,
    resolve,
)
from llmb.run.plugin_returns import PluginReturns
from llmb.run.record import build_record, loss_problems, run_facts
from llmb.spec.fingerprint import RELEASED_MODEL_FINGERPRINT, model_fingerprint
from llmb.training.loop import Trainer, build_optimizer, median_measurement, optimizer_problems

if TYPE_CHECKING:
    from llmb.api.backend import Backend


def run(options: RunOptions, progress: RunProgress | None = None, judge: WindowJudge | None = None) -> Result | None:
    """Run the benchmark once for one precision and return its result record (None on ranks other than 0).

    `judge` opens and closes each measured window (llmb.judge.cleanroom's link to the clean process); without one the
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
                    f"out of memory at batch size {options.batch_size} on {device}: {first_line(exc)}"
                ) from exc
            failure = plugins.backend_failure(plugin.backend, exc)  # the loop's direct calls: synchronize, step_end
            if failure is not None:
                raise failure from exc
            raise
        finally:
            release_device_memory(device)


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
    def backend(self) -> Backend:
        return self.plugin.backend


def prepare(
    options: RunOptions, plugin: Registration, device: torch.device, settings: dict, judge: WindowJudge | None = None
) -> Session:
    """Everything before the first step: the precision recipe, the plugin's backend setup, the model built from the
    seed on the CPU and moved to the device, AdamW, the plugin's post-processing, and the checks on its output."""
    config = options.config
    recipe = precision.recipe(options.precision, options.mode)
    precision.apply_backend_recipe(options.precision)
    backend = plugin.backend
    plugins.setup(backend, device, options.precision, settings)
    check_device_present(device)
    if judge is not None:
        # After the plugin read the host: the judge may build the replay's initial model while this process builds
        # the run's (llmb.judge.initial); the run waits for it before its warmup (Trainer's judge.ready below).
        judge.setup(str(device))
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
        judge = JobJudge(judge, world, plan)

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
    options: RunOptions,
    plugin: Registration,
    device: torch.device,
    settings: dict,
    progress: RunProgress,
    judge: WindowJudge | None = None,
) -> Result | None:
    # Shown before the plugin's setup and post-processing run: a plugin that hangs there leaves the user a line that
    # says where the run is, not a blank terminal (the display draws on events only, never by a timer).
    progress.phase("setup", 1)
    session = prepare(options, plugin, device, settings, judge)
    trainer, backend, invalid = session.trainer, session.backend, session.invalid
    # Every window starts from the initial weights and a fresh AdamW state, so it replays from the seed alone.
    initial_state = evidence.InitialState(session.model)
    trainer.judge.ready()  # untimed: whatever the judge prepared is done before the first warmup step

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
    # The training's peak, read before the audit step: that step runs eager under the dispatch recorder, and took
    # more than the compiled loop it follows (one H200, official shape, batch 64: FP8 42.1 GB against the loop's
    # 27.0, AMP 59.8 against 47.1; benchmarks/RESULTS.md section 25).
    returned = PluginReturns(plugin.name)  # read after the windows: a wrong value is unknown, never the run's end
    peak_memory = returned.byte_count("peak_memory_bytes", call(backend.peak_memory_bytes, device))
    # Untimed, after the last window (a dispatch mode de-optimises compiled graphs), on fewer rows where the window's
    # do not fit eager under the recorder.
    audit_within_memory(window, trainer, device, alone=session.world is None)
    invalid += window.problems
    if window.dispatch() is not None:
        audit = precision.with_dispatch(audit, window.dispatch())
    audit["window"] = window.record()
    chosen = median_measurement(measurements)
    # Before the roofline, whose square GEMM is sized by how fast the device answers (a lazy device compiles a graph
    # per size tried): the facts are the run's.
    facts = run_facts(backend, device, returned)
    # The roofline in the run's own backend state, at its own GEMM shapes, after the measured window; on rank 0
    # alone, since the ranks of one host would share its time.
    matmul = None
    if session.world is None or session.world.rank == 0:
        progress.phase("matmul roofline", 1)
        matmul = roofline.for_run(backend, device, audit["effective"], options.config, options.batch_size)
        progress.advance()

    invalid += returned.problems
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
        facts=facts,
    )
    record.evidence = records.Evidence.from_dict(
        {
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
                    m.seal_key,
                    m.moments_projection,
                ).to_dict()
                for m in measurements
            ],
            "headline_window": records.median_index([1 / m.window_seconds for m in measurements]),
            "replay": None,  # the clean room's judge replays the window; this process does not
        }
    )
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
        record.judge = records.Judge(clean_room=False)
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


def write(record: Result, out_dir: Path) -> Path:
    return write_result(record, out_dir)
