"""llmb: a vendor-neutral benchmark of LLM training throughput.

The public API for plugins is what this module exports. Importing it imports no torch (the command line's --help
must not wait for torch); `llmb.CpuBackend` is loaded, with torch, on first use.
"""

from typing import TYPE_CHECKING

from llmb.api.backend import Backend, EnergyCounter, Peak, PrecisionFact
from llmb.api.errors import LlmbError, UsageError
from llmb.api.hookspecs import hookimpl
from llmb.api.settings import PluginSettings, Setting, option

if TYPE_CHECKING:
    from llmb.default_plugins.cpu import CpuBackend

__all__ = [
    "Backend",
    "CpuBackend",
    "EnergyCounter",
    "LlmbError",
    "Peak",
    "PluginSettings",
    "PrecisionFact",
    "Setting",
    "UsageError",
    "hookimpl",
    "option",
    "__version__",
]


def __getattr__(name: str) -> "str | type[CpuBackend]":
    # Loaded on first use (PEP 562): the reference backend imports torch, and importlib.metadata (llmb.spec.version)
    # costs a few hundred ms on a loaded machine, which `llmb --help` must not pay.
    if name == "__version__":
        # Lazy (PEP 562): importlib.metadata costs `llmb --help` a few hundred ms.
        from llmb.spec.version import __version__

        return __version__
    if name == "CpuBackend":
        # Lazy (PEP 562): the reference backend imports torch; `import llmb` must not.
        from llmb.default_plugins.cpu import CpuBackend

        return CpuBackend
    raise AttributeError(f"module 'llmb' has no attribute {name!r}")
