"""FP8 training through torchao's float8 (an optional extra: `pip install llmb[fp8]`), for plugins to apply.

torchao swaps the model's nn.Linear modules for Float8Linear, which casts inputs, weights and gradients to float8
for each GEMM (e4m3 forward, e5m2 for gradients) with dynamically computed scales; the parameters stay the same
objects in their own dtype. With ``emulate`` the GEMM dequantizes and multiplies in high precision (torchao's
emulation mode, for devices without float8 GEMMs); without it, torch._scaled_mm runs the device's float8 GEMM.

FP8 is not one of the benchmark's four precisions: the audit sees the float8 tensors (llmb.audit.census) and labels such
a run FP8, so its record is invalid for the leaderboard, reported in its own rows, and has no MFU against a BF16
peak (as torchtitan reports none). torchao 0.18 has no delayed scaling any more (its ScalingType offers dynamic
only); the choices are its recipes, all dynamic: tensorwise, rowwise and rowwise_with_gw_hp.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import io
import logging
import warnings

import torch
from torch import nn

from llmb.api.errors import UsageError, describe

RECIPES = ("none", "tensorwise", "rowwise", "rowwise_with_gw_hp")
# torchtitan's default: the output projection stays in high precision (its error feeds the loss directly).
KEEP_HIGH_PRECISION = ("lm_head",)


def _import_float8():
    # torchao prints a line per CUDA extension it cannot load (every one, on a CPU build of torch) and logs a warning
    # about its pytree registrations: neither concerns float8 training, so they are kept out of llmb's output.
    pytree_log = logging.getLogger("torch.utils._pytree")
    level = pytree_log.level
    pytree_log.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                # Lazy: torchao is optional (the [fp8] extra); only an fp8 recipe needs it.
                import torchao.float8 as float8
    finally:
        pytree_log.setLevel(level)
    return float8


def torchao_unavailable() -> str | None:
    """Why torchao's float8 training cannot run here (one line), or None."""
    if importlib.util.find_spec("torchao") is None:
        return "torchao is not installed (pip install 'llmb[fp8]')"
    try:
        _import_float8()
    except Exception as exc:
        return f"torchao.float8 does not import with torch {torch.__version__}: {describe(exc)}"
    return None


def check_fp8(recipe: str) -> None:
    """A usage error, before the model exists, when FP8 is asked for and cannot run."""
    if recipe not in RECIPES:
        raise UsageError(f"unknown fp8 recipe {recipe!r} (choose from {', '.join(RECIPES)})")
    if recipe != "none":
        reason = torchao_unavailable()
        if reason:
            raise UsageError(f"fp8={recipe}: {reason}")


def _convertible(module: nn.Module, fqn: str) -> bool:
    # float8 GEMMs need both dimensions divisible by 16.
    if fqn.split(".")[-1] in KEEP_HIGH_PRECISION:
        return False
    return isinstance(module, nn.Linear) and module.in_features % 16 == 0 and module.out_features % 16 == 0


def convert(model: nn.Module, recipe: str, emulate: bool) -> nn.Module:
    """The model with its Linear layers (but the LM head) trained in float8 by torchao; same parameter objects."""
    check_fp8(recipe)
    if recipe == "none":
        return model
    float8 = _import_float8()
    config = dataclasses.replace(float8.Float8LinearConfig.from_recipe_name(recipe), emulate=emulate)
    return float8.convert_to_float8_training(model, config=config, module_filter_fn=_convertible)
