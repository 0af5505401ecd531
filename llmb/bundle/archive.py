"""Unpacking a bundle's archive that someone else made, without trusting a byte of it, and the limits and name
checks every bundle is read under.

An archive is opened as gzip only, through a reader that counts what it decompresses; its raw 512-byte tar headers
are walked here before `tarfile` sees them (tarfile reads a GNU long name or a pax header whole, and parses a long
pax header in quadratic time), and it is unpacked in a child process under memory, CPU-time, file-size and
wall-clock limits into a temporary folder. Every path built from bundle data must be plain components only.

The child runs this file as a script (`python -I -S bundle_archive.py unpack ...`), so this whole module uses the
standard library only: nothing from the current folder or from llmb is imported into the process that unpacks.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import re
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

BLOCK = 512
# One path component: what the packager writes (results, plugin sources), nothing a shell or a terminal reads twice.
PART_PATTERN = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._+@=,~-]{0,127}$|^\.[A-Za-z0-9_][A-Za-z0-9._+@=,~-]{0,126}$")
MAX_PATH = 255
HASH_CHUNK = 2**20  # bytes read at a time, skipping a member or hashing a file


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
    # Lazy: POSIX only, and only the unpacking child limits itself.
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
    """The child: `bundle_archive.py unpack ARCHIVE DEST LIMITS_JSON`; prints one JSON line."""
    if len(argv) != 4 or argv[0] != "unpack":
        print(json.dumps({"refused": "usage: bundle_archive.py unpack ARCHIVE DEST LIMITS_JSON"}))
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
