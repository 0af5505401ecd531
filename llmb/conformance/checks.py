"""check-plugin's checks: a candidate's trace against the reference's, each a named Check with its measured error
and the tolerance of the audited precision and mode (llmb.spec.tolerances)."""

from __future__ import annotations

import math

import torch

from llmb.audit import precision
from llmb.conformance.trace import Trace
from llmb.records import Check
from llmb.spec.fingerprint import RELEASED_MODEL_FINGERPRINT, model_fingerprint
from llmb.spec.tolerances import tolerance_for


def relative_error(candidate: torch.Tensor, reference: torch.Tensor) -> float:
    """||candidate - reference|| / ||reference|| in float64 (0 when both are zero, inf when only the reference is)."""
    c, r = candidate.double(), reference.double()
    if c.shape != r.shape:
        return math.inf
    difference, scale = (c - r).norm().item(), r.norm().item()
    if scale == 0:
        return 0.0 if difference == 0 else math.inf
    return difference / scale


def _within(name: str, error: float, tolerance: float, what: str) -> Check:
    passed = math.isfinite(error) and error <= tolerance
    return Check(name, passed, f"{what}: relative error {error:.3g} (tolerance {tolerance:g})", error, tolerance)


def _worst(name: str, candidate: dict, reference: dict, tolerance: float, what: str, base: dict | None = None) -> Check:
    """The worst per-parameter relative error; ``base`` turns both sides into updates from their initial values."""
    missing = [n for n in reference if candidate.get(n) is None]
    if missing:
        return Check(name, False, f"{what}: none for {len(missing)} parameters (first: {missing[0]})", None, tolerance)
    errors = {}
    for n, ref in reference.items():
        cand = candidate[n]
        if base is not None:
            cand, ref = cand.double() - base[0][n].double(), ref.double() - base[1][n].double()
        errors[n] = relative_error(cand, ref)
    worst = max(errors, key=errors.get)
    check = _within(name, errors[worst], tolerance, what)
    check.detail += f", worst parameter {worst}"
    return check


def compare(candidate: Trace, reference: Trace, requested: str, mode: str) -> list[Check]:
    """Every conformance check of a candidate trace against the reference trace."""
    effective = candidate.audit["effective"]
    tol = tolerance_for(effective, mode, candidate.master_fp32)
    checks = [_names_check(candidate, reference)]

    fingerprint = model_fingerprint()
    holds = fingerprint == RELEASED_MODEL_FINGERPRINT
    checks.append(
        Check("fingerprint", holds, "model definition is the released one" if holds else "model definition changed")
    )
    problems = candidate.optimizer_problems
    checks.append(
        Check(
            "optimizer",
            not problems,
            "; ".join(problems) or "torch.optim.AdamW with the fixed hyperparameters over every parameter",
            len(problems),
            0,
        )
    )
    changed = candidate.identity_problems
    checks.append(
        Check(
            "identities",
            not changed,
            "; ".join(changed)
            or "torch's entry points, AdamW, hook registries, aten kernels and llmb as before any plugin was imported",
            len(changed),
            0,
        )
    )
    steps_ok = candidate.optimizer_steps == candidate.harness_steps == len(reference.losses)
    checks.append(
        Check(
            "optimizer-steps",
            steps_ok,
            f"AdamW.step() ran {candidate.optimizer_steps} times for {candidate.harness_steps} harness steps",
            candidate.optimizer_steps,
            candidate.harness_steps,
        )
    )
    below = effective not in precision.PRECISIONS or precision.RANK[effective] > precision.RANK[requested]
    evidence = ", ".join(f"{k}={v}" for k, v in candidate.audit["evidence"].items() if v == effective)
    checks.append(
        Check(
            "precision",
            not below,
            f"requested {requested}, audited {effective}" + (f" ({evidence})" if below and evidence else ""),
            effective,
            requested,
        )
    )

    loss_error = abs(candidate.loss - reference.loss) / abs(reference.loss)
    checks.append(_within("forward-loss", loss_error, tol.loss, f"loss {candidate.loss:.6f} vs {reference.loss:.6f}"))
    if candidate.logits is None:
        checks.append(Check("forward-logits", False, "the forward pass returned no logits tensor", None, tol.logits))
    else:
        logits_error = relative_error(candidate.logits, reference.logits)
        checks.append(_within("forward-logits", logits_error, tol.logits, "logits"))
    checks.append(_worst("gradients", candidate.gradients, reference.gradients, tol.gradients, "gradients"))
    curve = [abs(c - r) / abs(r) for c, r in zip(candidate.losses, reference.losses, strict=True)]
    curve_error = max(curve) if all(math.isfinite(c) for c in candidate.losses) else math.inf
    checks.append(
        _within(
            "loss-curve",
            curve_error,
            tol.loss_curve,
            f"{len(curve)} steps, loss {candidate.losses[0]:.6f} -> {candidate.losses[-1]:.6f} "
            f"(reference {reference.losses[0]:.6f} -> {reference.losses[-1]:.6f})",
        )
    )
    if candidate.master_fp32:
        what, base = "updates p_K - p_0 of the FP32 weights", (candidate.initial, reference.initial)
    else:
        what, base = "weights after the steps (16-bit weights cannot hold the 1e-5 updates)", None
    checks.append(_worst("trained-parameters", candidate.trained, reference.trained, tol.trained, what, base))
    return checks


def _names_check(candidate: Trace, reference: Trace) -> Check:
    problems = []
    if candidate.count != reference.count:
        problems.append(f"parameter count {candidate.count:,}, reference {reference.count:,}")
    duplicated = sorted({n for n in candidate.names if candidate.names.count(n) > 1})
    if duplicated:
        problems.append(f"names repeated after normalisation: {', '.join(duplicated[:3])}")
    missing = [n for n in reference.names if n not in candidate.shapes]
    extra = [n for n in candidate.names if n not in reference.shapes]
    if missing:
        problems.append(f"{len(missing)} missing (first: {missing[0]})")
    if extra:
        problems.append(f"{len(extra)} unexpected (first: {extra[0]})")
    reshaped = [n for n in reference.names if n in candidate.shapes and candidate.shapes[n] != reference.shapes[n]]
    if reshaped:
        problems.append(f"{len(reshaped)} reshaped (first: {reshaped[0]})")
    detail = "; ".join(problems) or f"{candidate.count:,} parameters in {len(candidate.names)} tensors, names unchanged"
    return Check("parameter-names", not problems, detail, candidate.count, reference.count)
