"""The one hook a plugin implements: ``register_backends(register)``, called on every loaded plugin.

A plugin module (found through the ``llmb`` entry point group) registers its `llmb.Backend` instances::

    @llmb.hookimpl
    def register_backends(register: Callable[[llmb.Backend], None]) -> None:
        register(MyBackend())

Everything else a plugin does is a method of its Backend (llmb/api/backend.py), as simonw/llm's ``register_models``
hands out ``llm.Model`` instances.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from pluggy import HookimplMarker, HookspecMarker

if TYPE_CHECKING:
    from llmb.api.backend import Backend

hookspec = HookspecMarker("llmb")
hookimpl = HookimplMarker("llmb")


@hookspec
def register_backends(register: Callable[[Backend], None]) -> None:
    """Call ``register(backend)`` once for each `llmb.Backend` instance this plugin provides."""
