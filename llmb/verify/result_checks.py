"""The checks of each result of a bundle: every figure recomputed from what the run recorded (throughput, timing,
energy, peaks, MFU, shape, validity, fingerprint, precision, losses, optimizer)."""

from __future__ import annotations

import math
from pathlib import PurePosixPath

from llmb.records import (
    Result,
    energy,
    loss_band,
    median_index,
)
from llmb.spec import flops
from llmb.spec import peak_table as peaks
from llmb.spec.fingerprint import RELEASED_MODEL_FINGERPRINT
from llmb.spec.formats import DTYPE_NAME_FORMAT, RANK, lowest
from llmb.spec.presets import ADAMW_HYPERPARAMETERS, official_reasons
from llmb.spec.tolerances import MIN_STEP_SHARE_OF_WINDOW
from llmb.spec.vocab import PRECISIONS
from llmb.verify.bundle import Bundle, per_result

# Recorded figures are full-precision JSON floats, so a recomputation agrees to far better than this.
REL_TOLERANCE = 1e-6


def _close(recorded, expected) -> bool:
    if expected is None or recorded is None:
        return recorded is None and expected is None
    return isinstance(recorded, (int, float)) and math.isclose(recorded, expected, rel_tol=REL_TOLERANCE, abs_tol=1e-12)


def throughput_problems(b: Bundle, path: str, r: Result) -> list[str]:
    config, window = r.config, r.timing.window_seconds
    if not window > 0:
        return [f"window {window!r} is not a positive time"]
    # A multi-process job (llmb run --nproc-per-node) records a per-device batch; its throughput is the job's.
    world = r.world_size
    if world < 1:
        return [f"world_size {world!r} is not a positive integer"]
    # Tensor and pipeline groups share one batch: the data-parallel ranks' batches (x accumulation) are the global one.
    dp, accumulation = r.layout.dp, r.layout.grad_accum
    if not (1 <= dp <= world and accumulation >= 1):
        return [f"layout dp {dp!r} / grad_accum {accumulation!r} is not a layout of {world} processes"]
    global_batch = r.batch_size * accumulation * dp
    tokens_per_second = global_batch * config.sequence_length * r.steps / window
    parameters = flops.parameter_count(config)
    per_token = flops.model_flops_per_token(config, parameters)
    tflops = flops.achieved_tflops(tokens_per_second / world, per_token)
    expected = {
        "sequence_length": config.sequence_length,
        "parameters": parameters,
        "model_flops_per_token": per_token,
        "tokens_per_second": tokens_per_second,
        "samples_per_second": global_batch * r.steps / window,
        "tflops": tflops,
        "mfu": flops.mfu(tflops, r.peak.flops),
        "fom": flops.fom(config, global_batch, window / r.steps),
    }
    if r.global_batch_size is not None:  # recorded by releases that know multi-process jobs
        expected["global_batch_size"] = global_batch
        expected["tokens_per_second_per_device"] = tokens_per_second / world
    return [
        f"{key} recorded {getattr(r, key)!r}, recomputed {value!r}"
        for key, value in expected.items()
        if not _close(getattr(r, key), value)
    ]


def timing_problems(b: Bundle, path: str, r: Result) -> list[str]:
    window, steps, repeats = r.timing.window_seconds, r.timing.step_seconds, r.timing.repeat_window_seconds
    problems = []
    if len(steps) != r.steps or not all(s > 0 for s in steps):
        problems.append(f"{len(steps)} step times for {r.steps} steps, or a time that is not positive")
    elif sum(steps) > window * (1 + REL_TOLERANCE):
        problems.append(f"step times add up to {sum(steps):.6f} s, more than the {window:.6f} s window they lie in")
    elif sum(steps) < MIN_STEP_SHARE_OF_WINDOW * window:
        problems.append(f"step times add up to {sum(steps):.6f} s, under half the {window:.6f} s window")
    if len(repeats) != r.repeats:
        problems.append(f"{len(repeats)} repeat windows for {r.repeats} repeats")
    elif not all(w > 0 for w in repeats):
        problems.append(f"a repeat window that is not a positive time in {repeats!r}")
    elif window != repeats[median_index([1 / w for w in repeats])]:
        problems.append(f"window {window!r} is not the median repeat's (by throughput) of {repeats!r}")
    return problems


def shape_problems(b: Bundle, path: str, r: Result) -> list[str]:
    reasons = official_reasons(r.config)
    if bool(reasons) == r.official:
        return [f"marked official={r.official} but the shape says otherwise"]
    if not reasons:
        return []
    marked = [d.get("result") for d in (b.submission or {}).get("debug", {}).get("results", [])]
    if path not in marked:
        return [f"debug shape not marked as debug in submission.json ({reasons[0]})"]
    return [] if b.accept_debug else [f"not the official shape ({reasons[0]})"]


def validity_problems(b: Bundle, path: str, r: Result) -> list[str]:
    if r.invalid_reasons:
        return [f"invalid: {r.invalid_reasons[0]}"]
    if r.valid != (r.official and not r.invalid_reasons):
        return [f"valid={r.valid} does not follow from official={r.official} and no invalid reasons"]
    return []


def fingerprint_problems(b: Bundle, path: str, r: Result) -> list[str]:
    if r.model_fingerprint != RELEASED_MODEL_FINGERPRINT:
        return [
            f"model fingerprint {r.model_fingerprint[:12]}... is not the released {RELEASED_MODEL_FINGERPRINT[:12]}..."
        ]
    return []


def precision_problems(b: Bundle, path: str, r: Result) -> list[str]:
    prec, audit = r.precision, r.precision.audit
    folder = PurePosixPath(path).parts[1] if len(PurePosixPath(path).parts) == 3 else None
    evidence = dict(audit.evidence)
    for key in ("parameter_dtypes", "gradient_dtypes", "optimizer_state_dtypes", "buffer_dtypes"):
        for dtype in getattr(audit, key) or {}:
            if dtype not in DTYPE_NAME_FORMAT:
                return [f"unknown dtype {dtype!r} in the audit's {key}"]
            evidence[f"{key}:{dtype}"] = DTYPE_NAME_FORMAT[dtype]
    evidence["matmul_probe"] = audit.matmul_probe.verdict
    for rank, label in enumerate(audit.rank_effective or []):  # a multi-process job: every rank's verdict
        evidence[f"rank {rank}"] = label
    if any(v not in RANK for v in evidence.values()):
        return [f"unknown format in the audit evidence {sorted(set(evidence.values()) - set(RANK))}"]
    found = lowest(list(evidence.values()))
    problems = []
    if found != audit.effective:
        problems.append(f"the audit's evidence shows {found}, its verdict says {audit.effective}")
    if prec.effective != found:
        problems.append(f"labelled {prec.effective}, the audit's evidence shows {found}")
    if found not in PRECISIONS:
        problems.append(f"{found} is not a benchmark precision")
    if folder != found:
        problems.append(f"filed under results/{folder}/, the audit's evidence shows {found}")
    return problems


def loss_problems(b: Bundle, path: str, r: Result) -> list[str]:
    loss = r.loss
    values = [loss.initial, loss.first, loss.last]
    if not all(math.isfinite(v) for v in values):
        return [f"non-finite loss {values}"]
    low, high = loss_band(r.config.vocab_size)
    if not low <= loss.initial <= high:
        return [f"first loss {loss.initial:.4f} outside [{low:.2f}, {high:.2f}]"]
    if loss.last == loss.initial:
        return ["the loss did not move"]
    return []


def peak_problems(b: Bundle, path: str, r: Result) -> list[str]:
    """The peak behind the MFU is the one llmb.spec.peak_table.choose gives for the record's device name, label and
    the plugin's declaration (with the matmul rate the run measured), as the judge chose it, with every problem that
    choice names; and no MFU is above 100%."""
    problems = peaks.mfu_problems(r.mfu)
    recorded, origin, label, name = r.peak.flops, r.peak.origin, r.precision.effective, r.device.name
    # What the plugin declared; a record from before declared_flops was kept has only its figure, marked declared.
    declared = r.peak.declared_flops or (recorded if origin == peaks.ORIGIN_DECLARED else None)
    choice = peaks.choose(name, label, declared, r.peak.source, r.measured_matmul_peak)
    if (recorded, origin) == (choice.flops, choice.origin):
        pass
    elif choice.origin == peaks.ORIGIN_TABLE:
        row = peaks.match(name)  # the one row a table peak comes from
        problems.append(f"peak {recorded!r} for {row.label} {label}, llmb's table says {choice.flops!r}")
    elif choice.origin == peaks.ORIGIN_DECLARED and origin != peaks.ORIGIN_DECLARED:
        problems.append(f"peak {recorded!r} for a device llmb's table lacks, not marked declared by plugin")
    elif choice.origin == peaks.ORIGIN_DECLARED:
        problems.append(f"peak {recorded!r}, where the plugin declared {choice.flops!r}")
    elif declared is not None and not (r.peak.source or "").strip():
        problems.append(f"peak {recorded!r} declared without a source: no MFU may use it")
    elif recorded is not None:
        problems.append(f"peak {recorded!r} used where llmb's peak table and the plugin's declaration give none")
    return problems + [problem.removeprefix("peak: ") for problem in choice.problems]


def optimizer_record_problems(b: Bundle, path: str, r: Result) -> list[str]:
    """The recorded optimizer is torch.optim.AdamW with the fixed hyperparameters (re-checked, not trusted)."""
    problems = []
    if r.optimizer.class_name != "torch.optim.adamw.AdamW":
        problems.append(f"optimizer {r.optimizer.class_name!r} is not torch.optim.adamw.AdamW")
    for key, fixed in ADAMW_HYPERPARAMETERS.items():
        got = r.optimizer.defaults.get(key)
        if (tuple(got) if isinstance(got, list) else got) != fixed:
            problems.append(f"optimizer {key} recorded {got!r}, fixed value is {fixed!r}")
    return problems


def check_peaks(b: Bundle) -> None:
    per_result(b, "peak and MFU", peak_problems, "{n} results: peaks from llmb's table or declared, MFU <= 100%")


def check_optimizer(b: Bundle) -> None:
    per_result(b, "optimizer", optimizer_record_problems, "{n} results: AdamW with the fixed hyperparameters")


def check_throughput(b: Bundle) -> None:
    per_result(b, "throughput recomputed", throughput_problems, "tokens/s, samples/s, TFLOP/s, MFU of {n} results")


def check_timing(b: Bundle) -> None:
    per_result(b, "step times", timing_problems, "step times fit each window; windows are the repeats' medians")


def check_energy(b: Bundle) -> None:
    per_result(b, "energy", lambda b, path, r: energy.record_problems(r), "{n} results: recomputed where recorded")


def check_official_shape(b: Bundle) -> None:
    per_result(
        b, "official shape", shape_problems, "{n} results" + (" (debug shapes accepted)" if b.accept_debug else "")
    )


def check_validity(b: Bundle) -> None:
    per_result(b, "run validity", validity_problems, "no invalid reasons recorded")


def check_fingerprint(b: Bundle) -> None:
    per_result(b, "model fingerprint", fingerprint_problems, f"{RELEASED_MODEL_FINGERPRINT[:16]}... (released)")


def check_precision(b: Bundle) -> None:
    per_result(b, "effective precision", precision_problems, "label = audit's lowest format = folder")


def check_losses(b: Bundle) -> None:
    per_result(b, "losses", loss_problems, "finite, first loss in the band around ln(vocab), moving")
