"""The release manifest: sha256 of every file of the llmb package, shipped inside it.

A submission bundle diffs the installed llmb against it, so a reviewer sees every change a submitter made to the
harness. Regenerate it after changing any file under llmb/ with::

    python -m llmb.manifest --write
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

from llmb import __version__
from llmb.fingerprint import RELEASED_MODEL_FINGERPRINT
from llmb.records import RELEASE_MANIFEST_SCHEMA

MANIFEST_NAME = "release_manifest.json"
PACKAGE_DIR = Path(__file__).resolve().parent
MODEL_PATH = "llmb/model.py"
LOOP_PATH = "llmb/train.py"
REGENERATE = "python -m llmb.manifest --write"


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

    Left out: byte code, hidden files and the manifest itself (it cannot hash itself).
    """
    files = {}
    for path in sorted(package_dir.rglob("*")):
        relative = path.relative_to(package_dir)
        if path.is_dir() or any(part.startswith(".") or part == "__pycache__" for part in relative.parts):
            continue
        if path.suffix in (".pyc", ".pyo") or relative.as_posix() == MANIFEST_NAME:
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


def write(package_dir: Path = PACKAGE_DIR) -> Path:
    from llmb.results import write_json_atomic

    manifest = compute(package_dir)
    refused = problems(manifest)
    if refused:
        raise SystemExit(f"refusing to write the release manifest: {refused[0]}")
    return write_json_atomic(package_dir / MANIFEST_NAME, manifest)


def stale_files(package_dir: Path = PACKAGE_DIR) -> list[str]:
    """Files whose hash differs from the shipped manifest, or that it lacks or lists in excess."""
    shipped, current = load(package_dir)["files"], compute(package_dir)["files"]
    return sorted(name for name in set(shipped) | set(current) if shipped.get(name) != current.get(name))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m llmb.manifest", description=__doc__.splitlines()[0])
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
