"""The state each backend's setup returned for the run in this process (Backend.setup), handed to the methods that
name a ``state`` parameter, as pluggy hands a hook implementation only the arguments it names.

Apart from llmb.registry.plugins so that the training loop binds a method's state without loading the plugin
machinery (the judge imports the loop for its replay, and importing the judge loads no plugin code:
tests/test_clean_boundaries.py).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

# By backend instance: (the backend, what its setup returned).
_run_states: dict[int, tuple[Any, Any]] = {}


def keep(backend: Any, state: Any) -> None:
    """What the backend's setup returned, as this run's state (a later setup of the same backend replaces it)."""
    _run_states[id(backend)] = (backend, state)


def with_state(method: Callable[..., T]) -> Callable[..., T]:
    """A backend method with this run's state bound, where it names a ``state`` parameter; else the method itself.
    The loops bind theirs once, before the clock runs."""
    backend = getattr(method, "__self__", None)
    if backend is None or not _names_state(getattr(method, "__func__", method)):
        return method
    held = _run_states.get(id(backend))
    return functools.partial(method, state=held[1] if held is not None and held[0] is backend else None)


@functools.cache
def _names_state(function: Callable) -> bool:
    try:
        return "state" in inspect.signature(function).parameters
    except (TypeError, ValueError):  # a builtin without a signature names nothing
        return False
