"""Compilers a plugin may apply to the model instance: torch.compile (Inductor) modes and Lightning Thunder.

Thunder is optional and version-bound: lightning-thunder 0.2.6 (its newest release) imports only with torch up to
2.9 (with torch 2.13 it fails: `torch.Tensor.align_as` is gone). Where it cannot run, `thunder_unavailable()` says
why in one line, and asking for it is a usage error before any work is done.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import warnings

import torch
from torch import nn

from llmb.api.errors import UsageError, describe

INDUCTOR_MODES = ("default", "reduce-overhead", "max-autotune")
THUNDER = "thunder"
# The `compile` setting's help, one text for every plugin that offers these compilers.
HELP = "torch.compile the model with this mode, or thunder: Lightning Thunder's thunder.jit (needs torch 2.9)"


def thunder_unavailable() -> str | None:
    """Why Thunder cannot run with this torch (one line), or None when it imports."""
    if importlib.util.find_spec("thunder") is None:
        return (
            f"lightning-thunder is not installed; its newest release (0.2.6) needs torch 2.9 (this is torch "
            f"{torch.__version__}): pip install torch==2.9.0 lightning-thunder==0.2.6, or tox -e thunder"
        )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # it warns about every optional executor it does not find
            importlib.import_module("thunder")
    except Exception as exc:
        try:
            version = importlib.metadata.version("lightning-thunder")
        except importlib.metadata.PackageNotFoundError:
            version = "?"
        return (
            f"lightning-thunder {version} does not import with torch {torch.__version__} "
            f"({describe(exc)}); it runs with torch 2.9.0 (tox -e thunder)"
        )
    return None


def check_compiler(mode: str) -> None:
    """A usage error, before the model exists, when the chosen compiler cannot run here."""
    if mode == THUNDER:
        reason = thunder_unavailable()
        if reason:
            raise UsageError(f"compile=thunder: {reason}")


def compile_model(model: nn.Module, mode: str) -> nn.Module:
    """The model compiled as asked: "none", an Inductor mode, or "thunder". The parameters stay the same objects
    (torch.compile and thunder.jit wrap the module; they do not copy it), so the optimizer still holds them."""
    if mode == "none":
        return model
    if mode == THUNDER:
        check_compiler(mode)
        # Lazy: Lightning Thunder is optional (the [thunder] extra); only compile=thunder needs it.
        import thunder

        return thunder.jit(model)
    if mode not in INDUCTOR_MODES:
        raise UsageError(f"unknown compile mode {mode!r} (choose from none, {', '.join(INDUCTOR_MODES)}, thunder)")
    return torch.compile(model, mode=None if mode == "default" else mode)
