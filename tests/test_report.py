"""llmb report: tables, CSV/JSON/HTML and PNG plots from a real tiny sweep (see tiny_sweep in conftest.py)."""

import base64
import copy
import csv
import io
import json
import re
import shutil
import struct

import pytest
from click.testing import CliRunner

from llmb import runner
from llmb.cli import cli
from llmb.config import build_config
from llmb.report import load, make_plots, report, scaling_tables
from llmb.results import write_result

# The tiny sweep's pure FP16 run fails the replay's parameter digest at random (relative error up to 0.08
# against 0.05, seed-dependent: pure FP16 AdamW does not preserve training); see the closing note of issue 19.
FP16_REPLAY = "pure FP16 replay digest fails at random (issue 19 note)"

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


@pytest.mark.xfail(reason=FP16_REPLAY, strict=False)
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


@pytest.mark.xfail(reason=FP16_REPLAY, strict=False)
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
    assert names == ["memory_vs_batch.png", "methods.png", "tflops_vs_batch.png", "throughput_vs_batch.png"]
    for path in plots.iterdir():
        width, height = png_size(path.read_bytes())
        assert width > 400 and height > 200
    page = html_file.read_text()
    assert page.startswith("<!DOCTYPE html>") and page.count("<table>") == 3
    images = re.findall(r"src='data:image/png;base64,([A-Za-z0-9+/=]+)'", page)
    assert len(images) == len(names)
    assert {base64.b64decode(i) for i in images} == {p.read_bytes() for p in plots.iterdir()}
    assert "http" not in page.replace("http-equiv", "")  # nothing to fetch: it opens without a server


@pytest.mark.xfail(reason=FP16_REPLAY, strict=False)
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
    names = ["throughput_vs_batch.png", "tflops_vs_batch.png", "memory_vs_batch.png", "methods.png", "scaling.png"]
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
