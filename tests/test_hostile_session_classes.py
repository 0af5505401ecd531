"""Hostile input found by probing every command (2026-11-27), fixed by class: a line break in outside text never
starts a line of its own; the system's refusal of a file is one line; a projection refuses a figure no measurement
gives; plot labels are drawn as written, and matplotlib's warnings never quote them raw; the job's environment and
--sizes give usage errors however long or malformed."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import pytest
from click.testing import CliRunner

from llmb.api.errors import UsageError
from llmb.audit import guard
from llmb.cli import cli
from llmb.distributed import cluster
from llmb.report import time_to_solution as project
from llmb.run import commbench
from llmb.terminal import console as term


def test_a_line_break_in_outside_text_never_starts_a_line_of_its_own(capsys):
    term.error("plugin 'boom' failed to load: RuntimeError: first\nerror: forged [bold]x[/]")
    term.warning(("skipped: bad\nname.json", "yellow"))
    err = capsys.readouterr().err
    assert err.count("\n") == 2, err
    assert "first\\nerror: forged [bold]x[/]" in err and "bad\\nname.json" in err


@pytest.mark.skipif(
    not Path("/dev/full").exists(), reason="no /dev/full on this OS: a full disk cannot be stood in for"
)
def test_the_systems_refusal_of_an_output_file_is_one_line_with_no_traceback(tmp_path):
    """/dev/full takes the open and refuses the write (ENOSPC), past every check of the path made beforehand."""
    records = tmp_path / "none"
    records.mkdir()
    result = CliRunner().invoke(cli, ["report", str(records), "--format", "json", "--out", "/dev/full"])
    assert result.exit_code == 1, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.output
    assert "LLMB_DEBUG" not in lines[0]  # not an unexpected failure: the system said why


def _comm(**row) -> dict:
    good = {"bytes": 1024, "algbw_bytes_per_second": 1e9}
    return {"operation": "all_reduce", "world_size": 2, "results": [{**good, **row}]}


SHAPE = project.Shape(2, 64, 128, 32, 1, 2, 1, 1, 4, 2)
RESULT = {"tflops": 0.1}


@pytest.mark.parametrize(
    "comm",
    [
        _comm(bytes=0),
        _comm(bytes=-5),
        _comm(bytes=10**400),
        _comm(algbw_bytes_per_second=0),
        _comm(algbw_bytes_per_second=-1.0),
        _comm(algbw_bytes_per_second=float("nan")),
        _comm(algbw_bytes_per_second="fast"),
        {**_comm(), "world_size": 1},
    ],
)
def test_a_projection_refuses_a_commbench_figure_no_measurement_gives(comm):
    with pytest.raises(UsageError):
        project.project(SHAPE, RESULT, comm)


def test_a_projection_from_good_figures_is_finite_and_positive():
    projected = project.project(SHAPE, RESULT, _comm())
    assert 0 < projected["step_seconds"] < float("inf")


@pytest.mark.parametrize("window_seconds", [0, -1.0, float("nan")])
def test_a_check_against_a_run_with_no_step_time_is_refused(window_seconds):
    measured = {"timing": {"window_seconds": window_seconds}, "steps": 2}
    with pytest.raises(UsageError, match="no measured step time"):
        project.check_against(measured, RESULT, _comm())


def test_a_project_file_nested_past_any_record_is_one_line(tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    good = tmp_path / "comm.json"
    good.write_text(json.dumps(_comm()))
    args = ["project", "--layers", "2", "--hidden", "64", "--ffn", "128", "--seq", "32", "--global-batch", "1"]
    result = CliRunner().invoke(cli, [*args, "--from", str(deep), "--comm", str(good)])
    assert result.exit_code != 0 and "RecursionError" not in result.output
    assert result.output.strip().startswith("error: ") and len(result.output.strip().splitlines()) == 1


def test_plot_labels_are_drawn_as_written_and_drawing_warns_nothing_raw():
    from llmb.report import plots

    fig, (axes,) = plots._figure()
    axes.plot([1, 2], [1, 2], label="none$^^$ \x1b[31m\x07")
    axes.set_title("$x^2$")
    axes.legend()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning that escaped _png would raise here
        png = plots._png(fig)
    assert png.startswith(b"\x89PNG")


@pytest.mark.parametrize(
    "variables", [{"RANK": "0", "WORLD_SIZE": "1"}, {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1"}]
)
def test_a_master_port_that_is_no_number_is_a_usage_error_naming_it(variables):
    with pytest.raises(UsageError, match="MASTER_PORT='abc', not a number"):
        cluster.detect({**variables, "MASTER_PORT": "abc"})


@pytest.mark.parametrize("sizes", ["9" * 5000, "1" * 19, "1K,9999999999999999999999"])
def test_sizes_too_long_to_be_a_message_are_a_usage_error(sizes):
    with pytest.raises(UsageError, match="--sizes: cannot read"):
        commbench.parse_sizes(sizes)


@pytest.mark.parametrize(("option", "said"), [("--sizes", "--sizes: cannot read ''"), ("--device", "is empty")])
def test_an_empty_value_is_a_usage_error_not_the_default(option, said):
    """An unset variable in a script gives an option an empty value: it is said at once, never taken as the option
    left out (commbench's default sizes, the plugin's device), which ran and exited 0."""
    args = {"--sizes": ["--device", "cpu", "--sizes", ""], "--device": ["--device", ""]}[option]
    result = CliRunner().invoke(cli, ["commbench", *args])
    assert result.exit_code == 2 and said in result.output, result.output


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("[" * 100_000 + "]" * 100_000, "not readable JSON"),
        ('{"x": ' * 100 + "1" + "}" * 100, "nested deeper"),
        ('{"x": 1e999}', "NaN or Infinity"),
        ('{"x": NaN}', "NaN or Infinity"),
        ("[1]", "not a JSON object"),
    ],
)
def test_a_system_file_too_deep_or_holding_what_json_cannot_carry_is_refused(tmp_path, text, why):
    from llmb.submit import package

    path = tmp_path / "system.json"
    path.write_text(text)
    with pytest.raises(UsageError, match=why):
        package.read_json_file(path)


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ({"number_of_nodes": "two"}, "number_of_nodes: expected an integer, got a string"),
        ({"accelerators_per_node": True}, "accelerators_per_node: expected an integer, got a boolean"),
        ({"host_processor_core_count": -4}, "host_processor_core_count: -4 (0 or more)"),
        ({"host_memory_capacity": 512}, "host_memory_capacity: expected a string, got a number"),
        ({"devices": {"gpu": 8}}, "devices: expected a list, got an object"),
    ],
)
def test_a_system_file_that_retypes_a_field_llmb_fills_is_refused_before_anything_runs(tmp_path, given, said):
    """system.json's fields llmb fills keep their types (llmb.records.SYSTEM_FIELDS): a --system-file that gives one
    another is a usage error naming the field, before any result is read or check-plugin runs; its own fields are
    free (MLPerf's system description has more)."""
    from llmb.submit import package

    system_file = tmp_path / "system.json"
    system_file.write_text(json.dumps({**given, "rack": {"row": 3}}))
    options = package.PackageOptions(
        submitter="Acme", system="box", results=tmp_path / "absent", out=tmp_path / "out", system_file=system_file
    )
    with pytest.raises(UsageError, match=f"^--system-file {system_file}: {re.escape(said)}$"):
        package.package(options)
    assert not (tmp_path / "out").exists()


def test_a_system_files_own_fields_are_free():
    from llmb.records import system_problems

    assert system_problems({"rack": [1, "a"], "host_processor_threads": None, "number_of_nodes": 2}) == []


@pytest.mark.parametrize("command", [["peak", "--device", "cpu", "--preset", "tiny"], ["commbench", "--device", "cpu"]])
def test_an_out_file_that_would_be_refused_is_refused_before_anything_is_measured(tmp_path, monkeypatch, command):
    """peak and commbench measured for minutes, then refused a symbolic link at --out and lost the measurement."""
    from llmb.run import commbench as comm_run
    from llmb.run import roofline

    def measured(*args, **kwargs):
        raise AssertionError("measured before the --out check")

    guard.ensure_baseline()  # before the stand-ins: the process's identity baseline (taken once) must not hold them

    monkeypatch.setattr(roofline, "measure", measured, raising=False)
    monkeypatch.setattr(comm_run, "launch", measured)
    monkeypatch.setattr(comm_run, "run", measured)
    (tmp_path / "target.txt").write_text("mine")
    (tmp_path / "link.json").symlink_to(tmp_path / "target.txt")
    result = CliRunner().invoke(cli, [*command, "--out", str(tmp_path / "link.json")])
    assert result.exit_code == 2 and "is a symbolic link" in result.output, result.output
    assert (tmp_path / "target.txt").read_text() == "mine"


def test_check_out_file_takes_what_the_atomic_write_takes_and_refuses_the_rest(tmp_path):
    from llmb.records.result_files import check_out_file

    (tmp_path / "old.json").write_text("{}")
    (tmp_path / "folder.json").mkdir()
    (tmp_path / "link.json").symlink_to(tmp_path / "old.json")
    for fine in (tmp_path / "new.json", tmp_path / "old.json", tmp_path / "sub" / "new.json", Path("/dev/null")):
        check_out_file(fine)
    for refused in (tmp_path / "folder.json", tmp_path / "link.json", tmp_path / "old.json" / "x.json"):
        with pytest.raises(UsageError):
            check_out_file(refused)


@pytest.mark.parametrize("search", ["compile=none,bogus", "threads=1,abc"])
def test_every_searched_value_is_checked_before_the_first_trial(tmp_path, monkeypatch, search):
    """A bad value last in --search was refused only when its combination came, after the others had run."""
    from llmb.run import sweep as sweeps

    def trial(*args, **kwargs):
        raise AssertionError("a trial ran before every searched value was checked")

    guard.ensure_baseline()  # before the stand-in: the process's identity baseline (taken once) must not hold it

    monkeypatch.setattr(sweeps, "sweep", trial)
    args = ["sweep", "--device", "cpu", "--preset", "tiny", "--steps", "2", "--warmup-steps", "1", "--repeats", "0"]
    result = CliRunner().invoke(cli, [*args, "--batch-sizes", "1", "--search", search, "--out", str(tmp_path / "s")])
    assert result.exit_code == 2 and "error:" in result.output, result.output
    assert not (tmp_path / "s").exists()
