"""The training features every plugin may offer, written once: their settings, the checks made before the model
exists, the post-processing in torchtitan's order, and the precision fact the audit reads.

A plugin offers them by subclassing `FeatureSettings` for its own typed settings (or adding `settings(...)` to a
list of them) and calling `check`, `apply` and `facts` from its Backend's `setup`, `process_model` and
`precision_facts` (the cpu and cuda plugins do; a vendor's may). The values come resolved (llmb.api.settings
fills every declared default). A backend that subclasses one of these but declares its own settings without the
features' (a test backend, a vendor's on llmb.CpuBackend) gets them off, never a KeyError.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from torch import nn

from llmb.api.backend import PrecisionFact
from llmb.api.settings import PluginSettings, Setting, option
from llmb.toolkit import checkpointing, compilers, fp8

# Every compiler mode a plugin may offer: none, Inductor's modes, Thunder.
COMPILE_MODES = ("none", *compilers.INDUCTOR_MODES, compilers.THUNDER)
FP8_HELP = (
    "train the Linear layers (not the LM head) in float8 with this torchao recipe; torchao >= 0.18 scales "
    "dynamically only (no delayed scaling): tensorwise, rowwise, rowwise_with_gw_hp"
)
FP8_EMULATE_HELP = (
    "torchao's float8 emulation (high-precision GEMMs: checks the numerics anywhere) instead of torch._scaled_mm's "
    "float8 kernels"
)
# The fact every plugin's FP8 records under one name, so records say it alike whichever plugin ran.
FP8_FACT = "llmb.fp8"


@dataclass(frozen=True, eq=False)
class FeatureSettings(PluginSettings):
    """The features' settings, off by default. A plugin's typed settings subclass this and declare a field again to
    give it its own default or choices (the cuda plugin compiles by default; the cpu plugin emulates float8)."""

    compile: str = option("none", compilers.HELP, choices=COMPILE_MODES)
    activation_checkpointing: str = option("none", checkpointing.HELP, choices=checkpointing.MODES)
    fp8: str = option("none", FP8_HELP, choices=fp8.RECIPES)
    fp8_emulate: bool = option(False, FP8_EMULATE_HELP)


# A feature the backend does not declare is off: FeatureSettings's own defaults.
OFF = {s.name: s.default for s in FeatureSettings.declared()}


def settings(
    compile_default: str = "none",
    compile_modes: tuple[str, ...] = COMPILE_MODES,
    fp8_emulate_default: bool = False,
) -> list[Setting]:
    """The features' settings as a list, for a plugin that lists its settings rather than typing them: compile,
    activation_checkpointing, fp8, fp8_emulate (FeatureSettings's), with the plugin's defaults."""
    changed = {
        "compile": {"default": compile_default, "choices": compile_modes},
        "fp8_emulate": {"default": fp8_emulate_default},
    }
    return [dataclasses.replace(s, **changed.get(s.name, {})) for s in FeatureSettings.declared()]


def value(values: Mapping[str, Any], name: str) -> Any:
    """A feature's resolved value, or off where the backend's settings do not declare it."""
    return values.get(name, OFF[name])


def check(values: Mapping[str, Any]) -> None:
    """Before the model exists: a compiler or an FP8 recipe that cannot run here is one line, not a traceback."""
    compilers.check_compiler(value(values, "compile"))
    fp8.check_fp8(value(values, "fp8"))


def apply(model: nn.Module, values: Mapping[str, Any]) -> nn.Module:
    """torchtitan's order: float8 swaps the Linear modules, checkpointing wraps the layers, the compiler sees all."""
    model = fp8.convert(model, value(values, "fp8"), emulate=bool(value(values, "fp8_emulate")))
    model = checkpointing.apply_activation_checkpointing(model, value(values, "activation_checkpointing"))
    return compilers.compile_model(model, value(values, "compile"))


def facts(values: Mapping[str, Any]) -> list[PrecisionFact]:
    """FP8 lowers the run's format by itself: the fact says so (the audit's dtype census finds the float8 tensors
    too); the other features keep the precision the harness set."""
    recipe = value(values, "fp8")
    return [PrecisionFact(FP8_FACT, recipe, "FP8" if recipe != "none" else None)]
