"""Secrets never recorded, results never lost, files never clobbered, bad numbers refused: hostile environments,
settings, projects, output paths and record files, each built here."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import stat
import subprocess
import tempfile
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from llmb import Backend, Setting
from llmb.api.errors import LlmbError, UsageError
from llmb.api.settings import recorded, resolve_settings
from llmb.bundle import plugin_source
from llmb.cli import cli
from llmb.records import result_files as results
from llmb.report import load
from llmb.run import sysinfo
from llmb.run.sweep import LOG_NAME
from llmb.run.sweep_log import SweepLog, read_log
from llmb.spec.presets import PRESETS
from llmb.spec.redact import REDACTED, scrub
from llmb.submit import package as submission

REFERENCE = Path(__file__).resolve().parent.parent / "submissions" / "llmb" / "cpu-reference"
TINY = ["--preset", "tiny", "--device", "cpu", "--steps", "1", "--warmup-steps", "1"]


# Secrets: the environment, system files, settings, plugin sources


HOSTILE_ENVIRONMENT = {
    "XLA_PASSWD": "SECRET-1",
    "PJRT_AUTH": "SECRET-2",
    "TORCH_HUB_CREDENTIALS": "SECRET-3",
    "TORCH_DSN": "postgres://u:SECRET-4@db.example/x",
    "CUDA_LICENSE_SERVER": "https://user:SECRET-5@license.example",
    "XLA_FLAGS": "--xla_dump_to=/home/alice/dump --xla_auth_token=SECRET-6 --url=https://bob:SECRET-7@h/x",
    "LIBTPU_INIT_ARGS": "--key=SECRET-8 ghp_abcdefghijklmnopqrstuvwxyz0123456789",
    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
    "OMP_NUM_THREADS": "8",
    "HF_TOKEN": "SECRET-9",
}


def test_the_environment_keeps_listed_names_and_never_a_secret():
    kept = sysinfo.run_environment(HOSTILE_ENVIRONMENT)
    text = json.dumps(kept)
    assert "SECRET" not in text and "ghp_" not in text, text
    assert "/home/alice" not in text and "~/dump" in kept["XLA_FLAGS"]
    assert set(kept) <= set(sysinfo.ENV_NAMES)
    assert kept["OMP_NUM_THREADS"] == "8" and kept["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert "https://<redacted>@h/x" in kept["XLA_FLAGS"]


def test_a_system_file_does_not_record_secrets_or_home_folders_either():
    home = str(Path.home())
    given = {
        "environment": dict(HOSTILE_ENVIRONMENT),
        "hw_notes": f"driver from https://me:SECRET-10@repo.example, logs in {home}/logs and /home/carol/x",
    }
    merged = sysinfo.complete({"environment": {}}, given)
    text = json.dumps(merged)
    assert "SECRET" not in text and "/home/carol" not in text
    assert home == "/" or home not in text
    assert merged["environment"]["TORCH_DSN"] == REDACTED  # a credential-like name loses its value whatever it is


@pytest.mark.parametrize(
    "value, expected",
    [
        ("https://user:pw@host/x", "https://<redacted>@host/x"),
        ("s3://AKIAABCDEFGHIJKLMNOP@bucket", "s3://<redacted>@bucket"),
        ("password=hunter2 rest", "password=<redacted> rest"),
        ("plain value", "plain value"),
        ("/root/cache", "~/cache"),
    ],
)
def test_scrub(value, expected):
    assert scrub(value) == expected


class SecretPlugin(Backend):
    """A CPU backend with a license token (declared secret), an opaque secret blob, and a key by name only."""

    name = "licensed"
    seen: dict = {}

    def settings(self):
        return [
            Setting("license_token", str, "", "a license token", secret=True),
            Setting("vendor_blob", str, "default-blob", "opaque, declared secret", secret=True),
            Setting("api_key", str, "", "secret by its name alone"),
            Setting("pin", int, 0, "a secret number", secret=True),
            Setting("threads", int, 0, "an ordinary setting"),
        ]

    def setup(self, device, precision, settings):
        SecretPlugin.seen = dict(settings)


SECRET_OPTIONS = {"license_token": "SECRET-A", "vendor_blob": "SECRET-B", "api_key": "SECRET-C", "threads": "1"}


def test_secret_settings_reach_the_plugin_but_never_a_record(register_backend):
    from llmb.conformance.check import check_plugin
    from llmb.run.runner import RunOptions, run

    register_backend(SecretPlugin())
    options = RunOptions(
        config=PRESETS["tiny"], preset="tiny", plugin="licensed", steps=1, warmup_steps=1, settings=SECRET_OPTIONS
    )
    record = run(options)
    assert SecretPlugin.seen["license_token"] == "SECRET-A" and SecretPlugin.seen["vendor_blob"] == "SECRET-B"
    assert "SECRET" not in json.dumps(record.to_dict())
    assert record.plugin.settings == {
        "license_token": REDACTED,
        "vendor_blob": REDACTED,
        "api_key": REDACTED,
        "pin": REDACTED,
        "threads": 1,
    }
    conformance = check_plugin("licensed", "cpu", "FP32", settings=SECRET_OPTIONS, steps=2)
    assert "SECRET" not in json.dumps(conformance.to_dict())
    assert conformance.plugin.settings["vendor_blob"] == REDACTED
    # The packager matches the two by their (redacted) settings, and will not rerun a check it cannot reproduce.
    assert submission.conformance_key(record) == submission.conformance_key(conformance)
    with pytest.raises(UsageError, match="secret setting"):
        submission.gather_conformance([record], [], check_plugin)


def test_a_bad_secret_value_is_refused_without_echoing_it():
    declared = SecretPlugin().settings()
    with pytest.raises(UsageError) as caught:
        resolve_settings("licensed", declared, {"pin": "SECRET-D"})
    assert "SECRET" not in str(caught.value) and REDACTED in str(caught.value)
    described = {s.describe()["name"]: s.describe() for s in declared}
    assert described["vendor_blob"]["default"] == REDACTED and described["vendor_blob"]["secret"] is True
    assert described["threads"]["secret"] is False
    assert recorded({"license_token": "x", "threads": 2}) == {"license_token": REDACTED, "threads": 2}


def fake_distribution(site: Path, name: str, project: Path | None, record: list[str] | None = None) -> None:
    """A dist-info on sys.path: an editable install of `project`, or a wheel install whose RECORD lists files."""
    info = site / f"{name.replace('-', '_')}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    if project is not None:
        (info / "direct_url.json").write_text(json.dumps({"url": project.as_uri(), "dir_info": {"editable": True}}))
        (info / "RECORD").write_text("")
    else:
        (info / "RECORD").write_text("".join(f"{line},,\n" for line in record or []))


def project_with_secrets(root: Path) -> Path:
    (root / "fakeplug").mkdir(parents=True)
    (root / "fakeplug" / "__init__.py").write_text("VALUE = 1\n")
    (root / "pyproject.toml").write_text("[project]\nname = 'fakeplug'\n")
    (root / "id_ed25519").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nSECRET\n")
    (root / "aws-credentials.txt").write_text("SECRET")
    (root / "secrets.yaml").write_text("token: SECRET")
    (root / "venv" / "lib").mkdir(parents=True)
    (root / "venv" / "pyvenv.cfg").write_text("home = /usr\n")
    (root / "venv" / "lib" / "x.py").write_text("SECRET = 1\n")
    return root


def git(root: Path, *args: str) -> None:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t"}
    env["GIT_COMMITTER_EMAIL"] = "t@t"
    subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True, env=env)


needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed here")


@needs_git
def test_an_editable_git_project_gives_its_tracked_files_only(tmp_path, monkeypatch):
    project = project_with_secrets(tmp_path / "proj")
    git(project, "init", "-q")
    git(project, "add", "fakeplug/__init__.py", "pyproject.toml")
    fake_distribution(tmp_path / "site", "fakeplug", project)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    record = plugin_source.copy_plugin_source("fakeplug", "1.0", tmp_path / "out")
    assert sorted(record["files"]) == ["fakeplug/__init__.py", "pyproject.toml"]
    assert record["origin"] == "editable install: files tracked by git"
    assert str(tmp_path) not in json.dumps(record)
    assert sorted(p.name for p in (tmp_path / "out").rglob("*") if p.is_file()) == ["__init__.py", "pyproject.toml"]


@needs_git
@pytest.mark.parametrize("tracked", ["id_ed25519", "aws-credentials.txt", "secrets.yaml", "venv/pyvenv.cfg"])
def test_a_tracked_key_credential_or_virtualenv_file_is_refused(tmp_path, monkeypatch, tracked):
    project = project_with_secrets(tmp_path / "proj")
    git(project, "init", "-q")
    git(project, "add", "-f", "fakeplug/__init__.py", tracked)
    fake_distribution(tmp_path / "site", "fakeplug", project)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    with pytest.raises(LlmbError, match="not copied"):
        plugin_source.copy_plugin_source("fakeplug", "1.0", tmp_path / "out")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("*"))


def test_an_editable_project_outside_git_gives_its_packages_only(tmp_path, monkeypatch):
    project = project_with_secrets(tmp_path / "proj")
    fake_distribution(tmp_path / "site", "fakeplug", project)
    (tmp_path / "site" / "fakeplug-1.0.dist-info" / "top_level.txt").write_text("fakeplug\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setattr(plugin_source, "_git_files", lambda root: None)  # as on a machine without git
    record = plugin_source.copy_plugin_source("fakeplug", "1.0", tmp_path / "out")
    assert sorted(record["files"]) == ["fakeplug/__init__.py", "pyproject.toml"]
    assert "SECRET" not in "".join(p.read_text() for p in (tmp_path / "out").rglob("*") if p.is_file())


def test_a_wheel_whose_record_lists_a_secrets_file_is_refused(tmp_path, monkeypatch):
    site = tmp_path / "site"
    (site / "fakewheel").mkdir(parents=True)
    (site / "fakewheel" / "__init__.py").write_text("")
    (site / "fakewheel" / "secrets.yaml").write_text("SECRET")
    fake_distribution(site, "fakewheel", None, ["fakewheel/__init__.py", "fakewheel/secrets.yaml"])
    monkeypatch.syspath_prepend(str(site))
    with pytest.raises(LlmbError, match="fakewheel/secrets.yaml is a key or credential file"):
        plugin_source.copy_plugin_source("fakewheel", "1.0", tmp_path / "out")


# Files never clobbered


def test_the_atomic_writer_refuses_a_symlink_and_leaves_its_target_alone(tmp_path):
    target = tmp_path / "precious.txt"
    target.write_text("keep me")
    link = tmp_path / "report.md"
    link.symlink_to(target)
    with pytest.raises(UsageError, match="symbolic link"):
        results.write_bytes_atomic(link, b"clobbered")
    assert link.is_symlink() and target.read_text() == "keep me"
    (tmp_path / "folder").mkdir()
    with pytest.raises(UsageError, match="not a regular file"):
        results.write_bytes_atomic(tmp_path / "folder", b"x")


def test_the_atomic_writer_writes_through_a_device_and_a_pipe_never_replacing_them(tmp_path):
    results.write_bytes_atomic(Path("/dev/null"), b"into the void")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    results.write_bytes_atomic(fifo, b"through the pipe")
    reader.join(10)
    assert got == [b"through the pipe"] and stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_the_atomic_writer_honours_the_umask(tmp_path):
    previous = os.umask(0o027)
    try:
        path = results.write_bytes_atomic(tmp_path / "a.json", b"{}")
    finally:
        os.umask(previous)
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    previous = os.umask(0o002)
    try:
        path = results.write_bytes_atomic(tmp_path / "b.json", b"{}")
    finally:
        os.umask(previous)
    assert stat.S_IMODE(path.stat().st_mode) == 0o664


# Results never lost


def _proc_takes_no_folder() -> bool:
    """/proc refuses a new folder even to root (whom os.access answers yes everywhere): true on Linux."""
    try:
        os.rmdir(tempfile.mkdtemp(dir="/proc"))
    except OSError:
        return True
    return False


@pytest.mark.parametrize("out", ["/dev/full", "FILE/sub", "/proc/llmb-results"])
def test_run_refuses_an_unwritable_out_before_measuring(tmp_path, out):
    if out.startswith("/proc") and not _proc_takes_no_folder():
        pytest.skip("this host's /proc takes a folder (not Linux's procfs)")
    (tmp_path / "FILE").write_text("a file, not a folder")
    out = out.replace("FILE", str(tmp_path / "FILE"))
    result = CliRunner().invoke(cli, ["run", *TINY, "--out", out])
    assert result.exit_code == 2, result.output
    assert "is not a writable folder" in result.stderr
    assert "tokens/s" not in result.stdout  # nothing was measured
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_a_result_whose_write_fails_is_printed_and_saved_under_the_temporary_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    out = tmp_path / "out"
    real = results.write_result

    def full_disk(record, out_dir):
        if Path(out_dir) == out:  # the disk fills up during the measurement
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(record, out_dir)

    monkeypatch.setattr(results, "write_result", full_disk)
    result = CliRunner().invoke(cli, ["run", *TINY, "--out", str(out)])
    assert result.exit_code == 1, result.output
    assert "No space left on device" in result.stderr and "saved as" in result.stderr
    saved = list((tmp_path / "tmp").glob("llmb-unsaved-*/*.json"))
    assert len(saved) == 1
    record = json.loads(saved[0].read_text())
    assert record["tokens_per_second"] > 0
    assert str(record["run_id"]) in result.stdout  # printed as well


# Sweeps: one at a time per folder; readers never write


def test_a_second_sweep_on_a_locked_folder_is_refused_with_one_line(tmp_path, monkeypatch):
    from llmb.run import sysinfo

    # As on a CPU that emulates 16-bit (whether this one does depends on its flags): a refused sweep warns of nothing.
    monkeypatch.setattr(sysinfo, "cpu_emulated_precisions", lambda: ["BF16", "FP16"])
    out = tmp_path / "sweep"
    out.mkdir()
    fd = os.open(out, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the first sweep, as far as the second can tell
        result = CliRunner().invoke(cli, ["sweep", *TINY, "--batch-sizes", "1", "--out", str(out)])
    finally:
        os.close(fd)
    assert result.exit_code == 1, result.output
    assert "in use by another sweep" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert list(out.iterdir()) == []


def torn_sweep(folder: Path) -> tuple[Path, bytes]:
    folder.mkdir()
    header = {"type": "sweep", "schema": "llmb.sweep/1", "plugin": "cpu", "device": "cpu", "settings": {}}
    trial = {"type": "trial", "precision": "FP32", "batch_size": 1, "phase": "search", "index": 0, "status": "oom"}
    data = (json.dumps(header) + "\n" + json.dumps(trial) + "\n" + '{"type": "trial", "prec').encode()
    (folder / LOG_NAME).write_bytes(data)
    return folder / LOG_NAME, data


def test_report_never_writes_into_its_input(tmp_path):
    log, data = torn_sweep(tmp_path / "sweep")
    shutil.copy(next((REFERENCE / "results" / "FP32").glob("*.json")), tmp_path / "sweep" / "r.json")
    before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in (tmp_path / "sweep").iterdir()}
    header, trials = read_log(log)
    assert len(trials) == 1
    load([tmp_path / "sweep"])
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in (tmp_path / "sweep").iterdir()} == before
    # The sweep that resumes it, holding the folder's lock, is the one that cuts the torn line.
    SweepLog.open(tmp_path / "sweep", header, resume=True)
    assert log.read_bytes() == data[: data.rfind(b"\n") + 1]


def test_report_names_an_incomplete_record_instead_of_a_key_error(tmp_path):
    source = next((REFERENCE / "results" / "FP32").glob("*.json"))
    good, bad = json.loads(source.read_text()), json.loads(source.read_text())
    del bad["tokens_per_second"]
    bad["run_id"] = "incomplete"
    (tmp_path / "good.json").write_text(json.dumps(good))
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    result = CliRunner().invoke(cli, ["report", str(tmp_path), "--format", "csv"])
    assert result.exit_code == 0, result.output
    assert f"skipped: {tmp_path / 'bad.json'}: incomplete llmb result (tokens_per_second: missing)" in result.stderr
    alone = CliRunner().invoke(cli, ["report", str(tmp_path / "bad.json")])
    assert alone.exit_code == 1 and "bad.json" in alone.stderr and "KeyError" not in alone.output


# Numbers out of range are usage errors, and every bound is in --help


@pytest.mark.parametrize(
    "command, args",
    [
        ("sweep", ["--trial-timeout", "nan"]),
        ("sweep", ["--trial-timeout", "inf"]),
        ("sweep", ["--trial-timeout", "-1"]),
        ("run", ["--seed", str(2**70)]),
        ("run", ["--batch-size", str(10**30)]),
        ("run", ["--steps", "0"]),
        ("run", ["--dist-timeout", "nan"]),
        ("run", ["--hidden-size", str(10**30)]),
        ("sweep", ["--batch-sizes", f"1,{10**30}"]),
        ("check-plugin", ["--seed", "-1"]),
    ],
)
def test_numbers_out_of_range_are_usage_errors(command, args):
    result = CliRunner().invoke(cli, [command, *args, "--device", "cpu"])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and not isinstance(result.exception, (OverflowError, ValueError))


@pytest.mark.parametrize("command", ["run", "sweep", "check-plugin"])
def test_every_bound_shows_in_help(command):
    text = CliRunner().invoke(cli, [command, "--help"], terminal_width=200).output
    assert "1<=x<=1048576" in text  # the batch size
    assert "0<=x<=9223372036854775807" in text  # the seed


def test_report_skips_a_fifo_and_a_giant_file_without_hanging(tmp_path, monkeypatch):
    import llmb.report.points

    shutil.copy(next((REFERENCE / "results" / "FP32").glob("*.json")), tmp_path / "good.json")
    os.mkfifo(tmp_path / "pipe.json")
    os.mkfifo(tmp_path / LOG_NAME)
    limit = (tmp_path / "good.json").stat().st_size + 100  # the real record fits; the giant one does not
    monkeypatch.setattr(llmb.report.points, "RECORD_LIMIT", limit)
    (tmp_path / "giant.json").write_text(json.dumps({"schema": "llmb.result/1", "x": "y" * limit}))
    done = []
    worker = threading.Thread(target=lambda: done.append(load([tmp_path])), daemon=True)
    worker.start()
    worker.join(30)
    assert done, "report hung on a FIFO"
    skipped = "\n".join(done[0].skipped)
    for name in ("pipe.json", LOG_NAME, "giant.json"):
        assert str(tmp_path / name) in skipped, skipped


@pytest.mark.parametrize("out", ["FILE/r.md", "/proc/llmb-report.md"])
def test_report_refuses_an_unwritable_out_in_one_line(tmp_path, out):
    if out.startswith("/proc") and not _proc_takes_no_folder():
        pytest.skip("this host's /proc takes a folder (not Linux's procfs)")
    (tmp_path / "FILE").write_text("a file, not a folder")
    out = out.replace("FILE", str(tmp_path / "FILE"))
    result = CliRunner().invoke(cli, ["report", str(REFERENCE / "results"), "--out", out])
    assert result.exit_code == 2 and "is not a writable folder" in result.stderr, result.output
    assert len(result.stderr.strip().splitlines()) == 1 and "Error" not in result.stderr, result.stderr


@pytest.mark.parametrize("args", [["report", "RESULTS", "--format", "csv"], ["report", "RESULTS"]])
def test_a_reader_that_stops_reading_gets_no_error_line(args):
    """`llmb report | head -1`: the pipe's reader left before llmb wrote. Nothing failed, so nothing is said (no
    BrokenPipeError line, no 'Exception ignored' at exit); exit 1 as rich's console exits for the same."""
    import sys

    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first byte
    try:
        args = [str(REFERENCE / "results") if a == "RESULTS" else a for a in args]
        done = subprocess.run(
            [sys.executable, "-m", "llmb", *args], stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=300
        )
    finally:
        os.close(write_end)
    assert done.returncode == 1 and done.stderr == "", done.stderr


def test_check_plugin_refuses_an_unwritable_out_before_running(tmp_path):
    (tmp_path / "file").write_text("not a folder")
    result = CliRunner().invoke(cli, ["check-plugin", "--plugin", "cpu", "--out", str(tmp_path / "file" / "c.json")])
    assert result.exit_code == 2 and "is not a writable folder" in result.stderr, result.output


# One bad file among good ones: every reader of many records reads the rest, names each file it leaves out (one line,
# with why) and says what it dropped. Each kind below is a class of its own (parsing, decoding, shape, range).


def _good_result() -> tuple[Path, str]:
    source = sorted((REFERENCE / "results" / "FP32").glob("*.json"))[0]
    return source, source.read_text()


def _with_value(text: str, key: str, raw: str) -> str:
    """The record's text with one top-level field's value replaced by raw JSON text (numbers Python won't dump)."""
    data = json.loads(text)
    data[key] = "@@"
    return json.dumps(data).replace('"@@"', raw)


def _nested(depth: int) -> str:
    return '{"a": ' * depth + "1" + "}" * depth


HOSTILE_RECORDS = {
    "deep-array": lambda good: ("[" * 100_000 + "]" * 100_000).encode(),
    "deep-object": lambda good: _nested(100_000).encode(),
    # Parses (under the recursion limit) but is nested far deeper than any record: later steps would recurse on it.
    "deep-inside-a-result": lambda good: _with_value(good, "run_id", _nested(500)).encode(),
    "huge-int": lambda good: _with_value(good, "tokens_per_second", str(10**400)).encode(),
    "huge-int-nested": lambda good: _with_value(good, "seed", "-" + str(10**600)).encode(),
    "too-many-digits": lambda good: _with_value(good, "batch_size", "9" * 5000).encode(),
    "truncated": lambda good: good[: len(good) // 2].encode(),
    "bad-utf8": lambda good: good.encode()[:40] + b"\xff\xfe\xc3" + good.encode()[40:],
    "top-level-list": lambda good: b"[1, 2, 3]",
    "top-level-string": lambda good: b'"llmb.result/1"',
    "top-level-null": lambda good: b"null",
    "empty": lambda good: b"",
    "wrong-types": lambda good: _with_value(good, "plugin", '"cpu"').encode(),
}


@pytest.mark.parametrize("kind", sorted(HOSTILE_RECORDS))
def test_report_and_features_read_the_good_files_and_name_the_bad_one(tmp_path, kind):
    source, good = _good_result()
    (tmp_path / "good.json").write_text(good)
    bad = tmp_path / "bad.json"
    bad.write_bytes(HOSTILE_RECORDS[kind](good))
    for args in (["report", str(tmp_path), "--format", "csv"], ["features", str(tmp_path), "--markdown"]):
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 0, (args, result.output)
        named = [line for line in result.stderr.splitlines() if str(bad) in line]
        assert len(named) == 1 and named[0].startswith("skipped: "), (args, result.stderr)
        assert "Traceback" not in result.output and "Error:" not in named[0], named[0]  # a why, not an exception
    report = CliRunner().invoke(cli, ["report", str(tmp_path), "--format", "csv"])
    assert json.loads(good)["run_id"] in report.stdout  # the good result is reported


@pytest.mark.parametrize("kind", sorted(HOSTILE_RECORDS))
def test_package_submission_reads_the_good_files_and_names_the_bad_one(tmp_path, kind):
    source, good = _good_result()
    (tmp_path / "good.json").write_text(good)
    (tmp_path / "bad.json").write_bytes(HOSTILE_RECORDS[kind](good))
    found, conformance, skipped = submission.load_inputs(tmp_path)
    assert [r.run_id for r in found] == [json.loads(good)["run_id"]]
    assert len(skipped) == 1 and skipped[0].startswith(f"{tmp_path / 'bad.json'}: "), skipped


def test_a_report_alone_on_a_bad_file_names_it_and_why(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("[" * 100_000 + "]" * 100_000)
    result = CliRunner().invoke(cli, ["report", str(bad)])
    assert result.exit_code == 1 and str(bad) in result.stderr and "nested deeper" in result.stderr, result.output


def test_two_results_of_one_run_report_one_and_name_the_copy(tmp_path):
    source, good = _good_result()
    (tmp_path / "a.json").write_text(good)
    (tmp_path / "b.json").write_text(good)
    other = json.loads(sorted((REFERENCE / "results" / "FP32").glob("*.json"))[1].read_text())
    (tmp_path / "c.json").write_text(json.dumps(other))
    result = CliRunner().invoke(cli, ["report", str(tmp_path), "--format", "csv"])
    assert result.exit_code == 0, result.output
    assert len(result.stdout.strip().splitlines()) == 1 + 2  # the header, then one row per run
    run_id = json.loads(good)["run_id"]
    named = [line for line in result.stderr.splitlines() if str(tmp_path / "b.json") in line]
    assert len(named) == 1 and run_id in named[0] and str(tmp_path / "a.json") in named[0], result.stderr
    features = CliRunner().invoke(cli, ["features", str(tmp_path)])
    assert str(tmp_path / "b.json") in features.stderr and run_id in features.stderr


def _sweep_with_result(folder: Path, result_text: bytes, extra_line: str = "") -> dict:
    folder.mkdir()
    header = {"schema": "llmb.sweep/1", "plugin": "cpu", "device": "cpu", "settings": {}}
    trial = {
        "type": "trial",
        "precision": "FP32",
        "batch_size": 1,
        "phase": "search",
        "index": 0,
        "status": "ok",
        "tokens_per_second": 1.0,
        "result": "r.json",
        "run_id": "x",
    }
    failed = {**trial, "batch_size": 2, "status": "oom", "result": None, "tokens_per_second": None, "run_id": None}
    lines = [json.dumps({"type": "sweep", **header}), json.dumps(trial), extra_line, json.dumps(failed)]
    (folder / LOG_NAME).write_text("\n".join(line for line in lines if line) + "\n")
    (folder / "r.json").write_bytes(result_text)
    return header


@pytest.mark.parametrize("kind", ["truncated", "deep-array", "huge-int", "bad-utf8", "top-level-list"])
def test_a_resumed_sweep_names_a_logged_result_that_does_not_read_and_runs_it_again(tmp_path, kind, capsys):
    source, good = _good_result()
    header = _sweep_with_result(tmp_path / "sweep", HOSTILE_RECORDS[kind](good))
    log = SweepLog.open(tmp_path / "sweep", header, resume=True)
    assert log.find("FP32", "search", 1) is None  # measured again, not trusted
    assert log.find("FP32", "search", 2) is not None  # the failed trial has no result to read: kept
    err = capsys.readouterr().err
    assert str(tmp_path / "sweep" / "r.json") in err and "run again" in err, err


@pytest.mark.parametrize("line", ['{"type": "trial", "prec', "[1, 2]", "[" * 50_000, '{"type": "trial", "index": 1}'])
def test_a_resumed_sweep_names_a_bad_log_line_and_keeps_the_others(tmp_path, line, capsys):
    source, good = _good_result()
    header = _sweep_with_result(tmp_path / "sweep", good.encode(), extra_line=line)
    log = SweepLog.open(tmp_path / "sweep", header, resume=True)
    assert log.find("FP32", "search", 1) is not None and log.find("FP32", "search", 2) is not None
    err = capsys.readouterr().err
    assert f"{tmp_path / 'sweep' / LOG_NAME}:3" in err, err


@pytest.mark.parametrize("name", ["../outside.json", "/etc/passwd", ".hidden.json", "sub/r.json"])
def test_a_resumed_sweep_never_reads_a_logged_result_name_as_a_path(tmp_path, name, capsys):
    source, good = _good_result()
    header = _sweep_with_result(tmp_path / "sweep", good.encode())
    log_path = tmp_path / "sweep" / LOG_NAME
    log_path.write_text(log_path.read_text().replace('"r.json"', json.dumps(name)))
    (tmp_path / "outside.json").write_text(good)
    log = SweepLog.open(tmp_path / "sweep", header, resume=True)
    assert log.find("FP32", "search", 1) is None
    assert "is not a file name" in capsys.readouterr().err


# Outputs never destroy inputs, never land where a record's text points, and a usage error leaves nothing on disk.


def _snapshot(folder: Path) -> dict:
    return {p: p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _report_inputs(tmp_path: Path) -> tuple[Path, Path]:
    folder = tmp_path / "results"
    folder.mkdir()
    for source in sorted((REFERENCE / "results" / "FP32").glob("*.json"))[:2]:
        shutil.copy(source, folder / source.name)
    return folder, sorted(folder.glob("*.json"))[0]


REPORT_CLOBBERS = {
    "out is an input result": lambda folder, first: ["--out", str(first), "--format", "json"],
    "out is an input result, as csv": lambda folder, first: [str(first), "--out", str(first), "--format", "csv"],
    "out inside the input folder": lambda folder, first: ["--out", str(folder / "report.json")],
    "out deep inside the input folder": lambda folder, first: ["--out", str(folder / "new" / "report.md")],
    "out via a symlink": lambda folder, first: ["--out", str(folder.parent / "link.json"), "--format", "md"],
    # A hard link to a file of an input folder is replaced by the atomic write, never written through: no input is
    # lost. A hard link to an input named on the command line is that input.
    "out as a hard link": lambda folder, first: [str(first), "--out", str(folder.parent / "hard.json")],
    "plot is the input folder": lambda folder, first: ["--plot", str(folder), "--format", "md"],
    "plot holds the input folder": lambda folder, first: ["--plot", str(folder.parent), "--format", "md"],
    "plot inside the input folder": lambda folder, first: ["--plot", str(folder / "plots"), "--format", "md"],
    "markdown plots beside it land in the input": lambda folder, first: ["--out", str(folder / "r.md")],
    "out is the reference": lambda folder, first: ["--reference", str(first), "--out", str(first), "--format", "csv"],
}


@pytest.mark.parametrize("case", sorted(REPORT_CLOBBERS))
def test_report_never_writes_over_into_or_around_its_inputs(tmp_path, case):
    folder, first = _report_inputs(tmp_path)
    (tmp_path / "link.json").symlink_to(first)
    os.link(first, tmp_path / "hard.json")
    before, listed = _snapshot(folder), sorted(tmp_path.rglob("*"))
    args = REPORT_CLOBBERS[case](folder, first)
    inputs = [] if str(first) in args[:1] else [str(folder)]
    result = CliRunner().invoke(cli, ["report", *inputs, *args])
    assert result.exit_code == 2, (case, result.output)
    assert "never replaces, enters or holds" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert _snapshot(folder) == before and sorted(tmp_path.rglob("*")) == listed  # nothing lost, nothing added


def test_report_out_beside_its_inputs_is_written(tmp_path):
    folder, first = _report_inputs(tmp_path)
    result = CliRunner().invoke(cli, ["report", str(folder), "--out", str(tmp_path / "report.json")])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "report.json").read_text())["schema"] == "llmb.report/1"


@pytest.mark.parametrize("value", ["r" * 120_000, "a/" * 3000 + "x", "x\x00y", "y" * 300])
def test_an_over_long_or_impossible_reference_or_path_is_a_usage_message(tmp_path, value):
    folder, first = _report_inputs(tmp_path)
    # A NUL never reaches a command line (argv cannot hold one); the option's value is checked all the same.
    paths = [] if "\x00" in value else [["report", value]]
    for args in [["report", str(folder), "--reference", value], *paths]:
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 2, (args[:2], result.output[-500:])
        assert "Traceback" not in result.output and "OSError" not in result.output
        assert len(result.stderr) < 1000  # the value is shown capped


@pytest.mark.parametrize(
    "field, value",
    [
        ("run_id", "../../outside-0"),
        ("run_id", "/etc/passwd"),
        ("run_id", "a/b/../../../../c"),
        ("run_id", ".."),
        ("run_id", "x" * 10_000),
        ("run_id", "nul\x00byte"),
        ("plugin", "../../plugin"),
        ("precision", "../.."),
        ("created", "../../2026"),
    ],
)
def test_a_records_text_never_makes_a_path(tmp_path, field, value):
    from records_factory import make_result

    record = make_result()
    if field == "plugin":
        record.plugin.name = value
    elif field == "precision":
        record.precision.effective = value
    else:
        setattr(record, field, value)
    out = tmp_path / "deep" / "out"
    name = results.result_filename(record)
    assert "/" not in name and "\x00" not in name and not name.startswith(".") and len(name.encode()) <= 255
    path = results.write_result(record, out)
    assert path.parent == out and [p.name for p in tmp_path.rglob("*") if p.is_file()] == [path.name]


@pytest.mark.parametrize(
    "command",
    [
        ["run", "--precision", "fp64"],
        ["run", "--device", "gpu!!"],
        ["run", "-O", "foo"],
        ["run", "-O", "nokey=1"],
        ["run", "-O", "x[/]=1"],
        ["run", "-O", "compile=[/bold]"],
        ["run", "--plugin", "no-such-plugin"],
        ["sweep", "--precision", "fp64"],
        ["sweep", "-O", "threads=many"],
        ["check-plugin", "--precision", "fp64", "--out", "checks/c.json"],
        ["commbench", "--device", "gpu!!", "--out", "bench/c.json"],
    ],
)
def test_a_usage_error_leaves_nothing_on_disk(tmp_path, monkeypatch, command):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, [*command, "--preset", "tiny"] if command[0] != "commbench" else command)
    assert result.exit_code == 2, (command, result.output)
    assert list(tmp_path.iterdir()) == [], command  # no results/, sweep/ or any other folder made


def test_an_archive_on_a_full_disk_leaves_no_temporary_file_and_keeps_the_old_archive(tmp_path, monkeypatch):
    import tarfile

    bundle = tmp_path / "Acme" / "box"
    bundle.mkdir(parents=True)
    (bundle / "a.json").write_text("{}")
    archive = tmp_path / "Acme" / "box.tar.gz"
    archive.write_bytes(b"the previous archive")

    def full_disk(self, *args, **kwargs):  # a disk that fills cannot be made here: the write fails as one would
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tarfile.TarFile, "addfile", full_disk)
    with pytest.raises(LlmbError, match="No space left on device"):
        submission.write_archive(bundle, archive, "Acme/box")
    assert sorted(p.name for p in archive.parent.iterdir()) == ["box", "box.tar.gz"]  # no .tmp left behind
    assert archive.read_bytes() == b"the previous archive"
