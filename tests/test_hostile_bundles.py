"""Hostile bundles: archives and folders built here, byte by byte where tarfile would refuse to write them.

Each must give a failing row or one line, exit 1, in well under 10 s and 500 MB resident, with nothing written
outside a temporary folder that is removed afterwards. The committed reference bundle is the valid starting point.
"""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import pytest

from llmb import verify
from llmb.bundle import archive as bundle_archive
from llmb.bundle import reader as bundle_io
from llmb.bundle.reader import Limits, Refused
from llmb.records import PLUGIN_SOURCE_SCHEMA
from llmb.submit import package as submission

REFERENCE = Path(__file__).resolve().parent.parent / "submissions" / "llmb" / "cpu-reference"
SECONDS = 10.0


def header(name: str, size: int = 0, kind: bytes = b"0", prefix: str = "", magic: bytes = b"ustar\x0000") -> bytes:
    """One raw 512-byte ustar header with a right checksum (what a hand-made hostile archive holds)."""
    block = bytearray(512)
    raw = name.encode()[:100]
    block[0 : len(raw)] = raw
    block[100:108] = b"0000644\0"
    block[108:116] = block[116:124] = b"0000000\0"
    block[124:136] = b"%011o\0" % size if size < 8**11 else b"\x80" + size.to_bytes(11, "big")
    block[136:148] = b"00000000000\0"
    block[148:156] = b" " * 8
    block[156:157] = kind
    block[257:265] = magic
    block[345 : 345 + len(prefix)] = prefix.encode()
    block[148:156] = b"%06o\0 " % sum(block)
    return bytes(block)


def padded(data: bytes) -> bytes:
    return data + bytes(-len(data) % 512)


def end() -> bytes:
    return bytes(1024)


def pax(records: dict[str, str]) -> bytes:
    out = b""
    for key, value in records.items():
        body = f" {key}={value}\n".encode()
        length = len(body) + len(str(len(body)))
        length = len(body) + len(str(length))
        out += str(length).encode() + body
    return out


def gz(path: Path, *chunks: bytes) -> Path:
    with gzip.open(path, "wb", compresslevel=1) as f:
        for chunk in chunks:
            f.write(chunk)
    return path


def zeros(count: int) -> bytes:
    return bytes(count)


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """A current folder, a private temporary folder and an 'outside' folder; afterwards all must be as they were."""
    work, tmp, outside = tmp_path / "work", tmp_path / "tmp", tmp_path / "outside"
    for folder in (work, tmp, outside):
        folder.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    yield work
    assert list(tmp.iterdir()) == [], "the temporary unpacking folder was not removed"
    assert list(outside.iterdir()) == [], "something was written outside"


def refused(path: Path, limits: Limits = bundle_io.DEFAULT_LIMITS) -> str:
    started = time.monotonic()
    rows = verify.verify(path, limits=limits)
    took = time.monotonic() - started
    assert took < SECONDS, f"{path.name}: {took:.1f} s"
    assert len(rows) == 1 and not rows[0].passed, rows
    return rows[0].detail


MANIFEST_HEADER = header("bundle/MANIFEST.sha256")


ARCHIVES = {
    # name: (bytes of the tar stream, words the refusal must hold)
    "gnu long name declaring 1 GiB": (header("././@LongLink", 2**30, b"L") + zeros(4096), "GNU long-name"),
    "gnu long link": (header("././@LongLink", 100, b"K") + padded(b"x" * 100), "GNU long-link"),
    "pax header declaring 1 GiB": (header("bundle/PaxHeaders/x", 2**30, b"x") + zeros(4096), "pax header of"),
    "pax header of a million digits": (
        header("bundle/PaxHeaders/x", 10**6 + 20, b"x") + padded(b"%d path=x\n" % 10**6 + b"1" * 10**6) + end(),
        "pax header of",
    ),
    "global pax header": (header("pax_global_header", 20, b"g") + padded(pax({"comment": "x"})) + end(), "global"),
    "sparse member": (header("bundle/sparse", 512, b"S") + zeros(512) + end(), "sparse"),
    "pax sparse member": (
        header("x", len(pax({"GNU.sparse.major": "1"})), b"x")
        + padded(pax({"GNU.sparse.major": "1"}))
        + header("bundle/s", 0)
        + end(),
        "sparse",
    ),
    "pax link path": (
        header("x", len(pax({"linkpath": "/etc/passwd"})), b"x")
        + padded(pax({"linkpath": "/etc/passwd"}))
        + header("bundle/s", 0)
        + end(),
        "link",
    ),
    "pax path escaping": (
        header("x", len(pax({"path": "../../outside/x"})), b"x")
        + padded(pax({"path": "../../outside/x"}))
        + header("bundle/ok", 4)
        + padded(b"data")
        + end(),
        "escapes",
    ),
    "pax size over the member limit": (
        header("x", len(pax({"size": str(2**40)})), b"x") + padded(pax({"size": str(2**40)})) + header("b/a") + end(),
        "bytes (limit",
    ),
    "base-256 size": (header("bundle/huge", 2**40) + end(), "base-256"),
    "hard link": (MANIFEST_HEADER + header("bundle/h", 0, b"1") + end(), "link"),
    "symlink": (MANIFEST_HEADER + header("bundle/s", 0, b"2") + end(), "link"),
    "character device": (MANIFEST_HEADER + header("bundle/d", 0, b"3") + end(), "special file"),
    "block device": (MANIFEST_HEADER + header("bundle/d", 0, b"4") + end(), "special file"),
    "fifo": (MANIFEST_HEADER + header("bundle/f", 0, b"6") + end(), "special file"),
    "vendor type": (MANIFEST_HEADER + header("bundle/v", 0, b"V") + end(), "unsupported member type"),
    "absolute path": (header("/tmp/abs", 0) + end(), "absolute path"),
    "dot-dot": (header("bundle/../../up", 0) + end(), "escapes"),
    "ustar prefix escaping": (header("up", 0, prefix="../..") + end(), "escapes"),
    "folder declaring data": (header("bundle/", 1024, b"5") + zeros(1024) + end(), "declares"),
    "duplicate member": (MANIFEST_HEADER + MANIFEST_HEADER + end(), "duplicate member"),
    "duplicate through ./": (MANIFEST_HEADER + header("./bundle/MANIFEST.sha256") + end(), "duplicate member"),
    "control characters in a name": (header("bundle/\x1b]0;owned\x07", 0) + end(), "not a plain file name"),
    "bad checksum": (MANIFEST_HEADER[:148] + b"0000000\0" + MANIFEST_HEADER[156:] + end(), "checksum"),
    "truncated": (MANIFEST_HEADER, "truncated"),
    "member over the size limit": (header("bundle/big", 65 * 2**20) + zeros(512), "bytes (limit"),
    "importable llmb package": (
        MANIFEST_HEADER + header("bundle/llmb/__init__.py", 4) + padded(b"boom") + end(),
        "importable names",
    ),
    "sitecustomize at the top": (MANIFEST_HEADER + header("sitecustomize.py", 0) + end(), "importable names"),
    "a .pth file": (MANIFEST_HEADER + header("bundle/x.pth", 0) + end(), "importable names"),
    "conftest": (MANIFEST_HEADER + header("bundle/conftest.py", 0) + end(), "importable names"),
    "no bundle inside": (header("other/file", 0) + end(), "expected one bundle folder"),
    "deep nesting": (header("/".join(["d"] * 40) + "/f", 0) + end(), "deep"),
}


@pytest.mark.parametrize("what", list(ARCHIVES))
def test_hostile_archive_is_refused_fast_with_nothing_left_behind(sandbox, what):
    stream, words = ARCHIVES[what]
    archive = gz(sandbox / "bundle.tar.gz", stream)
    detail = refused(archive)
    assert words in detail, detail
    assert sorted(p.name for p in sandbox.iterdir()) == ["bundle.tar.gz"]


@pytest.mark.parametrize(
    "compress", [bz2.compress, lzma.compress, lambda data: data], ids=["bzip2", "xz", "uncompressed"]
)
def test_only_gzip_is_opened_whatever_the_name(sandbox, compress):
    # bzip2 inflates about 400,000:1; under a .tar.gz name tarfile's "r:*" used to open it anyway.
    archive = sandbox / "bundle.tar.gz"
    archive.write_bytes(compress(MANIFEST_HEADER + end() + zeros(2**20)))
    assert "not gzip-compressed" in refused(archive)


def test_a_gzip_bomb_stops_at_the_decompression_budget(tmp_path):
    bomb = gz(tmp_path / "bomb.gz", zeros(8 * 2**20))
    assert bomb.stat().st_size < 64 * 1024
    reader = bundle_archive.CountingReader(bomb, budget=2**20)
    try:
        with pytest.raises(Refused, match="decompresses to more than"):
            reader.skip(8 * 2**20)
        assert reader.count <= 2**20 + 1
    finally:
        reader.close()


def test_total_and_count_limits_hold_for_archives(sandbox):
    many = b"".join(header(f"bundle/f{i}", 0) for i in range(30)) + end()
    assert "more than 20 members" in refused(gz(sandbox / "many.tar.gz", many), Limits(members=20))
    big = b"".join(header(f"bundle/f{i}", 600) + padded(b"x" * 600) for i in range(4)) + end()
    assert "total more than 2000" in refused(gz(sandbox / "big.tar.gz", big), Limits(total_bytes=2000))


def test_the_unpacking_child_is_killed_at_its_wall_clock_limit(sandbox, monkeypatch):
    archive = gz(sandbox / "bundle.tar.gz", MANIFEST_HEADER + end())
    # A child that hangs (a stand-in for an archive that defeats every other limit) is killed on time.
    monkeypatch.setattr(bundle_archive, "child_command", lambda *args: [shutil.which("sleep") or "/bin/sleep", "30"])
    started = time.monotonic()
    with pytest.raises(Refused, match="longer than 1 s"):
        bundle_io.unpack(archive, sandbox, Limits(seconds=1.0))
    assert time.monotonic() - started < 5


def tar_of_folder(folder: Path, archive: Path, dot: bool = True) -> Path:
    """The usual way: tar -C DIR -czf x.tar.gz . (members named ./...)."""
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(folder, arcname="." if dot else folder.name)
    return archive


def test_a_bundle_archived_with_dot_prefixes_verifies_like_its_folder(sandbox):
    archive = tar_of_folder(REFERENCE, sandbox / "ref.tar.gz")
    assert any(m.startswith("./") for m in tarfile.open(archive).getnames())
    from_archive = verify.verify(archive, accept_debug=True)
    from_folder = verify.verify(REFERENCE, accept_debug=True)
    assert from_archive[0].check == "archive" and from_archive[0].passed, from_archive[0]
    assert [(r.check, r.passed) for r in from_archive[1:]] == [(r.check, r.passed) for r in from_folder[1:]]
    assert all(r.passed for r in from_archive), [r for r in from_archive if not r.passed]


def test_gnu_tar_archives_of_a_bundle_verify(sandbox):
    tar = shutil.which("tar")
    if tar is None:
        pytest.skip("no tar program on this machine")
    archive = sandbox / "gnu.tar.gz"
    subprocess.run([tar, "-C", str(REFERENCE), "-czf", str(archive), "."], check=True)
    rows = verify.verify(archive, accept_debug=True)
    assert all(r.passed for r in rows), [r for r in rows if not r.passed]


# Folder bundles


@pytest.fixture
def bundle(tmp_path):
    root = tmp_path / "bundle"
    shutil.copytree(REFERENCE, root)
    return root


def resign(root: Path) -> None:
    submission.write_manifest(root)


def test_a_hard_link_to_a_file_outside_is_refused_and_never_printed(bundle, tmp_path):
    secret = tmp_path / "passwd"
    secret.write_text("root:SECRET-FIRST-LINE\n")
    (bundle / "summary.md").unlink()
    os.link(secret, bundle / "summary.md")
    rows = verify.verify(bundle)
    assert "hard-linked file summary.md" in rows[0].detail
    assert "SECRET" not in repr(rows)


def test_a_fifo_in_a_folder_is_refused_without_hanging(bundle):
    os.mkfifo(bundle / "results" / "pipe.json")
    started = time.monotonic()
    rows = verify.verify(bundle)
    assert time.monotonic() - started < SECONDS
    assert "special file results/pipe.json" in rows[0].detail


def test_a_sparse_2_gib_file_is_refused_unread(bundle):
    with open(bundle / "code" / "huge.bin", "wb") as f:
        f.truncate(2 * 2**30)
    started = time.monotonic()
    rows = verify.verify(bundle)
    assert time.monotonic() - started < SECONDS
    assert "code/huge.bin' is 2147483648 bytes" in rows[0].detail


@pytest.mark.parametrize("name", ["llmb/__init__.py", "sitecustomize.py", "evil.pth", "conftest.py", "pkg/__init__.py"])
def test_a_folder_with_importable_names_at_its_top_is_refused(bundle, name):
    (bundle / name).parent.mkdir(exist_ok=True)
    (bundle / name).write_text("raise SystemExit('ran')\n")
    resign(bundle)
    assert "importable names" in refused(bundle)


def test_folder_limits_count_depth_and_size(bundle):
    deep = bundle.joinpath(*["d"] * 20)
    deep.mkdir(parents=True)
    assert "folders deep" in refused(bundle)
    shutil.rmtree(bundle / "d")
    assert "more than 10 members" in refused(bundle, Limits(members=10))
    assert "members total more than 1000 bytes" in refused(bundle, Limits(total_bytes=1000))


def test_a_giant_json_file_is_refused_before_it_is_read(bundle):
    sub = json.loads((bundle / "submission.json").read_text())
    sub["note"] = "x" * (5 * 2**20)
    (bundle / "submission.json").write_text(json.dumps(sub))
    resign(bundle)
    started = time.monotonic()
    rows = {r.check: r for r in verify.verify(bundle, accept_debug=True)}
    assert time.monotonic() - started < SECONDS
    assert not rows["submission.json"].passed
    assert f"bytes (limit {Limits().json_bytes})" in rows["submission.json"].detail
    assert len(rows["submission.json"].detail) < 300


@pytest.mark.parametrize("distribution", ["../../outside", "/etc", "a/../../../b", "x\x1b[2J"])
def test_a_plugin_distribution_name_cannot_lead_outside_the_bundle(bundle, tmp_path, distribution):
    (tmp_path / "outside.json").write_text(json.dumps({"schema": "OUTSIDE-SECRET"}))
    sub = json.loads((bundle / "submission.json").read_text())
    sub["plugins"][0]["distribution"] = distribution
    (bundle / "submission.json").write_text(json.dumps(sub))
    resign(bundle)
    rows = {r.check: r for r in verify.verify(bundle, accept_debug=True)}
    assert not rows["plugin source"].passed
    assert "not a plain file name" in rows["plugin source"].detail
    assert "OUTSIDE-SECRET" not in repr(rows)


def test_a_plugin_source_record_cannot_name_files_outside(bundle, tmp_path):
    sub = json.loads((bundle / "submission.json").read_text())
    sub["plugins"][0]["distribution"] = "evil"
    (bundle / "submission.json").write_text(json.dumps(sub))
    (bundle / "code" / "plugins").mkdir()
    record = {"schema": PLUGIN_SOURCE_SCHEMA, "files": {"../../../../etc/passwd": "0" * 64}}
    (bundle / "code" / "plugins" / "evil.json").write_text(json.dumps(record))
    resign(bundle)
    rows = {r.check: r for r in verify.verify(bundle, accept_debug=True)}
    assert "not a plain file name" in rows["plugin source"].detail


# The command line: one line or a table, exit 1, no traceback, bounded memory


def run_verify(path: Path, cwd: Path) -> tuple[subprocess.CompletedProcess, int, float]:
    """`llmb verify` in a child; its resident peak (and its own children's) in kB, and the wall time."""
    wrapper = (
        "import resource, subprocess, sys, time; t = time.monotonic(); "
        "p = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
        "print(p.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, time.monotonic() - t); "
        "print(p.stdout + p.stderr, file=sys.stderr)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", wrapper, sys.executable, "-m", "llmb", "verify", str(path)],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
    )
    code, rss, took = proc.stdout.split()
    return subprocess.CompletedProcess(proc.args, int(code), proc.stderr, proc.stderr), int(rss), float(took)


@pytest.mark.parametrize("what", ["gnu long name declaring 1 GiB", "pax header of a million digits"])
def test_verify_command_on_header_bombs(sandbox, what):
    archive = gz(sandbox / "bomb.tar.gz", ARCHIVES[what][0])
    proc, rss_kb, took = run_verify(archive, sandbox)
    assert proc.returncode == 1, proc.stdout
    assert "Traceback" not in proc.stdout and "refused" in proc.stdout
    assert rss_kb < 500 * 1024, f"{rss_kb / 1024:.0f} MB resident"
    # The import of torch dominates on a loaded machine; the bomb itself is bounded by the in-process tests above.
    assert took < 60, took


def test_an_archive_inflating_far_past_text_ratios_is_cut_short(sandbox):
    # 120 MiB of zeros, each member under every size limit, gzipped to about 120 KiB: refused at 200:1, not unpacked.
    archive = sandbox / "zeros.tar.gz"
    with gzip.open(archive, "wb", compresslevel=1) as f:
        f.write(MANIFEST_HEADER)
        for index in range(4):
            f.write(header(f"bundle/z{index}", 30 * 2**20) + zeros(30 * 2**20))
        f.write(end())
    assert "decompresses to more than" in refused(archive)


def test_pax_archives_with_long_names_verify(sandbox, tmp_path):
    # Long names the way Python's tarfile and `tar --format=pax` write them: a small pax header, accepted.
    folder = tmp_path / "long"
    shutil.copytree(REFERENCE, folder)
    deep = folder / "code" / ("a" * 90) / ("b" * 90)
    deep.mkdir(parents=True)
    (deep / "note.txt").write_text("a file with a path of over 200 characters\n")
    submission.write_manifest(folder)
    with tarfile.open(sandbox / "long.tar.gz", "w:gz", format=tarfile.PAX_FORMAT) as tar:
        tar.add(folder, arcname="bundle")
    rows = verify.verify(sandbox / "long.tar.gz", accept_debug=True)
    assert all(r.passed for r in rows), [r for r in rows if not r.passed]
    with tarfile.open(sandbox / "gnu.tar.gz", "w:gz", format=tarfile.GNU_FORMAT) as tar:
        tar.add(folder, arcname="bundle")
    assert "tar --format=pax" in refused(sandbox / "gnu.tar.gz")


def test_the_reference_bundle_archived_in_the_repositorys_layout_verifies(tmp_path):
    """Issue 26: llmb/cpu-reference/... at the archive's top is a wrapper, not an importable llmb package."""
    reference = Path(__file__).resolve().parent.parent / "submissions" / "llmb" / "cpu-reference"
    archive = tmp_path / "reference.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(reference, arcname="llmb/cpu-reference")
    with bundle_io.open_bundle(archive) as root:
        assert (root / "MANIFEST.sha256").is_file() and root.name == "cpu-reference"
    rows = verify.verify(archive, accept_debug=True)  # and every check passes on it, as on the folder
    assert all(row.passed for row in rows), [row for row in rows if not row.passed]
    assert [r.check for r in rows[1:]] == [r.check for r in verify.verify(reference, accept_debug=True)[1:]]
    package = tmp_path / "pkg.tar.gz"  # a real package above the root is still refused
    with tarfile.open(package, "w:gz") as tar:
        tar.add(reference, arcname="wrap/cpu-reference")
        info = tarfile.TarInfo("wrap/llmb/__init__.py")
        tar.addfile(info)
    assert "importable names" in refused(package)


VERIFY_PEAK = """
import json, sys
from llmb import verify
verify.bundle.RESULT_CACHE_BYTES = 2**20  # a small budget, so that this test's bundles are read as the largest would be
rows = verify.verify(sys.argv[1], accept_debug=True)
with open("/proc/self/status") as status:
    peak = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))
print(json.dumps({"peak": peak, "rows": len(rows)}))
"""


def _bundle_of_large_results(folder: Path, count: int) -> Path:
    """The reference bundle with `count` results, each padded to about 1 MiB of nested numbers in its facts (what a
    parsed record holds most of per byte), all within the bundle limits."""
    shutil.copytree(REFERENCE, folder)
    sources = sorted((folder / "results").rglob("*.json"))
    pad = [[0.1234567 + i, 0.7654321 - i] for i in range(30_000)]
    for index in range(count):
        source = sources[index % len(sources)]
        record = json.loads(source.read_text())
        record["facts"] = {**record["facts"], "pad": pad}
        (source.parent / f"padded-{index:03d}.json").write_text(json.dumps(record))
    for source in sources:
        source.unlink()
    return folder


@pytest.mark.slow
def test_verify_memory_does_not_grow_with_the_bundles_results(tmp_path):
    """Issue 26: verify reads a bundle's results one at a time past a budget (llmb.verify.bundle.RESULT_CACHE_BYTES);
    its peak memory over 32 results of 1 MiB is within 40 MiB of its peak over 8 (all 32 held parsed: about 200 MiB
    more)."""
    peaks = {}
    for count in (8, 32):
        folder = _bundle_of_large_results(tmp_path / f"b{count}", count)
        assert sum(p.stat().st_size for p in (folder / "results").rglob("*.json")) > count * 2**20 * 0.9
        proc = subprocess.run(
            [sys.executable, "-c", VERIFY_PEAK, str(folder)], capture_output=True, text=True, timeout=900, check=True
        )
        peaks[count] = json.loads(proc.stdout.strip().splitlines()[-1])["peak"]
    grown = peaks[32] - peaks[8]
    assert grown < 40 * 2**20, {n: f"{p / 2**20:.0f} MiB" for n, p in peaks.items()}


@pytest.mark.parametrize(
    ("key", "value", "said"),
    [
        ("created", ["2026"], "created: expected a string, got a list"),
        ("created", "yesterday", "created: 'yesterday' is no ISO 8601 time"),
        ("llmb_version", {"a": 1}, "llmb_version: expected a string, got an object"),
        ("division", "premier", "division: 'premier' (one of closed, open)"),
        ("note", 7, "note: expected a string, got a number"),
        ("results", ["results/a.json", 3], "results[1]: expected a string, got a number"),
        ("debug", {"is_debug": "no"}, "debug.is_debug: expected true or false, got a string"),
        ("extra", "\x1b[31mred", "extra: unknown field"),
    ],
)
def test_a_submission_index_of_other_types_than_the_packager_writes_fails_verify(bundle, key, value, said):
    """submission.json is read strictly, as a result is (llmb.records.Submission, the type the packager writes): a
    re-sealed index with a list for its date, a division no rule knows or a field nobody wrote fails its check with
    the field named, where only five of its keys were checked before (and --accept-debug passed the rest)."""
    index = json.loads((bundle / "submission.json").read_text())
    index[key] = value
    (bundle / "submission.json").write_text(json.dumps(index))
    resign(bundle)
    rows = {row.check: row for row in verify.verify(bundle, accept_debug=True)}
    assert not rows["submission.json"].passed and said in rows["submission.json"].detail


def test_the_packager_writes_the_index_the_verifier_reads():
    """One type for submission.json: the reference bundle's index reads back as a Submission, field for field."""
    from llmb.records import Submission

    index = json.loads((REFERENCE / "submission.json").read_text())
    assert Submission.from_dict(index).to_dict() == index


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ({"number_of_nodes": "1"}, "number_of_nodes: expected an integer, got a string"),
        ({"accelerators_per_node": -1}, "accelerators_per_node: -1 (0 or more)"),
        ({"environment": "PATH=/x"}, "environment: expected an object, got a string"),
    ],
)
def test_a_system_description_whose_filled_fields_are_retyped_fails_verify(bundle, given, said):
    """system.json's fields llmb fills keep their types in a re-sealed bundle too; a field of the submitter's own
    (a rack, a note) is theirs and passes."""
    system = json.loads((bundle / "system.json").read_text())
    (bundle / "system.json").write_text(json.dumps({**system, **given, "rack": {"row": 3}}))
    resign(bundle)
    rows = {row.check: row for row in verify.verify(bundle, accept_debug=True)}
    assert not rows["system.json"].passed and said in rows["system.json"].detail
    (bundle / "system.json").write_text(json.dumps({**system, "rack": {"row": 3}}))
    resign(bundle)
    assert {row.check: row for row in verify.verify(bundle, accept_debug=True)}["system.json"].passed
