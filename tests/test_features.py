"""The feature matrix: a cell is yes only with a conforming run of that combination; fails with the reason; blank
where never tried. Records here are built by hand: this tests the reading and the rules, not any run."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from click.testing import CliRunner
from conftest import markdown_table_widths

from llmb.cli import cli
from llmb.run import feature_matrix as features

ROOT = Path(__file__).resolve().parents[1]


def result(parallel="none", mode="pure", requested="FP32", effective=None, invalid=(), **settings):
    return {
        "schema": "llmb.result/1",
        "parallel": parallel,
        "precision": {"requested": requested, "effective": effective or requested, "mode": mode},
        "plugin": {"name": "cpu", "settings": {"compile": "none", "activation_checkpointing": "none", **settings}},
        "invalid_reasons": list(invalid),
    }


def conformance(passed=True, failed=(), mode="pure", requested="FP32", effective=None, **settings):
    record = result(mode=mode, requested=requested, effective=effective, **settings)
    record["schema"] = "llmb.conformance/1"
    record["checks"] = [{"name": n, "passed": n not in failed} for n in ("precision", "gradients", "loss-curve")]
    return record


def records(*items):
    found = features.Records([], [], [])
    for item in items:
        {"llmb.result/1": found.results, "llmb.conformance/1": found.conformance}.get(
            item["schema"], found.attempts
        ).append(item)
    return found


def test_features_of_reads_settings_and_precision():
    assert features.features_of(result(mode="amp", requested="BF16")) == {"amp"}
    assert features.features_of(result(requested="BF16")) == frozenset()  # pure BF16 is not mixed precision
    assert features.features_of(result(compile="default", activation_checkpointing="selective-ops")) == {
        "compile",
        "sac",
    }
    assert features.features_of(result(compile="thunder")) == {"thunder"}
    assert features.features_of(result(activation_checkpointing="selective-layers")) == frozenset()
    assert features.features_of(result(effective="FP8")) == {"fp8"}


def test_yes_needs_a_valid_run_and_a_passing_conformance_record():
    sac = {"activation_checkpointing": "selective-ops"}
    only_run = records(result(**sac))
    assert features.cell(only_run, frozenset({"sac"}), "none") == "unchecked"
    both = records(result(**sac), conformance(**sac))
    assert features.cell(both, frozenset({"sac"}), "none") == "yes"
    assert features.cell(both, frozenset({"sac"}), "ddp") == ""  # never tried with DDP
    with_ddp = records(result(parallel="ddp", **sac), conformance(**sac))
    assert features.cell(with_ddp, frozenset({"sac"}), "ddp") == "yes"
    failed = records(result(**sac), conformance(failed=("gradients",), **sac))
    assert features.cell(failed, frozenset({"sac"}), "none") == "fails: conformance (gradients)"
    invalid = records(result(invalid=["loss did not move over the run"], **sac), conformance(**sac))
    assert features.cell(invalid, frozenset({"sac"}), "none") == "fails: loss did not move over the run"


def test_fp8_conforms_in_every_check_but_precision():
    fp8 = {"fp8": "tensorwise"}
    run = result(effective="FP8", invalid=[features.FP8_LABEL_REASON], **fp8)
    ok = records(run, conformance(failed=("precision",), effective="FP8", **fp8))
    assert features.cell(ok, frozenset({"fp8"}), "none") == "yes"
    bad = records(run, conformance(failed=("precision", "loss-curve"), effective="FP8", **fp8))
    assert features.cell(bad, frozenset({"fp8"}), "none").startswith("fails: conformance")


def test_failed_attempts_and_exclusive_pairs():
    attempt = {
        "schema": features.ATTEMPT_SCHEMA,
        "features": ["compile", "fp8"],
        "parallel": "fsdp",
        "error": "InductorError: x",
    }
    found = records(attempt)
    assert features.cell(found, frozenset({"compile", "fp8"}), "fsdp") == "fails: InductorError: x"
    assert features.cell(found, frozenset({"compile", "thunder"}), "none").startswith("exclusive")


def test_features_command_renders_from_a_folder(tmp_path):
    sac = {"activation_checkpointing": "selective-ops"}
    for index, item in enumerate([result(**sac), conformance(**sac), {"not": "a record"}]):
        (tmp_path / f"{index}.json").write_text(json.dumps(item))
    (tmp_path / "broken.json").write_text("{")
    out = CliRunner().invoke(cli, ["features", str(tmp_path), "--markdown"])
    assert out.exit_code == 0, out.output
    assert "| Selective AC, per operator | yes |  |  |" in out.output
    table = CliRunner().invoke(cli, ["features", str(tmp_path)])
    assert table.exit_code == 0 and "Feature support" in table.output


def test_features_of_files_that_hold_no_record_is_a_one_line_error(tmp_path):
    (tmp_path / "broken.json").write_text("{")
    (tmp_path / "other.json").write_text(json.dumps({"not": "a record"}))
    for args in ([str(tmp_path)], [str(tmp_path / "broken.json")], [str(tmp_path), "--markdown"]):
        out = CliRunner().invoke(cli, ["features", *args])
        assert out.exit_code == 1, out.output
        assert "error: no llmb records found in" in out.output and "Traceback" not in out.output
        assert "Feature support" not in out.output
        # One line says it all, the files left out included: not a warning line and then the error.
        assert len(out.output.strip().splitlines()) == 1 and "(skipped: " in out.output, out.output
        assert out.output.count("broken.json: not JSON") == 1, out.output


def _checker():
    spec = importlib.util.spec_from_file_location("check_feature_records", ROOT / "scripts/check_feature_records.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_committed_yes_is_backed_by_records_that_verify():
    """The committed records behind benchmarks/RESULTS.md's matrix: each "yes" re-checked as `llmb verify` would."""
    out = CliRunner().invoke(_checker().main, [str(ROOT / "benchmarks/features")])
    assert out.exit_code == 0, out.output
    assert " 0 not;" in out.output and "backed " in out.output


def test_the_checker_refuses_a_yes_backed_only_by_a_record_s_own_word(tmp_path):
    """A hand-made record that says it is valid and conformed makes a "yes" in `llmb features`, not in the checker."""
    sac = {"activation_checkpointing": "selective-ops"}
    for index, item in enumerate([result(**sac), conformance(**sac)]):
        (tmp_path / f"{index}.json").write_text(json.dumps(item))
    assert features.cell(features.load_records([tmp_path]), frozenset({"sac"}), "none") == "yes"
    out = CliRunner().invoke(_checker().main, [str(tmp_path)])
    assert out.exit_code == 1 and "UNBACKED sac none: schema" in out.output


def test_a_records_reason_stays_inside_its_markdown_cell():
    """Issue 26: a failure reason from a record lands in the matrix as text: no heading, rule or row of its own, no
    cell boundary, no markup."""

    hostile = "x | y\n\n## owned\n---\n| a | b |\n<script>alert(1)</script> **bold**"
    text = features.markdown(records(result(invalid=[hostile], activation_checkpointing="selective-ops")))
    lines = text.splitlines()
    assert not [line for line in lines if line.startswith(("## owned", "---", "| a |"))], text
    assert "<script>" not in text and "**bold**" not in text and "owned" in text
    blocks = markdown_table_widths(lines)  # each table's rows all with its header's cell count
    assert len(blocks) == 4 and all(len(set(b)) == 1 for b in blocks), blocks
    assert any("fails: x \\| y\\n" in line for line in lines), text  # the reason itself, escaped, in its cell
