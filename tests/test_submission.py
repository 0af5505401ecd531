"""Submission bundles end to end on the CPU: package real tiny runs, verify them, tamper with them, attack verify.

The runs are real (tiny preset, 2 measured steps) and are made once for the module. The llmb package is copied to a
temporary folder with a fresh release manifest, so these tests do not depend on the working tree's manifest.
"""

import io
import json
import shutil
import subprocess
import tarfile
from importlib import metadata
from pathlib import Path

import pytest
from click.testing import CliRunner

from llmb import verify
from llmb.api.errors import LlmbError, UsageError
from llmb.bundle import manifest
from llmb.cli import cli
from llmb.conformance.check import check_plugin
from llmb.records import Result
from llmb.run import runner, sysinfo
from llmb.spec.presets import build_config
from llmb.submit import package as submission
from llmb.submit.package import PackageOptions

SECRET = "hunter2-do-not-record"


def tiny_run(precision: str) -> runner.Result:
    """A run as `llmb run` makes it: in a worker, judged from this process (a bundle holds clean-room runs only)."""
    from llmb.judge import cleanroom

    options = runner.RunOptions(
        config=build_config("tiny"), preset="tiny", device="cpu", precision=precision, steps=2, warmup_steps=1
    )
    (record,) = cleanroom.run_clean([options])
    return record


def fresh_package(folder: Path) -> Path:
    """A copy of the installed llmb with a manifest of itself: a release, as far as these tests are concerned."""
    package = folder / "llmb"
    shutil.copytree(manifest.PACKAGE_DIR, package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (package / manifest.MANIFEST_NAME).unlink(missing_ok=True)
    manifest.write(package)
    return package


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """Results (3 FP32 + 3 BF16 runs), a BF16 conformance record, a released package, and a bundle of them."""
    base = tmp_path_factory.mktemp("made")
    results = base / "results"
    for precision in ("FP32", "FP32", "FP32", "BF16", "BF16", "BF16"):
        runner.write(tiny_run(precision), results)
    # BF16's conformance record is given; FP32's is run by the packager, as a submitter without one would see.
    (results / "conformance-bf16.json").write_text(json.dumps(check_plugin("cpu", "cpu", "BF16", steps=2).to_dict()))
    package = fresh_package(base / "release")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
        mp.setenv("CUDA_API_TOKEN", SECRET)
        mp.setenv("MY_PASSWORD", SECRET)
        root, skipped = submission.package(
            PackageOptions(
                submitter="Acme",
                system="cpu-box",
                results=results,
                out=base / "submissions",
                archive=True,
                allow_debug_shapes=True,
                package_dir=package,
                note="Tiny preset: a test bundle.",
                check_plugin=check_plugin,
            )
        )
    assert skipped == []
    return {"results": results, "package": package, "root": root, "base": base}


@pytest.fixture(autouse=True)
def the_test_package_is_a_known_release(made, monkeypatch):
    """verify trusts only the releases its installation lists; these tests' release is the copied package's."""
    known = manifest.releases(made["package"])
    monkeypatch.setattr(manifest, "releases", lambda package_dir=manifest.PACKAGE_DIR: known)


def rows_by_check(rows) -> dict:
    return {row.check: row for row in rows}


def failing(rows) -> dict:
    return {row.check: row.detail for row in rows if not row.passed}


def copy_bundle(made, tmp_path) -> Path:
    target = tmp_path / "bundle"
    shutil.copytree(made["root"], target)
    return target


def resign(root: Path) -> None:
    """Rewrite MANIFEST.sha256 after a tampering, as a careful forger would, so only the semantic checks remain."""
    submission.write_manifest(root)


def edit_json(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data, indent=2))


def result_files(root: Path, precision: str) -> list[Path]:
    return sorted((root / "results" / precision).glob("*.json"))


# The round trip


def test_bundle_round_trips_through_verify_as_a_debug_bundle(made):
    rows = verify.verify(made["root"], accept_debug=True)
    assert failing(rows) == {}
    assert len(rows) >= 15
    strict = failing(verify.verify(made["root"]))
    assert set(strict) == {"official bundle", "official shape"}, strict
    assert "not the official shape (hidden_size is 64" in strict["official shape"]


def test_archive_round_trips_too(made):
    archive = made["root"].parent / "cpu-box.tar.gz"
    rows = verify.verify(archive, accept_debug=True)
    assert failing(rows) == {}
    assert rows[0].check == "archive"


def test_verify_command_exit_codes(made):
    ok = CliRunner().invoke(cli, ["verify", str(made["root"]), "--accept-debug"])
    assert ok.exit_code == 0, ok.output
    assert "checks passed" in ok.output
    strict = CliRunner().invoke(cli, ["verify", str(made["root"])])
    assert strict.exit_code == 1
    assert "FAIL" in strict.output and "checks failed" in strict.output


def test_bundle_layout_and_contents(made):
    root = made["root"]
    assert len(result_files(root, "FP32")) == 3 and len(result_files(root, "BF16")) == 3
    assert len(list((root / "conformance").glob("*.json"))) == 2
    for name in ("system.json", "submission.json", "summary.md", "MANIFEST.sha256", submission.CODE_DIFF):
        assert (root / name).is_file(), name
    sub = json.loads((root / "submission.json").read_text())
    assert sub["debug"]["is_debug"] and sub["debug"]["allow_debug_shapes"]
    assert sub["division"] == "closed" and sub["llmb_changes"] == []
    summary = (root / "summary.md").read_text()
    assert "| TF32 | not supported by cpu |" in summary
    assert "| FP16 | not submitted |" in summary
    assert "| FP32 | cpu | defaults | pure | tiny (4.2M params) | 1 |" in summary and "DEBUG BUNDLE" in summary
    system = json.loads((root / "system.json").read_text())
    for key in ("submitter", "system_name", "host_processor_model_name", "host_memory_capacity", "framework"):
        assert system[key], key
    assert system["plugins"] == [{"name": "cpu", "distribution": "llmb", "version": system["llmb_version"]}]


def test_no_secret_is_recorded(made):
    system = json.loads((made["root"] / "system.json").read_text())
    assert system["environment"]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert "CUDA_API_TOKEN" not in system["environment"]  # not in sysinfo.ENV_NAMES (and its name is a credential's)
    assert "MY_PASSWORD" not in system["environment"]
    assert "PATH" not in system["environment"] and "HOME" not in system["environment"]
    for path in made["root"].rglob("*"):
        if path.is_file():
            assert SECRET not in path.read_text(errors="replace"), path


# Tampering: each caught by a row that says why


def tamper_throughput(root):
    edit_json(result_files(root, "FP32")[0], lambda r: r.update(tokens_per_second=r["tokens_per_second"] * 2))


def tamper_step_time(root):
    edit_json(result_files(root, "FP32")[0], lambda r: r["timing"]["step_seconds"].__setitem__(0, 1e3))


def tamper_window(root):
    # Claim half the time, with every derived figure made to agree: only the step times give it away.
    def halve(r):
        r["timing"]["window_seconds"] /= 2
        r["timing"]["repeat_window_seconds"] = [r["timing"]["window_seconds"]]
        for key in ("tokens_per_second", "samples_per_second", "tflops", "fom"):
            r[key] *= 2

    edit_json(result_files(root, "FP32")[0], halve)


def tamper_remove(root):
    result_files(root, "FP32")[0].unlink()


def tamper_add(root):
    source = result_files(root, "FP32")[0]
    shutil.copy(source, source.with_name("added.json"))


def tamper_code_file(path: str):
    def tamper(root):
        def changed(status):
            for entry in status["files"]:
                if entry["path"] == path:
                    entry.update(status="changed", sha256="0" * 64)

        edit_json(root / submission.CODE_STATUS, changed)

    return tamper


tamper_model = tamper_code_file(manifest.MODEL_PATH)


def tamper_fingerprint(root):
    edit_json(result_files(root, "FP32")[0], lambda r: r.update(model_fingerprint="f" * 64))


def tamper_relabel(root):
    # A BF16 run filed under FP32, with its label and the audit's verdict rewritten: the evidence still says BF16.
    source = result_files(root, "BF16")[0]
    target = root / "results" / "FP32" / source.name.replace("BF16", "FP32")

    def relabel(r):
        r["precision"]["effective"] = r["precision"]["audit"]["effective"] = "FP32"
        r["precision"]["audit"]["evidence"] = {k: "FP32" for k in r["precision"]["audit"]["evidence"]}

    edit_json(source, relabel)
    source.rename(target)
    edit_json(
        root / "submission.json",
        lambda s: s.update(results=[p.replace(f"BF16/{source.name}", f"FP32/{target.name}") for p in s["results"]]),
    )


def tamper_summary(root):
    path = root / "summary.md"
    path.write_text(path.read_text().replace("| tiny (4.2M params) | 1 |", "| tiny (4.2M params) | 8 |", 1))


def tamper_duplicate(root):
    source = result_files(root, "FP32")[0]
    copy = source.with_name("copy.json")
    shutil.copy(source, copy)
    edit_json(copy, lambda r: r.update(run_id="deadbeef"))
    edit_json(root / "submission.json", lambda s: s["results"].append(copy.relative_to(root).as_posix()))


def tamper_conformance(root):
    for path in (root / "conformance").glob("*.json"):
        edit_json(path, lambda c: c.update(passed=False))


def tamper_malformed(root):
    result_files(root, "FP32")[0].write_text('{"schema": "llmb.result/1", "tokens_per_second": ')


TAMPERINGS = [
    ("edited throughput", tamper_throughput, "throughput recomputed", "tokens_per_second recorded"),
    ("edited step time", tamper_step_time, "step times", "more than the"),
    ("edited window", tamper_window, "run evidence", "is not its judged time"),
    ("removed file", tamper_remove, "result schema", "not the ones submission.json lists"),
    ("added file", tamper_add, "result schema", "not the ones submission.json lists"),
    ("changed model file", tamper_model, "model and loop unchanged", "llmb/model.py is changed"),
    # The shape left model.py in release 4 (torch-free, for the records): editing it is editing the model.
    ("changed shape file", tamper_code_file(manifest.SHAPE_PATH), "model and loop unchanged", "shape.py is changed"),
    ("changed model fingerprint", tamper_fingerprint, "model fingerprint", "is not the released"),
    ("precision under a higher label", tamper_relabel, "effective precision", "the audit's evidence shows BF16"),
    ("edited summary", tamper_summary, "summary.md", "the results give"),
    ("duplicated run", tamper_duplicate, "runs per precision", "repeats the step times"),
    ("failed conformance", tamper_conformance, "conformance", "conformance failed"),
    ("malformed JSON", tamper_malformed, "result schema", "not valid JSON"),
]


@pytest.mark.parametrize("what, tamper, check, reason", TAMPERINGS, ids=[t[0] for t in TAMPERINGS])
def test_each_tampering_is_caught_with_a_reason(made, tmp_path, what, tamper, check, reason):
    root = copy_bundle(made, tmp_path)
    tamper(root)
    unsigned = failing(verify.verify(root, accept_debug=True))
    assert "manifest" in unsigned, f"{what}: the manifest did not notice"
    resign(root)
    found = failing(verify.verify(root, accept_debug=True))
    assert check in found, f"{what}: {found}"
    assert reason in found[check], found[check]


def test_removed_file_is_named_by_the_manifest(made, tmp_path):
    root = copy_bundle(made, tmp_path)
    gone = result_files(root, "FP32")[0]
    gone.unlink()
    detail = failing(verify.verify(root, accept_debug=True))["manifest"]
    assert f"listed file missing: results/FP32/{gone.name}" in detail


def test_added_file_is_named_by_the_manifest(made, tmp_path):
    root = copy_bundle(made, tmp_path)
    (root / "code" / "extra.py").write_text("print('hello')\n")
    detail = failing(verify.verify(root, accept_debug=True))["manifest"]
    assert "file not listed: code/extra.py" in detail


def test_a_link_in_a_bundle_folder_refuses_the_bundle_unread(made, tmp_path):
    root = copy_bundle(made, tmp_path)
    outside = tmp_path / "outside.json"
    outside.write_text(json.dumps(json.loads(result_files(root, "FP32")[0].read_text())))
    (root / "results" / "FP32" / "link.json").symlink_to(outside)
    found = failing(verify.verify(root, accept_debug=True))
    assert set(found) == {"bundle"}, found
    assert "symlink results/FP32/link.json" in found["bundle"]


def test_conformance_must_match_the_runs_device_and_precision(made, tmp_path):
    root = copy_bundle(made, tmp_path)
    for path in (root / "conformance").glob("*.json"):
        edit_json(path, lambda c: c["device"].update(type="cuda"))
    resign(root)
    assert "checked on cuda, ran on {'cpu'}" in failing(verify.verify(root, accept_debug=True))["conformance"]


def test_malformed_bundle_files_give_failing_rows_not_crashes(made, tmp_path):
    root = copy_bundle(made, tmp_path)
    for name in ("submission.json", "system.json", submission.CODE_STATUS):
        (root / name).write_text("[1, 2")
    (root / submission.CODE_DIFF).write_text("garbage\n")
    edit_json(result_files(root, "FP32")[0], lambda r: r.update(config={"hidden_size": "wide"}, timing=[]))
    resign(root)
    found = failing(verify.verify(root, accept_debug=True))
    for check in ("submission.json", "system.json", "code diff", "result schema", "summary.md"):
        assert check in found, found


# The packager's refusals and the code diff


def test_package_refuses_a_changed_model(made, tmp_path):
    package = tmp_path / "llmb"
    shutil.copytree(made["package"], package)
    (package / "model.py").write_text((package / "model.py").read_text() + "\n# tuned\n")
    options = PackageOptions("Acme", "box", made["results"], out=tmp_path / "out", package_dir=package)
    with pytest.raises(LlmbError, match="model.py is not the released model"):
        submission.package(options)
    assert not (tmp_path / "out" / "Acme" / "box").exists()


@pytest.mark.parametrize(
    "change, message",
    [
        ({"allow_debug_shapes": False}, "no results to submit"),
        ({"run_conformance": False}, "no conformance record for plugin cpu FP32"),
        ({"submitter": "../evil"}, "must be letters"),
    ],
)
def test_package_refusals(made, tmp_path, change, message):
    options = PackageOptions(
        "Acme", "box", made["results"], out=tmp_path / "out", allow_debug_shapes=True, package_dir=made["package"]
    )
    for key, value in change.items():
        setattr(options, key, value)
    with pytest.raises(UsageError, match=message):
        submission.package(options)


def test_package_refuses_fewer_than_three_runs(made, tmp_path):
    results = tmp_path / "results"
    shutil.copytree(made["results"], results)
    next(p for p in sorted(results.glob("*.json")) if "-BF16-" in p.name).unlink()
    options = PackageOptions(
        "Acme", "box", results, out=tmp_path / "out", allow_debug_shapes=True, package_dir=made["package"]
    )
    with pytest.raises(UsageError, match="at least 3 runs.*BF16: 2"):
        submission.package(options)


def with_conformance(made, tmp_path) -> Path:
    """The results plus the bundle's conformance records, so repackaging runs no check."""
    results = tmp_path / "results"
    shutil.copytree(made["results"], results)
    for path in (made["root"] / "conformance").glob("*.json"):
        shutil.copy(path, results / path.name)
    return results


def package_changed(made, tmp_path, name: str) -> Path:
    """Bundle the results from a copy of the release with one file changed and one added."""
    package = tmp_path / "current" / "llmb"
    shutil.copytree(made["package"], package)
    (package / name).write_text((package / name).read_text() + "# a vendor's change\n")
    (package / "vendor_extra.py").write_bytes(b"EXTRA = 1\r\nOTHER = 2")  # CRLF, no final newline: kept exactly
    options = PackageOptions(
        "Acme",
        "box",
        with_conformance(made, tmp_path),
        out=tmp_path / "out",
        allow_debug_shapes=True,
        package_dir=package,
        release_sources=[made["package"].parent],
    )
    return submission.package(options)[0]


def test_changed_files_are_shown_as_diffs_that_verify(made, tmp_path):
    root = package_changed(made, tmp_path, "spec/flops.py")
    sub = json.loads((root / "submission.json").read_text())
    assert sub["division"] == "open" and sub["llmb_changes"] == ["llmb/spec/flops.py", "llmb/vendor_extra.py"]
    diff = (root / submission.CODE_DIFF).read_text()
    assert "+# a vendor's change" in diff and "--- /dev/null\n+++ b/llmb/vendor_extra.py" in diff
    assert failing(verify.verify(root, accept_debug=True)) == {}
    # Claiming the closed division with changed code is caught.
    edit_json(root / "submission.json", lambda s: s.update(division="closed", llmb_changes=[]))
    resign(root)
    assert "division" in failing(verify.verify(root, accept_debug=True))["code diff"]


def test_a_changed_training_loop_fails_verify(made, tmp_path):
    root = package_changed(made, tmp_path, "training/loop.py")
    found = failing(verify.verify(root, accept_debug=True))
    assert set(found) == {"model and loop unchanged"}
    assert "llmb/training/loop.py is changed" in found["model and loop unchanged"]


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed on this machine")
def test_released_text_comes_from_git_history_or_the_change_is_refused(made, tmp_path):
    package = tmp_path / "repo" / "llmb"
    shutil.copytree(made["package"], package)
    options = PackageOptions(
        "Acme", "box", with_conformance(made, tmp_path), out=tmp_path / "out", allow_debug_shapes=True
    )
    options.package_dir = package
    (package / "spec" / "flops.py").write_text((package / "spec" / "flops.py").read_text() + "# changed\n")
    with pytest.raises(LlmbError, match="llmb/spec/flops.py differs from the release .* --release-source"):
        submission.package(options)
    # Now commit the released text to git, as a development checkout has it.
    (package / "spec" / "flops.py").write_text((made["package"] / "spec" / "flops.py").read_text())
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run(["git", "init", "-q"], cwd=package.parent, check=True)
    subprocess.run([*git, "add", "-A"], cwd=package.parent, check=True)
    subprocess.run([*git, "commit", "-qm", "release"], cwd=package.parent, check=True)
    (package / "spec" / "flops.py").write_text((package / "spec" / "flops.py").read_text() + "# changed\n")
    root, _ = submission.package(options)
    assert "+# changed" in (root / submission.CODE_DIFF).read_text()
    assert failing(verify.verify(root, accept_debug=True)) == {}


# Malicious archives: refused, nothing written outside the temporary folder


def malicious_archive(path: Path, member: tarfile.TarInfo, data: bytes = b"") -> Path:
    with tarfile.open(path, "w:gz") as tar:
        ok = tarfile.TarInfo("bundle/MANIFEST.sha256")
        tar.addfile(ok, io.BytesIO(b""))
        tar.addfile(member, io.BytesIO(data) if member.isreg() else None)
    return path


def member(name: str, kind: bytes = tarfile.REGTYPE, size: int = 4, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.size, info.linkname = kind, size if kind == tarfile.REGTYPE else 0, linkname
    return info


def test_malicious_archives_are_refused(tmp_path, monkeypatch):
    outside = tmp_path / "outside"
    outside.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)  # a relative escape would land next to the archive
    cases = {
        "absolute path": (member(str(outside / "abs.txt")), "absolute path"),
        "dot-dot": (member("bundle/../../outside/up.txt"), "escapes the folder"),
        "symlink": (member("bundle/link", tarfile.SYMTYPE, linkname=str(outside)), "link"),
        "hard link": (member("bundle/hard", tarfile.LNKTYPE, linkname="/etc/passwd"), "link"),
        "device": (member("bundle/dev", tarfile.CHRTYPE), "special file"),
        "fifo": (member("bundle/fifo", tarfile.FIFOTYPE), "special file"),
        "oversized": (member("bundle/big.bin", size=2048), "bytes (limit 1024)"),
    }
    for what, (info, reason) in cases.items():
        archive = malicious_archive(work / f"{what}.tar.gz", info, b"x" * info.size)
        rows = verify.verify(archive, limits=verify.Limits(member_bytes=1024))
        assert [r.check for r in rows] == ["archive"], what
        assert not rows[0].passed and reason in rows[0].detail, (what, rows[0].detail)
    assert list(outside.iterdir()) == []
    assert sorted(p.name for p in work.iterdir()) == sorted(f"{what}.tar.gz" for what in cases)


def test_not_an_archive_is_a_failing_row(tmp_path):
    bogus = tmp_path / "bundle.tar.gz"
    bogus.write_bytes(b"not gzip at all")
    rows = verify.verify(bogus)
    assert len(rows) == 1 and not rows[0].passed and "not a readable tar archive" in rows[0].detail


def test_plugin_source_is_copied_with_hashes(tmp_path):
    # pluggy stands in for a plugin distribution installed from a wheel (the way most plugins will be).
    version = metadata.version("pluggy")
    record = submission.copy_plugin_source("pluggy", version, tmp_path / "pluggy")
    assert record["origin"] == "installed distribution" and record["version"] == version
    assert "pluggy/__init__.py" in record["files"]
    assert not [name for name in record["files"] if name.endswith(".pyc") or "__pycache__" in name]
    for name, digest in record["files"].items():
        assert manifest.sha256_file(tmp_path / "pluggy" / name) == digest
    with pytest.raises(LlmbError, match="is not installed"):
        submission.copy_plugin_source("no-such-llmb-plugin", "1.0", tmp_path / "x")


def test_a_plugin_distribution_needs_its_source_in_the_bundle(made, tmp_path):
    # The bundle's one plugin claimed by a third-party distribution (pluggy stands in for it): no source, a failing
    # row; with the source record added by the packager's own function, the row passes.
    root = copy_bundle(made, tmp_path)
    edit_json(
        root / "submission.json",
        lambda s: s["plugins"][0].update(distribution="pluggy", source="code/plugins/pluggy"),
    )
    resign(root)
    assert "code/plugins/pluggy.json is missing" in failing(verify.verify(root, accept_debug=True))["plugin source"]
    version = json.loads((root / "submission.json").read_text())["plugins"][0]["version"]
    record = submission.copy_plugin_source("pluggy", version, root / "code" / "plugins" / "pluggy")
    (root / "code" / "plugins" / "pluggy.json").write_text(json.dumps(record))
    resign(root)
    assert "plugin source" not in failing(verify.verify(root, accept_debug=True))


def test_package_submission_command_gives_one_line_on_bad_input(tmp_path):
    result = CliRunner().invoke(
        cli, ["package-submission", "--submitter", "../evil", "--system", "x", "--results", str(tmp_path)]
    )
    assert result.exit_code == 2
    assert "must be letters" in result.output and "Traceback" not in result.output


def test_include_debug_keeps_an_invalid_run_marked_and_verify_still_fails_it(made, tmp_path):
    results = with_conformance(made, tmp_path)
    invalid = next(p for p in sorted(results.glob("*.json")) if "-FP32-" in p.name)
    edit_json(invalid, lambda r: r.update(valid=False, invalid_reasons=["loss did not move over the run"]))
    options = PackageOptions(
        "Acme", "box", results, out=tmp_path / "out", allow_debug_shapes=True, package_dir=made["package"]
    )
    with pytest.raises(UsageError, match="FP32: 2"):
        submission.package(options)
    options.include_debug = True
    root, skipped = submission.package(options)
    assert skipped == []
    sub = json.loads((root / "submission.json").read_text())
    assert sub["debug"]["include_debug"] and "loss did not move over the run" in sub["debug"]["reasons"]
    found = failing(verify.verify(root, accept_debug=True))
    assert set(found) == {"run validity", "runs per precision"}, found
    assert "invalid: loss did not move over the run" in found["run validity"]


def test_environment_allow_list_and_system_file_merge():
    environ = {
        "CUDA_VISIBLE_DEVICES": "0",
        "HF_TOKEN": "x",
        "TORCH_HUB_TOKEN": "y",
        "OMP_NUM_THREADS": "2",
        "PATH": ".",
    }
    # Only the listed names are kept (sysinfo.ENV_NAMES): HF_TOKEN, TORCH_HUB_TOKEN and PATH are not among them.
    assert sysinfo.run_environment(environ) == {"CUDA_VISIBLE_DEVICES": "0", "OMP_NUM_THREADS": "2"}
    merged = sysinfo.complete(
        {"status": "", "cooling": "", "environment": {}},
        {"status": "available", "environment": {"XLA_API_KEY": "z"}, "accelerator_interconnect": "NVLink"},
    )
    assert merged["status"] == "available" and merged["environment"] == {"XLA_API_KEY": "<redacted>"}
    assert merged["fields_to_complete"] == ["cooling", "hw_notes"]


@pytest.mark.skipif(
    bool(manifest.stale_files()),
    reason="the installed llmb differs from its release manifest (tests/test_manifest.py says how to regenerate it)",
)
def test_package_submission_and_verify_commands(made, tmp_path):
    results = with_conformance(made, tmp_path)
    out = tmp_path / "out"
    args = ["--submitter", "Acme", "--system", "cli", "--results", str(results), "--out", str(out)]
    packaged = CliRunner().invoke(cli, ["package-submission", *args, "--allow-debug-shapes", "--archive"])
    assert packaged.exit_code == 0, packaged.output
    assert (
        "| FP32 | cpu | defaults | pure |" in packaged.output.replace("\n", "")
        and "bundle written to" in packaged.output
    )
    again = CliRunner().invoke(cli, ["package-submission", *args, "--allow-debug-shapes"])
    assert again.exit_code == 2 and "exists" in again.output
    verified = CliRunner().invoke(cli, ["verify", str(out / "Acme" / "cli.tar.gz"), "--accept-debug"])
    assert verified.exit_code == 0, verified.output


# Issue 26: package-submission never deletes, enters or holds its inputs; --force replaces only what llmb wrote.


def _files(folder: Path) -> dict:
    return {p: p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize(
    "layout",
    [
        "results are the bundle folder",
        "results inside the bundle folder",
        "bundle inside the results",
        "out is the results",
        "system file inside the bundle folder",
        "archive is the system file",
    ],
)
def test_package_force_never_deletes_an_input(made, tmp_path, layout):
    out = tmp_path / "out"
    bundle = out / "Acme" / "box"
    system_file = None
    archive = False
    if layout == "results are the bundle folder":
        results = bundle
    elif layout == "results inside the bundle folder":
        results = bundle / "mine" / "results"
    elif layout == "bundle inside the results":
        results, out = tmp_path / "results", tmp_path / "results" / "bundles"
    elif layout == "out is the results":
        results, out = tmp_path / "results", tmp_path / "results"
    else:
        results = tmp_path / "results"
    shutil.copytree(with_conformance(made, tmp_path / "copy"), results)
    if layout == "system file inside the bundle folder":
        system_file = bundle / "system-extra.json"
    elif layout == "archive is the system file":
        system_file, archive = out / "Acme" / "box.tar.gz", True
    if system_file is not None:
        system_file.parent.mkdir(parents=True, exist_ok=True)
        system_file.write_text(json.dumps({"notes": "mine"}))
    before = _files(tmp_path)
    options = PackageOptions(
        "Acme",
        "box",
        results,
        out=out,
        archive=archive,
        system_file=system_file,
        allow_debug_shapes=True,
        package_dir=made["package"],
        force=True,
    )
    with pytest.raises(UsageError, match="never replaces, enters or holds"):
        submission.package(options)
    assert _files(tmp_path) == before  # every input file, byte for byte


def test_package_force_replaces_only_a_bundle_llmb_wrote(made, tmp_path):
    results = with_conformance(made, tmp_path)
    options = PackageOptions(
        "Acme", "box", results, out=tmp_path / "out", allow_debug_shapes=True, package_dir=made["package"], force=True
    )
    root, _ = submission.package(options)
    mine = root / "results" / "notes.txt"  # the submitter's own file, put in the bundle folder afterwards
    mine.write_text("keep me")
    with pytest.raises(UsageError, match="replaces only a bundle llmb wrote.*results/notes.txt"):
        submission.package(options)
    assert mine.read_text() == "keep me" and (root / "MANIFEST.sha256").is_file()
    mine.unlink()
    (root / "MANIFEST.sha256").unlink()  # a folder without llmb's manifest is not one llmb wrote
    with pytest.raises(UsageError, match="replaces only a bundle llmb wrote"):
        submission.package(options)
    assert (root / "submission.json").is_file()
    other = tmp_path / "out" / "Acme" / "other"
    other.mkdir()
    (other / "x.json").write_text("{}")
    with pytest.raises(UsageError, match="replaces only a bundle llmb wrote"):
        submission.package(PackageOptions(**{**options.__dict__, "system": "other"}))
    assert (other / "x.json").read_text() == "{}"


def test_package_force_replaces_its_own_bundle(made, tmp_path):
    results = with_conformance(made, tmp_path)
    options = PackageOptions(
        "Acme", "box", results, out=tmp_path / "out", allow_debug_shapes=True, package_dir=made["package"], force=True
    )
    first, _ = submission.package(options)
    (first / "summary.md").write_text("edited")  # a listed file, changed: still llmb's to replace
    second, _ = submission.package(options)
    assert second == first and "edited" not in (second / "summary.md").read_text()


@pytest.mark.parametrize("run_id", ["../../../outside-0", "/tmp/abs", "a/../../b", "..", "x\\..\\y"])
def test_a_run_id_never_makes_a_path_in_the_bundle(made, tmp_path, run_id):
    results = with_conformance(made, tmp_path)
    edit_json(next(iter(sorted(results.glob("*FP32*.json")))), lambda r: r.update(run_id=run_id))
    out = tmp_path / "out"
    before = sorted(p for p in tmp_path.rglob("*") if not p.is_relative_to(out))
    options = PackageOptions("Acme", "box", results, out=out, allow_debug_shapes=True, package_dir=made["package"])
    root, _ = submission.package(options)
    assert sorted(p for p in tmp_path.rglob("*") if not p.is_relative_to(out)) == before  # nothing outside --out
    for path in root.rglob("*"):
        assert path.resolve().is_relative_to(root.resolve()), path
    listed = json.loads((root / "submission.json").read_text())["results"]
    for name in listed:  # results/<precision>/<one file name>
        assert (root / name).is_file() and len(Path(name).parts) == 3 and ".." not in Path(name).parts, name


@pytest.mark.parametrize("field", ["submitter", "system_name", "note", "plugin", "debug reason"])
def test_summary_md_shows_a_bundles_text_literally_on_its_own_line(field):
    """Text a bundle brings lands in summary.md as data: no heading, rule, list, table row or markup of its own."""
    reference = Path(__file__).resolve().parent.parent / "submissions" / "llmb" / "cpu-reference"
    sub = json.loads((reference / submission.SUBMISSION_JSON).read_text())
    records = [Result.from_dict(json.loads((reference / p).read_text())) for p in sub["results"]]
    hostile = "x\n\n## owned\n---\n| a | b |\n- item <script>alert(1)</script> **bold** [link](http://evil)"
    if field == "plugin":
        sub["plugins"] = [{**sub["plugins"][0], "name": hostile, "precisions": ["FP32"]}]
    elif field == "debug reason":
        sub["debug"] = {**sub["debug"], "reasons": [hostile]}
    else:
        sub[field] = hostile
    text = submission.render_summary(sub, records)
    lines = text.splitlines()
    assert not [line for line in lines if line.startswith(("## owned", "---", "| a", "- item"))], text
    assert "<script>" not in text and "**bold**" not in text and "[link](" not in text
    assert any("\\#\\# owned" in line for line in lines), text  # shown, escaped, in its place
