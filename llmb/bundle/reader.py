"""Reading a bundle that someone else made, an archive or a folder, under limits, without trusting a byte of it.

A folder is scanned under the limits an archive is unpacked under (llmb.bundle.archive: the archive's own walk and
its limited child process, into a temporary folder that is always removed). Every path built from bundle data must
name a plain file inside the bundle, and no file is read but a regular one, under its size limit.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

# The limits, the name checks and the archive's unpacking are llmb.bundle.archive's (a script run in a child process
# with the standard library only); every reader of bundles imports them from here, as before.
from llmb.bundle.archive import (  # noqa: F401
    DEFAULT_LIMITS,
    HASH_CHUNK,
    MAX_PATH,
    PART_PATTERN,
    BadFile,
    Limits,
    Refused,
    check_part,
    relative_parts,
    unpack,
)

# A file someone else may have put in place is read as llmb's records read theirs (one reader, below the bundle).
from llmb.records.files import read_regular  # noqa: F401

# Top-level names Python imports from the current folder or from a folder on sys.path.
IMPORTABLE_NAMES = {"llmb", "conftest.py", "sitecustomize.py", "usercustomize.py", "__main__.py"}
IMPORTABLE_SUFFIXES = (".py", ".pyc", ".pth", ".so", ".pyd")
MANIFEST_FILE = "MANIFEST.sha256"  # the file that marks a bundle's root (llmb.submit.package writes it)


def inside(root: Path, name: str) -> Path:
    """The path under root that bundle data names, refused unless it is a plain path that stays inside root."""
    path = Path(root).joinpath(*relative_parts(name))
    resolved, base = path.resolve(), Path(root).resolve()
    if resolved != base and base not in resolved.parents:
        raise BadFile(f"{name[:80]!r} leads outside the bundle")
    return path


def _open_plain(root: Path, name: str) -> int:
    """A file descriptor for a regular, singly linked file of the bundle, never through a link."""
    path = inside(root, name)
    current = Path(root)
    for part in relative_parts(name):
        current = current / part
        if current.is_symlink():
            raise BadFile(f"{name} is a link")
    try:
        # O_NONBLOCK: a FIFO put in place of a file must not hang the reader; O_NOFOLLOW: nor a late link.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise BadFile(f"{name} is missing") from None
    except OSError as exc:
        raise BadFile(f"{name} is unreadable ({exc.__class__.__name__})") from None
    info = os.fstat(fd)
    problem = None
    if stat.S_ISDIR(info.st_mode):
        problem = f"{name} is missing (a folder is there)"
    elif not stat.S_ISREG(info.st_mode):
        problem = f"{name} is not a regular file"
    elif info.st_nlink > 1:
        problem = f"{name} has {info.st_nlink} hard links"
    if problem:
        os.close(fd)
        raise BadFile(problem)
    return fd


def read_bytes(root: Path, name: str, max_bytes: int) -> bytes:
    """A file of the bundle, refused before reading when it is larger than max_bytes."""
    fd = _open_plain(root, name)
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size > max_bytes:
            raise BadFile(f"{name} is {size} bytes (limit {max_bytes})")
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:  # it grew while we read
        raise BadFile(f"{name} is over {max_bytes} bytes (limit {max_bytes})")
    return data


def sha256_file(path: Path, max_bytes: int | None = None) -> str:
    """sha256 of a file read in chunks (a large file never sits in memory whole), never through a link."""
    digest = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    read = 0
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise BadFile(f"{path.name} is not a regular file")
        while chunk := f.read(HASH_CHUNK):
            read += len(chunk)
            if max_bytes is not None and read > max_bytes:
                raise BadFile(f"{path.name} is over {max_bytes} bytes")
            digest.update(chunk)
    return digest.hexdigest()


# Folders


def scan_folder(root: Path, limits: Limits = DEFAULT_LIMITS) -> dict[str, int]:
    """Every file of a bundle folder (relative path -> size), refused unless each entry is a plain folder or a
    singly linked regular file with a plain name, within the limits. Nothing is read."""
    files: dict[str, int] = {}
    total = entries = 0
    pending: list[tuple[Path, tuple[str, ...]]] = [(Path(root), ())]
    while pending:
        folder, parts = pending.pop()
        try:
            listing = os.scandir(folder)  # iterated, never listed whole: a million entries stop at the limit
        except OSError as exc:
            raise Refused(f"cannot list {'/'.join(parts) or '.'} ({exc.__class__.__name__})") from None
        with listing:
            for entry in listing:
                rel = "/".join((*parts, entry.name))
                entries += 1
                if entries > limits.members:
                    raise Refused(f"more than {limits.members} members")
                if not PART_PATTERN.match(entry.name):
                    raise Refused(f"name {rel[:120]!r} is not a plain file name")
                info = entry.stat(follow_symlinks=False)
                if stat.S_ISLNK(info.st_mode):
                    raise Refused(f"symlink {rel}")
                if stat.S_ISDIR(info.st_mode):
                    if len(parts) + 1 > limits.depth:
                        raise Refused(f"{rel} is more than {limits.depth} folders deep")
                    pending.append((Path(entry.path), (*parts, entry.name)))
                    continue
                if not stat.S_ISREG(info.st_mode):
                    raise Refused(f"special file {rel} (device, fifo or other)")
                if info.st_nlink > 1:
                    raise Refused(f"hard-linked file {rel} ({info.st_nlink} links)")
                if info.st_size > limits.member_bytes:
                    raise Refused(f"member {rel!r} is {info.st_size} bytes (limit {limits.member_bytes})")
                total += info.st_size
                if total > limits.total_bytes:
                    raise Refused(f"members total more than {limits.total_bytes} bytes")
                files[rel] = info.st_size
    return files


def importable_names(folder: Path, namespaces: bool = True) -> list[str]:
    """Entries of a folder that Python would import if the folder were the current one or on sys.path; without
    ``namespaces``, a folder with no __init__.py (a namespace package, which never wins over an installed one) is
    not counted."""
    found = []
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        name = entry.name
        namespace = entry.is_dir(follow_symlinks=False) and not os.path.lexists(os.path.join(entry.path, "__init__.py"))
        if namespace and not namespaces:
            continue
        if name in IMPORTABLE_NAMES or name.endswith(IMPORTABLE_SUFFIXES):
            found.append(name)
        elif entry.is_dir(follow_symlinks=False) and os.path.lexists(os.path.join(entry.path, "__init__.py")):
            found.append(name + "/")
    return found


def bundle_folders(top: Path, depth: int = DEFAULT_LIMITS.depth) -> list[Path]:
    """The folders under ``top`` (itself included, at most ``depth`` levels down) that hold a MANIFEST.sha256. A
    bundle's own folders hold none, so each is a bundle's root; links are never followed."""
    found = []
    for folder, dirs, files in os.walk(top):
        level = len(Path(folder).relative_to(top).parts)
        if MANIFEST_FILE in files:
            found.append(Path(folder))
            dirs.clear()  # a bundle's insides are its own: nothing below its root is another bundle's root
        elif level >= depth:
            dirs.clear()
    return found


def find_root(extracted: Path, depth: int = DEFAULT_LIMITS.depth) -> Path:
    """The one folder in an unpacked archive (or a folder given) that holds a MANIFEST.sha256, however deep its
    wrapper folders put it within the depth limit: a valid bundle verifies however it is wrapped."""
    found = bundle_folders(extracted, depth)
    if len(found) != 1:
        shown = ", ".join(p.relative_to(extracted).as_posix() or "." for p in found[:3])
        raise Refused(
            f"expected one bundle folder holding {MANIFEST_FILE}, found {len(found)}" + (f" ({shown})" if found else "")
        )
    return found[0]


def _refuse_importable(top: Path, root: Path) -> None:
    """Every folder from the archive's top down to the bundle root: no name there may be importable."""
    folder = root
    while True:
        # Above the root (an archive's wrapper folders, e.g. the repository's llmb/cpu-reference/ layout) a folder
        # named like a package is only a namespace: the bundle is unpacked in a folder of its own, never imported.
        names = importable_names(folder, namespaces=folder == root)
        if names:
            where = folder.relative_to(top).as_posix()
            raise Refused(
                f"importable names at {where if where != '.' else 'the top'}: {', '.join(names[:5])} "
                "(a bundle holds no Python module where Python would import it)"
            )
        if folder == top or top not in folder.parents:
            return
        folder = folder.parent


@contextlib.contextmanager
def open_bundle(path: Path, limits: Limits = DEFAULT_LIMITS) -> Iterator[Path]:
    """The checked root folder of a bundle folder or a .tar.gz of one; a temporary unpacking is removed after."""
    path = Path(path)
    if path.is_dir():
        scan_folder(path, limits)
        # A folder that wraps the bundle (a submitter's folder, a copy of the repository's submissions/ layout) is
        # opened at the bundle's root, as an archive is; a folder with no manifest anywhere is checked as given (its
        # checks say what is missing).
        root = path if (path / MANIFEST_FILE).is_file() or not bundle_folders(path, limits.depth) else None
        root = root or find_root(path, limits.depth)
        _refuse_importable(path, root)
        yield root
        return
    if not path.is_file():
        raise Refused(f"{path} is neither a bundle folder nor a .tar.gz archive")
    tmp = tempfile.mkdtemp(prefix="llmb-verify-")
    try:
        top = Path(tmp) / "bundle"
        top.mkdir()
        unpack(path, top, limits)
        scan_folder(top, limits)  # the unpacked tree gets the folder checks too
        root = find_root(top, limits.depth)
        _refuse_importable(top, root)
        yield root
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
