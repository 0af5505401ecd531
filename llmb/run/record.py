"""A run's result record, built from what the run measured: throughput, FLOPs, the peak and MFU, the device, the
software, the optimizer, the precision audit, the job's layout; and the loss guard every run passes."""

from __future__ import annotations

import math
import platform
import uuid
from typing import TYPE_CHECKING

import torch

from llmb import records
from llmb.api.backend import Peak
from llmb.api.errors import LlmbError
from llmb.api.settings import recorded
from llmb.audit import guard, precision
from llmb.model import ModelConfig
from llmb.records import Result, loss_band
from llmb.records.files import as_record_value
from llmb.registry.plugins import call, resolve_settings
from llmb.run import roofline
from llmb.run.options import layout
from llmb.run.plugin_returns import PluginReturns
from llmb.spec import flops
from llmb.spec import peak_table as peaks
from llmb.spec.presets import official_reasons

if TYPE_CHECKING:
    from llmb.api.backend import Backend
    from llmb.registry.plugins import Registration
    from llmb.run.options import RunOptions
    from llmb.training.loop import Measurement, Trainer


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
    options: RunOptions,
    plugin: Registration,
    settings: dict,
    device: torch.device,
    parameters: int,
    audit: dict,
    measurements: list[Measurement],
    chosen: Measurement,
    initial_loss: float,
    peak_memory: int | None,
    invalid: list[str],
    fingerprint: str,
    trainer: Trainer,
    facts: dict,
    job: dict | None = None,
    host: records.Host | None = None,
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
    returned = PluginReturns(plugin.name)  # a value of the wrong type is unknown, and the run invalid for it
    device_name = returned.name("device_name", call(backend.device_name, device))
    device_count = returned.count("device_count", call(backend.device_count, device))
    device_memory = returned.byte_count("device_memory_bytes", call(backend.device_memory_bytes, device)) or None
    measured_peak = matmul.peak_flops if matmul else None
    peak = choose_peak(plugin.name, backend, device, device_name, effective, measured_peak)
    mfu = flops.mfu(tflops, peak.flops)
    invalid = [*invalid, *returned.problems, *peak.problems, *peaks.mfu_problems(mfu)]
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
            settings=as_record_value(recorded(settings)),  # a secret setting's value is never recorded
            defaults=as_record_value(recorded(resolve_settings(backend, {}))),
            precisions=[str(as_record_value(p, 64)) for p in call(backend.precisions)],
        ),
        device=records.DeviceRef(
            type=device.type,
            spec=str(device),
            name=device_name,
            count=device_count,
            memory_bytes=device_memory,  # 0 says no more than None does
        ),
        software=records.Software(
            python=platform.python_version(), torch=torch.__version__, platform=platform.platform()
        ),
        facts=facts,  # run_facts, read by the runner before the roofline
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
        layout=records.JobLayout.of(job["layout"]),
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
        peak=records.PeakInfo.from_dict(peak.to_dict()),
        mfu=mfu,
        fom=flops.fom(config, global_batch, chosen.window_seconds / options.steps),
        peak_memory_bytes=peak_memory,
        loss=records.Loss(initial=initial_loss, first=chosen.loss_first, last=chosen.loss_last),
        host=host,
        measured_matmul_peak=measured_peak,
        measured_model_gemm_flops=matmul.model_gemm_flops if matmul else None,
        matmul_peak_efficiency=roofline.efficiency(tflops, measured_peak),
    )


def _jsonable(value):
    """What JSON holds: tuples as lists (AdamW's betas), so a record reads back equal to what was built."""
    return list(value) if isinstance(value, tuple) else value


def choose_peak(
    name: str, backend: Backend, device: torch.device, device_name: str, effective: str, measured: float | None = None
) -> peaks.PeakChoice:
    """llmb's table peak for the device and the label; the backend's declared llmb.Peak only where the table lacks
    the device, and never below `measured`, the matmul rate the run measured on it (llmb.spec.peak_table.choose)."""
    declared = call(backend.peak_flops, device, effective) if effective in precision.PRECISIONS else None
    if declared is not None and not isinstance(declared, Peak):
        raise LlmbError(f"backend {name!r}: peak_flops must return llmb.Peak(flops, source) or None")
    if declared is None:
        return peaks.choose(device_name, effective)
    return peaks.choose(device_name, effective, declared.flops, declared.source, measured)


def run_facts(backend: Backend, device: torch.device, returned: PluginReturns | None = None) -> dict:
    """The run's facts: the backend's (as the record can hold them; `returned` says where they were no object), and
    the vendor-library replacements the guard accepted. Read when the last window and its audit are done, before
    llmb's own measurements beside the run (the roofline), so a fact that counts work (torch-xla's graphs compiled)
    counts the run's, not the roofline's sizing."""
    returned = returned or PluginReturns(getattr(backend, "name", "?"))
    return returned.facts("run_facts", call(backend.run_facts, device)) | _vendor_facts()


def _vendor_facts() -> dict:
    """The process-wide replacements the guard accepted from known vendor libraries (llmb/audit/vendor_libraries.py), by
    library: the harness's fact, written over any plugin fact of the same name."""
    accepted = guard.vendor_changes()
    return {"vendor_library_replacements": accepted} if accepted else {}
