"""The committed reference CPU bundle verifies (as a debug bundle: it uses a debug preset, see
docs/reviewers/submitting.md)."""

from pathlib import Path

from click.testing import CliRunner

from llmb import verify
from llmb.cli import cli

REFERENCE = Path(__file__).resolve().parent.parent / "submissions" / "llmb" / "cpu-reference"


def test_reference_bundle_verifies_with_accept_debug():
    assert REFERENCE.is_dir(), f"{REFERENCE} is missing: run scripts/make_reference_bundle.sh"
    result = CliRunner().invoke(cli, ["verify", str(REFERENCE), "--accept-debug"])
    assert result.exit_code == 0, result.output


def test_reference_bundle_is_marked_debug_and_nothing_else_fails():
    failed = {row.check for row in verify.verify(REFERENCE) if not row.passed}
    assert failed == {"official bundle", "official shape"}


def test_reference_bundle_has_three_runs_for_each_cpu_precision():
    for precision in ("FP32", "FP16", "BF16"):
        assert len(list((REFERENCE / "results" / precision).glob("*.json"))) == 3, precision
    assert not (REFERENCE / "results" / "TF32").exists()


def test_reference_bundle_replays_here():
    """Every result's headline window, replayed on this CPU from the seed and its challenge, agrees."""
    rows = verify.verify(REFERENCE, accept_debug=True, replay_steps=2)
    replay = [row for row in rows if row.check == "replay"]
    assert replay and replay[0].passed, replay
