"""llmb's version, from its installed metadata: one module that imports nothing of llmb's, so the modules that
record it (records, manifest, report) do not import the package's public API (and, through it, the cpu backend)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("llmb")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0"
