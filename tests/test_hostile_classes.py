"""Issue 26, by class rather than by instance: variants of each hostile input beyond those the issue listed (a folder
named x.json, a link, text no UTF-8 decoder takes, a figure no run can give, a record of no llmb schema; outputs over
a file llmb did not write; record text in every format; credentials in odd forms; a bundle however it is wrapped)."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import shutil
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner
from records_factory import make_result

from llmb import verify
from llmb.api.errors import LlmbError, UsageError
from llmb.api.settings import recorded
from llmb.bundle import reader as bundle_io
from llmb.cli import cli
from llmb.records import files as record_files
from llmb.run import sysinfo
from llmb.spec.redact import REDACTED, scrub
from llmb.submit import package as submission
from llmb.submit import reproduce
from llmb.terminal import console as term

REFERENCE = Path(__file__).resolve().parent.parent / "submissions" / "llmb" / "cpu-reference"


def _good() -> dict:
    return json.loads(sorted((REFERENCE / "results" / "FP32").glob("*.json"))[0].read_text())


def _set(key: str, value: object) -> Callable[[Path], None]:
    """A copy of the good result with one field changed (values Python writes as NaN/Infinity included)."""

    def write(path: Path) -> None:
        data = _good()
        parent, _, leaf = key.rpartition(".")
        (data[parent] if parent else data)[leaf] = value
        data["run_id"] = data["run_id"] if key == "run_id" else "other-run"
        path.write_text(json.dumps(data))

    return write


def _raw(text: bytes) -> Callable[[Path], None]:
    return lambda path: path.write_bytes(text)


# A file no reader of results can take, whatever it reads (report, features, package-submission).
BAD_FILES: dict[str, Callable[[Path], None]] = {
    # Searched like any folder (a torn file inside named once), never read as a file itself.
    "a folder named x.json": lambda path: (path.mkdir(), (path / "inner.json").write_text("{")),
    "a link to a folder": lambda path: path.symlink_to(path.parent.parent, target_is_directory=True),
    "a dangling link": lambda path: path.symlink_to(path.parent / "nowhere.json"),
    "a link to a file that is no JSON": lambda path: (
        (path.parent.parent / "notes.txt").write_text("not json"),
        path.symlink_to(path.parent.parent / "notes.txt"),
    ),
    "utf-16": lambda path: path.write_bytes(json.dumps(_good()).encode("utf-16")),
    "a byte order mark": lambda path: path.write_bytes(b"\xef\xbb\xbf" + json.dumps(_good()).encode()),
    "a lone surrogate": _raw(json.dumps({**_good(), "run_id": "x\ud800y"}).encode()),
    "a lone surrogate in a key": _raw(b'{"schema": "llmb.result/2", "\\udfff": 1}'),
    "no schema": _raw(b'{"hello": 1}'),
    "another program's schema": _raw(b'{"schema": "acme.bench/3", "tokens_per_second": 1}'),
    "a result schema this llmb does not read": _raw(json.dumps({**_good(), "schema": "llmb.result/99"}).encode()),
    "NaN at the top": _raw(b"NaN"),
    "whitespace only": _raw(b" \n\t "),
}

# A file of the result's shape whose figures no run can give: every reader that reads figures leaves it out.
BAD_FIGURES: dict[str, Callable[[Path], None]] = {
    "NaN tokens/s": _set("tokens_per_second", float("nan")),
    "Infinity tokens/s": _set("tokens_per_second", float("inf")),
    "-Infinity TFLOP/s": _set("tflops", float("-inf")),
    "1e999 (a float that overflows)": lambda path: path.write_text(
        json.dumps({**_good(), "run_id": "other-run", "samples_per_second": 12345.5}).replace("12345.5", "1e999")
    ),
    "negative tokens/s": _set("tokens_per_second", -5.0),
    "a batch of 0": _set("batch_size", 0),
    "a negative batch": _set("batch_size", -3),
    "no devices": _set("world_size", 0),
    "an empty run id": _set("run_id", ""),
    "a blank run id": _set("run_id", "   "),
    "steps as a string": _set("steps", "3"),
    "tokens/s as a string": _set("tokens_per_second", "1656.5"),
    "a NaN step time": _set("timing.step_seconds", [0.1, float("nan")]),
    "a boolean batch": _set("batch_size", True),
}


def _folder(tmp_path: Path, make: Callable[[Path], None]) -> tuple[Path, Path]:
    folder = tmp_path / "results"
    folder.mkdir()
    (folder / "good.json").write_text(json.dumps(_good()))
    bad = folder / "bad.json"
    make(bad)
    return folder, bad


def _named_once(stderr: str, bad: Path) -> str:
    named = [line for line in stderr.splitlines() if str(bad) in line]
    assert len(named) == 1 and named[0].startswith("skipped: "), stderr
    assert "Error" not in named[0] and "Errno" not in named[0] and "Traceback" not in stderr, named[0]
    return named[0]


@pytest.mark.parametrize("kind", sorted({**BAD_FILES, **BAD_FIGURES}))
def test_report_reads_the_good_result_and_names_each_bad_file_with_why(tmp_path, kind):
    folder, bad = _folder(tmp_path, {**BAD_FILES, **BAD_FIGURES}[kind])
    result = CliRunner().invoke(cli, ["report", str(folder), "--format", "csv"])
    assert result.exit_code == 0, result.output
    _named_once(result.stderr, bad)
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert [row["run_id"] for row in rows] == [_good()["run_id"]]  # the good one, and nothing of the bad one


@pytest.mark.parametrize("kind", sorted({**BAD_FILES, **BAD_FIGURES}))
def test_package_submission_reads_the_good_result_and_names_each_bad_file(tmp_path, kind):
    folder, bad = _folder(tmp_path, {**BAD_FILES, **BAD_FIGURES}[kind])
    found, _, skipped = submission.load_inputs(folder)
    assert [r.run_id for r in found] == [_good()["run_id"]]
    assert len(skipped) == 1 and skipped[0].startswith(f"{bad}"), skipped  # a folder: the torn file inside it


@pytest.mark.parametrize("kind", sorted({**BAD_FILES, **BAD_FIGURES}))
def test_features_names_each_file_it_cannot_read(tmp_path, kind):
    folder, bad = _folder(tmp_path, {**BAD_FILES, **BAD_FIGURES}[kind])
    result = CliRunner().invoke(cli, ["features", str(folder), "--markdown"])
    assert result.exit_code == 0, result.output
    _named_once(result.stderr, bad)


def test_other_llmb_records_beside_results_are_passed_over_in_silence(tmp_path):
    """A conformance record, a sweep summary and a bundle's system.json are llmb's own: not named as skipped."""
    folder = tmp_path / "results"
    shutil.copytree(REFERENCE, folder)
    result = CliRunner().invoke(cli, ["report", str(folder), "--format", "csv"])
    assert result.exit_code == 0 and "skipped" not in result.stderr, result.stderr
    found, conformance, skipped = submission.load_inputs(folder)
    assert len(found) == 9 and len(conformance) == 3 and skipped == []


def test_one_run_in_two_folders_is_read_once_and_the_copy_named_by_every_reader(tmp_path):
    folder = tmp_path / "results"
    for sub in ("a", "b/c"):
        (folder / sub).mkdir(parents=True)
        (folder / sub / "r.json").write_text(json.dumps(_good()))
    copy, first, run_id = folder / "b" / "c" / "r.json", folder / "a" / "r.json", _good()["run_id"]
    report = CliRunner().invoke(cli, ["report", str(folder), "--format", "csv"])
    assert report.exit_code == 0 and len(list(csv.DictReader(io.StringIO(report.stdout)))) == 1
    line = _named_once(report.stderr, copy)
    assert run_id in line and str(first) in line
    found, _, skipped = submission.load_inputs(folder)
    assert len(found) == 1 and len(skipped) == 1 and str(copy) in skipped[0] and str(first) in skipped[0]
    features = CliRunner().invoke(cli, ["features", str(folder)])
    assert str(copy) in features.stderr


def test_a_bad_sweep_log_among_results_is_named_and_the_package_reads_on(tmp_path):
    folder = tmp_path / "results"
    (folder / "sweep").mkdir(parents=True)
    (folder / "r.json").write_text(json.dumps(_good()))
    (folder / "sweep" / "sweep.jsonl").write_text('{"type": "sweep", "schema": "other"}\n')
    skipped: list[str] = []
    assert submission.sweep_phases(folder, skipped) == {}
    assert len(skipped) == 1 and skipped[0].startswith(str(folder / "sweep" / "sweep.jsonl")), skipped
    (folder / "sweep" / "sweep.jsonl").unlink()
    os.mkfifo(folder / "sweep" / "sweep.jsonl")  # a FIFO in the log's place: named, never waited on
    skipped = []
    submission.sweep_phases(folder, skipped)
    assert len(skipped) == 1 and "a FIFO" in skipped[0], skipped


@pytest.mark.parametrize("kind", ["a folder", "a FIFO"])
def test_reading_a_special_file_names_what_it_is(tmp_path, kind):
    path = tmp_path / "x.json"
    path.mkdir() if kind == "a folder" else os.mkfifo(path)
    with pytest.raises(record_files.Unreadable, match=f"^{kind}, not a regular file$"):
        record_files.read_object(path)


def test_reproduce_names_a_bundle_result_that_does_not_read(tmp_path, monkeypatch):
    bundle = shutil.copytree(REFERENCE, tmp_path / "bundle")
    bad = sorted((bundle / "results" / "FP32").glob("*.json"))[0]
    bad.write_text("[" * 100_000)
    monkeypatch.setattr(reproduce, "reproduce_one", lambda root, record, runs, timeout: [record] * runs)
    warned: list[str] = []
    said: list[str] = []
    rows = reproduce.reproduce(bundle, warn=warned.append, say=said.append)
    assert rows and all(row.passed for row in rows)
    assert len(warned) == 1 and warned[0].startswith(str(bad.relative_to(bundle))) and "nested" in warned[0]
    # The bundle no longer verifies (its manifest's hash of that file, the file's schema): said before any run.
    assert said[0].startswith("this bundle does not verify (") and "it does not make it valid" in said[0], said[0]
    assert all(line.startswith("reproducing ") for line in said[1:])


# Outputs: nothing llmb did not write is replaced; a name from a record or a bundle is never a path.


def test_leaderboard_never_writes_through_a_link_in_its_site_folder(tmp_path):
    precious = tmp_path / "precious.txt"
    precious.write_text("keep me")
    site = tmp_path / "site"
    site.mkdir()
    (site / "index.html").symlink_to(precious)
    result = CliRunner().invoke(cli, ["leaderboard", str(REFERENCE), "--out", str(site)])
    assert result.exit_code == 2 and "not a regular file" in result.stderr, result.output
    assert precious.read_text() == "keep me" and sorted(p.name for p in site.iterdir()) == ["index.html"]


def test_leaderboard_lists_a_bundle_given_twice_once_and_names_the_copy(tmp_path):
    link = tmp_path / "link"
    link.symlink_to(REFERENCE)
    result = CliRunner().invoke(cli, ["leaderboard", str(REFERENCE), str(link), "--out", str(tmp_path / "site")])
    assert result.exit_code == 0, result.output
    assert "1 submission(s)" in result.stdout and f"skipped: {link}: the bundle {REFERENCE}" in result.stderr
    assert sorted(p.name for p in (tmp_path / "site").iterdir()) == ["index.html", "submission-1.html"]


def test_package_archive_replaces_only_an_archive_llmb_wrote_of_that_bundle(tmp_path):
    archive = tmp_path / "box.tar.gz"
    archive.write_bytes(b"the user's own file")
    with pytest.raises(UsageError, match="exists: remove it or pass --force"):
        submission.check_archive_replaceable(archive, "Acme/box", force=False)
    with pytest.raises(UsageError, match="only an archive llmb wrote"):
        submission.check_archive_replaceable(archive, "Acme/box", force=True)
    with tarfile.open(archive, "w:gz") as tar:  # another bundle's archive by the same name: not this one's
        tar.add(REFERENCE / "summary.md", arcname="Other/box/summary.md")
    with pytest.raises(UsageError, match="only an archive llmb wrote"):
        submission.check_archive_replaceable(archive, "Acme/box", force=True)
    bundle = tmp_path / "box"
    bundle.mkdir()
    (bundle / "a.json").write_text("{}")
    submission.write_archive(bundle, archive, "Acme/box")
    submission.check_archive_replaceable(archive, "Acme/box", force=True)  # its own: replaced
    link = tmp_path / "link.tar.gz"
    link.symlink_to(archive)
    with pytest.raises(UsageError, match="only an archive llmb wrote"):
        submission.check_archive_replaceable(link, "Acme/box", force=True)


@pytest.mark.parametrize("distribution", ["../../outside", "a/b", "..", "x\ny", "-rf"])
def test_a_recorded_plugin_distribution_never_names_a_folder_of_the_bundle(distribution):
    record = make_result()
    record.plugin.distribution = distribution
    with pytest.raises(LlmbError, match="not a plain file name"):
        submission.plugin_entries([record])


def _shipped(root: Path, distribution: str, version: str = "1.0", entry: str = 'p = "pkg.mod:Backend"') -> None:
    source = root / "code" / "plugins" / distribution
    source.mkdir(parents=True)
    (source / "pyproject.toml").write_text(
        f'[project]\nname = "{distribution}"\nversion = "{version}"\n[project.entry-points.llmb]\n{entry}\n'
    )


@pytest.mark.parametrize(
    "distribution, version, entry",
    [
        ("../../etc", "1.0", 'p = "pkg.mod:Backend"'),
        ("plugin", "../../../outside", 'p = "pkg.mod:Backend"'),
        ("plugin", "1.0\\nName: other", 'p = "pkg.mod:Backend"'),
        ("plugin", "1.0", '"p\\n[console_scripts]\\nx" = "pkg.mod:Backend"'),
        ("plugin", "1.0", "p = = broken toml"),
    ],
)
def test_reproduce_never_makes_a_path_or_a_metadata_line_from_a_bundles_text(tmp_path, distribution, version, entry):
    root, site = tmp_path / "bundle", tmp_path / "site"
    if ".." not in distribution:
        _shipped(root, distribution, version, entry)
    with pytest.raises(LlmbError):
        reproduce.shipped_plugin_path(root, distribution, site)
    assert not site.exists() and not (tmp_path / "outside-1.0.dist-info").exists()


def test_reproduce_makes_the_dist_info_of_a_plain_plugin(tmp_path):
    _shipped(tmp_path / "bundle", "llmb-acme", "0.2.1")
    paths = reproduce.shipped_plugin_path(tmp_path / "bundle", "llmb-acme", tmp_path / "site")
    assert (tmp_path / "site" / "llmb_acme-0.2.1.dist-info" / "entry_points.txt").is_file() and len(paths) == 2


@pytest.mark.parametrize(
    "command",
    [
        ["sweep", "--preset", "tiny", "--search", "nokey=1,2", "--out", "deep/sweep"],
        ["sweep", "--preset", "tiny", "--search", "nokey=1,2"],
        ["run", "--preset", "tiny", "--sequence-parallel"],
        ["run", "--preset", "tiny", "--pp-schedule", "1f1b"],
        ["run", "--preset", "tiny", "--out", "deep/er/results", "-O", "threads=many"],
        ["reproduce", "--tolerance", "nan", str(REFERENCE)],
        ["reproduce", "--tolerance", "inf", str(REFERENCE)],
    ],
)
def test_a_usage_error_leaves_nothing_on_disk_whatever_folders_it_would_have_made(tmp_path, monkeypatch, command):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, command)
    assert result.exit_code == 2, (command, result.output)
    assert list(tmp_path.iterdir()) == [], command


# Record text in every format it lands in.

LEADS = ['"=1+1', "'=1+1", ' "@SUM(1)', "\u200b=1+1", "\ufeff+1", "\u00a0=1", "\u3000-1+2", '""=cmd|" /C calc"!A0']


@pytest.mark.parametrize("value", LEADS)
def test_a_formula_behind_quotes_blanks_or_invisible_characters_is_neutralised(tmp_path, value):
    folder = tmp_path / "r"
    folder.mkdir()
    record = make_result(plugin=value, device_name=value, run_id="lead0001")
    (folder / "r.json").write_text(json.dumps(record.to_dict()))
    result = CliRunner().invoke(cli, ["report", str(folder), "--format", "csv"])
    assert result.exit_code == 0, result.output
    row = next(csv.DictReader(io.StringIO(result.stdout)))
    for key in ("method", "device"):
        assert row[key].startswith("'"), (key, row[key])
    assert term.csv_cell("a=b") == "a=b" and term.csv_cell("-1.5") == "'-1.5"


@pytest.mark.parametrize("value", ["- item", "+ item", "1. item", "12) item", "===", "---", "$\\color{red}{x}$"])
def test_a_note_on_its_own_line_in_summary_markdown_stays_a_paragraph(value):
    shown = term.markdown(value)
    assert not re.match(r"\s*([-+=]|\d+[.)])(\s|$)", shown) and "$" not in shown.replace("\\$", ""), shown
    assert term.markdown("-1.5") == "-1.5" and term.markdown("1,656.5") == "1,656.5"  # figures stay as written


def test_search_results_print_their_text_escaped(capsys):
    from llmb.run import grid

    summary = {
        "combinations": [{"folder": "compile=[bold]x[/bold]", "error": "RuntimeError: \x1b[2J\u202eevil"}],
        "best": {},
    }
    grid.print_search(summary, term.out)
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\u202e" not in out and "\\x1b" in out and "\\u202e" in out
    assert "[bold]x[/bold]" in out  # shown as written, never markup


# Secrets in odd forms: scrubbed wherever a value is recorded.


@pytest.mark.parametrize(
    "value",
    [
        "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",  # an AWS secret access key standing alone
        "https://store.example/x?sv=2024&sig=Zm9vYmFyYmF6cXV4&se=1",  # an Azure SAS signature
        "--xla_cache=https://h/x?secret%3DSECRETVALUE",  # a pair URL-encoded
        "mlx5_0:1 password SECRETVALUE",  # a credential word, its value the next word
        "Authorization: Bearer SECRETVALUE123",
        "eth0,token SECRETVALUE",
        "--api-key SECRETVALUE",
        "redis://:SECRETVALUE@cache:6379",
    ],
)
def test_credentials_in_odd_forms_never_reach_a_record(value):
    for name in ("NCCL_IB_HCA", "NCCL_SOCKET_IFNAME", "XLA_FLAGS", "OMP_PLACES", "LIBTPU_INIT_ARGS"):
        kept = sysinfo.run_environment({name: value})[name]
        assert "SECRETVALUE" not in kept and "wJalrXUtnFEMI" not in kept and "Zm9vYmFy" not in kept, kept
    assert "SECRETVALUE" not in json.dumps(recorded({"cache_url": value}))  # a plugin's setting too


@pytest.mark.parametrize("value", ["expandable_segments:True", "{0:4},{4:4}", "mlx5_0:1,mlx5_1:1", "--xla_foo=true"])
def test_ordinary_values_are_kept_as_written(value):
    assert scrub(value) == value


def test_a_system_file_never_records_a_value_under_a_credentials_name_at_any_depth():
    merged = sysinfo.complete({}, {"bmc": {"user": "admin", "password": "hunter2"}, "notes": [{"api_key": "k1"}]})
    assert "hunter2" not in json.dumps(merged) and "k1" not in json.dumps(merged)
    assert merged["bmc"] == {"user": "admin", "password": REDACTED}


# Bundles verify however they are wrapped.


@pytest.mark.parametrize("wrapper", ["", "one", "a/b/c/d/e"])
def test_a_bundle_folder_verifies_inside_any_wrapper_folders(tmp_path, wrapper):
    top = tmp_path / "given"
    shutil.copytree(REFERENCE, top / wrapper / "cpu-reference")
    rows = verify.verify(top, accept_debug=True)
    assert all(row.passed for row in rows), [row for row in rows if not row.passed]


@pytest.mark.parametrize("arcname", ["cpu-reference", "a/b/c/d/cpu-reference", "submissions/llmb/cpu-reference"])
def test_a_bundle_archive_verifies_however_deep_its_wrapper(tmp_path, arcname):
    archive = tmp_path / "bundle.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(REFERENCE, arcname=arcname)
    rows = verify.verify(archive, accept_debug=True)
    assert all(row.passed for row in rows), [row for row in rows if not row.passed]


def test_a_folder_of_two_bundles_is_refused_naming_them(tmp_path):
    for name in ("one", "two"):
        shutil.copytree(REFERENCE, tmp_path / "given" / name)
    with pytest.raises(bundle_io.Refused, match="found 2 \\(one, two\\)"), bundle_io.open_bundle(tmp_path / "given"):
        pass
