"""The red team's forged bundles: each edit is made as a careful forger would make it (every derived figure and the
bundle's MANIFEST.sha256 redone), and `llmb verify` must fail it, naming the check and the reason.

The starting point is the shipped reference bundle (submissions/llmb/cpu-reference), copied.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from llmb import verify
from llmb.bundle import manifest
from llmb.records import Result
from llmb.spec import peak_table as peaks
from llmb.submit import package as submission

REFERENCE = Path(__file__).resolve().parents[2] / "submissions" / "llmb" / "cpu-reference"


@pytest.fixture
def bundle(tmp_path) -> Path:
    if not REFERENCE.is_dir():
        pytest.skip("no reference bundle in this checkout")
    target = tmp_path / "bundle"
    shutil.copytree(REFERENCE, target)
    return target


def edit_json(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data, indent=2))


def failing(root: Path) -> dict[str, str]:
    submission.write_manifest(root)  # the forger re-signs the bundle
    return {row.check: row.detail for row in verify.verify(root, accept_debug=True) if not row.passed}


def results(root: Path) -> list[Path]:
    return sorted((root / "results").glob("*/*.json"))


def test_the_reference_bundle_verifies_before_any_forgery(bundle):
    assert failing(bundle) == {}


def test_an_edited_loop_written_as_the_release_manifest_is_not_the_release(bundle):
    """The attack: edit llmb/training/loop.py, run `python -m llmb.bundle.manifest --write` in one's own copy, package.
    The bundle then says every file is unchanged against "the release". verify knows the released manifests."""
    edited = manifest.sha256_bytes(b"# a faster loop\n")

    def forge_manifest(released):
        released["files"][manifest.LOOP_PATH] = edited

    def forge_status(status):
        for entry in status["files"]:
            if entry["path"] == manifest.LOOP_PATH:
                entry.update(sha256=edited, released_sha256=edited, status="unchanged")

    edit_json(bundle / "code" / "release_manifest.json", forge_manifest)
    edit_json(bundle / "code" / "llmb.json", forge_status)
    found = failing(bundle)
    assert "not a known llmb release" in found["code diff"], found
    assert f"{manifest.LOOP_PATH} differs from the nearest known release" in found["code diff"]
    assert f"{manifest.LOOP_PATH} differs from the nearest known release" in found["model and loop unchanged"]


def _declare_peak(record: dict, peak: float, origin: str) -> None:
    record["peak"] = {"flops": peak, "source": "https://acme.example", "origin": origin, "declared_flops": peak}
    record["mfu"] = record["tflops"] * 1e12 / peak  # consistent: the throughput check recomputes it


def test_a_declared_peak_of_one_megaflop_is_refused_by_verify(bundle):
    for path in results(bundle):
        edit_json(path, lambda r: _declare_peak(r, 1e6, "declared by plugin"))
    found = failing(bundle)
    assert "is above 100%" in found["peak and MFU"], found


def test_a_peak_claimed_from_the_table_for_a_device_it_lacks_is_refused(bundle):
    for path in results(bundle):
        edit_json(path, lambda r: _declare_peak(r, 1e15, "llmb table"))
    found = failing(bundle)
    assert "not marked declared by plugin" in found["peak and MFU"], found


def test_a_declared_peak_for_a_name_spelt_with_a_look_alike_character_is_refused(bundle):
    """The forger renames the device (Cyrillic EN for the H of H100: it reads as the table's H100 and matches no row)
    and declares a peak for it, every figure redone; verify refuses a declaration for such a name."""

    def forge(record):
        record["device"]["name"] = "NVIDIA \u041d100 80GB HBM3"
        _declare_peak(record, 1e12, "declared by plugin")

    for path in results(bundle):
        edit_json(path, forge)
    found = failing(bundle)
    assert "not printable ASCII" in found["peak and MFU"], found


def test_a_declared_peak_below_the_matmul_rate_the_run_measured_is_refused(bundle):
    """The forger declares half the matmul rate its own run measured on the device, every figure redone."""
    for path in results(bundle):
        edit_json(path, lambda r: _declare_peak(r, 0.5 * r["measured_matmul_peak"], "declared by plugin"))
    found = failing(bundle)
    assert "FLOP/s its matmuls reached in this run" in found["peak and MFU"], found


def test_a_low_declaration_kept_under_a_table_figure_is_refused(bundle):
    """The forger names a device the table has, records the table's figure as the peak and keeps its own low
    declaration beside it, the run's invalid reasons dropped: verify chooses the peak as the judge does and names
    the declaration under the row."""

    def forge(record):
        record["device"]["name"] = "NVIDIA H100 80GB HBM3"
        known = peaks.match("NVIDIA H100 80GB HBM3").peaks[record["precision"]["effective"]]
        record["peak"] = {"flops": known, "source": "x", "origin": peaks.ORIGIN_TABLE, "declared_flops": 1e12}
        record["mfu"] = record["tflops"] * 1e12 / known

    for path in results(bundle):
        edit_json(path, forge)
    found = failing(bundle)
    assert "below llmb's table entry" in found["peak and MFU"], found


def test_a_peak_recorded_for_an_ambiguous_name_is_refused(bundle):
    def forge(record):
        record["device"]["name"] = "NVIDIA H100 80GB HBM3 A100"  # an H100 row and an A100 row
        _declare_peak(record, 1e16, "declared by plugin")  # above both rows: only the ambiguity is wrong

    for path in results(bundle):
        edit_json(path, forge)
    found = failing(bundle)
    assert "used where llmb's peak table and the plugin's declaration give none" in found["peak and MFU"], found
    assert "matches 2 rows" in found["peak and MFU"], found


def test_a_changed_learning_rate_in_the_record_is_refused(bundle):
    for path in results(bundle):
        edit_json(path, lambda r: r["optimizer"]["defaults"].update(lr=1e-3))
    found = failing(bundle)
    assert "optimizer lr recorded 0.001, fixed value is 1e-05" in found["optimizer"], found


def test_an_honestly_declared_peak_is_accepted_and_the_summary_says_declared_by_plugin(bundle):
    """Not an attack: a plugin's peak for a device the table lacks, with its source, is shown as declared."""
    for path in results(bundle):
        edit_json(path, lambda r: _declare_peak(r, 1e12, "declared by plugin"))
    sub = json.loads((bundle / "submission.json").read_text())
    records = [Result.from_dict(json.loads(p.read_text())) for p in results(bundle)]
    (bundle / "summary.md").write_text(submission.render_summary(sub, records))
    found = failing(bundle)
    assert "peak and MFU" not in found, found
    summary = (bundle / "summary.md").read_text()
    assert "(peak declared by plugin)" in summary
    assert "- FP32: peak 1 TFLOP/s, declared by plugin: https://acme.example" in summary
