"""Rebuild llmb/releases.json from a branch's history: every llmb/release_manifest.json that branch has shipped.

    python scripts/releases_from_git.py [BRANCH]        # default: main

Use it to resolve a conflict in llmb/releases.json (take the branch's history, then `python -m llmb.bundle.manifest
--write` adds the manifest being landed), or to drop manifests written on a work branch that never reached the branch.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from llmb.bundle import manifest


def main(branch: str = "main") -> int:
    root = Path(__file__).resolve().parents[1]
    git = ["git", "-C", str(root)]
    path = "llmb/" + manifest.MANIFEST_NAME
    commits = subprocess.run(
        [*git, "log", "--reverse", "--format=%H", branch, "--", path], capture_output=True, text=True, check=True
    ).stdout.split()
    (manifest.PACKAGE_DIR / manifest.RELEASES_NAME).unlink(missing_ok=True)
    added = 0
    for commit in commits:
        shown = subprocess.run([*git, "show", f"{commit}:{path}"], capture_output=True, text=True)
        try:
            released = json.loads(shown.stdout)
        except ValueError:
            continue
        if isinstance(released, dict) and isinstance(released.get("files"), dict):
            added += manifest.record_release(released)
    print(f"{added} releases from {len(commits)} commits of {branch}")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:2]))
