"""Vendor libraries whose process-wide replacements the integrity guard accepts: named by the plugin, known by llmb's
pins of their official releases, checked on disk.

A backend may set up vendor libraries (the rules' part (a)), and some replace torch's functions and aten kernels for
the whole process when they load or optimise a model: IPEX 2.8.0's `ipex.optimize` replaces `torch.embedding_bag`,
two `torch.Tensor` methods and about 30 aten CPU kernels (`aten::sum.dim_IntList`, `aten::index_select`, ...). By
identity alone the guard (llmb/audit/guard.py) cannot tell that from a cheat, so it accepts such a change only when all
of these hold, and records it:

1. the running backend names the library (`Backend.vendor_libraries`: the xpu plugin names IPEX), so no other
   plugin's run accepts what that library does;
2. the library is a release llmb holds pins for: llmb/audit/vendor_releases/ holds, per release, the sha256 of every
   file of the library's package in each official wheel, its module and where its aten kernels say they were
   registered (its build tree: IPEX 2.8.0's reads /opt/workspace/ipex-cpu-dev/, measured with
   `torch._C._dispatch_dump("aten::sum.dim_IntList")` after `ipex.optimize`). They are written by
   `python -m llmb.audit.vendor_libraries pin WHEEL... --kernel-source PATH` from wheels pip downloaded from the
   registry, which checks each wheel against the index's hash: a new library or release is a data file, never an
   edit to llmb's code, and a plugin cannot widen what counts as the library's;
3. its installed files are one pinned wheel's, byte for byte. A wheel's own RECORD is never trusted: a look-alike
   wheel writes a RECORD that matches its own files. The installed package must hold exactly one pinned wheel's files
   (byte code caches aside), so no file can be added either;
4. the replacement is the library's own: a Python function whose code was compiled from one of those files, or an
   aten kernel that the dispatcher says was registered from the library's pinned source tree (`registered at ...`
   names the source file the binary was built from; a `torch.library` registration from Python reads `/dev/null`).

Residual risk (docs/integrity.md): a plugin can compile its own code under a filename inside the library, plant byte
code in the library's `__pycache__` that claims its source's size and time, or build a C++ extension whose
registration paths imitate the library's; only reading the plugin source closes that.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import importlib.metadata
import json
import re
import sys
import types
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from llmb.bundle.manifest import sha256_file


@dataclass(frozen=True)
class VendorLibrary:
    """A library as llmb's pins describe it: its distribution, its module, where its aten kernels were registered from
    (its build tree), and the releases pinned."""

    distribution: str
    module: str
    versions: tuple[str, ...]
    kernel_sources: tuple[str, ...]

    def label(self, version: str) -> str:
        return f"{self.distribution} {version}"


@dataclass(frozen=True)
class Installed:
    library: VendorLibrary
    version: str
    root: Path  # the library's package directory
    intact: bool
    detail: str


RELEASES_DIR = Path(__file__).resolve().parent / "vendor_releases"
RELEASE_PINS_SCHEMA = "llmb.vendor-release/2"
BYTE_CODE_DIR = "__pycache__"  # written by the interpreter after install; never part of a wheel's pinned files

# The distributions the running backend named (Backend.vendor_libraries), set before its setup: only their
# replacements can be accepted in this process.
_named: tuple[str, ...] = ()


def normalise(distribution: str) -> str:
    """A distribution's name as the registry compares it (PEP 503): lower case, runs of -_. as one dash."""
    return re.sub(r"[-_.]+", "-", distribution).lower()


def use(distributions: Iterable[str]) -> None:
    """Name the vendor libraries the running backend sets up; replacements by any other library are not accepted."""
    global _named
    _named = tuple(sorted({normalise(str(name)) for name in distributions}))


def pins_path(library: VendorLibrary, version: str) -> Path:
    return RELEASES_DIR / f"{library.distribution}-{version}.json"


def _pins(distribution: str) -> list[dict]:
    found = []
    for path in sorted(RELEASES_DIR.glob("*.json")) if RELEASES_DIR.is_dir() else []:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if data.get("schema") == RELEASE_PINS_SCHEMA and normalise(data.get("distribution", "")) == distribution:
            found.append(data)
    return found


def pinned(distribution: str) -> VendorLibrary | None:
    """The library as llmb's pins describe it, or None: no release of it is pinned."""
    releases = _pins(normalise(distribution))
    if not releases:
        return None
    latest = releases[-1]
    return VendorLibrary(
        latest["distribution"],
        latest["module"],
        tuple(data["version"] for data in releases),
        tuple(latest.get("kernel_sources") or ()),
    )


def _package_files(root: Path, module: str) -> dict[str, Path]:
    """The installed package's files by their path in a wheel ("module/sub/file.py"), byte code caches aside."""
    return {
        f"{module}/{path.relative_to(root).as_posix()}": path
        for path in sorted(root.rglob("*"))
        if not path.is_dir() and BYTE_CODE_DIR not in path.relative_to(root).parts
    }


def _wheel_difference(pinned: dict[str, str], files: dict[str, Path]) -> str | None:
    """The first way these installed files differ from one pinned wheel's, or None when they are that wheel's."""
    missing = sorted(set(pinned) - set(files))
    if missing:
        return f"{missing[0]} is missing"
    added = sorted(set(files) - set(pinned))
    if added:
        return f"{added[0]} is in no official wheel"
    for name, path in files.items():
        try:
            if sha256_file(path) != pinned[name]:
                return f"{name} differs from the official wheel's"
        except OSError as error:
            return f"{name} cannot be read ({error.strerror})"
    return None


@functools.cache
def installed(library: VendorLibrary) -> Installed | None:
    """The library as installed here, its files checked against the pinned official wheels once per process; None if
    absent."""
    try:
        dist = importlib.metadata.distribution(library.distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
    version = dist.version
    root = Path(str(dist.locate_file(library.module))).resolve()
    pins = pins_path(library, version)
    if version not in library.versions or not pins.is_file():
        return Installed(library, version, root, False, f"{library.label(version)} is not a release llmb knows")
    wheels = json.loads(pins.read_text())["wheels"]
    files = _package_files(root, library.module)
    # The wheel for this interpreter shares the most file names with what is installed; only it is hashed.
    name, wheel = max(wheels.items(), key=lambda item: (len(set(item[1]["files"]) & set(files)), item[0]))
    difference = _wheel_difference(wheel["files"], files)
    if difference is not None:
        return Installed(library, version, root, False, f"{difference} ({name})")
    return Installed(library, version, root, True, f"files match the official {name}")


def pin(wheels: list[Path], kernel_sources: tuple[str, ...] = (), module: str | None = None) -> dict[Path, dict]:
    """The pins of official wheels, grouped by the file they are written to: every file of the library's package in
    each wheel, by its sha256, and the wheel's own sha256 (compare it with the registry's listing). The module is the
    wheel's one top-level package unless given; the kernel sources, unless given, are those already pinned."""
    out: dict[Path, dict] = {}
    for wheel_path in wheels:
        distribution, version = wheel_path.name.split("-")[:2]
        distribution = normalise(distribution)
        with zipfile.ZipFile(wheel_path) as archive:
            names = [item.filename for item in archive.infolist() if not item.is_dir()]
            packages = sorted(
                {n.split("/")[0] for n in names if "/" in n and not n.split("/")[0].endswith((".dist-info", ".data"))}
            )
            package = module or (packages[0] if len(packages) == 1 else None)
            if package is None:
                raise ValueError(
                    f"{wheel_path.name}: {len(packages)} top-level packages ({', '.join(packages)}); give --module"
                )
            files = {n: hashlib.sha256(archive.read(n)).hexdigest() for n in names if n.startswith(f"{package}/")}
        known = pinned(distribution)
        sources = tuple(kernel_sources) or (known.kernel_sources if known else ())
        library = VendorLibrary(distribution, package, (version,), sources)
        target = out.setdefault(
            pins_path(library, version),
            {
                "schema": RELEASE_PINS_SCHEMA,
                "distribution": distribution,
                "version": version,
                "module": package,
                "kernel_sources": list(sources),
                "wheels": {},
            },
        )
        target["wheels"][wheel_path.name] = {"sha256": sha256_file(wheel_path), "files": dict(sorted(files.items()))}
    return out


def _intact() -> list[Installed]:
    """The named libraries that are pinned releases, installed intact."""
    libraries = [library for name in _named if (library := pinned(name)) is not None]
    return [found for library in libraries if (found := installed(library)) is not None and found.intact]


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m llmb.audit.vendor_libraries",
        description="Pin official release wheels of a vendor library (download them first: pip download "
        "DIST==VERSION --no-deps --only-binary=:all: --python-version 3.X --platform manylinux_2_28_x86_64).",
    )
    parser.add_argument("command", choices=["pin"])
    parser.add_argument("wheels", nargs="+", type=Path)
    parser.add_argument(
        "--kernel-source",
        action="append",
        default=[],
        help="where the library's aten kernels say they were registered (its build tree; see the dispatcher's dump)",
    )
    parser.add_argument("--module", default=None, help="the library's package, where the wheel holds several")
    args = parser.parse_args(argv)
    try:
        pinned_files = pin(args.wheels, tuple(args.kernel_source), args.module)
    except (OSError, ValueError, zipfile.BadZipFile) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    for path, data in pinned_files.items():
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps(data, indent=1) + "\n")
        print(f"wrote {path} ({len(data['wheels'])} wheels)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
