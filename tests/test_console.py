"""Text from others (plugins, results, bundles, exceptions, paths) reaches the terminal as the characters it holds:
never parsed as rich markup, control characters shown as \\xNN, each detail capped (llmb/terminal/console.py)."""

import json

import pytest
from click.testing import CliRunner

from llmb import Backend
from llmb.api.errors import LlmbError
from llmb.api.settings import Setting
from llmb.cli import cli
from llmb.terminal import console as term

# rich markup that would raise MarkupError ([/]) or restyle ([bold]), and the ESC sequences of a hostile terminal
# title, a clipboard write and a screen clear.
HOSTILE = "x[/]y[bold]z\x1b]0;owned\x07\x1b]52;c;cHduZWQ=\x07\x1b[2J"
SHOWN = "x[/]y[bold]z\\x1b]0;owned\\x07\\x1b]52;c;cHduZWQ=\\x07\\x1b[2J"
TINY = ["--device", "cpu", "--preset", "tiny", "--steps", "2", "--warmup-steps", "1"]


def assert_clean(output: str, expect_shown: bool = True) -> None:
    assert "\x1b" not in output and "\x07" not in output, repr(output[:2000])
    assert "Traceback" not in output and "MarkupError" not in output, output[-2000:]
    if expect_shown:
        assert "x[/]y[bold]z" in output, output[-3000:]


def test_clean_shows_controls_and_caps():
    assert term.clean(HOSTILE) == SHOWN
    assert term.clean("tab\tand\nnewline") == "tab\tand\nnewline"
    capped = term.clean("a" * 100_000)
    assert len(capped) < term.DETAIL_LIMIT + 50 and capped.endswith("(99,600 more characters)")
    assert term.text("[bold]x[/]").plain == "[bold]x[/]"


def test_console_never_parses_markup(capsys):
    term.say("plots need matplotlib: pip install 'llmb[report]'")
    term.error("a [/] b ", ("[bold]", "red"))
    out, err = capsys.readouterr()
    assert "pip install 'llmb[report]'" in out
    assert "error: a [/] b [bold]" in err


class HostilePlugin(Backend):
    """A backend whose every piece of text (device name, settings, facts) holds markup and ESC sequences."""

    name = "hostile"

    def device_types(self):
        return ["cpu"]

    def settings(self):
        return [Setting("mode", str, HOSTILE, f"help {HOSTILE}", choices=(HOSTILE, "plain"))]

    def device_name(self, device):
        return f"CPU {HOSTILE}"

    def run_facts(self, device):
        return {"note": HOSTILE}


class FailingPlugin(Backend):
    name = "hostile_fails"

    def device_types(self):
        return ["cpu"]

    def setup(self, device, precision, settings):
        raise RuntimeError(f"driver said {HOSTILE}")


def test_hostile_plugin_text_through_run_plugins_and_report(register_backend, tmp_path):
    register_backend(HostilePlugin())
    runner = CliRunner()
    out = tmp_path / "results"
    result = runner.invoke(cli, ["run", *TINY, "--plugin", "hostile", "--out", str(out)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert_clean(result.output)
    [path] = out.glob("*.json")
    assert HOSTILE in json.loads(path.read_text())["device"]["name"]  # the record keeps the text as it was

    listed = runner.invoke(cli, ["plugins"], catch_exceptions=False)
    assert listed.exit_code == 0, listed.output
    assert_clean(listed.output)
    assert "one of " in listed.output  # a setting's allowed values are shown

    for fmt in (None, "md", "html", "csv"):
        args = ["report", str(out)] + (["--format", fmt] if fmt else [])
        shown = runner.invoke(cli, args, catch_exceptions=False)
        assert shown.exit_code == 0, shown.output
        # Markdown shows the text as written through escapes: a backslash before each markup character.
        assert_clean(shown.output, expect_shown=fmt != "md")
        if fmt == "md":
            assert "x\\[/\\]y\\[bold\\]z" in shown.output, shown.output[-3000:]


def test_plugin_error_text_is_shown_not_parsed(register_backend, tmp_path, monkeypatch):
    monkeypatch.delenv("LLMB_DEBUG", raising=False)
    register_backend(FailingPlugin())
    result = CliRunner().invoke(cli, ["run", *TINY, "--plugin", "hostile_fails", "--out", str(tmp_path)])
    assert result.exit_code == 1, result.output
    assert_clean(result.output)
    assert "driver said x[/]y[bold]z\\x1b]0;owned" in result.output


def test_llmb_debug_shows_the_plugins_own_traceback(register_backend, tmp_path, monkeypatch):
    monkeypatch.setenv("LLMB_DEBUG", "1")
    register_backend(FailingPlugin())
    result = CliRunner().invoke(cli, ["run", *TINY, "--plugin", "hostile_fails", "--out", str(tmp_path)])
    assert result.exit_code == 1
    assert "Traceback" in result.output and ", in setup\n" in result.output  # the plugin's frame
    assert "raise RuntimeError" in result.output


@pytest.mark.parametrize("word", ["0", "off", "false", "No", ""])
def test_llmb_debug_set_to_a_no_word_is_off(register_backend, tmp_path, monkeypatch, word):
    from llmb.distributed.cluster import quiet_native_logs

    monkeypatch.setenv("LLMB_DEBUG", word)
    register_backend(FailingPlugin())
    result = CliRunner().invoke(cli, ["run", *TINY, "--plugin", "hostile_fails", "--out", str(tmp_path)])
    assert result.exit_code == 1
    assert "Traceback" not in result.output and "LLMB_DEBUG=1 shows the traceback" not in result.output
    env = {"LLMB_DEBUG": word}
    quiet_native_logs(env)
    assert env["TORCH_CPP_LOG_LEVEL"] == "FATAL"  # torch's C++ logs stay quiet too


def test_error_messages_keep_their_brackets(monkeypatch):
    import click

    from llmb.cli.common import handle_errors

    @click.command()
    @handle_errors
    def fails():
        raise LlmbError(f"plots need matplotlib: pip install 'llmb[report]' ({HOSTILE}{'y' * 10_000})")

    result = CliRunner().invoke(fails, [])
    assert result.exit_code == 1
    assert "pip install 'llmb[report]'" in result.output
    assert_clean(result.output)
    assert len(result.output) < 2_000  # capped


def test_hostile_bundle_fields_in_verify(tmp_path):
    """A folder bundle whose submission, system and result fields hold markup, ESC and a giant string."""
    bundle = tmp_path / "bundle"
    (bundle / "results").mkdir(parents=True)
    giant = "g" * 2_000_000
    (bundle / "submission.json").write_text(
        json.dumps(
            {
                "schema": "nope",
                "submitter": HOSTILE,
                "system_name": HOSTILE,
                "plugins": [],
                "debug": {},
                "results": [f"results/{HOSTILE}.json"],
                "note": giant,
            }
        )  # fmt: skip
    )
    (bundle / "system.json").write_text(
        json.dumps({"submitter": HOSTILE, "system_name": HOSTILE, "host_processor_model_name": HOSTILE + giant})
    )
    (bundle / "results" / "r.json").write_text(json.dumps({"schema": HOSTILE, "device": {"name": HOSTILE}}))
    result = CliRunner().invoke(cli, ["verify", str(bundle)], catch_exceptions=False)
    assert result.exit_code == 1, result.output
    assert_clean(result.output)
    assert "does not match" in result.output  # submitter and system_name held to the packager's name pattern
    assert len(result.output) < 200_000  # every detail capped: the 2 MB string is not drawn


def test_sweep_keeps_secret_settings_off_the_command_line():
    from llmb.run import runner
    from llmb.run import sweep_trials as sweep
    from llmb.spec.presets import PRESETS

    options = runner.RunOptions(
        config=PRESETS["tiny"], preset="tiny", plugin="cpu", device="cpu", settings={"threads": "1", "tok": "S3CRET"}
    )
    args = sweep.child_args(options, "FP32", 1, secret=frozenset({"tok"}))
    assert "threads=1" in args and not any("S3CRET" in a for a in args)
    args = sweep.child_args(options, "FP32", 1)  # a credential-like name is kept off without being declared
    options.settings["license_token"] = "L1CENSE"
    assert not any("L1CENSE" in a for a in sweep.child_args(options, "FP32", 1))
    assert sweep._redact_values("error near S3CRET here", ["S3CRET"]) == "error near <redacted> here"


@pytest.mark.parametrize("value", ['{"a": 1', "[1]"])
def test_secret_options_env_must_be_an_object(monkeypatch, value):
    from llmb.api.settings import SECRET_OPTIONS_ENV
    from llmb.run.request import secret_options

    monkeypatch.setenv(SECRET_OPTIONS_ENV, value)
    with pytest.raises(LlmbError):
        secret_options()


# Issue 16: the CLI says what it is doing and refuses what it cannot do in one line.


def test_oversubscribed_host_is_named():
    from records_factory import make_result

    from llmb.run.host_load import oversubscribed

    busy = make_result(load_average=20.0, threads_per_rank=[1])
    assert "load average 20.0" in oversubscribed(busy)
    assert oversubscribed(make_result(load_average=0.5, threads_per_rank=[1])) is None


def test_unknown_baseline_is_a_usage_error_naming_the_methods(tmp_path):
    from records_factory import make_result

    for tps in (100.0, 120.0):
        (tmp_path / f"r{tps:.0f}.json").write_text(json.dumps(make_result(tokens_per_second=tps).to_dict()))
    for given in ("foo", "", " "):  # an empty one too (an unset variable in a script): never "no baseline", exit 0
        result = CliRunner().invoke(cli, ["report", str(tmp_path), "--baseline", given])
        assert result.exit_code == 2, result.output
        assert f"{given!r} is no method" in result.output and "methods: cpu" in result.output


def test_debug_shapes_refused_once_with_their_count():
    from records_factory import make_result

    from llmb.submit.package import PackageOptions, select_results

    records = [make_result(preset="tiny") for _ in range(25)]
    with pytest.raises(LlmbError) as refused:
        select_results(records, PackageOptions("Acme", "box", None))
    message = str(refused.value)
    assert message.count("debug shape") == 1 and "25 run(s)" in message and "and 20 more" in message


def test_project_from_a_debug_run_warns_and_names_the_shape():
    from records_factory import make_result

    from llmb.report import time_to_solution as project

    comm = {"operation": "all_reduce", "world_size": 2, "results": [{"bytes": 1024, "algbw_bytes_per_second": 1e9}]}
    shape = project.Shape(layers=2, hidden=4, ffn=16, seq=8, global_batch=4, tp=2, pp=1, dp=2, bytes_per_element=2)
    p = project.project(shape, make_result(preset="tiny").to_dict(), comm)
    assert "tiny preset" in p["alpha_measured_at"]
    assert any("debug run" in w and "tiny preset" in w for w in p["warnings"])


def test_check_plugin_takes_precision_all(register_backend, tmp_path):
    class Fp32Only(Backend):
        name = "fp32_only"

        def device_types(self):
            return ["cpu"]

        def precisions(self):
            return ["FP32"]

    register_backend(Fp32Only())
    out = tmp_path / "conformance.json"
    args = ["check-plugin", "--plugin", "fp32_only", "--precision", "all", "--steps", "2", "--out", str(out)]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["precision"]["requested"] == "FP32"


# Issue 26: characters a terminal draws as nothing, or uses to reorder text, are shown escaped, whichever printer.

HIDDEN = [
    "\u200b",  # zero-width space
    "\u200c",
    "\u200d",
    "\u200e",  # left-to-right mark
    "\u200f",
    "\u2028",  # line separator
    "\u2029",  # paragraph separator
    "\u202a",
    "\u202b",
    "\u202c",
    "\u202d",
    "\u202e",  # right-to-left override
    "\u2060",  # word joiner
    "\u2066",  # the isolates
    "\u2067",
    "\u2068",
    "\u2069",
    "\u061c",  # Arabic letter mark
    "\u180e",
    "\ufeff",  # zero-width no-break space
    "\u00ad",  # soft hyphen
    "\u3164",  # Hangul filler (a letter by category, drawn as nothing)
    "\ufe0f",  # variation selector
    "\U000e0041",  # a tag character (ASCII smuggled invisibly)
    "\u0085",  # C1 controls
    "\u009b",
    "\x1b",
    "\x7f",
    "\r",
    "\ue000",  # private use
    "\u0378",  # unassigned
]


@pytest.mark.parametrize("char", HIDDEN, ids=[f"U+{ord(c):04X}" for c in HIDDEN])
def test_clean_shows_hidden_and_bidi_characters_escaped(char):
    shown = term.clean(f"a{char}b")
    assert char not in shown and shown.startswith("a\\") and shown.endswith("b")
    code = ord(char)
    assert f"{code:02x}" in shown  # the code point is named (\xNN, \uNNNN or \UNNNNNNNN)


def test_clean_keeps_visible_text_from_every_script():
    visible = "Ryzen™ Ω ß é 中文 日本語 한국어 עברית العربية 😀 – “quoted”"
    assert term.clean(visible) == visible


@pytest.mark.parametrize("fmt", [None, "md", "csv", "html"])
def test_report_shows_bidi_and_invisible_characters_escaped(tmp_path, fmt):
    from records_factory import make_result

    hidden = "".join(HIDDEN)
    record = make_result(device_name=f"AMD EPYC{hidden}", run_id="bidi0001")
    (tmp_path / "r.json").write_text(json.dumps(record.to_dict()))
    args = ["report", str(tmp_path)] + (["--format", fmt] if fmt else [])
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    for char in HIDDEN:
        assert char not in result.output, (fmt, hex(ord(char)))
    assert "\\u202e" in result.output


def test_verify_shows_a_bundles_bidi_and_invisible_characters_escaped(tmp_path):
    bundle = tmp_path / "bundle"
    (bundle / "results").mkdir(parents=True)
    hidden = "".join(HIDDEN)
    (bundle / "submission.json").write_text(
        json.dumps({"schema": "nope", "submitter": f"org{hidden}", "system_name": hidden, "results": [hidden]})
    )
    (bundle / "system.json").write_text(json.dumps({"host_processor_model_name": hidden}))
    (bundle / "results" / "r.json").write_text(json.dumps({"schema": hidden, "device": {"name": hidden}}))
    result = CliRunner().invoke(cli, ["verify", str(bundle)])
    assert result.exit_code == 1, result.output
    for char in HIDDEN:
        assert char not in result.output, hex(ord(char))
    assert "\\u202e" in result.output
