"""The release manifest: sha256 of every file of the llmb package, shipped inside it, and the known releases.

A submission bundle diffs the installed llmb against it, so a reviewer sees every change a submitter made to the
harness. Regenerate it after changing any file under llmb/ with::

    python -m llmb.bundle.manifest --write

Writing the manifest in llmb's own tree is the release act: it also records the manifest in `llmb/releases.json`,
the list of every released manifest (digest and file hashes) that llmb ships. `llmb verify` trusts only the list of
the installation it runs from: a bundle made against a manifest that is not on it (a submitter edited
llmb/training/loop.py and wrote the manifest in their own copy) is compared with the nearest known release, and its
changes are diffs against that release, never "the release". Like the manifest, the list is generated: on a
conflict, `python scripts/releases_from_git.py main` rebuilds it from main's history and `--write` adds the manifest
being landed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

from llmb.records.codec import RELEASE_MANIFEST_SCHEMA, RELEASES_SCHEMA
from llmb.records.result_files import write_json_atomic
from llmb.spec.fingerprint import RELEASED_MODEL_FINGERPRINT
from llmb.spec.version import __version__

MANIFEST_NAME = "release_manifest.json"
RELEASES_NAME = "releases.json"
PACKAGE_DIR = Path(__file__).resolve().parent.parent
MODEL_PATH = "llmb/model.py"
# The model's shape, part of its definition since release 4 (torch-free, so records read without torch).
SHAPE_PATH = "llmb/spec/shape.py"
LOOP_PATH = "llmb/training/loop.py"
REGENERATE = "python -m llmb.bundle.manifest --write"


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:  # in chunks: a large file never sits in memory whole
        while chunk := f.read(2**20):
            digest.update(chunk)
    return digest.hexdigest()


def package_files(package_dir: Path = PACKAGE_DIR) -> dict[str, Path]:
    """Every file the package ships, by its path relative to the package's parent ("llmb/model.py").

    Left out: byte code, hidden files, the manifest itself (it cannot hash itself) and the list of releases (which
    holds the manifest's digest).
    """
    files = {}
    for path in sorted(package_dir.rglob("*")):
        relative = path.relative_to(package_dir)
        if path.is_dir() or any(part.startswith(".") or part == "__pycache__" for part in relative.parts):
            continue
        if path.suffix in (".pyc", ".pyo") or relative.as_posix() in (MANIFEST_NAME, RELEASES_NAME):
            continue
        files[f"{package_dir.name}/{relative.as_posix()}"] = path
    return files


def compute(package_dir: Path = PACKAGE_DIR) -> dict:
    """The manifest of the package as it is on disk now."""
    return {
        "schema": RELEASE_MANIFEST_SCHEMA,
        "llmb_version": __version__,
        "files": {name: sha256_file(path) for name, path in package_files(package_dir).items()},
    }


def load(package_dir: Path = PACKAGE_DIR) -> dict:
    """The manifest shipped with the package."""
    return json.loads((package_dir / MANIFEST_NAME).read_text())


def problems(manifest: dict) -> list[str]:
    """Why a manifest cannot be a release's (empty when it can): the model file must be the pinned one."""
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict):
        return ["the manifest has no files"]
    if files.get(MODEL_PATH) != RELEASED_MODEL_FINGERPRINT:
        return [f"the manifest's {MODEL_PATH} is not the released model (fingerprint {RELEASED_MODEL_FINGERPRINT})"]
    return []


def digest(manifest: dict) -> str:
    """A manifest's identity: sha256 of its file table in canonical JSON (the version string is not part of it)."""
    files = manifest.get("files") if isinstance(manifest, dict) else None
    return sha256_bytes(json.dumps(files, sort_keys=True, separators=(",", ":")).encode("utf-8"))


def releases(package_dir: Path = PACKAGE_DIR) -> list[dict]:
    """Every released manifest this installation knows: {"llmb_version", "digest", "files"}, oldest first."""
    try:
        data = json.loads((package_dir / RELEASES_NAME).read_text())
    except (OSError, ValueError):
        return []
    return [r for r in data.get("releases", []) if isinstance(r, dict) and isinstance(r.get("files"), dict)]


def known_release(manifest: dict, package_dir: Path = PACKAGE_DIR) -> dict | None:
    """The known release whose file table is exactly this manifest's, or None."""
    wanted = digest(manifest)
    return next((r for r in releases(package_dir) if r.get("digest") == wanted and digest(r) == wanted), None)


def nearest_release(files: dict[str, str], package_dir: Path = PACKAGE_DIR) -> tuple[dict | None, list[str]]:
    """The known release that the given file hashes are closest to (most files equal, newest on a tie), and the
    files that differ from it: changed, added or missing."""
    best, best_changed = None, []
    for release in releases(package_dir):
        known = release["files"]
        changed = sorted(p for p in set(known) | set(files) if known.get(p) != files.get(p))
        if best is None or len(changed) <= len(best_changed):
            best, best_changed = release, changed
    return best, best_changed


def record_release(manifest: dict, package_dir: Path = PACKAGE_DIR) -> bool:
    """Add a manifest to the list of releases (once); True if it was new."""
    if known_release(manifest, package_dir) is not None:
        return False
    entry = {"llmb_version": manifest.get("llmb_version"), "digest": digest(manifest), "files": manifest["files"]}
    listed = releases(package_dir) + [entry]
    write_json_atomic(package_dir / RELEASES_NAME, {"schema": RELEASES_SCHEMA, "releases": listed})
    return True


def write(package_dir: Path = PACKAGE_DIR) -> Path:
    manifest = compute(package_dir)
    refused = problems(manifest)
    if refused:
        raise SystemExit(f"refusing to write the release manifest: {refused[0]}")
    path = write_json_atomic(package_dir / MANIFEST_NAME, manifest)
    record_release(manifest, package_dir)
    return path


def stale_files(package_dir: Path = PACKAGE_DIR) -> list[str]:
    """Files whose hash differs from the shipped manifest, or that it lacks or lists in excess."""
    shipped, current = load(package_dir)["files"], compute(package_dir)["files"]
    return sorted(name for name in set(shipped) | set(current) if shipped.get(name) != current.get(name))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m llmb.bundle.manifest", description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="write llmb/release_manifest.json")
    args = parser.parse_args(argv)
    if args.write:
        print(f"wrote {write()}")
        return 0
    stale = stale_files()
    if stale:
        print(f"release manifest is stale ({', '.join(stale)}): run `{REGENERATE}`", file=sys.stderr)
        return 1
    print("release manifest is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
