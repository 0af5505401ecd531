"""Issue 27, a user's first hour: one headline everywhere, one way to parse every choice, errors that name their fix,
defaults that suit the device, output a log can read. Fast tests: records from tests/records_factory.py, no runs."""

from __future__ import annotations

from pathlib import Path

from records_factory import make_result

from llmb import report, submission, sweep
from llmb.records import SWEEP_LOG_SCHEMA
from llmb.results import write_json_atomic


def write_sweep(out: Path, trials: list[tuple[int, str, float]]) -> list[sweep.Trial]:
    """A sweep folder as `llmb sweep` leaves it: a result JSON per trial and the log naming each trial's phase."""
    header = {"schema": SWEEP_LOG_SCHEMA, "plugin": "cpu", "device": "cpu", "mode": "pure"}
    log = sweep.SweepLog.open(out, header, False)
    made = []
    counts: dict[tuple[int, str], int] = {}
    for batch, phase, tps in trials:
        record = make_result(tokens_per_second=tps, batch_size=batch)
        name = f"{record.run_id}.json"
        write_json_atomic(out / name, record.to_dict())
        index = counts[batch, phase] = counts.get((batch, phase), -1) + 1
        trial = sweep.Trial("FP32", batch, phase, index, "ok", tokens_per_second=tps, result=name, run_id=record.run_id)
        log.add(trial)
        made.append(trial)
    return made


def test_sweep_report_and_summary_md_show_one_headline(tmp_path):
    # Batch 2 wins the search with fast trials; its re-runs are slower. Pooling the two (what summary.md did) gives
    # 1,010; the re-runs alone give 1,000: every reader must show the re-runs' median.
    trials = write_sweep(
        tmp_path,
        [(1, "search", 500.0), (1, "search", 520.0), (2, "search", 1400.0), (2, "search", 1500.0)]
        + [(2, "repeat", 990.0), (2, "repeat", 1000.0), (2, "repeat", 1010.0)],
    )
    points = {b: [t for t in trials if t.phase == "search" and t.batch_size == b] for b in (1, 2)}
    shown, _ = sweep.headline_of(points, [t for t in trials if t.phase == "repeat"])

    inputs = report.load([tmp_path])
    best, runs = report.headline(inputs.points)

    records, _ = submission.load_inputs(tmp_path)
    counted, left_out = submission.counted_results(records, submission.sweep_phases(tmp_path))
    in_summary = submission.headlines(counted)["FP32"]
    assert shown.tokens_per_second == best.tokens_per_second == in_summary.run.tokens_per_second == 1000.0
    assert len(runs) == len(in_summary.runs) == 3
    assert left_out and "search trial" in left_out[0]
    md = submission.render_summary({"submitter": "t", "system_name": "s", "plugins": [], "debug": {"is_debug": False}},
                                   counted)  # fmt: skip
    assert "| 1,000.0 | 990.0-1,010.0 |" in md  # pooled: "| 1,010.0 | 990.0-1,500.0 |"
