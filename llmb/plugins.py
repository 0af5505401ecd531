"""Plugin loading (entry point group "llmb" plus the built-in cpu plugin) and calls to the selected plugin."""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from typing import Any

import pluggy

from llmb import __version__, guard, hookspecs
from llmb.errors import LlmbError, PluginError, UsageError
from llmb.settings import Setting, resolve_settings

DEFAULT_PLUGINS = {"cpu": "llmb.default_plugins.cpu"}

pm = pluggy.PluginManager("llmb")
pm.add_hookspecs(hookspecs)

# name -> (distribution, version) for every registered plugin; name -> error for entry points that failed to load.
distributions: dict[str, tuple[str, str]] = {}
load_errors: dict[str, str] = {}
_loaded = False


def load_plugins() -> None:
    """Register the built-in plugins and every installed entry point in group "llmb" (once)."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    # Before any plugin module runs: what the benchmark depends on, to compare after the plugin had its turn.
    guard.ensure_baseline()
    for name, module_name in DEFAULT_PLUGINS.items():
        pm.register(importlib.import_module(module_name), name=name)
        distributions[name] = ("llmb", __version__)
    for ep in entry_points(group="llmb"):
        if pm.has_plugin(ep.name) or pm.is_blocked(ep.name):
            continue
        try:
            pm.register(ep.load(), name=ep.name)
        except Exception as exc:  # a broken third-party plugin must not break llmb
            load_errors[ep.name] = f"{type(exc).__name__}: {exc}"
            continue
        dist = ep.dist
        distributions[ep.name] = (dist.name, dist.version) if dist else ("unknown", "unknown")


def plugin_names() -> list[str]:
    """Registered plugin names: built-ins first, then entry points in installation order."""
    load_plugins()
    return [name for name, _ in pm.list_name_plugin() if name is not None and not name.startswith("_")]


class Plugin:
    """The selected plugin: every hook call goes to it alone, and its failures name it and the hook."""

    def __init__(self, name: str) -> None:
        load_plugins()
        self.module = pm.get_plugin(name)
        if self.module is None:
            if name in load_errors:
                raise LlmbError(f"plugin {name!r} failed to load: {load_errors[name]}")
            known = ", ".join(plugin_names())
            raise UsageError(f"no plugin named {name!r} (installed: {known})")
        self.name = name
        self.distribution, self.version = distributions.get(name, ("unknown", "unknown"))

    def implements(self, hook: str) -> bool:
        return any(impl.plugin is self.module for impl in getattr(pm.hook, hook).get_hookimpls())

    def hooks(self) -> list[str]:
        return sorted(caller.name for caller in pm.get_hookcallers(self.module) or [])

    def call(self, hook: str, **kwargs: Any) -> Any:
        others = [p for p in pm.get_plugins() if p is not self.module]
        caller = pm.subset_hook_caller(hook, remove_plugins=others)
        try:
            return caller(**kwargs)
        except LlmbError:
            raise
        except Exception as exc:
            raise PluginError(self.name, hook, exc) from exc

    # Capability, with the defaults a plugin that says nothing gets.

    def device_types(self) -> list[str]:
        return list(self.call("device_types") or [])

    def precisions(self) -> list[str]:
        return list(self.call("supported_precisions") or ["FP32"])

    def available(self) -> bool:
        return bool(self.call("hardware_available"))

    def settings(self) -> list[Setting]:
        return list(self.call("plugin_settings") or [])

    def resolve_settings(self, given: dict[str, str]) -> dict[str, Any]:
        return resolve_settings(self.name, self.settings(), given)

    def describe(self) -> dict:
        return {
            "name": self.name,
            "distribution": self.distribution,
            "version": self.version,
            "device_types": self.device_types(),
            "precisions": self.precisions(),
            "hardware_available": self.available(),
            "hooks": self.hooks(),
            "settings": [s.describe() for s in self.settings()],
        }


def select_plugin(name: str | None) -> Plugin:
    """The named plugin; without a name, the first installed plugin whose hardware is present, else cpu."""
    if name:
        return Plugin(name)
    for candidate in plugin_names():
        if candidate in DEFAULT_PLUGINS:
            continue
        plugin = Plugin(candidate)
        if plugin.available():
            return plugin
    return Plugin("cpu")
