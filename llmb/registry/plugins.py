"""Plugins: found by entry point (group "llmb", plus the built-in cpu plugin), loaded on demand, and the backends they
register through the one hook, ``register_backends(register)``.

A run imports only the plugin its backend comes from: a backend is named after its plugin's entry point ("cuda", or
"cuda-something" for a plugin with several), so `llmb run --plugin NAME` loads that entry point alone and no other
installed plugin's import-time code runs in the benchmark's process. Only `llmb plugins` loads them all;
auto-selection (no --plugin) loads them all in a throwaway process that names the choice (`probe`, started once by
llmb.registry.probe_process). `installed()` lists every plugin from package metadata without importing any.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import Any, TypeVar

import pluggy

from llmb.api import hookspecs
from llmb.api.backend import Backend, PrecisionFact, overridden, public_methods
from llmb.api.errors import LlmbError, PluginError, UsageError, message, shown
from llmb.api.errors import describe as describe_error
from llmb.api.settings import Setting, declaration_problem, did_you_mean
from llmb.api.settings import resolve_settings as resolve
from llmb.audit import vendor_libraries
from llmb.registry import probe_process
from llmb.registry import state as run_state
from llmb.spec.version import __version__
from llmb.spec.vocab import FIRST_PARTY_PLUGINS
from llmb.terminal import console as term
from llmb.terminal.streams import stdout_to_stderr

GROUP = "llmb"
BUILTIN = {"cpu": "llmb.default_plugins.cpu"}

pm = pluggy.PluginManager(GROUP)
pm.add_hookspecs(hookspecs)

# Plugin name -> "ExceptionType: message" for plugins that failed to import or to register their backends.
load_errors: dict[str, str] = {}


@dataclass(frozen=True)
class PluginInfo:
    """An installed plugin as its package metadata describes it: nothing of it is imported to know this."""

    name: str  # the entry point's name
    distribution: str
    version: str
    value: str  # the entry point's target, "module" or "module:attribute"

    def describe(self) -> dict:
        return {"name": self.name, "distribution": self.distribution, "version": self.version}


# Plugin name -> its metadata, for each plugin loaded from an entry point.
_infos: dict[str, PluginInfo] = {}


@dataclass(frozen=True)
class Registration:
    """A registered backend and the plugin that registered it."""

    backend: Backend
    plugin: PluginInfo

    @property
    def name(self) -> str:
        return self.backend.name

    @property
    def distribution(self) -> str:
        return self.plugin.distribution

    @property
    def version(self) -> str:
        return self.plugin.version


def installed() -> list[PluginInfo]:
    """Every installed llmb plugin (built-ins first, then entry points), from metadata only: nothing is imported."""
    infos = [PluginInfo(name, "llmb", __version__, value) for name, value in BUILTIN.items()]
    seen = set(BUILTIN)
    for ep in entry_points(group=GROUP):
        if ep.name in seen:
            continue
        seen.add(ep.name)
        dist = ep.dist
        infos.append(
            PluginInfo(ep.name, dist.name if dist else "unknown", dist.version if dist else "unknown", ep.value)
        )
    return infos


def installed_records() -> list[dict]:
    """`installed()` as plain dicts, for result records."""
    return [info.describe() for info in installed()]


def load(names: Iterable[str] | None = None) -> None:
    """Import and register the named installed plugins (all when None), each once. A plugin that fails to import is
    recorded in `load_errors`, never raised: a broken third-party plugin must not break llmb."""
    # Before any plugin module runs: what the benchmark depends on, to compare after the plugin had its turn.
    from llmb.audit import guard  # here, not at the top: `import llmb.registry.plugins` loads no torch

    guard.ensure_baseline()
    wanted = None if names is None else set(names)
    for info in installed():
        if wanted is not None and info.name not in wanted:
            continue
        if pm.has_plugin(info.name) or pm.is_blocked(info.name) or info.name in load_errors:
            continue
        try:
            module = EntryPoint(info.name, info.value, GROUP).load()
        except Exception as exc:
            load_errors[info.name] = describe_error(exc)
            continue
        _infos[info.name] = info
        pm.register(module, name=info.name)


def registrations() -> dict[str, Registration]:
    """Every backend the loaded plugins register, by name. Each plugin's hook is called on its own, so a failure or
    a bad registration is charged to the plugin that made it (and its backends are left out)."""
    found: dict[str, Registration] = {}
    # Built-ins first, then installed plugins, then any registered in memory (tests), each in registration order.
    impls = sorted(
        pm.hook.register_backends.get_hookimpls(),
        key=lambda impl: 0 if impl.plugin_name in BUILTIN else 1 if impl.plugin_name in _infos else 2,
    )
    for impl in impls:
        plugin = impl.plugin_name
        info = _infos.get(plugin) or PluginInfo(plugin, "unknown", "unknown", "")
        mine: list[Backend] = []
        try:
            impl.function(register=mine.append)
            for backend in mine:
                _check_registration(backend, plugin, found)
        except Exception as exc:
            load_errors[plugin] = describe_error(exc)
            continue
        for backend in mine:
            found[backend.name] = Registration(backend, info)
    return found


def _check_registration(backend: Any, plugin: str, found: dict[str, Registration]) -> None:
    if not isinstance(backend, Backend):
        raise TypeError(f"register() takes llmb.Backend instances, got {type(backend).__name__}")
    name = backend.name
    if not isinstance(name, str) or not (name == plugin or name.startswith(f"{plugin}-")):
        raise ValueError(f"backend name {name!r} must be the entry point's name {plugin!r} or start with '{plugin}-'")
    if name in found:
        raise ValueError(f"backend {name!r} is already registered by plugin {found[name].plugin.name!r}")


def _plugins_for(name: str) -> list[str]:
    """The installed plugins a backend of this name can come from (its own entry point, by the naming rule)."""
    return [info.name for info in installed() if name == info.name or name.startswith(f"{info.name}-")]


def get_backend(name: str) -> Registration:
    """The backend of this name, loading only the plugin it can come from; a one-line error otherwise."""
    sources = _plugins_for(name)
    load(sources)
    found = registrations()
    if name in found:
        return found[name]
    same = [n for n in found if n.lower() == name.lower()]  # in any case, as check_name matched the plugin's name
    if len(same) == 1:
        return found[same[0]]
    for plugin in sources:
        if plugin in load_errors:
            raise LlmbError(f"plugin {plugin!r} failed to load: {load_errors[plugin]}")
    if name in sources:
        # Installed and loaded, yet no backend by its name: an old hook-per-method plugin, or one that registers
        # under other names. Say so rather than "no plugin named" beside a list that names it.
        mine = sorted(n for n, reg in found.items() if reg.plugin.name == name)
        hint = f"it registers {', '.join(mine)}" if mine else "it registers no llmb.Backend through register_backends"
        raise UsageError(f"plugin {name!r} has no backend named {name!r}: {hint}")
    raise UsageError(unknown_plugin(name, sorted({*found, *(info.name for info in installed())})))


def check_name(name: str) -> str:
    """Refuse a backend name that no installed or registered plugin can provide, from metadata only (nothing is
    imported, torch included), so a mistyped --plugin fails at once instead of after seconds of imports. The name
    matches in any case, as every choice on llmb's command line does: the plugin's own spelling is returned."""
    known = sorted({*(info.name for info in installed()), *(n for n, _ in pm.list_name_plugin() if n)})
    if any(name == n or name.startswith(f"{n}-") for n in known):
        return name
    for n in sorted(known, key=len, reverse=True):  # the longest plugin name the given one starts with, in any case
        lower = name.lower()
        if lower == n.lower() or lower.startswith(f"{n.lower()}-"):
            return n + name[len(n) :]
    raise UsageError(unknown_plugin(name, known))


def unknown_plugin(name: str, known: list[str]) -> str:
    """The one-line error for a plugin name nothing provides, with what fixes it."""
    return f"no plugin named {shown(name)} (installed: {', '.join(known)}){_install_hint(name, known)}"


def _install_hint(name: str, installed_names: list[str]) -> str:
    """What fixes an unknown plugin name: the install command of a plugin shipped in the checkout, else the
    closest installed names."""
    # A fact, not a look at the disk: an installed llmb (not an editable checkout) has no plugins/ folder beside it.
    if name.lower() in FIRST_PARTY_PLUGINS:  # in any case, as every name on the command line
        return f"; it ships with llmb: pip install -e plugins/{name.lower()} (from the llmb checkout)"
    return did_you_mean(name, installed_names)


def all_registrations() -> dict[str, Registration]:
    """Every installed plugin loaded, and every backend they register (for `llmb plugins` and auto-selection)."""
    load()
    return registrations()


def select_backend(name: str | None, device: str | None = None) -> Registration:
    """The named backend; without a name, the first installed non-built-in backend whose hardware is present and
    which serves the device asked for (`--device`, when given), else cpu: `--device cpu` runs on the CPU on a GPU
    host too. Asking for hardware means importing every plugin, so that is done in a throwaway process and only the
    chosen plugin is imported here (backends registered in memory, which no other process can see, are asked here).
    That process is started once per device type in this process (llmb.registry.probe_process)."""
    if name:
        return get_backend(name)
    device_type = _device_type(device)
    if _in_memory_plugins():
        return get_backend(first_available(all_registrations(), device_type))
    infos = tuple(installed())  # package metadata, read once
    if all(info.name in BUILTIN for info in infos):
        return get_backend("cpu")
    return get_backend(probe_process.chosen_backend(device_type, infos))


def _device_type(device: str | None) -> str | None:
    """The type of a --device value ("cuda" of "cuda:1"); None for none, or one torch cannot parse (the run's own
    parse says what is wrong with it)."""
    if not device:
        return None
    from llmb.registry.device_spec import parse_device  # lazy: listing plugins needs no torch

    try:
        return parse_device(device).type
    except UsageError:
        return None


def first_available(found: dict[str, Registration], device_type: str | None = None) -> str:
    """Auto-selection's rule over loaded backends: the first non-built-in one serving `device_type` (any, for None)
    with its hardware present, else cpu. A plugin that cannot say is taken as absent, with a warning line naming it."""
    chosen, unanswered = _choose(found, device_type)
    for reason in unanswered:
        term.warning(reason)
    return chosen


def _choose(found: dict[str, Registration], device_type: str | None = None) -> tuple[str, list[str]]:
    """The backend auto-selection takes, and one line for each plugin whose device_types() or available() raised or
    returned the wrong type (taken as absent: one broken plugin must not stop a run the others, cpu at least, can
    make)."""
    unanswered = []
    for backend_name, registration in found.items():
        if registration.plugin.name in BUILTIN:
            continue
        asked = "available" if device_type is None else "device_types"  # the method a failure is charged to
        try:
            if device_type is not None and device_type not in call(registration.backend.device_types):
                continue
            asked = "available"
            present = call(registration.backend.available)
        except LlmbError as exc:
            said = charged(registration.backend, asked, exc)
            unanswered.append(f"plugin {registration.plugin.name!r} taken as without hardware: {said}")
            continue
        if present:
            return backend_name, unanswered
    return "cpu", unanswered


def _in_memory_plugins() -> list[str]:
    """Plugins registered by code in this process (tests, a library user), not by an installed entry point."""
    return [name for name, _ in pm.list_name_plugin() if name and name not in BUILTIN and name not in _infos]


def probe() -> None:
    """The throwaway process's work: its last stdout line is the choice and the plugins taken as without hardware,
    as JSON. What the plugins print goes to stderr, so no plugin's line can pass for the choice."""
    device_type = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] else None
    with stdout_to_stderr():
        chosen, unanswered = _choose(all_registrations(), device_type)
    print(json.dumps({"chosen": chosen, "unanswered": unanswered}))


T = TypeVar("T")


def call(method: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Call a backend's method, with this run's state where the method names a ``state`` parameter
    (llmb.registry.state.with_state); a failure, or a value of the wrong type from a method whose type llmb relies on
    (RETURNS), leaves as one error naming the backend and the method. (The timed loop calls its few methods
    directly: the harness's errors still name the run, and the window stays lean.)"""
    backend = getattr(getattr(method, "__self__", None), "name", "?")
    name = _method_name(method)
    try:
        returned = run_state.with_state(method)(*args, **kwargs)
    except LlmbError:
        raise
    except Exception as exc:
        raise PluginError(backend, name, exc) from exc
    wrong = _wrong_return(name, returned)
    if wrong is not None:
        raise PluginError(backend, name, TypeError(wrong))
    return returned


def backend_failure(backend: Backend, exc: BaseException) -> PluginError | None:
    """`exc` as the PluginError naming `backend` and the method it was raised in, where a frame of its traceback runs
    the backend's code: the outermost method called on the backend (the one the harness called; the timed loop calls
    synchronize, step_end and its events unwrapped by `call`, so the window stays lean), else a method of an object
    the plugin's own module defines (its device events). None where no frame is the plugin's."""
    module, named = type(backend).__module__, None
    traceback = exc.__traceback__
    while traceback is not None and named is None:
        frame = traceback.tb_frame
        owner = frame.f_locals.get("self")
        if owner is backend:
            named = next((name for name in public_methods() if _code(type(backend), name) is frame.f_code), None)
            named = named or frame.f_code.co_name
        elif owner is not None and type(owner).__module__ == module and module != Backend.__module__:
            named = f"{type(owner).__name__}.{frame.f_code.co_name}"
        traceback = traceback.tb_next
    return None if named is None else PluginError(getattr(backend, "name", "?"), named, exc)


def _code(cls: type, name: str) -> object:
    """The code object of `cls`'s method `name` (None where it has no plain function by that name)."""
    return getattr(getattr(cls, name, None), "__code__", None)


def _method_name(method: Callable) -> str:
    """The contract's name for a backend's method: a lambda or an unwrapped decorator on the plugin's class has
    another __name__, and the check of what it returns must not pass it by."""
    function = getattr(method, "__func__", None)
    cls = type(getattr(method, "__self__", None))
    if function is not None:
        for name in public_methods():
            if getattr(cls, name, None) is function:
                return name
    return getattr(method, "__name__", "?")


def charged(backend: Backend, method: str, exc: BaseException) -> str:
    """One line charging a failure to the backend's method: call()'s own error says it already; an llmb error the
    plugin raised itself is given the backend's and the method's names."""
    if isinstance(exc, PluginError):
        return message(exc)
    return f"backend {backend.name!r} failed in {method}: {describe_error(exc)}"


@dataclass(frozen=True)
class _Returns:
    """What a method must return: one of these types, and where it holds values (a list's items, a dict's keys and
    values), each of this type."""

    said: str
    types: tuple[type, ...]
    member: type | None = None


# The declarations every command reads (`llmb plugins`, options, settings, the guard): what each must return, checked
# once, where llmb calls the plugin, so a wrong type is the plugin's error and never a TypeError deep in llmb's code.
RETURNS: dict[str, _Returns] = {
    "device_types": _Returns("a list of str", (list, tuple), str),
    "precisions": _Returns("a list of str", (list, tuple), str),
    "vendor_libraries": _Returns("a list of str", (list, tuple), str),
    "settings": _Returns("a list of llmb.Setting", (list, tuple), Setting),
    "peak_sources": _Returns("a dict of str to str", (dict,), str),
    "available": _Returns("a bool", (bool,)),
    # Read as the run is set up: a wrong type was a TypeError naming neither backend nor method.
    "optimizer_options": _Returns("a dict of AdamW options", (dict, type(None))),
    "precision_facts": _Returns("a list of llmb.PrecisionFact", (list, tuple), PrecisionFact),
    # The process group's name, handed to torch.distributed (None: torch's default for the device): any other type
    # once left as torch's "Backend constructor parameter must be string-ish", naming neither plugin nor method.
    "distributed_backend": _Returns("a str or None", (str, type(None))),
}


def _wrong_return(method: str, value: Any) -> str | None:
    """What is wrong with a method's returned value, in one line (types only, never the plugin's text); None where
    it fits or llmb sets no type for the method."""
    expected = RETURNS.get(method)
    if expected is None:
        return None
    if not isinstance(value, expected.types):
        return f"returned {type(value).__name__}, not {expected.said}"
    if expected.member is None:
        return None
    members = [part for pair in value.items() for part in pair] if isinstance(value, dict) else list(value)
    odd = [type(member).__name__ for member in members if not isinstance(member, expected.member)]
    if odd:
        return f"returned a {type(value).__name__} holding {odd[0]}, not {expected.said}"
    if method == "settings":  # each declaration sound too: a name -O can give, a type and values llmb can parse
        problem = declaration_problem(value)
        return f"returned a setting llmb cannot offer: {problem}" if problem else None
    return None


def setup(backend: Backend, device: Any, precision: str, settings: Any) -> Any:
    """Run the backend's setup for a run and keep what it returns as the run's state (llmb.registry.state; a later
    setup replaces it). First, the vendor libraries it names are the only ones whose process-wide replacements the
    guard may accept."""
    vendor_libraries.use(call(backend.vendor_libraries))
    state = call(backend.setup, device, precision, settings)
    run_state.keep(backend, state)
    return state


def resolve_settings(backend: Backend, given: dict[str, str]) -> Any:
    """The backend's settings validated against what it declares, every declared setting's value: an instance of
    its ``Settings`` class where it declares one and takes its settings from it, else a dict."""
    values = resolve(backend.name, list(call(backend.settings)), given)
    typed = backend.Settings
    if typed is not None and type(backend).settings is Backend.settings:
        return typed(**values)
    return values


def describe(registration: Registration) -> dict:
    """What `llmb plugins` shows of a backend: origin, devices, precisions, methods overridden, settings, peaks, and
    the vendor libraries it names as replacing torch process-wide (the only ones the guard accepts such code from).
    A method that fails or returns the wrong type leaves its entry None, and ``errors`` says why by method name (one
    line each): the rest of the backend, and every other backend, is still described."""
    backend = registration.backend
    errors: dict[str, str] = {}

    def asked(method: str, shaped: Callable[[Any], Any]) -> Any:
        try:
            value = shaped(call(getattr(backend, method)))
            json.dumps(value, allow_nan=False)  # what it holds (a setting's default) is listed as JSON too
        except Exception as exc:  # noqa: BLE001 - the plugin's answer, however it fails, is the plugin's error
            errors[method] = charged(backend, method, exc)
            return None
        return value

    return {
        "name": backend.name,
        "plugin": registration.plugin.name,
        "distribution": registration.plugin.distribution,
        "version": registration.plugin.version,
        "device_types": asked("device_types", list),
        "precisions": asked("precisions", list),
        "hardware_available": asked("available", bool),
        "methods_overridden": overridden(backend),
        "settings": asked("settings", lambda settings: [s.describe() for s in settings]),
        "peak_sources": asked("peak_sources", dict),
        "vendor_libraries": asked("vendor_libraries", list),
        "errors": errors,
    }
