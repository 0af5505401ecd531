"""Red team, bundles: an honest tiny bundle made by `llmb run` and `llmb package-submission`, then forged the way a
submitter who edits files after packaging would (every derived figure, summary.md and the manifest redone). Each
forgery must be caught, and the test names the stage (verify, verify --replay, reproduce) and the reason."""

import copy
import json
import shutil

import pytest
from redteam_kit import TINY, llmb

from llmb import verify
from llmb.judge.verdict import headline_figures
from llmb.records import Result
from llmb.submit import package as submission


@pytest.fixture(scope="module")
def honest_bundle(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bundle")
    results = tmp / "results"
    for _ in range(3):
        done = llmb(None, ["run", *TINY, "--plugin", "cpu", "--out", str(results)], tmp)
        assert done.returncode == 0, done.stderr[-2000:]
    args = ["package-submission", "--submitter", "red", "--system", "box", "--results", str(results)]
    done = llmb(None, [*args, "--out", str(tmp / "subs"), "--allow-debug-shapes"], tmp)
    assert done.returncode == 0, done.stderr[-2000:]
    return tmp / "subs" / "red" / "box"


def forge(honest, tmp_path, edit) -> tuple:
    """A copy of the bundle with `edit(root, records)` applied, its summary and manifest redone."""
    root = tmp_path / "forged"
    shutil.copytree(honest, root)
    paths = sorted(p for p in (root / "results").rglob("*.json"))
    records = {p: json.loads(p.read_text()) for p in paths}
    edit(root, records)
    for path, record in records.items():
        path.write_text(json.dumps(record, indent=2) + "\n")
    sub = json.loads((root / submission.SUBMISSION_JSON).read_text())
    sub["results"] = sorted(p.relative_to(root).as_posix() for p in records)
    (root / submission.SUBMISSION_JSON).write_text(json.dumps(sub, indent=2) + "\n")
    results = [Result.from_dict(r) for r in records.values()]
    (root / submission.SUMMARY_MD).write_text(submission.render_summary(sub, results))
    submission.write_manifest(root)
    return root


def failing(rows) -> dict[str, str]:
    return {row.check: row.detail for row in rows if not row.passed}


def rescale(record: dict, factor: float) -> None:
    """Every window times `factor`, with every figure derived from the window redone."""
    timing = record["timing"]
    for key in ("window_seconds", "worker_window_seconds"):
        timing[key] *= factor
    for key in ("repeat_window_seconds", "worker_repeat_window_seconds", "step_seconds"):
        timing[key] = [v * factor for v in timing[key]]
    record["per_rank"] = [v * factor for v in record["per_rank"]]
    for window in record["evidence"]["windows"]:
        window["clean_window_seconds"] *= factor
        window["worker_window_seconds"] *= factor
    record.update(headline_figures(record, timing["window_seconds"]))


def test_the_honest_bundle_verifies_and_replays(honest_bundle):
    assert set(failing(verify.verify(honest_bundle, accept_debug=True, replay_steps=3))) == set()


def test_a_cloned_run_with_jittered_times_is_caught_by_verify(honest_bundle, tmp_path):
    def clone(root, records):
        source_path, source = next(iter(records.items()))
        twin = copy.deepcopy(source)
        twin["run_id"] = "c10ed000"
        rescale(twin, 1.013)
        records[source_path.with_name(source_path.name.replace(source["run_id"], "c10ed000"))] = twin

    failed = failing(verify.verify(forge(honest_bundle, tmp_path, clone), accept_debug=True))
    assert "repeats the challenge" in failed.get("distinct runs", ""), failed


def test_a_cloned_run_with_a_new_challenge_fails_the_replay(honest_bundle, tmp_path):
    def clone(root, records):
        source_path, source = next(iter(records.items()))
        twin = copy.deepcopy(source)
        twin["run_id"] = "c10ed001"
        for window in twin["evidence"]["windows"]:
            window["challenge"] += 1
            window["losses"] = [v * (1 + 1e-4) for v in window["losses"]]  # not the same curve either
        twin["loss"]["first"] = twin["evidence"]["windows"][twin["evidence"]["headline_window"]]["losses"][0]
        twin["loss"]["last"] = twin["evidence"]["windows"][twin["evidence"]["headline_window"]]["losses"][-1]
        rescale(twin, 0.987)
        records[source_path.with_name(source_path.name.replace(source["run_id"], "c10ed001"))] = twin

    forged = forge(honest_bundle, tmp_path, clone)
    assert "distinct runs" not in failing(verify.verify(forged, accept_debug=True))
    failed = failing(verify.verify(forged, accept_debug=True, replay_steps=2))
    assert "replay: step 1: recorded loss" in failed.get("replay", ""), failed


def test_results_of_another_model_with_a_perfect_conformance_record_fail_the_replay(honest_bundle, tmp_path):
    """The conformance record is the honest plugin's, untouched; the results' losses are a cheat's (what a run on
    half the tokens records). Verify without --replay cannot tell; the replay does not take the record's word."""

    def cheat(root, records):
        for record in records.values():
            for window in record["evidence"]["windows"]:
                window["losses"] = [v - 2e-3 for v in window["losses"]]
            headline = record["evidence"]["windows"][record["evidence"]["headline_window"]]["losses"]
            record["loss"]["first"], record["loss"]["last"] = headline[0], headline[-1]

    forged = forge(honest_bundle, tmp_path, cheat)
    assert "conformance" not in failing(verify.verify(forged, accept_debug=True))
    failed = failing(verify.verify(forged, accept_debug=True, replay_steps=2))
    assert "replay: step 1: recorded loss" in failed.get("replay", ""), failed


def test_an_edited_conformance_record_is_caught_by_its_own_arithmetic(honest_bundle, tmp_path):
    def edit(root, records):
        path = next((root / "conformance").glob("*.json"))
        record = json.loads(path.read_text())
        check = next(c for c in record["checks"] if c["name"] == "loss-curve")
        check["measured"] = check["tolerance"] * 40  # what a cheat measured, with passed left true
        path.write_text(json.dumps(record, indent=2) + "\n")

    failed = failing(verify.verify(forge(honest_bundle, tmp_path, edit), accept_debug=True))
    assert "check 'loss-curve' says passed=True" in failed.get("conformance", ""), failed


def test_windows_scaled_with_every_figure_redone_are_refuted_by_reproduce(honest_bundle, tmp_path):
    """No file check can prove a time: the rescaled bundle is consistent. `llmb reproduce` re-runs it here. The
    forgery claims 10x, against a 50% tolerance: on this shared 2-core machine two honest tiny runs minutes apart
    have differed by 3x (a 1.1x claim is beyond the default 5% wherever the hardware is quiet enough to say so)."""

    def scale(root, records):
        for record in records.values():
            rescale(record, 0.1)

    forged = forge(honest_bundle, tmp_path, scale)
    assert "throughput recomputed" not in failing(verify.verify(forged, accept_debug=True))
    done = llmb(None, ["reproduce", str(forged), "--runs", "2", "--tolerance", "0.5"], tmp_path)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    assert "REFUTED" in done.stdout, done.stdout
