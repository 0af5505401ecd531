"""A replayed window's checks: what the run answered against the judge's replay (llmb.judge.replay), with the
tolerances of what really ran. Split from the replay itself so each module keeps one job: replay.py trains the
window again, this module judges it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from llmb.audit.evidence import MODEL_SCOPE
from llmb.spec.tolerances import (
    AUTOCAST_DIRECTIONS_FACTORS,
    BRACKETED,
    SAME_PRECISION_TOLERANCES,
    drift_tolerance,
    loss_drift_tolerance,
    nats_fallen,
    replay_tolerance_for,
    row_mode,
)

# AdamW first-moment digests of a whole window against the FP32 replay (relative). Measured on the CPU by
# benchmarks/replay_calibration.py (tiny preset, seeds 0-1, batch 1 and 8, 5-step windows; raw/replay_calibration-
# cpu-tiny-20261123.jsonl): worst honest error 0 in FP32, 0.040 pure BF16, 0.0105 BF16 amp, 0.020 pure FP16 with the
# fused AdamW, 0.00057 FP16 amp; 2.5x margin at least. A skipped step moves them by O(1). Not yet measured on a GPU
# (gpu.sh's calibration step measures them with the losses now).
MOMENT_TOLERANCES = {"FP32": 1e-3, "TF32": 2e-2, "FP16": 5e-2, "BF16": 1e-1, "FP8": 1e-1}


# A run made on the CPU, replayed on the CPU (issue 25, class 4): a plugin that runs every MLP under
# autocast(float16) from step 3 on, FP32 whenever a dispatch mode is pushed, keeps its losses within 4e-7 of the
# replay's (under the 1e-6 FP32 tolerance: at the tiny shape the loss barely depends on the matmuls' rounding), where
# AdamW's moments, a tenth of every gradient, differ by 8.1e-6 to 7.8e-5 by the window's draw (tiny preset, 5 steps,
# eight runs). Honest FP32 windows, replayed with their own AdamW (fused or per-tensor), differ by 0 eager and by at
# most 5.2e-7 where another compiler's kernels ran (tiny, 5 and 50 steps, batch 1 and 4: Inductor 1.9e-7, Thunder
# 5.2e-7, IPEX 4.2e-8; small preset, Inductor: 3.4e-7). 2e-6 holds both with a margin of about 4; 1e-5, before,
# passed the attack on one draw in eight (8.1e-6; CI, 2026-11-26). Other devices keep MOMENT_TOLERANCES until a GPU
# measures theirs (benchmarks/gpu.sh).
CPU_MOMENT_TOLERANCES = {"FP32": 2e-6}


# What the same-precision and autocast replays' direction checks compare (moment_seal), as their details name it.
MOMENT_DIRECTIONS = "AdamW's first moments projected onto the judge's random directions"


@dataclass
class ReplayCheck:
    name: str
    passed: bool
    detail: str
    measured: float | None = None
    tolerance: float | None = None

    def to_dict(self) -> dict:
        measured = self.measured
        if isinstance(measured, float) and not math.isfinite(measured):
            measured = str(measured)
        return {
            "name": self.name,
            "passed": self.passed,
            "detail": self.detail,
            "measured": measured,
            "tolerance": self.tolerance,
        }


@dataclass
class Replayed:
    losses: list[float]
    digest_start: list[list[float]]
    digest_end: list[list[float]] | None
    seconds: float
    peak_rss_bytes: int | None
    moments_end: list[list[float]] | None = None  # AdamW's first moments after a whole window (moment_digest)
    device: str = "cpu"  # where it ran (replay_device)
    build_seconds: float | None = None  # of `seconds`: the initial model (built, or its prebuilt twin) on the device
    # llmb.judge.initial.Prebuilt where the judge built the initial model while the worker set itself up
    prebuilt: object | None = None
    device_init_seconds: float = 0.0  # of `seconds`: the device brought up in the judge's process (0 on the CPU)
    matmuls: str = "FP32"  # the format its FP32 matmuls ran in: "TF32" on an accelerator where asked, else IEEE
    # of build_seconds: llmb.judge.initial.Placement, what the initial model's twin on the device took (None: no twin)
    placement: object | None = None
    # AdamW's first moments after a whole window, projected onto the window's seal key (moment_seal).
    moments_projection: list[list[float]] | None = None


def relative_error(candidate: list[float], reference: list[float]) -> float:
    c, r = torch.tensor(candidate, dtype=torch.float64), torch.tensor(reference, dtype=torch.float64)
    if c.shape != r.shape or not bool(torch.isfinite(c).all()):
        return math.inf
    scale = r.norm().item()
    difference = (c - r).norm().item()
    if scale == 0:
        return 0.0 if difference == 0 else math.inf
    return difference / scale


FP16_LOOP_HINT = (
    "; pure FP16 with AdamW's per-tensor loops keeps g^2 in FP16, where it underflows and the weights run away: use "
    "the fused AdamW (its arithmetic is FP32) or --precision-mode amp"
)


def compare(
    window: dict,
    replayed: Replayed,
    effective: str,
    mode: str,
    fp32_master: bool,
    fused: bool | None = None,
    scope: str = MODEL_SCOPE,
    device_type: str | None = None,
) -> list[ReplayCheck]:
    """The window's recorded losses (and digest, for a whole window) against the replay, with the conformance
    tolerances of what really ran (`fp32_master`: the weights were FP32, replay.weights_format; `fused`: whether the
    run's AdamW was the fused kernel, for the failure's hint).
    `scope` is what the digests cover as the job's layout says (evidence.digest_scope), never the window's own word:
    a seal that called a one-process run's digests a part would skip the digest and AdamW moment checks.
    `device_type`: the run's device type, which picks the moment tolerance (moment_tolerance)."""
    # The row of what ran: 16-bit compute over FP32 weights (an FP32 request whose matmuls ran BF16) is held to the amp
    # row, whose losses follow the FP32 replay's, not to the pure row's bracket (which only pure 16-bit weights need).
    mode = row_mode(effective, mode, fp32_master)
    tol = replay_tolerance_for(effective, mode)
    digest_tolerance = tol.trained
    hint = FP16_LOOP_HINT if (effective, mode) == ("FP16", "pure") and not fused else ""
    checks = []
    recorded = window.get("losses") or []
    if len(recorded) < len(replayed.losses):
        return [
            ReplayCheck(
                "replay-losses", False, f"the window records {len(recorded)} losses, replayed {len(replayed.losses)}"
            )
        ]
    untrained = replayed.losses[0] if replayed.losses else math.nan  # every window step trains on one batch
    for index, reference in enumerate(replayed.losses):
        value = recorded[index]
        if index and (effective, mode) in BRACKETED:
            checks.append(_bracketed(index, value, reference, untrained, tol.loss, effective, mode, hint))
            continue
        # A later loss may part further where the judge's own replay has fallen far (loss_drift_tolerance).
        tolerance = tol.loss if index == 0 else loss_drift_tolerance(tol, untrained, reference)
        error = abs(value - reference) / abs(reference) if _finite(value) else math.inf
        fallen = _fallen(tolerance, tol.loss_curve, untrained, reference) if index else ""
        checks.append(
            ReplayCheck(
                f"replay-loss-{index + 1}",
                error <= tolerance,
                f"step {index + 1}: recorded loss {value!r}, replayed {reference:.6f}: relative error {error:.3g} "
                f"(tolerance {tolerance:.3g}{fallen}, {effective} {mode})" + ("" if error <= tolerance else hint),
                error,
                tolerance,
            )
        )
    if replayed.digest_end is not None and scope == MODEL_SCOPE:
        end = window.get("digest_end") or []
        if fp32_master:
            # The weights dwarf their updates (about steps x 1e-5 per element): compare what the window changed.
            start = window.get("digest_start") or []
            candidate = _difference(end, start)
            reference = _difference(replayed.digest_end, replayed.digest_start)
            what = "update of the parameter digest"
        else:
            candidate, reference, what = _flat(end), _flat(replayed.digest_end), "parameter digest"
        error = relative_error(candidate, reference) if candidate is not None and reference is not None else math.inf
        passed = error <= digest_tolerance
        detail = f"{what} after {len(replayed.losses)} steps: relative error {error:.3g}"
        detail += f" (tolerance {digest_tolerance:g})"
        if not passed:
            detail += hint
        checks.append(ReplayCheck("replay-digest", passed, detail, error, digest_tolerance))
        # Records made before the moments were sealed have no such key: nothing to compare, as before.
        if replayed.moments_end and "moments_end" in window:
            checks.append(_moments_check(window, replayed, moment_tolerance(effective, mode, device_type), hint))
    return checks


def moment_tolerance(effective: str, mode: str, device_type: str | None = None) -> float:
    """Relative error allowed between a whole window's AdamW first-moment digest and the FP32 replay's: AdamW's
    state is kept in the parameters' dtype, so a pure 16-bit run's moments carry its rounding (MOMENT_TOLERANCES:
    measured by benchmarks/replay_calibration.py, on the CPU so far); a run made on the CPU is held to the CPU's own
    measurement where one exists (CPU_MOMENT_TOLERANCES)."""
    if device_type == "cpu" and effective in CPU_MOMENT_TOLERANCES:
        return CPU_MOMENT_TOLERANCES[effective]
    return MOMENT_TOLERANCES.get(effective, MOMENT_TOLERANCES["FP8"])


def _moments_check(window: dict, replayed: Replayed, tolerance: float, hint: str = "") -> ReplayCheck:
    candidate, reference = _flat(window.get("moments_end") or []), _flat(replayed.moments_end)
    error = relative_error(candidate, reference) if candidate is not None and reference is not None else math.inf
    passed = error <= tolerance
    detail = (
        f"AdamW's first-moment digest after {len(replayed.losses)} steps: relative error {error:.3g} "
        f"(tolerance {tolerance:g})"
    )
    if candidate is None:
        detail = (
            f"the window records no AdamW first-moment digest to compare with the replay's (tolerance {tolerance:g})"
        )
    return ReplayCheck("replay-moments", passed, detail + ("" if passed else hint), error, tolerance)


def _bracketed(
    index: int, value, trained: float, untrained: float, tolerance: float, effective: str, mode: str, hint: str
) -> ReplayCheck:
    """A pure 16-bit step after the first. Its weights keep only part of AdamW's updates, yet rounding to nearest
    can also round an update up to a whole unit in the last place (up to twice the update): so its loss lies between
    the untrained loss (no update) and twice the FP32 replay's fall (2 x trained - untrained, where the loss is convex
    along the updates), each widened by the first loss's tolerance."""
    low = 2 * trained - untrained - tolerance * abs(trained)
    high = untrained * (1 + tolerance)
    if not _finite(value):
        error = math.inf
    else:
        error = max(low - value, value - high, 0.0) / abs(trained) if trained else math.inf
    passed = error == 0.0
    detail = (
        f"step {index + 1}: recorded loss {value!r}, {'between' if passed else 'outside'} {low:.6f} (twice the FP32 "
        f"replay's fall to {trained:.6f}) and the untrained {untrained:.6f} ({effective} {mode} weights round "
        f"AdamW's updates; widened by {tolerance:g})"
    )
    if not passed:
        detail += f": {error:.3g} beyond" + hint
    # measured: how far outside the bracket (already widened), so the verdict is measured <= 0 as for every check.
    return ReplayCheck(f"replay-loss-{index + 1}", passed, detail, error, 0.0)


def _fallen(tolerance: float, flat: float, first: float, reference: float) -> str:
    """What a loss check's detail adds where its tolerance was widened past `flat` by the replay's fall (the nats
    drift_tolerance counted); nothing where it was not."""
    return f" after {nats_fallen(first, reference):.2f} nats fallen" if tolerance > flat else ""


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _flat(rows) -> list[float] | None:
    try:
        values = [float(x) for row in rows for x in row]
    except (TypeError, ValueError):
        return None
    return values if values else None


# A digest row per parameter: [sum, sum of squares] of its elements (llmb.audit.evidence.digest).
SQUARES = 1


def _column(rows, column: int) -> list[float] | None:
    """One column of a digest's rows (None where the rows are not a digest: too short, or not numbers)."""
    try:
        values = [float(row[column]) for row in rows]
    except (TypeError, ValueError, IndexError, KeyError):
        return None
    return values if values else None


def _difference(end, start) -> list[float] | None:
    a, b = _flat(end), _flat(start)
    if a is None or b is None or len(a) != len(b):
        return None
    return [x - y for x, y in zip(a, b, strict=True)]


def same_precision_checks(
    window: dict, same: Replayed, effective: str, mode: str, scope: str = MODEL_SCOPE, fused: bool | None = None
) -> list[ReplayCheck]:
    """A pure 16-bit whole window against the judge's replay of it in the same 16-bit format (torch's own kernels and
    AdamW implementation, no plugin): every loss, the parameter digest and AdamW's first moments
    (SAME_PRECISION_TOLERANCES); of a replay that stopped short of the whole window, the losses it reached. Missing
    work (steps skipped, half a sequence, layers without backward) moves the moments by O(1) where an honest run
    stays within SAME_PRECISION_TOLERANCES' measurements."""
    tol = SAME_PRECISION_TOLERANCES.get(effective, SAME_PRECISION_TOLERANCES["BF16"])
    # The per-tensor loops' g^2 underflows in FP16 and their steps grow chaotic: two honest runs part (tiny preset,
    # batch 8, 20 steps: 0.04-0.14 in the moments), so the failure says which AdamW to use.
    hint = FP16_LOOP_HINT if effective == "FP16" and fused is False else ""
    recorded, checks = window.get("losses") or [], []
    label = f"{effective} {mode}, against a {effective} replay"
    if len(recorded) < len(same.losses):
        what = f"the window records {len(recorded)} losses, replayed {len(same.losses)}"
        return [ReplayCheck("same-precision-losses", False, what)]
    first = same.losses[0] if same.losses else math.nan
    for index, reference in enumerate(same.losses):
        value = recorded[index]
        error = abs(value - reference) / abs(reference) if _finite(value) and reference else math.inf
        # Further where the same-format replay's own loss has fallen far (SAME_PRECISION_TOLERANCES).
        tolerance = drift_tolerance(tol.loss, tol.loss_drift, first, reference) if index else tol.loss
        fallen = _fallen(tolerance, tol.loss, first, reference)
        checks.append(
            ReplayCheck(
                f"same-precision-loss-{index + 1}",
                error <= tolerance,
                f"step {index + 1}: recorded loss {value!r}, replayed {reference:.6f}: relative error {error:.3g} "
                f"(tolerance {tolerance:.3g}{fallen}, {label})" + ("" if error <= tolerance else hint),
                error,
                tolerance,
            )
        )
    if scope != MODEL_SCOPE or same.digest_end is None:  # a part of the model, or the window's first steps only
        return checks
    # Each digest's sums of squares only (SQUARES): the signed sums of zero-mean weights and gradients cancel, and an
    # honest compiled FP16 window's moment sums parted from torch's eager kernels' by 0.87 of their norm where their
    # squares parted by 0.014 (tiny preset, 50 steps; SAME_PRECISION_TOLERANCES).
    squares = " of its sums of squares"
    compared = [
        ("same-precision-digest", "parameter digest", _column(window.get("digest_end") or [], SQUARES),
         _column(same.digest_end or [], SQUARES), tol.digest, squares),
        ("same-precision-moments", "AdamW's first-moment digest", _column(window.get("moments_end") or [], SQUARES),
         _column(same.moments_end or [], SQUARES), tol.moments, squares),
    ]  # fmt: skip
    if tol.directions is not None and same.moments_projection is not None:
        # The moments projected onto the directions of the window's seal key, against the replay's projection onto
        # the same directions: their relative error estimates the moments' own, direction and all
        # (moment_seal), where the squares see only sizes. A window whose judge handed over a key answers with
        # its projection; one that left it out fails.
        compared.append(("same-precision-moment-directions", MOMENT_DIRECTIONS,
                         _flat(window.get("moments_projection") or []), _flat(same.moments_projection),
                         tol.directions, ""))  # fmt: skip
    for name, what, a, b, tolerance, of in compared:
        error = relative_error(a, b) if a is not None and b is not None else math.inf
        detail = (
            f"{what} after {len(same.losses)} steps: relative error {error:.3g}{of} (tolerance {tolerance:g}, {label})"
        )
        if a is None:
            detail = f"the window records no {what} to compare with the {effective} replay's"
        checks.append(ReplayCheck(name, error <= tolerance, detail + ("" if error <= tolerance else hint), error,
                                  tolerance))  # fmt: skip
    return checks


def autocast_checks(
    window: dict, amp: Replayed, fp32: Replayed, effective: str, scope: str = MODEL_SCOPE
) -> list[ReplayCheck]:
    """An AMP whole window's AdamW first moments, projected onto the judge's directions, against the judge's replay
    of it under autocast, within its format's AUTOCAST_DIRECTIONS_FACTORS times that replay's own distance from the
    FP32 replay (`fp32`): the yardstick of what 16-bit rounding moves them by. Moments of the right size pointing
    elsewhere (stale gradients) pass the FP32 replay's digest at small shapes; a window whose judge handed over a
    key answers with its projection, and one that left it out fails."""
    if scope != MODEL_SCOPE or amp.moments_projection is None or fp32.moments_projection is None:
        return []
    yardstick = relative_error(_flat(amp.moments_projection), _flat(fp32.moments_projection))
    factor = AUTOCAST_DIRECTIONS_FACTORS.get(effective, AUTOCAST_DIRECTIONS_FACTORS["BF16"])
    tolerance = factor * yardstick
    candidate = _flat(window.get("moments_projection") or [])
    error = relative_error(candidate, _flat(amp.moments_projection)) if candidate is not None else math.inf
    passed = error <= tolerance
    detail = (
        f"{MOMENT_DIRECTIONS} after {len(amp.losses)} steps: relative error {error:.3g} (tolerance {tolerance:.3g}: "
        f"{factor:g} x the autocast replay's own {yardstick:.3g} from the FP32 replay's, "
        f"{effective} amp, against a {effective} autocast replay)"
    )
    if candidate is None:
        detail = f"the window records no {MOMENT_DIRECTIONS} to compare with the {effective} autocast replay's"
    return [ReplayCheck("autocast-moment-directions", passed, detail, error, tolerance)]


def failed(replay_result: dict) -> list[str]:
    return [c["detail"] for c in replay_result.get("checks", []) if not c.get("passed")]
