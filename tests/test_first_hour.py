"""Issue 27, a user's first hour: one headline everywhere, one way to parse every choice, errors that name their fix,
defaults that suit the device, output a log can read. Fast tests: records from tests/records_factory.py, no runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from records_factory import make_result

from llmb import plugins, report, submission, sweep, verify
from llmb.records import SWEEP_LOG_SCHEMA
from llmb.results import write_json_atomic
from llmb.settings import Setting


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


# One way to parse every choice; errors that name what fixes them.


def command_params():
    from llmb.cli import cli

    for name, command in cli.commands.items():
        for param in command.params:
            yield name, param


def test_every_fixed_choice_matches_in_any_case():
    choices = [(name, p) for name, p in command_params() if isinstance(p.type, click.Choice)]
    assert {"--preset", "--precision", "--precision-mode"} <= {p.opts[0] for _, p in choices}
    for name, param in choices:
        for listed in param.type.choices:
            for spelling in (listed.upper(), listed.lower(), listed.title()):
                assert param.type.convert(spelling, param, None) == listed, (name, param.opts, spelling)


def test_preset_and_precision_in_any_case_reach_the_run(tmp_path):
    result = CliRunner().invoke(cli_main(), ["run", "--preset", "Tiny", "--precision", "fp64", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "unknown precision 'fp64'" in result.output  # --preset Tiny was taken
    assert "Traceback" not in result.output


def cli_main():
    from llmb.cli import cli

    return cli


def test_booleans_take_every_word_their_error_names():
    setting = Setting("fast", bool, False, "a flag")
    with pytest.raises(ValueError) as refused:
        setting.parse("maybe")
    words = str(refused.value).rsplit(" ", 1)[-1].split("/")
    assert len(words) >= 8
    for word in words:
        for spelling in (word, word.upper()):
            assert setting.parse(spelling) in (True, False)
    assert [setting.parse(w) for w in ("Yes", "ON", "1", "No", "off", "0")] == [True] * 3 + [False] * 3


def test_setting_choices_match_in_any_case_and_give_the_declared_spelling():
    setting = Setting("compile", str, "none", "how", choices=("none", "default"))
    assert setting.parse("Default") == "default"
    with pytest.raises(ValueError, match="expected one of none, default"):
        setting.parse("fast")


def test_an_unknown_plugin_name_says_what_fixes_it():
    assert "did you mean acme?" in plugins.unknown_plugin("acmee", ["acme", "cpu"])
    shipped = sorted(p.name for p in plugins.SHIPPED_PLUGINS.iterdir() if (p / "pyproject.toml").is_file())
    assert "cuda" in shipped
    for name in shipped:
        assert f"pip install -e plugins/{name}" in plugins.unknown_plugin(name, ["cpu"])


def test_a_mistyped_plugin_is_refused_before_torch_is_imported():
    # The usage error must not wait seconds for torch: the name is checked against installed metadata only.
    code = (
        "import sys\nfrom llmb.cli import cli\n"
        "try:\n    cli(['run', '--plugin', 'acmee', '--preset', 'tiny'])\n"
        "except SystemExit as exc:\n    print('exit', exc.code, 'torch' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "exit 2 False" in done.stdout, done.stdout + done.stderr
    assert "no plugin named 'acmee'" in done.stderr


def test_a_debug_bundle_refusal_names_accept_debug(tmp_path):
    bundle = verify.Bundle(tmp_path, accept_debug=False, submission={"debug": {"is_debug": True, "reasons": ["x"]}})
    verify.check_debug(bundle)
    (row,) = bundle.rows
    assert not row.passed and "--accept-debug" in row.detail


def test_no_baseline_names_the_baseline_option():
    runs = [make_result(tokens_per_second=t, settings={"threads": n}) for t, n in ((100.0, 2), (200.0, 4))]
    points = [report.point_from_record(r, None, "") for r in runs]
    (table,) = report.comparison_tables(points)
    assert table.note.startswith("No baseline") and "--baseline" in table.note
