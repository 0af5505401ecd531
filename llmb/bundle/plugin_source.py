"""A plugin's source, copied into its bundle so anyone can read what ran: the files of its installed distribution
(its git checkout's tracked files where it was installed from one), never installer bookkeeping, build output or a
file that looks like a secret, within a size and file-count limit."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from importlib import metadata
from pathlib import Path
from urllib.parse import urlparse
from urllib.request import url2pathname

from llmb.api.errors import LlmbError
from llmb.bundle import manifest
from llmb.bundle import reader as bundle_io
from llmb.records import (
    PLUGIN_SOURCE_SCHEMA,
)

PLUGIN_SOURCE_LIMIT = 64 * 2**20
PLUGIN_SOURCE_FILES = 1_500  # of the 2,000 entries llmb/bundle/archive.py lets a bundle hold
SKIP_PARTS = {"__pycache__", "build", "dist", ".git", ".tox", ".venv", "venv", "node_modules"}
# Installer bookkeeping, not source (direct_url.json holds the absolute path of the project).
INSTALLER_FILES = {"direct_url.json", "INSTALLER", "REQUESTED"}
PROJECT_FILES = {"pyproject", "setup", "README", "LICENSE", "COPYING", "NOTICE", "MANIFEST"}
# Never copied into a public bundle: private keys, credential stores, secrets files.
SECRET_FILE = re.compile(
    r"(^|/)(id_(rsa|dsa|ecdsa|ed25519)(\.pub)?|\.env(\..*)?|\.netrc|\.pypirc|\.npmrc|\.htpasswd|\.git-credentials"
    r")$"
    r"|\.(pem|key|p12|pfx|jks|keystore|kdbx|ppk|gpg|asc)$"
    r"|(^|[/_.-])(credentials?|secrets?|passwords?|tokens?)([/_.-]|$)",
    re.IGNORECASE,
)


def _skipped(relative: Path) -> bool:
    return (
        any(part in SKIP_PARTS or part.startswith(".") or part.endswith(".egg-info") for part in relative.parts)
        or relative.suffix in (".pyc", ".pyo")
        or relative.name in INSTALLER_FILES
    )


def refused_reason(relative: str) -> str | None:
    """Why a file must never go into a public bundle (a key, a credential, a virtualenv), or None."""
    if SECRET_FILE.search(relative):
        return "a key or credential file"
    parts = relative.split("/")
    if "pyvenv.cfg" in parts or "site-packages" in parts or relative.endswith(("bin/activate", "Scripts/activate")):
        return "part of a virtualenv"
    return None


def _git_files(root: Path) -> list[str] | None:
    """The files git tracks under root (None when root is not in a git checkout or git is missing)."""
    git = shutil.which("git")
    if git is None:
        return None
    try:
        proc = subprocess.run(
            [git, "-C", str(root), "ls-files", "-z", "--cached", "--", "."],
            capture_output=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    return sorted(name for name in proc.stdout.decode("utf-8", "replace").split("\0") if name)


def _package_files(dist: metadata.Distribution, root: Path) -> list[str]:
    """An editable install outside git: the distribution's own packages and the project's build files only."""
    tops = (dist.read_text("top_level.txt") or "").split()
    tops += [ep.value.split(":")[0].split(".")[0] for ep in dist.entry_points if ep.group == "llmb"]
    found = [f.name for f in root.iterdir() if f.is_file() and f.name.split(".")[0] in PROJECT_FILES]
    for top in sorted(set(tops)):
        for base in (root, root / "src"):
            if (base / top).is_dir():
                found += [p.relative_to(root).as_posix() for p in (base / top).rglob("*") if p.is_file()]
            elif (base / f"{top}.py").is_file():
                found.append((base / f"{top}.py").relative_to(root).as_posix())
    return sorted(set(found))


def distribution_files(name: str) -> tuple[str, dict[str, Path]]:
    """How an installed distribution's own files were found (no absolute path: it is published), and the files.

    A wheel install: the files its RECORD lists. An editable install: the files git tracks in its project (else its
    own packages and build files). Byte code, hidden and installer files are left out; a key, credential or
    virtualenv file is refused, as is a name a bundle cannot hold."""
    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        raise LlmbError(f"plugin distribution {name!r} is not installed; its source cannot be bundled") from None
    direct = json.loads(dist.read_text("direct_url.json") or "{}")
    url = urlparse(direct.get("url", ""))
    if "dir_info" in direct and url.scheme == "file":
        root = Path(url2pathname(url.path))
        tracked = _git_files(root)
        origin = "editable install: files tracked by git" if tracked is not None else "editable install: its packages"
        names = tracked if tracked is not None else _package_files(dist, root)
        candidates = {relative: root / relative for relative in names}
    else:
        origin = "installed distribution"
        candidates = {}
        for item in dist.files or []:
            relative = Path(str(item))
            if ".." not in relative.parts:  # scripts in bin/ lie outside: not source
                candidates[relative.as_posix()] = Path(item.locate())
    files = {}
    for relative, path in sorted(candidates.items()):
        reason = refused_reason(relative)
        if reason:
            raise LlmbError(
                f"plugin distribution {name}: {relative} is {reason}; a bundle is public, so it is not copied "
                "(remove it from the distribution, or from git, and package again)"
            )
        if _skipped(Path(relative)) or not path.is_file() or path.is_symlink():
            continue
        try:
            bundle_io.relative_parts(relative)
        except ValueError:
            raise LlmbError(
                f"plugin distribution {name}: {relative!r} is not a plain file name (letters, digits, ._+@=,~-), "
                "which `llmb verify` refuses"
            ) from None
        files[relative] = path
    return origin, files


def copy_plugin_source(name: str, version: str, dest: Path) -> dict:
    """Copy a plugin distribution's own files into the bundle; the record lists every file copied, with its hash."""
    origin, files = distribution_files(name)
    if len(files) > PLUGIN_SOURCE_FILES:
        raise LlmbError(
            f"plugin distribution {name} has {len(files)} files; a bundle holds at most {PLUGIN_SOURCE_FILES} of a "
            f"plugin's ({bundle_io.DEFAULT_LIMITS.members} entries in all, the limit of `llmb verify`)"
        )
    total = sum(path.stat().st_size for path in files.values())
    if total > PLUGIN_SOURCE_LIMIT:
        raise LlmbError(f"plugin distribution {name} has {total / 2**20:.0f} MiB of files; the limit is 64 MiB")
    hashes = {}
    for relative, path in files.items():
        target = dest / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
        hashes[relative] = manifest.sha256_file(target)
    if not any(name.endswith(".py") for name in hashes):
        raise LlmbError(f"no Python source found for plugin distribution {name} ({origin})")
    return {"schema": PLUGIN_SOURCE_SCHEMA, "distribution": name, "version": version, "origin": origin, "files": hashes}
