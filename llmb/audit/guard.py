"""Identities of what the benchmark depends on, captured before any plugin is imported and compared afterwards.

A plugin is arbitrary code in llmb's process: at import it can replace `nn.Linear.forward`, `torch.optim.AdamW`,
llmb's loop or its constants, register a global optimizer hook, or override an aten kernel through
`torch.library`. None of that shows in the plugin's hooks, so llmb keeps the objects themselves (not copies of
their names) from before the first plugin import and compares them, by identity, after the plugin's
post-processing and after the measured window. Any difference makes the run invalid and names what changed.

Watched (see docs/integrity.md):
- torch's matmul, attention, linear and loss entry points: the callables of `torch`, `torch.nn.functional`,
  `torch._C._nn` (torch._C._VariableFunctions is read-only), and the class dictionaries of `torch.Tensor`, `nn.Module`,
  `nn.Linear`, `nn.Embedding`, the optimizer classes and `GradScaler` (a name added later shadows a C method);
- AdamW: `torch.optim.AdamW`, its bases, the functional `adam`/`adamw` modules, and the global optimizer and module
  hook registries (their contents);
- the aten dispatcher table of every aten operator (a `torch.library` override leaves the old kernel "inactive"):
  a kernel replaced or removed, or one added for a key that computes on the run's devices;
- llmb's own modules: every function and class (and each llmb class's dictionary) by identity, and every UPPER_CASE
  constant by value;
- the clocks in `time`.

A change that a known vendor library release makes (IPEX's `ipex.optimize` replaces torch functions and aten kernels
process-wide), from its own unmodified files, is accepted and recorded instead: llmb/audit/vendor_libraries.py.

This cannot stop a plugin that also patches the comparison; that is what the clean-room process and the replay
close (docs/integrity.md, "residual risks").
"""

from __future__ import annotations

import collections
import importlib
import pkgutil
import sys
import time
import types
from dataclasses import dataclass, field

import torch

import llmb
from llmb.audit import vendor_libraries

# Every module of the llmb package is watched, found by walking the package: a module added later is watched
# without an edit here (a hand-kept list drifted: it named modules that no longer existed and missed the ones that
# judge and time windows). Imported before the baseline, so a plugin's patch to any is seen. Left out: every
# `__main__` module (`python -m llmb`, `python -m llmb.records`), which is an entry point and runs when imported.
ENTRY_POINT = "__main__"

TORCH_MODULES = (
    ("torch", torch),
    ("torch.nn.functional", torch.nn.functional),
    ("torch._C._nn", torch._C._nn),
    ("torch.autograd", torch.autograd),
    ("torch.optim.adamw", importlib.import_module("torch.optim.adamw")),
    ("torch.optim.adam", importlib.import_module("torch.optim.adam")),
    ("torch.optim.optimizer", importlib.import_module("torch.optim.optimizer")),
)
TORCH_CLASSES = (
    ("torch.Tensor", torch.Tensor),
    ("torch.nn.Module", torch.nn.Module),
    ("torch.nn.Linear", torch.nn.Linear),
    ("torch.nn.Embedding", torch.nn.Embedding),
    ("torch.nn.Parameter", torch.nn.Parameter),
    ("torch.optim.Optimizer", torch.optim.Optimizer),
    ("torch.optim.Adam", torch.optim.Adam),
    ("torch.optim.AdamW", torch.optim.AdamW),
    ("torch.amp.GradScaler", torch.amp.GradScaler),
    ("torch.autocast", torch.autocast),
)
# Registries whose contents a public API changes globally: a step pre-hook that drops gradients is one line.
HOOK_REGISTRIES = (
    ("torch.optim.optimizer", "_global_optimizer_pre_hooks"),
    ("torch.optim.optimizer", "_global_optimizer_post_hooks"),
    ("torch.nn.modules.module", "_global_forward_pre_hooks"),
    ("torch.nn.modules.module", "_global_forward_hooks"),
    ("torch.nn.modules.module", "_global_backward_pre_hooks"),
    ("torch.nn.modules.module", "_global_backward_hooks"),
    ("torch.nn.modules.module", "_global_forward_hooks_always_called"),
    ("torch.nn.modules.module", "_global_module_registration_hooks"),
    ("torch.nn.modules.module", "_global_parameter_registration_hooks"),
    ("torch.nn.modules.module", "_global_buffer_registration_hooks"),
)
CLOCKS = ("perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns", "time", "time_ns", "process_time")

_MISSING = object()


@dataclass
class Baseline:
    """The watched objects as they were before any plugin import: name -> (holder, key, object)."""

    bindings: dict[str, tuple[object, str, object]] = field(default_factory=dict)
    constants: dict[str, str] = field(default_factory=dict)
    class_keys: dict[str, tuple[type, frozenset[str]]] = field(default_factory=dict)
    hooks: dict[str, tuple] = field(default_factory=dict)
    dispatcher: dict[str, dict[str, str]] = field(default_factory=dict)

    def watch(self, name: str, holder: object, key: str) -> None:
        self.bindings[name] = (holder, key, vars(holder).get(key, _MISSING))

    def watch_class(self, name: str, cls: type, state_too: bool = True) -> None:
        """Every name of the class; with `state_too` False (llmb's own classes) only its code and its upper-case
        constants, as for a module: other class attributes are state a run sets (a job's one heartbeat)."""
        for key, value in vars(cls).items():
            if key in _SKIPPED_CLASS_KEYS:
                continue
            if state_too or _is_code(value) or isinstance(value, types.ModuleType) or key.isupper():
                self.watch(f"{name}.{key}", cls, key)
        self.class_keys[name] = (cls, frozenset(vars(cls)))


_SKIPPED_CLASS_KEYS = frozenset({"__dict__", "__weakref__", "__doc__", "__annotations__", "__parameters__"})


def _settle_lazy_patches() -> None:
    """Apply torch's own lazy patches now, so the baseline holds what every later run uses and an honest run never
    shows them as changes: an optimizer class's `step` is wrapped with its hook machinery on the first instance, and
    torch.compile's first use wraps the optimizers' `_init_group` and fused kernels (dynamo's TorchPatcher) and
    `nn.Module.__init__` (generation tagging)."""
    torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))])
    try:
        # Lazy: dynamo's own patchers, loaded only to settle what they patch before the baseline.
        from torch._dynamo.eval_frame import TorchPatcher
        from torch._dynamo.mutation_guard import install_generation_tagging_init
    except ImportError:  # pragma: no cover - a torch without dynamo's patches has nothing to settle
        return
    TorchPatcher.patch()
    install_generation_tagging_init()


def llmb_module_names() -> list[str]:
    """The watched llmb modules, by walking the installed package."""
    found = pkgutil.walk_packages(llmb.__path__, "llmb.")
    return sorted(info.name for info in found if info.name.rsplit(".", 1)[-1] != ENTRY_POINT)


def _llmb_modules() -> list[types.ModuleType]:
    return [importlib.import_module(name) for name in llmb_module_names()]


def _is_code(value: object) -> bool:
    return callable(value) or isinstance(value, (staticmethod, classmethod, property))


# Dispatch keys whose kernels compute nothing the benchmark measures (Meta: shapes only; torch registers Python meta
# kernels lazily), or that belong to an out-of-tree device backend, whose library registers its own kernels when
# it loads (torch_xla registers XLA kernels for every aten operator): new kernels there are not a change.
TOLERATED_NEW_KEYS = (
    "Meta",
    "XLA",
    "AutogradXLA",
    "AutocastXLA",
    "Lazy",
    "AutogradLazy",
    "PrivateUse1",
    "AutogradPrivateUse1",
    "AutocastPrivateUse1",
    "HPU",
    "AutogradHPU",
    "MTIA",
    "AutogradMTIA",
)


def _aten_dispatch_table() -> dict[str, dict[str, str]]:
    """Per aten operator, its registered kernels by dispatch key (an overridden kernel shows as "KEY (inactive)")."""
    table = {}
    for name in torch._C._dispatch_get_all_op_names():
        if name.startswith("aten::"):
            kernels = {}
            for line in torch._C._dispatch_dump(name).splitlines():
                key, sep, where = line.partition(": registered at ")
                if sep:
                    kernels[key] = where
            table[name] = kernels
    return table


def _dispatch_changes(before: dict[str, str], after: dict[str, str]) -> bool:
    """Whether an operator's kernels changed: one replaced or removed, or one added for a key that computes."""
    if any(after.get(key) != where for key, where in before.items() if not key.startswith("Meta")):
        return True
    return any(key not in before and not key.startswith(TOLERATED_NEW_KEYS) for key in after)


def _hook_contents(module_name: str, attribute: str) -> tuple:
    registry = getattr(sys.modules[module_name], attribute, None)
    return tuple(registry.items()) if isinstance(registry, dict) else (registry,)


def capture() -> Baseline:
    """Everything watched, as it is now (call before importing any plugin)."""
    _settle_lazy_patches()
    baseline = Baseline()
    for prefix, module in TORCH_MODULES:
        for key, value in list(vars(module).items()):
            if not key.startswith("__") and _is_code(value) and not isinstance(value, types.ModuleType):
                baseline.watch(f"{prefix}.{key}", module, key)
    for prefix, cls in TORCH_CLASSES:
        module_name, _, key = prefix.rpartition(".")
        baseline.watch(prefix, sys.modules[module_name], key)
        baseline.watch_class(prefix, cls)
    baseline.watch("torch.optim.AdamW", torch.optim, "AdamW")
    for name in CLOCKS:
        baseline.watch(f"time.{name}", time, name)
    for module in _llmb_modules():
        for key, value in list(vars(module).items()):
            if key.startswith("__"):
                continue
            qualified = f"{module.__name__}.{key}"
            if isinstance(value, types.ModuleType) or _is_code(value):
                baseline.watch(qualified, module, key)
                if isinstance(value, type) and value.__module__ == module.__name__:
                    baseline.watch_class(qualified, value, state_too=False)
            elif key.isupper():
                baseline.watch(qualified, module, key)
                baseline.constants[qualified] = repr(value)
    for module_name, attribute in HOOK_REGISTRIES:
        baseline.hooks[f"{module_name}.{attribute}"] = _hook_contents(module_name, attribute)
    baseline.dispatcher = _aten_dispatch_table()
    return baseline


def _vendor_kernels(before: dict[str, str], after: dict[str, str]) -> str | None:
    """The known vendor library that registered an operator's changed kernels (each one displaced, not removed), or
    None: llmb.audit.vendor_libraries."""
    active = []
    for key, where in after.items():
        if key.startswith("Meta"):  # shape functions compute nothing (IPEX registers its Meta kernels from Python)
            continue
        base, inactive, _ = key.partition(" (inactive)")
        if inactive:
            if before.get(base) != where:  # only the displaced original may turn up as inactive
                return None
        elif before.get(key) != where:
            active.append(where)
    if any(key not in after for key in before if not key.startswith("Meta")):
        return None
    return vendor_libraries.owner_of_kernels(active)


def changes(baseline: Baseline) -> tuple[list[str], dict[str, list[str]]]:
    """What changed since the baseline, one phrase per change; and apart, the changes a known, intact vendor
    library made (by library), which do not make a run invalid (llmb/audit/vendor_libraries.py)."""
    changed: list[str] = []
    accepted: dict[str, list[str]] = {}

    def note(phrase: str, owner: str | None) -> None:
        if owner is None:
            changed.append(phrase)
        else:
            accepted.setdefault(owner, []).append(phrase)

    for name, (holder, key, original) in baseline.bindings.items():
        now = vars(holder).get(key, _MISSING)
        if now is original:
            if name in baseline.constants and repr(now) != baseline.constants[name]:
                changed.append(f"{name} was changed (was {baseline.constants[name]})")
        elif now is _MISSING:
            changed.append(f"{name} was removed")
        elif original is _MISSING:
            note(f"{name} was added", vendor_libraries.owner_of_object(now))
        else:
            note(f"{name} was replaced", vendor_libraries.owner_of_object(now))
    for name, (cls, keys) in baseline.class_keys.items():
        # An added name matters where it shadows an inherited one (`torch.Tensor.mm` over the C method); a new name
        # nothing calls does not (transformers adds `nn.Module.smart_apply` when it loads).
        added = [key for key in sorted(set(vars(cls)) - keys) if any(key in vars(base) for base in cls.__mro__[1:])]
        for key in added:
            note(f"{name}.{key} was added", vendor_libraries.owner_of_object(vars(cls)[key]))
    for name, contents in baseline.hooks.items():
        module_name, _, attribute = name.rpartition(".")
        if _hook_contents(module_name, attribute) != contents:
            changed.append(f"{name} changed (a global hook was registered or removed)")
    now_table = _aten_dispatch_table()
    for op, kernels in baseline.dispatcher.items():
        after = now_table.get(op, {})
        if _dispatch_changes(kernels, after):
            phrase = f"the dispatcher's kernels for {op} changed (overridden through torch.library?)"
            note(phrase, _vendor_kernels(kernels, after))
    return changed, accepted


def compare(baseline: Baseline, limit: int = 10) -> list[str]:
    """What changed since the baseline that no known vendor library accounts for (empty when nothing did)."""
    global _last_accepted
    changed, accepted = changes(baseline)
    if baseline is _baseline:
        _last_accepted = accepted
    if len(changed) > limit:
        changed = changed[:limit] + [f"and {len(changed) - limit} more"]
    return changed


def vendor_changes() -> dict[str, int]:
    """Per known vendor library, how many watched objects and kernels it replaced (recorded with the run): what the
    last comparison with the process's baseline accepted (the window audit's, at its close), so a run walks every
    watched object, class and kernel table once there and not again for this (about a second on a 2-core CPU)."""
    if _baseline is None:
        return {}
    accepted = _last_accepted if _last_accepted is not None else changes(_baseline)[1]
    return {owner: len(phrases) for owner, phrases in accepted.items()}


_baseline: Baseline | None = None
# What the last comparison with _baseline accepted as a known vendor library's (vendor_changes reads it).
_last_accepted: dict[str, list[str]] | None = None


def ensure_baseline() -> Baseline:
    """The process's baseline, captured on the first call (plugins.load calls it before any import)."""
    global _baseline
    if _baseline is None:
        _baseline = capture()
    return _baseline


def problems(when: str) -> list[str]:
    """Invalid reasons for everything changed since the baseline, naming the stage (`when`)."""
    if _baseline is None:
        return [f"{when}: no identity baseline was captured before the plugins were imported"]
    return [f"identity {when}: {change}" for change in compare(_baseline)]


def optimizer_problems(optimizer: object) -> list[str]:
    """What was changed on the harness's optimizer instance, where the watch of its classes cannot see: a method set
    on the instance shadows the class's (`optimizer.step = ...`: the harness's loop calls the instance's), a
    replaced `state` mapping runs code on every read of AdamW's state (the moment digest's, after the clock), and a
    step pre-hook of the instance changes the gradients AdamW receives. AdamW's post-hooks are the harness's (the
    loop counts the real steps with one) and not judged here (tests/redteam/test_redteam_optimizer_instance.py)."""
    found = []
    members = {name for cls in type(optimizer).__mro__ for name in vars(cls)}
    # A known, intact vendor library may set them (IPEX's `ipex.optimize` binds its own step, zero_grad and
    # load_state_dict to the instance for its BF16 master weights), as it may replace torch's functions.
    shadowed = sorted(
        name
        for name, value in vars(optimizer).items()
        if name in members and vendor_libraries.owner_of_object(getattr(value, "__func__", value)) is None
    )
    if shadowed:
        found.append(f"the optimizer instance replaces its class's {', '.join(shadowed)}")
    state = vars(optimizer).get("state")
    if type(state) is not collections.defaultdict:
        found.append(f"the optimizer's state is a {type(state).__module__}.{type(state).__qualname__}, not torch's")
    if vars(optimizer).get("_optimizer_step_pre_hooks"):
        found.append("the optimizer instance has step pre-hooks")
    return found
