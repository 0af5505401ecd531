"""llmb.records: strict reading of untrusted records, the headline rule, and what may be pooled (no runs needed)."""

import dataclasses
import json
from pathlib import Path

import pytest
from records_factory import make_result

from llmb import records, report, verify
from llmb.records import (
    Commbench,
    Conformance,
    RecordError,
    Result,
    SweepTrial,
    Timing,
    field_tree,
    headline,
    median_index,
)
from llmb.run import sweep
from llmb.submit import package as submission
from llmb.training.loop import Measurement, median_measurement

FOUR = [100.0, 110.0, 120.0, 130.0]  # tokens/s of four runs of one group


def test_a_result_round_trips_and_old_records_without_new_fields_still_read():
    result = make_result()
    data = result.to_dict()
    assert Result.from_dict(json.loads(json.dumps(data))) == result
    del data["host"], data["plugin"]["defaults"], data["plugin"]["precisions"]  # as written before they existed
    old = Result.from_dict(data)
    assert old.host is None and old.plugin.defaults is None


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda d: d.pop("tokens_per_second"), "tokens_per_second: missing"),
        (lambda d: d.update(tokens_per_second="fast"), "tokens_per_second: expected a number, got a string"),
        (lambda d: d.update(batch_size=True), "batch_size: expected an integer, got a boolean"),
        (lambda d: d.update(batch_size=1.5), "batch_size: expected an integer, got a number"),
        (
            lambda d: d["timing"]["step_seconds"].__setitem__(2, None),
            "timing.step_seconds[2]: expected a number, got null",
        ),
        (lambda d: d["precision"]["audit"].pop("matmul_probe"), "precision.audit.matmul_probe: missing"),
        (lambda d: d["config"].pop("hidden_size"), "config.hidden_size: missing"),  # never defaults to official
        (lambda d: d.update(surprise=1), "surprise: unknown field"),
        (lambda d: d["plugin"].update(settings=[]), "plugin.settings: expected an object, got a list"),
        (lambda d: d.update(schema="llmb.result/0"), "schema: is 'llmb.result/0', expected llmb.result/2"),
        (lambda d: d["precision"].pop("audit"), "precision.audit: missing"),
    ],
)
def test_from_dict_names_the_bad_field(change, message):
    data = make_result().to_dict()
    change(data)
    with pytest.raises(RecordError) as caught:
        Result.from_dict(data)
    assert str(caught.value) == message


@pytest.mark.parametrize("data", [None, [], "x", 3, {"schema": "llmb.result/1"}])
def test_from_dict_refuses_what_is_not_a_record(data):
    with pytest.raises(RecordError):
        Result.from_dict(data)


def test_the_schema_page_lists_exactly_the_declared_fields():
    """The results schema page's field lists are the types' (one source of truth: records.py, from which
    scripts/gen_docs.py makes the page; `python -m llmb.records`)."""
    text = (Path(__file__).parents[1] / "docs" / "reference" / "records.md").read_text()
    for cls in (Result, Conformance, Commbench):
        block = text.split(f"<!-- fields:{cls.__name__} -->")[1].split("<!-- /fields -->")[0]
        assert " ".join(block.split()) == f"`{records.describe(cls)}`", cls.__name__


def test_field_tree_follows_nesting():
    tree = field_tree(Result)
    assert tree["timing.window_seconds"] is True and tree["host"] is False
    assert "precision.audit.backend[].implies" in tree


def test_the_four_run_example_has_one_headline_everywhere(tmp_path):
    """100/110/120/130 tokens/s: the headline is 110 (a run that happened) in run, sweep, report, summary and verify."""
    runs = [make_result(tokens_per_second=t, peak_memory_bytes=int(t) * 2**20) for t in FOUR]
    assert median_index(FOUR) == 1
    # llmb run --repeats 4: the repeats' windows, chosen by throughput.
    windows = [runs[0].timing.window_seconds * runs[0].tokens_per_second / t for t in FOUR]
    chosen = median_measurement([Measurement(w, [w], "host", 1.0, 0.9) for w in windows])
    assert chosen.window_seconds == windows[1]
    # The sweep: four re-runs of its best batch (the two search trials that picked it are not counted again).
    trials = [SweepTrial("FP32", 1, "repeat", i, "ok", tokens_per_second=t) for i, t in enumerate(reversed(FOUR))]
    search = [SweepTrial("FP32", 1, "search", i, "ok", tokens_per_second=t) for i, t in enumerate((140.0, 150.0))]
    assert sweep.headline_of({1: search}, trials)[0].tokens_per_second == 110.0
    # The records' rule.
    h = headline(runs)
    assert h.run.tokens_per_second == 110.0 and h.run.peak_memory_bytes == 110 * 2**20
    assert (h.low, h.high) == (100.0, 130.0)
    # The report.
    points = [report.point_from_record(r, None, "") for r in runs]
    row = report.best_table(points).rows[0]
    assert row["tokens_per_second"] == 110.0 and row["spread"] == [100.0, 130.0]
    assert row["peak_memory_bytes"] == 110 * 2**20 and row["runs"] == 4
    # The submission summary, and verify's check of it (it renders the same summary from the same rule).
    sub = {"submitter": "t", "system_name": "s", "debug": {"is_debug": False}, "plugins": [], "note": ""}
    summary = submission.render_summary(sub, runs)
    fp32 = next(line for line in summary.splitlines() if line.startswith("| FP32 |"))
    assert "| 110.0 |" in fp32 and "| 100.0-130.0 |" in fp32 and "| 0.11 GiB |" in fp32
    assert "Noisy:" in summary  # 30 / 110 > 10%


def test_runs_that_differ_in_shape_settings_or_layout_are_never_pooled():
    runs = [make_result(tokens_per_second=t) for t in (100, 101, 102)]
    runs += [make_result(tokens_per_second=200, preset="small")]
    runs += [make_result(tokens_per_second=300, settings={"compile": "default"})]
    runs += [make_result(tokens_per_second=400, world_size=2, parallel="ddp")]
    groups = records.group_runs(runs)
    assert len(groups) == 4
    with pytest.raises(ValueError):
        headline(runs)
    rows = report.best_table([report.point_from_record(r, None, "") for r in runs]).rows
    assert len(rows) == 4
    assert {(r["shape"], r["settings"], r.get("devices", 1)) for r in rows} == {
        ("tiny (4.2M params)", "defaults", 1),
        ("small (43.3M params)", "defaults", 1),
        ("tiny (4.2M params)", "compile=default", 1),
        ("tiny (4.2M params)", "defaults", 2),
    }
    # The summary takes the group with enough runs, not a faster single run, and names its shape and settings.
    best = submission.headlines(runs)["FP32"]
    assert best.run.tokens_per_second == 101 and len(best.runs) == 3
    summary = submission.render_summary(
        {"submitter": "t", "system_name": "s", "debug": {"is_debug": False}, "plugins": [], "note": ""}, runs
    )
    assert "| cpu | defaults | pure | tiny (4.2M params) | 1 | 101.0 | 100.0-102.0 |" in summary


def test_report_warns_when_a_headline_spreads_more_than_ten_percent():
    steady = [make_result(tokens_per_second=t) for t in (100, 104, 108)]
    noisy = [make_result(tokens_per_second=t, precision="BF16", load_average=7.5) for t in (100, 150, 160)]
    table = report.best_table([report.point_from_record(r, None, "") for r in steady + noisy])
    assert len(table.warnings) == 1 and "BF16" in table.warnings[0] and "host load up to 7.50" in table.warnings[0]
    assert "60.0%" not in table.warnings[0] and "40.0%" in table.warnings[0]  # (160 - 100) / 150
    text = report.to_markdown([table], {})
    assert "**Noisy:**" in text


def test_verify_reads_results_through_the_types(tmp_path):
    """A bundle's result with a field of the wrong type fails the schema row, naming the file and the field."""
    folder = tmp_path / "results" / "FP32"
    folder.mkdir(parents=True)
    data = make_result().to_dict()
    data["timing"]["step_seconds"][1] = "0.1"
    (folder / "r.json").write_text(json.dumps(data))
    bundle = verify.Bundle(tmp_path, accept_debug=True)
    verify.check_results_schema(bundle)
    row = bundle.rows[0]
    assert not row.passed and "results/FP32/r.json: timing.step_seconds[1]: expected a number" in row.detail


def test_a_run_whose_repeats_spread_more_than_ten_percent_says_so():
    steady = make_result(tokens_per_second=100.0)
    window = steady.timing.window_seconds
    assert steady.repeat_spread_warning() is None
    repeats = [window, window * 100 / 80, window * 100 / 105]  # 100, 80 and 105 tokens/s: the headline is 100
    noisy = dataclasses.replace(
        steady, repeats=3, timing=Timing(**{**vars(steady.timing), "repeat_window_seconds": repeats})
    )
    assert noisy.repeat_throughputs() == pytest.approx([100.0, 80.0, 105.0])
    warning = noisy.repeat_spread_warning()
    assert warning is not None and "spread 25.0%" in warning and "load average 0.50" in warning


def test_python_m_llmb_records_prints_the_field_lists_and_importing_it_prints_nothing():
    """`python -m llmb.records` is the command; the guard imports every llmb module, and an import prints nothing
    (`llmb plugins --json` must stay JSON)."""
    import subprocess
    import sys

    command = subprocess.run([sys.executable, "-m", "llmb.records"], capture_output=True, text=True, timeout=120)
    assert command.returncode == 0 and command.stdout.startswith("Result: `schema,"), command.stderr
    imported = subprocess.run(
        [sys.executable, "-c", "import llmb.records.__main__"], capture_output=True, text=True, timeout=120
    )
    assert imported.returncode == 0 and imported.stdout == "", imported.stdout[:200]


def test_a_result_of_schema_1_reads_as_schema_2_with_each_fact_once():
    """llmb.result/1 repeated the layout's degrees at its top level and the peak as peak_flops: it still reads, as a
    /2 record that holds each once (llmb.records.schemas.upgrade_v1)."""
    current = make_result(world_size=2, parallel="ddp").to_dict()
    old = {key: value for key, value in current.items() if key not in ("layout", "peak")}
    old |= {"schema": "llmb.result/1", "tp": 1, "pp": 1, "dp": 2, "microbatches": 1, "grad_accum": 1}
    old |= {"peak_flops": 5e11, "peak": {"flops": 5e11, "source": "https://x.example", "origin": "llmb table"}}
    old["layout"] = {**current["layout"], "world_size": 2, "nodes": 1, "strategy": "ddp"}
    read = Result.from_dict(old)
    assert read.schema == "llmb.result/2" and read.layout == Result.from_dict(current).layout
    assert read.peak.flops == 5e11 and read.peak.source == "https://x.example"
    written = read.to_dict()
    assert not {"tp", "pp", "dp", "microbatches", "grad_accum", "peak_flops"} & set(written)
    assert not {"world_size", "nodes", "strategy"} & set(written["layout"])
    # A /1 record from before jobs recorded a layout: its flat degrees make one; its peak_flops, a peak with no source.
    older = {k: v for k, v in old.items() if k not in ("layout", "peak")} | {"grad_accum": 4}
    read = Result.from_dict(older)
    assert (read.layout.dp, read.layout.grad_accum, read.layout.tp) == (2, 4, 1)
    assert (read.peak.flops, read.peak.source) == (5e11, None)
    # The /2 schema refuses what /1 allowed: a repeated field is unknown there.
    with pytest.raises(RecordError, match="^tp: unknown field$"):
        Result.from_dict(current | {"tp": 1})


def test_a_result_needs_its_layout_and_its_evidence_is_typed():
    data = make_result().to_dict()
    with pytest.raises(RecordError, match="^layout: missing$"):
        Result.from_dict({k: v for k, v in data.items() if k != "layout"})
    bad = json.loads(json.dumps(data))
    bad["evidence"]["windows"][0]["losses"] = "many"
    with pytest.raises(RecordError, match=r"^evidence\.windows\[0\]\.losses: expected a list, got a string$"):
        Result.from_dict(bad)
    bad = json.loads(json.dumps(data))
    bad["judge"]["clean_room"] = "yes"
    with pytest.raises(RecordError, match=r"^judge\.clean_room: expected true or false, got a string$"):
        Result.from_dict(bad)


def test_a_bundle_of_schema_1_results_still_verifies(tmp_path):
    """A bundle packaged by llmb 0.1 holds llmb.result/1 records: verify reads them as /2 and passes them."""
    import shutil

    reference = Path(__file__).resolve().parents[1] / "submissions" / "llmb" / "cpu-reference"
    if not reference.is_dir():
        pytest.skip("no reference bundle in this checkout")
    bundle = tmp_path / "bundle"
    shutil.copytree(reference, bundle)
    paths = sorted((bundle / "results").glob("*/*.json"))
    for path in paths:
        data = json.loads(path.read_text())
        layout = data["layout"]
        data |= {"schema": "llmb.result/1", "peak_flops": data["peak"]["flops"]}
        data |= {key: layout[key] for key in ("tp", "pp", "dp", "microbatches", "grad_accum")}
        layout |= {"world_size": data["world_size"], "nodes": data["nodes"], "strategy": data["parallel"]}
        path.write_text(json.dumps(data, indent=2))
    submission.write_manifest(bundle)
    assert paths and all(json.loads(p.read_text())["schema"] == "llmb.result/1" for p in paths)
    assert [row.check for row in verify.verify(bundle, accept_debug=True) if not row.passed] == []
