"""make_result(**overrides): a consistent llmb.records.Result without running anything.

Every figure is derived from the window the way the runner derives it (so `llmb verify` recomputes the same numbers),
which lets report, verify and submission logic be tested in milliseconds. Records made here are labelled as made by
the factory (facts.factory) and are never written anywhere but a test's tmp_path.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools

from llmb.records import (
    Audit,
    DeviceRef,
    Evidence,
    Host,
    JobLayout,
    Judge,
    Loss,
    MatmulProbe,
    OptimizerInfo,
    PeakInfo,
    PluginRef,
    Precision,
    Result,
    Software,
    Timing,
    loss_band,
)
from llmb.spec import flops
from llmb.spec.fingerprint import RELEASED_MODEL_FINGERPRINT
from llmb.spec.presets import PRESETS

DTYPE = {"FP32": "float32", "TF32": "float32", "FP16": "float16", "BF16": "bfloat16"}
CPU_DEFAULTS = {"compile": "none", "threads": 0, "fused_adamw": True, "oom_above_batch_size": 0}
_ids = itertools.count()


def make_audit(effective: str) -> Audit:
    dtype = DTYPE[effective]
    return Audit(
        effective=effective,
        parameter_dtypes={dtype: 21},
        gradient_dtypes={dtype: 21},
        optimizer_state_dtypes={dtype: 42},
        autocast_dtype=None,
        grad_scaler=False,
        backend=[],
        matmul_probe=MatmulProbe(relative_error=3e-7, fp16_range_overflow=False, verdict=effective),
        evidence={"parameters": effective, "matmul_probe": effective},
    )


def make_result(
    *,
    tokens_per_second: float = 1000.0,
    precision: str = "FP32",
    mode: str = "pure",
    batch_size: int = 1,
    preset: str = "tiny",
    plugin: str = "cpu",
    settings: dict | None = None,
    defaults: dict | None = None,
    world_size: int = 1,
    nodes: int = 1,
    parallel: str = "none",
    device_name: str = "Test CPU",
    steps: int = 3,
    peak_memory_bytes: int | None = 2**30,
    invalid_reasons: list[str] | None = None,
    load_average: float = 0.5,
    **fields,
) -> Result:
    """A result whose figures follow from tokens_per_second; any other Result field can be overridden by name."""
    config = PRESETS[preset]
    number = next(_ids)
    run_id = fields.pop("run_id", hashlib.sha256(str(number).encode()).hexdigest()[:8])
    defaults = dict(CPU_DEFAULTS if defaults is None else defaults)
    settings = {**defaults, **(settings or {})}
    global_batch = batch_size * world_size
    window = global_batch * config.sequence_length * steps / tokens_per_second
    parameters = flops.parameter_count(config)
    per_token = flops.model_flops_per_token(config, parameters)
    tflops = flops.achieved_tflops(tokens_per_second / world_size, per_token)
    # Distinct step times per record (verify refuses two runs with the same ones), inside the window.
    step_seconds = [window / steps * (0.9 - 0.001 * ((number + k) % 7)) for k in range(steps)]
    low, high = loss_band(config.vocab_size)
    initial = (low + high) / 2
    debug = [] if preset == "official" else [f"{preset} preset"]
    # The clean room's evidence as `llmb run` records it (its own challenge and loss curve per record); the replay
    # result is the record's claim, which only `verify --replay` re-checks (tests/test_evidence.py does it for real).
    losses = [initial - 0.01 - 0.005 * k / max(1, steps - 1) - number * 1e-9 for k in range(steps)]
    evidence = Evidence.from_dict(
        {
            "schema": "llmb.evidence/1",
            "windows": [
                {
                    "challenge": 10**12 + number,
                    "clean_window_seconds": window,
                    "worker_window_seconds": window * 0.99,
                    "losses": losses,
                    "digest_start": [],
                    "digest_end": [],
                    "digest_scope": "model",
                }
            ],
            "headline_window": 0,
            "replay": {"passed": True, "checks": []},
        }
    )
    invalid = list(invalid_reasons or [])
    result = Result(
        run_id=run_id,
        official=not debug,
        valid=not debug and not invalid,
        debug_reasons=debug,
        invalid_reasons=invalid,
        model_fingerprint=RELEASED_MODEL_FINGERPRINT,
        preset=preset,
        config=config,
        parameters=parameters,
        batch_size=batch_size,
        sequence_length=config.sequence_length,
        warmup_steps=1,
        steps=steps,
        repeats=1,
        seed=0,
        plugin=PluginRef(
            name=plugin,
            version="0.1.0",
            distribution="llmb",
            settings=settings,
            defaults=defaults,
            precisions=["FP32", "FP16", "BF16"],
        ),
        device=DeviceRef(type="cpu", spec="cpu", name=device_name, count=1),
        software=Software(python="3.11", torch="2.13.0+cpu", platform="test"),
        facts={"factory": True},
        optimizer=OptimizerInfo(
            class_name="torch.optim.adamw.AdamW",
            defaults={"lr": 1e-5, "betas": [0.9, 0.999], "eps": 1e-6, "weight_decay": 0.01},
            harness_steps=steps + 1,
            optimizer_steps=steps + 1,
        ),
        precision=Precision(requested=precision, effective=precision, mode=mode, audit=make_audit(precision)),
        timing=Timing(
            window_seconds=window,
            step_seconds=step_seconds,
            method="host-synchronised",
            repeat_window_seconds=[window],
            clock="judge",
            worker_window_seconds=window * 0.99,
            worker_repeat_window_seconds=[window * 0.99],
        ),
        world_size=world_size,
        nodes=nodes,
        parallel=parallel,
        layout=JobLayout.data_parallel(world_size),
        global_batch_size=global_batch,
        per_rank=[window] * world_size,
        tokens_per_second=tokens_per_second,
        tokens_per_second_per_device=tokens_per_second / world_size,
        samples_per_second=global_batch * steps / window,
        model_flops_per_token=per_token,
        tflops=tflops,
        peak=PeakInfo(flops=None, source=None, origin=None),
        mfu=None,
        fom=flops.fom(config, global_batch, window / steps),
        peak_memory_bytes=peak_memory_bytes,
        loss=Loss(initial=initial, first=losses[0], last=losses[-1]),
        host=Host(
            load_average_start=[load_average] * 3, load_average_end=[load_average] * 3, cpu_affinity=[0], cpu_count=1
        ),
        evidence=evidence,
        judge=Judge(clean_room=True, clock="time.perf_counter of a process that imported no plugin"),
    )
    return dataclasses.replace(result, **fields) if fields else result
