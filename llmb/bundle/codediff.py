"""The diff of the installed llmb against its release manifest, in a form a reviewer can check without trust.

The manifest holds hashes only, and a hash cannot give back the released text of a changed file. So each changed or
removed file's released text is looked up (a directory of released sources, else the git history of the checkout)
and accepted only if its sha256 is the manifest's. Every diff is a unified diff with the whole file as context:
from it a verifier rebuilds both sides and checks their hashes against the released and the shipped ones.
"""

from __future__ import annotations

import difflib
import subprocess
from pathlib import Path

from llmb.api.errors import LlmbError
from llmb.bundle import manifest

NO_NEWLINE = "\\ No newline at end of file"
GIT_HISTORY_LIMIT = 500


def file_status(released: dict[str, str], current: dict[str, str]) -> list[dict]:
    """One entry per file in either manifest: unchanged, changed, added or removed, with both hashes."""
    entries = []
    for path in sorted(set(released) | set(current)):
        old, new = released.get(path), current.get(path)
        status = "added" if old is None else "removed" if new is None else "unchanged" if old == new else "changed"
        entries.append({"path": path, "status": status, "released_sha256": old, "sha256": new})
    return entries


def _lines(text: str | None) -> list[str]:
    return text.splitlines(keepends=True) if text else []


def _range(lines: list[str]) -> str:
    return f"1,{len(lines)}" if lines else "0,0"


def full_diff(path: str, old: str | None, new: str | None) -> str:
    """A unified diff of one file with the whole file as context (None: the file does not exist on that side)."""
    a, b = _lines(old), _lines(new)
    out = [
        f"--- {'a/' + path if old is not None else '/dev/null'}",
        f"+++ {'b/' + path if new is not None else '/dev/null'}",
        f"@@ -{_range(a)} +{_range(b)} @@",
    ]

    def emit(marker: str, line: str) -> None:
        if line.endswith("\n"):
            out.append(marker + line[:-1])
        else:  # the file's last line has no newline: say so, as git does
            out.extend([marker + line, NO_NEWLINE])

    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag == "equal":
            for line in a[i1:i2]:
                emit(" ", line)
        else:
            for line in a[i1:i2]:
                emit("-", line)
            for line in b[j1:j2]:
                emit("+", line)
    return "\n".join(out) + "\n"


def parse_diffs(text: str) -> dict[str, tuple[str | None, str | None]]:
    """Rebuild both sides of every file in a series of whole-file diffs: path -> (old text, new text).

    Raises ValueError on anything that is not such a diff (the verifier turns that into a failing row).
    """
    lines = text.split("\n")  # not splitlines(): a line may hold \r or other separators that belong to the file
    if lines and lines[-1] == "":
        lines.pop()
    files: dict[str, tuple[str | None, str | None]] = {}
    i = 0
    while i < len(lines):
        if i + 2 >= len(lines) or not (lines[i].startswith("--- ") and lines[i + 1].startswith("+++ ")):
            raise ValueError(f"line {i + 1}: expected a '--- '/'+++ '/'@@' file header")
        old_name, new_name, hunk = lines[i][4:], lines[i + 1][4:], lines[i + 2]
        old_count, new_count = _hunk_counts(hunk, i + 3)
        path = _diff_path(old_name, "a/") or _diff_path(new_name, "b/")
        if path is None or (old_name != "/dev/null" and new_name != "/dev/null" and old_name[2:] != new_name[2:]):
            raise ValueError(f"line {i + 1}: bad file names {old_name!r}, {new_name!r}")
        if path in files:
            raise ValueError(f"{path} appears twice")
        i += 3
        old: list[str] = []
        new: list[str] = []
        while len(old) < old_count or len(new) < new_count:
            if i >= len(lines) or not lines[i] or lines[i][0] not in " -+":
                raise ValueError(f"line {i + 1}: the hunk of {path} ends early")
            marker, content = lines[i][0], lines[i][1:]
            i += 1
            ending = "" if i < len(lines) and lines[i] == NO_NEWLINE else "\n"
            if not ending:
                i += 1
            if marker in " -":
                old.append(content + ending)
            if marker in " +":
                new.append(content + ending)
        if len(old) != old_count or len(new) != new_count:
            raise ValueError(f"the hunk of {path} does not match its counts")
        files[path] = (
            None if old_name == "/dev/null" else "".join(old),
            None if new_name == "/dev/null" else "".join(new),
        )
    return files


def _hunk_counts(hunk: str, number: int) -> tuple[int, int]:
    parts = hunk.split()
    if len(parts) != 4 or parts[0] != "@@" or parts[3] != "@@":
        raise ValueError(f"line {number}: bad hunk header {hunk!r}")
    counts = []
    for part, sign in ((parts[1], "-"), (parts[2], "+")):
        start, _, count = part[1:].partition(",")
        if part[0] != sign or not start.isdigit() or not count.isdigit():
            raise ValueError(f"line {number}: bad hunk header {hunk!r}")
        counts.append(int(count))
    return counts[0], counts[1]


def _diff_path(name: str, prefix: str) -> str | None:
    return name[len(prefix) :] if name.startswith(prefix) and len(name) > len(prefix) else None


def _git(args: list[str], cwd: Path) -> bytes | None:
    try:
        done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def released_text(path: str, sha256: str, package_dir: Path, sources: list[Path]) -> bytes | None:
    """The released bytes of a file whose hash the manifest gives, from a sources directory or git history."""
    relative = Path(path).relative_to(package_dir.name)
    for source in sources:
        for candidate in (source / path, source / relative):
            if candidate.is_file() and manifest.sha256_file(candidate) == sha256:
                return candidate.read_bytes()
    top = _git(["rev-parse", "--show-toplevel"], package_dir)
    if top is None:
        return None
    repo = Path(top.decode().strip())
    in_repo = (package_dir.resolve() / relative).relative_to(repo.resolve()).as_posix()
    log = _git(["log", "--all", "--format=%H", "-n", str(GIT_HISTORY_LIMIT), "--", in_repo], repo) or b""
    for commit in ["HEAD", *log.decode().split()]:
        blob = _git(["show", f"{commit}:{in_repo}"], repo)
        if blob is not None and manifest.sha256_bytes(blob) == sha256:
            return blob
    return None


def code_diff(released: dict, package_dir: Path, sources: list[Path]) -> tuple[list[dict], str]:
    """The status of every package file against the released manifest, and the whole-file diffs of the changes.

    Refuses when the released text of a changed or removed file cannot be found, or a file is not UTF-8 text.
    """
    files = manifest.package_files(package_dir)
    current = {name: manifest.sha256_file(path) for name, path in files.items()}
    status = file_status(released["files"], current)
    diffs = []
    for entry in status:
        if entry["status"] == "unchanged":
            continue
        path = entry["path"]
        old = new = None
        if entry["released_sha256"] is not None:
            blob = released_text(path, entry["released_sha256"], package_dir, sources)
            if blob is None:
                raise LlmbError(
                    f"{path} differs from the release and its released text (sha256 {entry['released_sha256']}) "
                    "cannot be found: pass --release-source DIR with the released llmb sources"
                )
            old = _decode(path, blob)
        if entry["sha256"] is not None:
            new = _decode(path, files[path].read_bytes())
        diffs.append(full_diff(path, old, new))
    return status, "".join(diffs)


def _decode(path: str, blob: bytes) -> str:
    try:
        return blob.decode("utf-8")
    except UnicodeDecodeError:
        raise LlmbError(f"{path} is not UTF-8 text; a changed binary file cannot be shown as a diff") from None
