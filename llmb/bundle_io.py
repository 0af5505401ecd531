"""Reading a bundle that someone else made: an archive or a folder, under limits, without trusting a byte of it.

An archive is opened as gzip only, through a reader that counts what it decompresses; its raw 512-byte tar headers
are walked here before `tarfile` sees them (tarfile reads a GNU long name or a pax header whole, and parses a long
pax header in quadratic time), and it is unpacked in a child process under memory, CPU-time, file-size and
wall-clock limits into a temporary folder that is always removed. A folder gets the same limits. Every path built
from bundle data must name a plain file inside the bundle.

The child runs this file as a script (`python -I -S bundle_io.py unpack ...`), so everything above `main` uses the
standard library only: nothing from the current folder or from llmb is imported into the process that unpacks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

BLOCK = 512
# One path component: what the packager writes (results, plugin sources), nothing a shell or a terminal reads twice.
PART_PATTERN = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._+@=,~-]{0,127}$|^\.[A-Za-z0-9_][A-Za-z0-9._+@=,~-]{0,126}$")
MAX_PATH = 255
# Top-level names Python imports from the current folder or from a folder on sys.path.
IMPORTABLE_NAMES = {"llmb", "conftest.py", "sitecustomize.py", "usercustomize.py", "__main__.py"}
IMPORTABLE_SUFFIXES = (".py", ".pyc", ".pth", ".so", ".pyd")
MANIFEST_FILE = "MANIFEST.sha256"  # the file that marks a bundle's root (llmb.submission writes it)
HASH_CHUNK = 2**20


@dataclass(frozen=True)
class Limits:
    """What a bundle may hold before it is refused unread (the README's Submissions section states them)."""

    member_bytes: int = 64 * 2**20  # one file
    total_bytes: int = 256 * 2**20  # all files together
    members: int = 2_000  # files and folders (unpacking ~1 ms each on a loaded 2-core machine: well inside the clock)
    depth: int = 16  # folders below the root
    json_bytes: int = 4 * 2**20  # a JSON file is refused unread above this
    text_bytes: int = 16 * 2**20  # any other text file (the code diff)
    pax_bytes: int = 8192  # one pax extended header
    seconds: float = 8.0  # wall clock for unpacking an archive
    cpu_seconds: int = 6  # CPU time of the unpacking child
    memory_bytes: int = 384 * 2**20  # address space of the unpacking child
    ratio: int = 200  # decompressed to compressed bytes, past the first 32 MiB (real bundles are text: about 10:1)

    def stream_bytes(self, compressed: int) -> int:
        """The most an archive may decompress to: its files, a header (and a pax header) each, the end; and no
        more than `ratio` times its size (a gzip of zeros inflates 1000:1 and would only waste the time limit)."""
        valid = self.total_bytes + self.members * (3 * BLOCK + self.pax_bytes) + 20 * BLOCK
        return min(valid, max(32 * 2**20, self.ratio * compressed))


DEFAULT_LIMITS = Limits()


class Refused(Exception):
    """The bundle cannot be read safely; nothing further is checked."""


class BadFile(ValueError):
    """One file of a bundle cannot be read safely (missing, a link, too large, ...): a failing row, not a refusal."""


def check_part(part: str, what: str = "name") -> str:
    """One path component (or a distribution name) against the strict pattern; ValueError otherwise."""
    if not PART_PATTERN.match(part):
        raise BadFile(f"{what} {part[:80]!r} is not a plain file name")
    return part


def relative_parts(name: str, what: str = "path") -> tuple[str, ...]:
    """A relative path from bundle data, split and checked: plain components only, no '..', no absolute path."""
    if not isinstance(name, str) or not name or len(name) > MAX_PATH or name.startswith("/") or "\\" in name:
        raise BadFile(f"{what} {str(name)[:80]!r} is not a plain relative path")
    parts = tuple(p for p in name.split("/") if p not in ("", "."))
    if not parts:
        raise BadFile(f"{what} {name[:80]!r} is empty")
    for part in parts:
        check_part(part, what)
    return parts


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


def read_regular(path: Path, max_bytes: int) -> bytes:
    """A file someone else may have put in place (a result, a log, a system file): refused unless it is a regular
    file of at most max_bytes, and never waited on (a FIFO named x.json would hang a plain open())."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise BadFile(f"{path}: unreadable ({exc.strerror or exc.__class__.__name__})") from None
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise BadFile(f"{path}: not a regular file")
        if info.st_size > max_bytes:
            raise BadFile(f"{path}: {info.st_size} bytes (limit {max_bytes})")
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise BadFile(f"{path}: over {max_bytes} bytes (limit {max_bytes})")
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


def find_root(extracted: Path) -> Path:
    """The one folder in an unpacked archive that holds a MANIFEST.sha256 (at most three levels down)."""
    found = [
        Path(d)
        for d, _, files in os.walk(extracted)
        if MANIFEST_FILE in files and len(Path(d).relative_to(extracted).parts) <= 3
    ]
    if len(found) != 1:
        raise Refused(f"expected one bundle folder holding {MANIFEST_FILE}, found {len(found)}")
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
        _refuse_importable(path, path)
        yield path
        return
    if not path.is_file():
        raise Refused(f"{path} is neither a bundle folder nor a .tar.gz archive")
    tmp = tempfile.mkdtemp(prefix="llmb-verify-")
    try:
        top = Path(tmp) / "bundle"
        top.mkdir()
        unpack(path, top, limits)
        scan_folder(top, limits)  # the unpacked tree gets the folder checks too
        root = find_root(top)
        _refuse_importable(top, root)
        yield root
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# Archives


class CountingReader:
    """A gzip stream that refuses to decompress more than a budget (a 1 KB archive may inflate to gigabytes)."""

    def __init__(self, path: Path, budget: int) -> None:
        raw = open(path, "rb")  # noqa: SIM115 (closed in close())
        magic = raw.read(2)
        raw.seek(0)
        if magic != b"\x1f\x8b":
            raw.close()
            raise Refused("not a readable tar archive: not gzip-compressed (only .tar.gz is accepted)")
        self.raw, self.gzip, self.budget, self.count = raw, gzip.GzipFile(fileobj=raw, mode="rb"), budget, 0

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            size = self.budget + 1 - self.count
        data = self.gzip.read(min(size, self.budget + 1 - self.count))
        self.count += len(data)
        if self.count > self.budget:
            raise Refused(f"decompresses to more than {self.budget} bytes")
        return data

    def read_exactly(self, size: int) -> bytes:
        data = self.read(size)
        if len(data) != size:
            raise Refused("not a readable tar archive: truncated")
        return data

    def skip(self, size: int) -> None:
        while size > 0:
            chunk = self.read(min(size, HASH_CHUNK))
            if not chunk:
                raise Refused("not a readable tar archive: truncated")
            size -= len(chunk)

    def close(self) -> None:
        self.gzip.close()
        self.raw.close()


@dataclass(frozen=True)
class Member:
    name: str  # normalised: no "./" prefix, no trailing "/"
    kind: str  # "file" or "dir"
    size: int


def _text(field: bytes) -> str:
    return field.split(b"\0", 1)[0].decode("utf-8")


def _number(field: bytes) -> int:
    if field[:1] and field[0] & 0x80:
        raise Refused("not a readable tar archive: a base-256 number in a header (far over any limit)")
    text = field.split(b"\0", 1)[0].strip(b" ")
    if not re.fullmatch(rb"[0-7]*", text):
        raise Refused("not a readable tar archive: a malformed number in a header")
    return int(text or b"0", 8)


def _pax_records(data: bytes) -> dict[str, str]:
    """A pax header's records ("LENGTH KEY=VALUE\\n"), parsed in one linear pass."""
    records, pos = {}, 0
    while pos < len(data):
        if data[pos:].strip(b"\0") == b"":
            break
        space = data.find(b" ", pos, pos + 12)
        if space < 0 or not data[pos:space].isdigit():
            raise Refused("malformed pax header")
        length = int(data[pos:space])
        record = data[space + 1 : pos + length]
        if length <= space - pos or pos + length > len(data) or not record.endswith(b"\n") or b"=" not in record:
            raise Refused("malformed pax header")
        key, _, value = record[:-1].partition(b"=")
        records[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
        pos += length
    return records


TYPE_REFUSALS = {
    b"1": "link",
    b"2": "link",
    b"L": "GNU long-name header",
    b"K": "GNU long-link header",
    b"g": "global pax header",
    b"S": "sparse member",
    b"3": "special file (device, fifo or other)",
    b"4": "special file (device, fifo or other)",
    b"6": "special file (device, fifo or other)",
    b"7": "special file (device, fifo or other)",
}


def walk_headers(reader: CountingReader, limits: Limits) -> list[Member]:
    """Every member of a tar stream from its raw headers, refusing anything but plain files and folders with plain
    names within the limits, before tarfile reads a single header."""
    members: list[Member] = []
    seen: set[str] = set()
    total = 0
    pax: dict[str, str] | None = None
    while True:
        block = reader.read(BLOCK)
        if len(block) < BLOCK:
            raise Refused("not a readable tar archive: truncated (no end-of-archive marker)")
        if block == bytes(BLOCK):
            return members
        stored = _number(block[148:156])
        if stored != sum(block[:148]) + 8 * 0x20 + sum(block[156:]):
            raise Refused("not a readable tar archive: a header's checksum is wrong")
        kind, size = block[156:157], _number(block[124:136])
        try:
            name, prefix = _text(block[0:100]), _text(block[345:500])
        except UnicodeDecodeError:
            raise Refused("a member name that is not UTF-8") from None
        if kind == b"x":
            if pax is not None:
                raise Refused("two pax headers in a row")
            if size > limits.pax_bytes:
                raise Refused(f"a pax header of {size} bytes (limit {limits.pax_bytes})")
            data = reader.read_exactly(size)
            reader.skip(-size % BLOCK)
            pax = _pax_records(data)
            if "linkpath" in pax:
                raise Refused(f"link {pax.get('path', name)!r} -> {pax['linkpath'][:80]!r}")
            if any(key.startswith("GNU.sparse") for key in pax):
                raise Refused(f"sparse member {pax.get('path', name)!r}")
            continue
        if kind in TYPE_REFUSALS:
            hint = " (archive names over 100 characters with `tar --format=pax`)" if kind in (b"L", b"K") else ""
            raise Refused(f"{TYPE_REFUSALS[kind]} {name!r}{hint}")
        if kind == b"\0" and name.endswith("/"):
            kind = b"5"  # an old-style folder, as tarfile reads it
        if kind not in (b"0", b"\0", b"5"):
            raise Refused(f"unsupported member type {kind!r} for {name!r}")
        if prefix:
            name = f"{prefix}/{name}"
        if pax is not None:
            name = pax.get("path", name)
            if "size" in pax:
                if not pax["size"].isdigit():
                    raise Refused("malformed pax header")
                size = int(pax["size"])
            pax = None
        member = _member(name, "dir" if kind == b"5" else "file", size, limits)
        if member.kind == "dir" and size:
            raise Refused(f"folder {name!r} declares {size} bytes of data")
        if member.name:
            if member.name in seen:
                raise Refused(f"duplicate member {member.name!r} (the last copy would silently win)")
            seen.add(member.name)
        members.append(member)
        if len(members) > limits.members:
            raise Refused(f"more than {limits.members} members")
        total += member.size
        if total > limits.total_bytes:
            raise Refused(f"members total more than {limits.total_bytes} bytes")
        reader.skip(size + (-size % BLOCK))


def _member(name: str, kind: str, size: int, limits: Limits) -> Member:
    if name.startswith(("/", "\\")) or ":" in name.split("/", 1)[0]:
        raise Refused(f"absolute path {name!r}")
    if "\\" in name or ".." in name.split("/"):
        raise Refused(f"path escapes the folder {name!r}")
    if len(name) > MAX_PATH:
        raise Refused(f"member name of {len(name)} characters (limit {MAX_PATH})")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if not parts and kind == "file":
        raise Refused(f"member with an empty name {name!r}")
    for part in parts:
        if not PART_PATTERN.match(part):
            raise Refused(f"member name {name!r} is not a plain file name")
    if len(parts) > limits.depth + 1:
        raise Refused(f"member {name!r} is more than {limits.depth} folders deep")
    if size > limits.member_bytes:
        raise Refused(f"member {name!r} is {size} bytes (limit {limits.member_bytes})")
    return Member("/".join(parts), kind, size)


def extract(archive: Path, dest: Path, limits: Limits) -> int:
    """Walk the headers, then unpack with tarfile (its data filter as a second line), checking that tarfile reads
    the same members in the same order. Runs in the child process."""
    reader = CountingReader(archive, limits.stream_bytes(archive.stat().st_size))
    try:
        members = walk_headers(reader, limits)
    finally:
        reader.close()
    reader = CountingReader(archive, limits.stream_bytes(archive.stat().st_size))
    try:
        with tarfile.open(fileobj=reader, mode="r|") as tar:
            for index, info in enumerate(tar):
                expected = members[index] if index < len(members) else None
                got = Member(
                    "/".join(p for p in info.name.split("/") if p not in ("", ".")),
                    "dir" if info.isdir() else "file",
                    info.size,
                )
                if got != expected or not (info.isreg() or info.isdir()):
                    raise Refused("tarfile reads the archive differently from its headers")
                if got.name:
                    tar.extract(info, dest, filter="data")
    finally:
        reader.close()
    return len(members)


def _limit_self(limits: Limits) -> None:
    import resource

    for which, value in (
        (resource.RLIMIT_AS, limits.memory_bytes),
        (resource.RLIMIT_CPU, limits.cpu_seconds),
        (resource.RLIMIT_FSIZE, limits.member_bytes + BLOCK),
        (resource.RLIMIT_CORE, 0),
        (resource.RLIMIT_NOFILE, 64),
    ):
        _, hard = resource.getrlimit(which)
        soft = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(which, (soft, soft if which != resource.RLIMIT_CPU else hard))


def child_command(archive: Path, dest: Path, limits: Limits) -> list[str]:
    """This file run as a script by the same interpreter, isolated from the environment and the current folder."""
    return [
        sys.executable,
        "-I",  # no PYTHON* variables, no user site, not the current folder on sys.path
        "-S",  # no site-packages either: the child needs the standard library only
        str(Path(__file__).resolve()),
        "unpack",
        str(Path(archive).resolve()),
        str(Path(dest).resolve()),
        json.dumps(dataclasses.asdict(limits)),
    ]


def unpack(archive: Path, dest: Path, limits: Limits = DEFAULT_LIMITS) -> int:
    """Unpack a .tar.gz into dest (an empty folder) in a child process under the limits; Refused otherwise."""
    command = child_command(archive, dest, limits)
    try:
        proc = subprocess.run(
            command, cwd=dest, env={}, stdin=subprocess.DEVNULL, capture_output=True, timeout=limits.seconds
        )
    except subprocess.TimeoutExpired:
        raise Refused(f"unpacking took longer than {limits.seconds:g} s") from None
    try:
        answer = json.loads(proc.stdout.decode("utf-8", "replace").strip().splitlines()[-1])
    except (ValueError, IndexError):
        answer = None
    if proc.returncode == 0 and isinstance(answer, dict) and answer.get("members") is not None:
        return int(answer["members"])
    if isinstance(answer, dict) and isinstance(answer.get("refused"), str):
        raise Refused(answer["refused"][:300])
    if proc.returncode < 0:
        raise Refused(f"unpacking went over its limits (killed by signal {-proc.returncode})")
    if b"MemoryError" in proc.stderr:
        raise Refused(f"unpacking needed more than {limits.memory_bytes} bytes of memory")
    raise Refused(f"not a readable tar archive (unpacking failed with exit code {proc.returncode})")


def main(argv: list[str]) -> int:
    """The child: `bundle_io.py unpack ARCHIVE DEST LIMITS_JSON`; prints one JSON line."""
    if len(argv) != 4 or argv[0] != "unpack":
        print(json.dumps({"refused": "usage: bundle_io.py unpack ARCHIVE DEST LIMITS_JSON"}))
        return 2
    limits = Limits(**json.loads(argv[3]))
    _limit_self(limits)
    try:
        count = extract(Path(argv[1]), Path(argv[2]), limits)
    except Refused as exc:
        print(json.dumps({"refused": str(exc)[:300]}))
        return 1
    except MemoryError:
        print(json.dumps({"refused": f"unpacking needed more than {limits.memory_bytes} bytes of memory"}))
        return 1
    except Exception as exc:  # gzip, zlib and tarfile raise many kinds on a damaged archive
        print(json.dumps({"refused": f"not a readable tar archive ({exc.__class__.__name__}: {str(exc)[:200]})"}))
        return 1
    print(json.dumps({"members": count}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
