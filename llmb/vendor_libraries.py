"""Vendor libraries whose process-wide replacements the integrity guard accepts: pinned releases, checked on disk.

A backend may set up vendor libraries (the rules' part (a)), and some replace torch's functions and aten kernels for
the whole process when they load or optimise a model: IPEX 2.8.0's `ipex.optimize` replaces `torch.embedding_bag`,
two `torch.Tensor` methods and about 30 aten CPU kernels (`aten::sum.dim_IntList`, `aten::index_select`, ...). By
identity alone the guard (llmb/guard.py) cannot tell that from a cheat, so it accepts such a change only when all of
these hold, and records it:

1. the library is a release listed in `KNOWN` below (a new release is added here, after reading what it replaces);
2. its installed files are the ones its wheel shipped: every file pip hashed in the distribution's RECORD matches;
3. the replacement is the library's own: a Python function whose code was compiled from one of those files, or an
   aten kernel that the dispatcher says was registered from the library's C++ source tree (`registered at ...`
   names the source file the binary was built from; a `torch.library` registration from Python reads `/dev/null`).

Residual risk (docs/integrity.md): a plugin can compile its own code under a filename inside the library, or build a
C++ extension whose registration paths imitate the library's; only reading the plugin source closes that.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import importlib.metadata
import types
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class VendorLibrary:
    distribution: str
    module: str
    versions: tuple[str, ...]
    kernel_sources: tuple[str, ...]  # where its aten kernels say they were registered (its build tree)

    def label(self, version: str) -> str:
        return f"{self.distribution} {version}"


KNOWN: tuple[VendorLibrary, ...] = (
    # Built from /opt/workspace/ipex-cpu-dev (measured: `torch._C._dispatch_dump("aten::sum.dim_IntList")` after
    # ipex.optimize reads "CPU: registered at /opt/workspace/ipex-cpu-dev/csrc/cpu/aten/Sum.cpp:83").
    VendorLibrary(
        "intel-extension-for-pytorch", "intel_extension_for_pytorch", ("2.8.0",), ("/opt/workspace/ipex-cpu-dev/",)
    ),
)


@dataclass(frozen=True)
class Installed:
    library: VendorLibrary
    version: str
    root: Path  # the library's package directory
    intact: bool
    detail: str


def _record_hash_matches(path: Path, expected) -> bool:
    digest = hashlib.new(expected.mode)
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode() == expected.value


@functools.cache
def installed(library: VendorLibrary) -> Installed | None:
    """The library as installed here, its files checked against its RECORD once per process; None if absent."""
    try:
        dist = importlib.metadata.distribution(library.distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
    version = dist.version
    root = Path(str(dist.locate_file(library.module))).resolve()
    if version not in library.versions:
        return Installed(library, version, root, False, f"{library.label(version)} is not a release llmb knows")
    for entry in dist.files or []:
        if entry.hash is None or not str(entry).startswith(f"{library.module}/"):
            continue
        path = Path(str(dist.locate_file(entry)))
        try:
            ok = _record_hash_matches(path, entry.hash)
        except OSError:
            ok = False
        if not ok:
            return Installed(library, version, root, False, f"{entry} differs from the wheel's RECORD")
    return Installed(library, version, root, True, "files match the wheel's RECORD")


def _intact() -> list[Installed]:
    return [found for library in KNOWN if (found := installed(library)) is not None and found.intact]


def owner_of_object(value: object) -> str | None:
    """The intact known library whose file the function's code was compiled from, or None."""
    code = getattr(value, "__code__", None)
    if not isinstance(code, types.CodeType):
        return None
    try:
        source = Path(code.co_filename).resolve()
    except (OSError, ValueError):
        return None
    for found in _intact():
        if source.is_relative_to(found.root):
            return found.library.label(found.version)
    return None


def owner_of_kernels(locations: list[str]) -> str | None:
    """The intact known library from whose source tree every one of these aten kernels was registered, or None."""
    if not locations:
        return None
    for found in _intact():
        if all(where.startswith(found.library.kernel_sources) for where in locations):
            return found.library.label(found.version)
    return None
