"""Precision recipes, and the audit that finds which numeric format really ran.

The rules: a run that mixes formats counts as its lowest-bit format (ranked in llmb.spec.formats). A run is
labelled with the lowest rank that any piece of evidence shows: tensor dtypes, backend flags, the autocast dtype,
the plugin's own facts, and a matmul probe run on the device in the run's real backend state.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import torch

# PrecisionFact and PRECISIONS live in torch-free modules; importable from here as before.
from llmb.api.backend import PrecisionFact  # noqa: F401
from llmb.spec.formats import DTYPE_NAME_FORMAT, RANK, lowest  # noqa: F401 - the rules, torch-free
from llmb.spec.vocab import MODES, PRECISIONS  # noqa: F401

HALF_DTYPES = MappingProxyType({"FP16": torch.float16, "BF16": torch.bfloat16})
# Read-only, like every constant that judges a run (llmb.audit.guard also compares their values). From the torch-free
# table of names: the dtypes this torch has.
DTYPE_FORMAT = MappingProxyType(
    {getattr(torch, name): label for name, label in DTYPE_NAME_FORMAT.items() if hasattr(torch, name)}
)

# Relative Frobenius error of a 256x256x256 FP32 matmul against float64, measured on this project's CPU:
# IEEE FP32 ~3e-7, BF16 inputs ~2.3e-3 to 2.9e-3, FP16 inputs ~4e-4; TF32 has FP16's 10-bit mantissa, so ~4e-4.
# The thresholds sit a decade away from each measured cluster.
PROBE_FP32_MAX_ERROR = 1e-5
PROBE_10BIT_MAX_ERROR = 1.2e-3
PROBE_BF16_MAX_ERROR = 1.5e-2


@dataclass(frozen=True)
class Recipe:
    precision: str
    mode: str
    param_dtype: torch.dtype
    autocast_dtype: torch.dtype | None
    grad_scaler: bool


def recipe(precision: str, mode: str) -> Recipe:
    """How the harness runs a precision: parameter dtype, autocast dtype, and whether FP16 needs a scaler."""
    if precision in ("FP32", "TF32"):
        return Recipe(precision, "pure", torch.float32, None, False)
    half = HALF_DTYPES[precision]
    if mode == "pure":
        return Recipe(precision, mode, half, None, False)
    return Recipe(precision, mode, torch.float32, half, precision == "FP16")


def _set_fp32_precision(value: str) -> None:
    """Set the per-backend fp32_precision switches this torch has ("ieee" or "tf32")."""
    b = torch.backends
    for holder in (b.cuda.matmul, b.cudnn.conv, b.cudnn.rnn, b.mkldnn.matmul, b.mkldnn.conv, b.mkldnn.rnn):
        if hasattr(holder, "fp32_precision"):
            holder.fp32_precision = value


def apply_backend_recipe(precision: str) -> None:
    """Set the framework's matmul switches for the precision; a plugin's setup_backend runs after this.

    Only TF32 allows TF32: FP16/BF16 keep IEEE FP32 for their FP32 leftovers, as the reference's defaults did.
    """
    allow = precision == "TF32"
    torch.set_float32_matmul_precision("high" if allow else "highest")
    if hasattr(torch.backends.cuda.matmul, "fp32_precision"):
        # Newer torch: use only the new switches; mixing them with allow_tf32 makes torch raise when read.
        _set_fp32_precision("tf32" if allow else "ieee")
    else:  # pragma: no cover - older torch
        torch.backends.cuda.matmul.allow_tf32 = allow
        torch.backends.cudnn.allow_tf32 = allow


def _read(getter) -> Any:
    try:
        return getter()
    except Exception as exc:  # torch raises when legacy and new switches disagree; record that
        return f"unreadable: {exc.__class__.__name__}"


_SWITCH_FORMAT = MappingProxyType({"ieee": None, "none": None, "tf32": "TF32", "bf16": "BF16"})
_MATMUL_PRECISION_FORMAT = MappingProxyType({"highest": None, "high": "TF32", "medium": "BF16"})


# Which per-backend fp32_precision switches govern each device type's kernels (oneDNN serves CPU and XPU; the
# CUDA switches serve NVIDIA and ROCm). Other device types (xla, ...) report their own state through the plugin.
_BACKEND_SWITCHES = MappingProxyType(
    {
        "cpu": ("mkldnn.matmul", "mkldnn.conv", "mkldnn.rnn"),
        "xpu": ("mkldnn.matmul", "mkldnn.conv", "mkldnn.rnn"),
        "cuda": ("cuda.matmul", "cudnn.conv", "cudnn.rnn"),
    }
)
# Every per-backend switch, for the cheap per-step state check (whatever the device type).
_ALL_SWITCHES = ("cuda.matmul", "cudnn.conv", "cudnn.rnn", "mkldnn.matmul", "mkldnn.conv", "mkldnn.rnn")


def matmul_precision_setting() -> str:
    """torch's global float32 matmul precision, or "unreadable: ..." where torch refuses to say: it raises when the
    per-backend fp32_precision switches disagree (a plugin set one of them, e.g. cudnn.conv, as it may)."""
    return _read(torch.get_float32_matmul_precision)


def _switch(path: str):
    holder = torch.backends
    for part in path.split("."):
        holder = getattr(holder, part, None)
    return getattr(holder, "fp32_precision", None) if holder is not None else None


# Switches that govern matmuls; the others (conv, rnn) govern layers the fixed model does not have, so they are
# recorded without an implication (a convolution that did run would show in the dispatch record).
MATMUL_SWITCHES = frozenset(
    {
        "torch.float32_matmul_precision",
        "torch.backends.cuda.matmul.fp32_precision",
        "torch.backends.mkldnn.matmul.fp32_precision",
        "torch.backends.cuda.matmul.allow_tf32",
    }
)


def backend_flag_facts(device: torch.device) -> list[PrecisionFact]:
    """What torch's global and per-backend switches allow for FP32 matmuls on this device type."""
    b = torch.backends
    mm = matmul_precision_setting()
    facts = [PrecisionFact("torch.float32_matmul_precision", mm, _MATMUL_PRECISION_FORMAT.get(mm))]
    for path in _BACKEND_SWITCHES.get(device.type, ()):
        value = _switch(path)
        if value is not None:
            name = f"torch.backends.{path}.fp32_precision"
            facts.append(PrecisionFact(name, value, _SWITCH_FORMAT.get(value) if name in MATMUL_SWITCHES else None))
    if device.type == "cuda":
        for name, getter in (
            ("torch.backends.cuda.matmul.allow_tf32", lambda: b.cuda.matmul.allow_tf32),
            ("torch.backends.cudnn.allow_tf32", lambda: b.cudnn.allow_tf32),
        ):
            value = _read(getter)
            facts.append(PrecisionFact(name, value, "TF32" if value is True and name in MATMUL_SWITCHES else None))
        for name, getter in (
            ("allow_fp16_reduced_precision_reduction", lambda: b.cuda.matmul.allow_fp16_reduced_precision_reduction),
            ("allow_bf16_reduced_precision_reduction", lambda: b.cuda.matmul.allow_bf16_reduced_precision_reduction),
        ):
            # These only touch FP16/BF16 GEMMs, whose runs are labelled FP16/BF16 already: recorded, no implication.
            facts.append(PrecisionFact(f"torch.backends.cuda.matmul.{name}", _read(getter), None))
    return facts


def backend_state(device_type: str) -> tuple[tuple[str, Any], ...]:
    """Everything global that changes what a step computes, cheap enough to read after every step: the matmul
    switches of every backend, autocast, the default dtype, grad mode, and Python-level torch function/dispatch
    modes (a mode pushed by a plugin could rewrite every operator)."""
    state: list[tuple[str, Any]] = [("torch.float32_matmul_precision", matmul_precision_setting())]
    state += [(f"torch.backends.{path}.fp32_precision", _switch(path)) for path in _ALL_SWITCHES]
    if device_type == "cuda":
        state.append(("torch.backends.cuda.matmul.allow_tf32", _read(lambda: torch.backends.cuda.matmul.allow_tf32)))
        state.append(("torch.backends.cudnn.allow_tf32", _read(lambda: torch.backends.cudnn.allow_tf32)))
    state += [
        (f"autocast enabled ({device_type})", _read(lambda: torch.is_autocast_enabled(device_type))),
        (f"autocast dtype ({device_type})", _read(lambda: str(torch.get_autocast_dtype(device_type)))),
        ("default dtype", str(torch.get_default_dtype())),
        ("grad enabled", torch.is_grad_enabled()),
        ("torch function modes", torch._C._len_torch_function_stack()),
        ("torch dispatch modes", torch._C._len_torch_dispatch_stack()),
    ]
    return tuple(state)


def state_changes(before: tuple, after: tuple) -> list[str]:
    """Each entry of backend_state that differs, as "name: before -> after"."""
    old = dict(before)
    return [f"{name}: {old.get(name)!r} -> {value!r}" for name, value in after if old.get(name) != value]


def tensor_dtypes(tensors: Iterable[torch.Tensor]) -> dict[str, int]:
    """Count of tensors per dtype name."""
    counts: dict[str, int] = {}
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.is_floating_point():
            key = str(t.dtype).replace("torch.", "")
            counts[key] = counts.get(key, 0) + 1
    return counts


def optimizer_state_tensors(optimizer: torch.optim.Optimizer) -> Iterator[torch.Tensor]:
    for state in optimizer.state.values():
        for key, value in state.items():
            if key != "step" and isinstance(value, torch.Tensor):
                yield value


def _format_of_dtype_name(name: str) -> str | None:
    dtype = getattr(torch, name, None)
    return DTYPE_FORMAT.get(dtype)


def matmul_probe(
    device: torch.device,
    autocast_dtype: torch.dtype | None,
    sync: Callable[[], None],
    shape: tuple[int, int, int] | None = None,
) -> dict:
    """Multiply FP32 matrices on the device in the run's backend state and compare with float64 on the CPU.

    The relative error tells the mantissa width the device really used; a second product with large values
    overflows FP16's range (65504) but not TF32's or BF16's, which tells the two 10-bit formats apart. Besides the
    256x256x256 product, ``shape`` (m, k, n) adds one at the model's own sizes, so a backend that picks its kernel
    by shape is probed where the model computes; the worse of the two errors decides.
    """
    gen = torch.Generator().manual_seed(1234)
    a = torch.randn(256, 256, generator=gen)
    b = torch.randn(256, 256, generator=gen)
    big = 300.0  # products ~9e4 each, sums ~1.4e6: finite in FP32/TF32/BF16, inf in FP16

    def product(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        ctx = torch.autocast(device.type, dtype=autocast_dtype) if autocast_dtype else contextlib.nullcontext()
        with ctx:
            out = x.to(device) @ y.to(device)
        sync()
        return out.detach().to("cpu", torch.float64)

    def error_of(x: torch.Tensor, y: torch.Tensor) -> float:
        reference = x.double() @ y.double()
        return ((product(x, y) - reference).norm() / reference.norm()).item()

    error = error_of(a, b)
    errors = {"256x256x256": error}
    if shape is not None:
        m, k, n = shape
        model_error = error_of(torch.randn(m, k, generator=gen), torch.randn(k, n, generator=gen))
        errors[f"{m}x{k}x{n}"] = model_error
        error = max(error, model_error)
    reference = a.double() @ b.double()
    big_result = product(a * big, b * big)
    big_reference = reference * big * big
    range_ok = bool(torch.isfinite(big_result).all()) and (
        ((big_result - big_reference).norm() / big_reference.norm()).item() < 0.1
    )
    if not range_ok:
        verdict = "FP16"
    elif error <= PROBE_FP32_MAX_ERROR:
        verdict = "FP32"
    elif error <= PROBE_10BIT_MAX_ERROR:
        verdict = "TF32"
    elif error <= PROBE_BF16_MAX_ERROR:
        verdict = "BF16"
    else:
        verdict = "FP8"
    return {"relative_error": error, "errors": errors, "fp16_range_overflow": not range_ok, "verdict": verdict}


def audit(
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    device: torch.device,
    recipe: Recipe,
    plugin_facts: list[PrecisionFact],
    sync: Callable[[], None],
    probe_shape: tuple[int, int, int] | None = None,
) -> dict:
    """Collect every piece of evidence of the numeric format after one training step; return the audit record.

    The matmul switches say what a backend is *allowed* to do; the probe shows what it did. Where the switches
    allow a lower format than the probe found (``"high"`` on a CPU, which has no TF32), the label follows the probe
    and the record keeps the disagreement. The switches are checked again at every step of the window, so one
    turned on after this audit does not pass (llmb.audit.window).
    """
    params = list(model.parameters())
    param_dtypes = tensor_dtypes(params)
    grad_dtypes = tensor_dtypes(p.grad for p in params if p.grad is not None)
    state_dtypes = tensor_dtypes(optimizer_state_tensors(optimizer))
    # Buffers carry function too (the rotary tables): one rounded to a lower format lowers the run's label.
    buffer_dtypes = tensor_dtypes(model.buffers())
    flags = backend_flag_facts(device)
    facts = flags + list(plugin_facts)
    autocast_format = DTYPE_FORMAT.get(recipe.autocast_dtype) if recipe.autocast_dtype else None
    probe = matmul_probe(device, recipe.autocast_dtype, sync, probe_shape)

    evidence: dict[str, str | None] = {}
    for label, counts in (
        ("parameters", param_dtypes),
        ("gradients", grad_dtypes),
        ("optimizer_state", state_dtypes),
        ("buffers", buffer_dtypes),
    ):
        evidence[label] = lowest([_format_of_dtype_name(n) for n in counts])
    evidence["autocast"] = autocast_format
    switch_formats = {f.name: f.implies for f in flags if f.implies}
    allowed = lowest(list(switch_formats.values())) if switch_formats else None
    disagreement = None
    if allowed and RANK[allowed] > RANK[probe["verdict"]]:
        disagreement = {"switches": switch_formats, "allow": allowed, "probe": probe["verdict"], "label": "probe"}
    else:
        evidence.update(switch_formats)
    for fact in plugin_facts:
        if fact.implies:
            evidence[fact.name] = fact.implies
    evidence["matmul_probe"] = probe["verdict"]
    effective = lowest(list(evidence.values()))
    return {
        "effective": effective,
        "parameter_dtypes": param_dtypes,
        "gradient_dtypes": grad_dtypes,
        "optimizer_state_dtypes": state_dtypes,
        "buffer_dtypes": buffer_dtypes,
        "autocast_dtype": str(recipe.autocast_dtype).replace("torch.", "") if recipe.autocast_dtype else None,
        "grad_scaler": recipe.grad_scaler,
        "backend": [{"name": f.name, "value": _jsonable(f.value), "implies": f.implies} for f in facts],
        "matmul_probe": probe,
        "switches_vs_probe": disagreement,
        "evidence": {k: v for k, v in evidence.items() if v},
    }


def with_dispatch(audit_record: dict, dispatch: dict) -> dict:
    """The audit with a dispatch record (llmb.audit.dispatch) added: the formats the matmul, linear and attention
    operators really received in a measured step join the evidence, so the label follows what ran."""
    evidence = dict(audit_record["evidence"])
    if dispatch.get("effective"):
        evidence["dispatch"] = dispatch["effective"]
    return {**audit_record, "dispatch": dispatch, "evidence": evidence, "effective": lowest(list(evidence.values()))}


def _jsonable(value: Any) -> Any:
    return value if isinstance(value, (bool, int, float, str, type(None))) else str(value)
