"""Values no run can take, fixed by class: every numeric or fixed-choice option of every command refuses a value
longer than any it takes without echoing it whole, every float option refuses NaN (a range alone lets it in: every
comparison with NaN is false), so does a plugin's float setting; a record claiming a seed or a replay draw no run can
give is refused; and a verify row says an unforeseen exception as its type and first line, not as Python's repr."""

from __future__ import annotations

import json

import click
import pytest
from click.testing import CliRunner
from records_factory import make_result

from llmb.api import settings
from llmb.api.errors import LONGEST_SHOWN, describe, shown
from llmb.cli import cli
from llmb.cli import click_types as bounds
from llmb.records import RecordError, Result
from llmb.spec.vocab import SEED_MAX

LONG = "9" * 10_000


def _options(types: tuple[type, ...]) -> list[tuple[str, str]]:
    """(command, option) for every option of every llmb command whose type is one of `types`."""
    found = []
    for name, command in sorted(cli.commands.items()):
        for param in command.params:
            if isinstance(param, click.Option) and isinstance(param.type, types) and not param.is_flag:
                found.append((name, max(param.opts, key=len)))
    return found


def test_every_numeric_option_is_one_of_llmbs_bounded_types():
    """A bare click.IntRange, FloatRange, INT or FLOAT lets in what llmb's types refuse (NaN, an echoed megabyte)."""
    bare = [
        (name, max(p.opts, key=len), type(p.type).__name__)
        for name, command in cli.commands.items()
        for p in command.params
        if isinstance(p, click.Option)
        and isinstance(p.type, (click.types._NumberParamTypeBase, click.Choice))
        and not isinstance(p.type, (bounds.IntRange, bounds.FiniteFloatRange, bounds.Choice))
    ]
    assert not bare, bare


@pytest.mark.parametrize("command,option", _options((click.types._NumberParamTypeBase, click.Choice)))
def test_an_over_long_value_is_a_usage_error_that_never_echoes_it_whole(command, option):
    result = CliRunner().invoke(cli, [command, option, LONG])
    assert result.exit_code == 2, result.output
    assert "10000 characters" in result.output and LONG[: LONGEST_SHOWN + 1] not in result.output
    assert len(result.output) < 1000, result.output


def _checked_text_options() -> list[tuple[str, str]]:
    """(command, option) for every free-text option that llmb checks as it parses it (a callback): --plugin against
    the installed plugins, --device by torch's parse and the plugin's device types."""
    return [
        (name, max(param.opts, key=len))
        for name, command in sorted(cli.commands.items())
        for param in command.params
        if isinstance(param, click.Option) and not param.is_flag and param.callback is not None
    ]


@pytest.mark.parametrize("command,option", _checked_text_options())
def test_an_over_long_name_is_refused_without_echoing_it_whole(command, option):
    """A checked text option refuses a name no plugin or device has without repeating it whole: `--plugin` echoed
    a 20,000-character name in full through click's own error line (found 2026-11-28), `--device` through the
    run's parse."""
    result = CliRunner().invoke(
        cli, [command, "--plugin", "cpu", option, LONG] if option != "--plugin" else [command, option, LONG]
    )
    assert result.exit_code == 2, result.output
    assert "10000 characters" in result.output and LONG[: LONGEST_SHOWN + 1] not in result.output, result.output
    assert len(result.output) < 1000 and "Traceback" not in result.output, result.output


@pytest.mark.parametrize("command,option", _options((click.FloatRange,)))
@pytest.mark.parametrize("value", ["nan", "NaN", "-nan"])
def test_every_float_option_refuses_nan(command, option, value):
    result = CliRunner().invoke(cli, [command, option, value])
    assert result.exit_code == 2 and "finite" in result.output, result.output


def test_the_float_options_include_the_replay_draw():
    assert ("run", "--replay-whole") in _options((click.FloatRange,))
    assert ("run", "--replay-budget") in _options((click.FloatRange,))


@pytest.mark.parametrize("raw", ["nan", "inf", "-Infinity"])
def test_a_plugin_float_setting_refuses_what_no_setting_means(raw):
    declared = [settings.Setting("ratio", float, 0.5, "a share")]
    with pytest.raises(settings.UsageError, match="finite"):
        settings.resolve_settings("p", declared, {"ratio": raw})
    assert settings.resolve_settings("p", declared, {"ratio": "0.25"})["ratio"] == 0.25


def _result_dict(**changes) -> dict:
    data = json.loads(json.dumps(make_result().to_dict()))
    data.update(changes)
    return data


@pytest.mark.parametrize("field", ["peak_memory_bytes", "warmup_steps", "parameters", "model_flops_per_token"])
def test_a_record_with_a_negative_count_is_refused(field):
    """A count no run gives (negative bytes of peak memory; a worker records an unknown one as null) is no record:
    a copied bundle's result re-sealed with -1 passed verify."""
    with pytest.raises(RecordError, match=f"^{field}: -1 \\(0 or more\\)$"):
        Result.from_dict(_result_dict(**{field: -1}))
    assert Result.from_dict(_result_dict(peak_memory_bytes=None)).peak_memory_bytes is None


@pytest.mark.parametrize("seed", [-1, SEED_MAX + 1, 2**64])
def test_a_record_with_a_seed_no_run_takes_is_refused(seed):
    with pytest.raises(RecordError, match="seed"):
        Result.from_dict(_result_dict(seed=seed))
    assert Result.from_dict(_result_dict(seed=SEED_MAX)).seed == SEED_MAX


@pytest.mark.parametrize(
    "draw",
    [
        {"whole_window_probability": float("nan")},
        {"whole_window_probability": 1.5},
        {"budget_share": -0.1},
        {"floor_steps": -1},
    ],
)
def test_a_record_with_a_replay_draw_no_run_gives_is_refused(draw):
    data = _result_dict()
    good = {"floor_steps": 2, "whole_window_probability": 0.25, "whole": False, "budget_share": 0.1}
    data["evidence"]["replay"]["drawn"] = good
    Result.from_dict(json.loads(json.dumps(data)))  # the good draw reads
    data["evidence"]["replay"]["drawn"] = {**good, **draw}
    with pytest.raises(RecordError, match="drawn"):
        Result.from_dict(data)


def test_an_exception_is_said_as_its_type_and_first_line():
    assert describe(KeyError("steps")) == "KeyError: 'steps'"
    assert describe(ValueError("first\nforged: line")) == "ValueError: first"
    assert describe(RuntimeError()) == "RuntimeError"
    assert shown("a\nb") == "'a\\nb'" and shown(LONG).endswith("(10000 characters)")
    # An int past Python's 4300-digit str() limit (a plugin's return, a parsed JSON number) is said, not raised.
    assert "could not be read" in shown(10**5000) and shown(10**70).endswith("(71 characters)")


def test_a_verify_row_says_an_unforeseen_failure_without_pythons_repr(tmp_path, monkeypatch):
    from llmb import verify

    def check_boom(bundle):
        raise TypeError("'<' not supported\nforged row")

    monkeypatch.setattr(verify, "CHECKS", [check_boom])
    rows = verify.verify_folder(tmp_path)
    last = rows[-1]
    assert (last.check, last.passed, last.detail) == ("boom", False, "malformed: TypeError: '<' not supported")


HOSTILE_TEXT = "\x1b]0;owned\x07\x1b[2J\nError: forged line" + "z" * 20_000


def _path_arguments() -> list[str]:
    """Every command that takes an existing path as an argument (click.Path(exists=True))."""
    return [
        name
        for name, command in sorted(cli.commands.items())
        for param in command.params
        if isinstance(param, click.Argument) and isinstance(param.type, click.Path) and param.type.exists
    ]


@pytest.mark.parametrize(
    "args",
    [
        *([name, f"--no-such{HOSTILE_TEXT}"] for name in sorted(cli.commands)),  # click: "No such option: ..."
        *([name, f"/nonexistent/{HOSTILE_TEXT}"] for name in _path_arguments()),  # click: "Path ... does not exist"
        ["plugins", HOSTILE_TEXT],  # click: "Got unexpected extra argument (...)"
        [f"no-such-command{HOSTILE_TEXT}"],  # click: "No such command ..."
    ],
    ids=lambda args: " ".join(a[:20] for a in args),
)
def test_clicks_own_usage_errors_say_what_was_typed_as_data(args):
    """click's own usage errors repeated the text typed whole and raw, a terminal's escape sequences and line breaks
    included (a forged "Error:" line; 20,000 characters echoed back; found 2026-11-28): llmb's group says each on one
    capped line, its control characters shown escaped (llmb.cli.common.Commands)."""
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert "\x1b" not in result.output and "\x07" not in result.output, result.output[:300]
    errors = [line for line in result.output.splitlines() if "Error:" in line]
    assert len(errors) == 1 and errors[0].startswith("Error:") and "\\x1b" in errors[0], result.output[:300]
    assert len(result.output) < 1500 and "Traceback" not in result.output, result.output[:300]


@pytest.mark.parametrize("threads", [-5, "more than the CPUs", 10**9])
def test_the_cpu_plugins_thread_count_is_refused_outside_the_cpus_it_may_use(threads, tmp_path):
    """-O threads beyond the CPUs the process may use, or below 0 (0 is torch's default), is a usage error before
    any work: threads=10**9 ended the worker inside OpenMP (libgomp could not allocate its 216 GB of thread state:
    "the worker process exited with code 1", no word of why) and threads=-5 was torch's RuntimeError in setup. The
    least is the setting's declared minimum (refused as the command line is read), the greatest the host's."""
    from llmb.run.sysinfo import usable_cpus

    value = usable_cpus() + 1 if threads == "more than the CPUs" else threads
    result = CliRunner().invoke(cli, ["run", "--preset", "tiny", "--steps", "1", "--warmup-steps", "1",
                                      "-O", f"threads={value}", "--out", str(tmp_path)])  # fmt: skip
    assert result.exit_code == 2, result.output
    said = "setting threads='-5': expected at least 0" if value == -5 else f"-O threads={value}: 0 (torch's default)"
    assert said in result.output, result.output
    assert value == -5 or f"or 1 to {usable_cpus()}, the CPUs" in result.output, result.output
    assert not list(tmp_path.glob("*.json"))


def test_a_bare_llmb_still_prints_its_help_on_many_lines():
    """The group's own help, raised by click as a usage error, is llmb's text: printed as written, not as one line."""
    result = CliRunner().invoke(cli, [])
    lines = result.output.splitlines()
    assert "Commands:" in lines and any(line.split()[:1] == ["run"] for line in lines), result.output[:300]
    assert "\\n" not in result.output, result.output[:300]
