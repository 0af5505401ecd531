"""What `llmb package-submission` writes beside the bundle folder, and what its --force may replace: the archive
(written whole or not at all), and only a bundle folder or an archive that llmb wrote (nothing of the user's is ever
deleted)."""

from __future__ import annotations

import contextlib
import os
import tarfile
import tempfile
import zlib
from pathlib import Path

from llmb.api.errors import LlmbError, UsageError
from llmb.bundle.layout import MANIFEST_FILE


def write_archive(root: Path, archive: Path, arcname: str) -> Path:
    """A .tar.gz of the bundle: regular files and folders only, owner and mode normalised. Written whole or not at
    all: a temporary file renamed into place, removed on any failure (a full disk leaves no .tmp behind)."""

    def normalise(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        info.mode = 0o755 if info.isdir() else 0o644
        return info

    fd, tmp = tempfile.mkstemp(prefix=f".{archive.name}.", suffix=".tmp", dir=archive.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            with tarfile.open(fileobj=f, mode="w:gz") as tar:
                tar.add(root, arcname=arcname, filter=normalise)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, archive)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            why = exc.strerror or exc.__class__.__name__
            raise LlmbError(f"--archive: {archive} not written ({why}); the bundle folder {root} is whole") from None
        raise
    return archive


def written_by_llmb(folder: Path) -> str | None:
    """None when every file under ``folder`` is one its MANIFEST.sha256 lists (a bundle llmb wrote, which --force
    may replace), else the first file that is not (something llmb did not write, which it never deletes)."""
    try:
        listed = {
            line.split("  ", 1)[1]
            for line in (folder / MANIFEST_FILE).read_text(encoding="utf-8").splitlines()
            if "  " in line
        }
    except (OSError, UnicodeDecodeError):
        return f"{MANIFEST_FILE} (missing or unreadable: not a bundle llmb wrote)"
    for path in sorted(folder.rglob("*")):
        name = path.relative_to(folder).as_posix()
        if path.is_symlink() or (not path.is_dir() and name != MANIFEST_FILE and name not in listed):
            return name
    return None


def check_archive_replaceable(archive: Path, arcname: str, force: bool) -> None:
    """An archive in the way is replaced only with --force, and only when it is one llmb wrote of this bundle: a
    gzipped tar whose every member lies under ``arcname`` (a file of the user's by the same name is never lost)."""
    if not os.path.lexists(archive):
        return
    if not force:
        raise UsageError(f"{archive} exists: remove it or pass --force to replace it")
    refuse = UsageError(
        f"--force replaces only an archive llmb wrote of {arcname}, and {archive} is not one: move it out of the way, "
        "or give another --out or --system"
    )
    if archive.is_symlink() or not archive.is_file():
        raise refuse
    try:
        with tarfile.open(archive, mode="r|gz") as tar:  # streamed: the members' names only, nothing extracted
            for member in tar:
                if member.name != arcname and not member.name.startswith(f"{arcname}/"):
                    raise refuse
    except (OSError, EOFError, tarfile.TarError, zlib.error):
        raise refuse from None


def check_replaceable(final: Path, force: bool) -> None:
    """A bundle folder in the way is replaced only with --force, and only when llmb wrote all of it."""
    if not os.path.lexists(final):
        return
    if not force:
        raise UsageError(f"{final} exists: remove it or pass --force to replace it")
    foreign = written_by_llmb(final) if final.is_dir() and not final.is_symlink() else final.name
    if foreign:
        raise UsageError(
            f"--force replaces only a bundle llmb wrote, and {final} holds {foreign}, which its manifest does not "
            "list: move what you keep out of it, or give another --out or --system"
        )
