"""The plugin system with in-memory plugins (llm/datasette style): listing, selection, settings, failures, limits."""

import json
import types

import pytest
from click.testing import CliRunner

from llmb import Setting, hookimpl, hookspecs, plugins
from llmb.cli import cli
from llmb.errors import PluginError, UsageError
from llmb.plugins import Plugin, select_plugin
from llmb.scaffold import hook_specs

TINY = ["--preset", "tiny", "--steps", "2", "--warmup-steps", "1"]


class HostPlugin:
    """Serves the host CPU like the built-in plugin; subclasses change one behaviour each."""

    present = False

    @hookimpl
    def device_types(self):
        return ["cpu"]

    @hookimpl
    def supported_precisions(self):
        return ["FP32", "BF16"]

    @hookimpl
    def hardware_available(self):
        return self.present

    @hookimpl
    def plugin_settings(self):
        return [
            Setting("mode", str, "off", "a choice", ("off", "on")),
            Setting("threads", int, 0, "an int"),
            Setting("fast", bool, False, "a bool"),
        ]


class PresentPlugin(HostPlugin):
    present = True

    @hookimpl
    def optimizer_options(self, device, precision, settings):
        return {"foreach": False}

    @hookimpl
    def peak_flops(self, device, precision):
        # An invented peak with a source for this in-memory device (not in llmb's table), so MFU has a denominator.
        return types.SimpleNamespace(flops=5e11, source="invented for this test")


class BrokenPlugin(HostPlugin):
    @hookimpl
    def process_model(self, model, optimizer, device, precision, settings):
        raise RuntimeError("kernel library missing\nsecond line of detail")


class GreedyOptimizerPlugin(HostPlugin):
    @hookimpl
    def optimizer_options(self, device, precision, settings):
        return {"fused": False, "lr": 1.0}


class TamperingPlugin(HostPlugin):
    @hookimpl
    def process_model(self, model, optimizer, device, precision, settings):
        optimizer.param_groups[0]["lr"] = 1.0  # post-processing must not change the benchmark's hyperparameters
        return model


def invoke(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def run_record(tmp_path, *args) -> dict:
    result = invoke("run", *TINY, "--out", str(tmp_path), *args)
    assert result.exit_code == 0, result.output
    (path,) = tmp_path.glob("*.json")
    return json.loads(path.read_text())


def test_every_hook_has_a_one_line_docstring():
    specs = hook_specs()
    assert len(specs) >= 15
    for name, _, doc in specs:
        assert doc and "\n" not in doc, name


def test_plugins_json_describes_each_plugin(register_plugin):
    register_plugin(HostPlugin(), "host")
    result = invoke("plugins", "--json")
    assert result.exit_code == 0, result.output
    described = {p["name"]: p for p in json.loads(result.stdout)}
    assert list(described)[0] == "cpu"
    cpu = described["cpu"]
    assert (cpu["distribution"], cpu["device_types"], cpu["hardware_available"]) == ("llmb", ["cpu"], True)
    assert "process_model" in cpu["hooks"] and "device_event" not in cpu["hooks"]
    host = described["host"]
    assert host["precisions"] == ["FP32", "BF16"]
    assert host["hooks"] == sorted(["device_types", "supported_precisions", "hardware_available", "plugin_settings"])
    assert set(host["hooks"]) <= {name for name, _, _ in hook_specs()}
    assert host["settings"][0] == {
        "name": "mode",
        "type": "str",
        "default": "off",
        "help": "a choice",
        "choices": ["off", "on"],
        "secret": False,
    }
    assert [s["type"] for s in host["settings"]] == ["str", "int", "bool"]


def test_plugins_table_lists_each_plugin(register_plugin):
    register_plugin(HostPlugin(), "host")
    result = invoke("plugins")
    assert result.exit_code == 0, result.output
    assert "host" in result.output and "cpu" in result.output and "absent" in result.output


def test_plugins_command_reports_entry_points_that_failed_to_load(monkeypatch):
    plugins.load_plugins()
    monkeypatch.setitem(plugins.load_errors, "halfbaked", "ImportError: no module named vendor_sdk")
    result = invoke("plugins", "--json")
    assert result.exit_code == 0
    assert "halfbaked" not in {p["name"] for p in json.loads(result.stdout)}
    assert "plugin 'halfbaked' failed to load: ImportError: no module named vendor_sdk" in result.stderr
    with pytest.raises(Exception, match="failed to load"):
        Plugin("halfbaked")


def test_auto_selection_takes_the_first_plugin_with_hardware_present(register_plugin, monkeypatch):
    register_plugin(HostPlugin(), "absent")
    register_plugin(PresentPlugin(), "present")
    register_plugin(PresentPlugin(), "present_too")
    # The installed plugins of this machine are left out of the candidates, so the test does not depend on them.
    monkeypatch.setattr(plugins, "plugin_names", lambda: ["cpu", "absent", "present", "present_too"])
    assert select_plugin(None).name == "present"
    assert select_plugin("absent").name == "absent"
    monkeypatch.setattr(plugins, "plugin_names", lambda: ["cpu", "absent"])
    assert select_plugin(None).name == "cpu"


def test_settings_are_validated_and_parsed(register_plugin):
    register_plugin(HostPlugin(), "host")
    plugin = Plugin("host")
    assert plugin.resolve_settings({}) == {"mode": "off", "threads": 0, "fast": False}
    assert plugin.resolve_settings({"mode": "on", "threads": "4", "fast": "yes"}) == {
        "mode": "on",
        "threads": 4,
        "fast": True,
    }
    for raw, value in (("true", True), ("1", True), ("on", True), ("FALSE", False), ("0", False), ("no", False)):
        assert plugin.resolve_settings({"fast": raw})["fast"] is value
    for given, message in (
        ({"colour": "red"}, "plugin 'host' has no setting 'colour' (settings: fast, mode, threads)"),
        ({"mode": "turbo"}, "expected one of off, on"),
        ({"threads": "four"}, "setting threads='four'"),
        ({"fast": "maybe"}, "expected true or false"),
    ):
        with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
            plugin.resolve_settings(given)


@pytest.mark.parametrize(
    "option, message",
    [
        ("colour=red", "has no setting 'colour'"),
        ("fast=maybe", "expected true or false"),
        ("fast", "expects key=value"),
    ],
)
def test_bad_settings_on_the_command_line_are_usage_errors(register_plugin, tmp_path, option, message):
    register_plugin(HostPlugin(), "host")
    result = CliRunner().invoke(cli, ["run", *TINY, "--plugin", "host", "-O", option, "--out", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert not list(tmp_path.glob("*.json"))


def test_auto_selected_plugin_runs_and_its_settings_peak_and_options_are_recorded(
    register_plugin, monkeypatch, tmp_path
):
    register_plugin(PresentPlugin(), "present")
    monkeypatch.setattr(plugins, "plugin_names", lambda: ["cpu", "present"])
    record = run_record(tmp_path, "-O", "threads=1", "-O", "fast=on")
    assert record["plugin"] == {
        "name": "present",
        "version": "unknown",
        "distribution": "unknown",
        "settings": {"mode": "off", "threads": 1, "fast": True},
        "defaults": {"mode": "off", "threads": 0, "fast": False},  # so a report tells what was changed
        "precisions": ["FP32", "BF16"],
    }
    assert record["device"]["type"] == "cpu" and record["device"]["count"] == 1
    assert record["optimizer"]["defaults"]["foreach"] is False
    assert record["peak_flops"] == 5e11
    assert record["mfu"] == pytest.approx(record["tflops"] * 1e12 / 5e11)
    assert record["mfu"] > 0


def test_a_plugin_without_a_peak_gets_no_mfu(register_plugin, tmp_path):
    register_plugin(HostPlugin(), "host")
    record = run_record(tmp_path, "--plugin", "host")
    assert record["plugin"]["settings"] == {"mode": "off", "threads": 0, "fast": False}
    assert record["peak_flops"] is None and record["mfu"] is None
    assert record["tflops"] > 0


def test_a_plugin_raising_in_a_hook_is_one_line_naming_plugin_and_hook(register_plugin, tmp_path):
    register_plugin(BrokenPlugin(), "broken")
    result = CliRunner().invoke(cli, ["run", *TINY, "--plugin", "broken", "--out", str(tmp_path)])
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert lines == ["error: plugin 'broken' failed in hook process_model: RuntimeError: kernel library missing"]
    assert not list(tmp_path.glob("*.json"))


def test_plugin_call_wraps_the_error(register_plugin):
    register_plugin(BrokenPlugin(), "broken")
    with pytest.raises(PluginError) as info:
        Plugin("broken").call("process_model", model=None, optimizer=None, device=None, precision="FP32", settings={})
    assert (info.value.plugin, info.value.hook) == ("broken", "process_model")


def test_optimizer_options_beyond_the_implementation_are_refused(register_plugin, tmp_path):
    register_plugin(GreedyOptimizerPlugin(), "greedy")
    result = CliRunner().invoke(cli, ["run", *TINY, "--plugin", "greedy", "--out", str(tmp_path)])
    assert result.exit_code == 1, result.output
    assert "plugin 'greedy': optimizer options lr refused: only foreach, fused, capturable may be set" in result.output
    assert not list(tmp_path.glob("*.json"))


def test_post_processing_that_changes_the_optimizer_makes_the_run_invalid(register_plugin, tmp_path):
    register_plugin(TamperingPlugin(), "tampering")
    record = run_record(tmp_path, "--plugin", "tampering")
    assert "optimizer: optimizer lr is 1.0, fixed value is 1e-05" in record["invalid_reasons"]


def test_hooks_are_called_on_the_selected_plugin_only(register_plugin):
    register_plugin(PresentPlugin(), "present")
    # cpu implements no peak_flops; the other registered plugin's answer must not leak into cpu's call.
    assert Plugin("cpu").call("peak_flops", device=None, precision="FP32") is None
    assert Plugin("present").call("peak_flops", device=None, precision="FP32").flops == 5e11


def test_readme_plugins_section_lists_every_hook():
    from pathlib import Path

    readme = (Path(__file__).parent.parent / "README.md").read_text()
    section = readme.split("## Plugins", 1)[1].split("\n## ", 1)[0]
    for name in vars(hookspecs):
        if hasattr(getattr(hookspecs, name), "llmb_spec"):
            assert f"`{name}`" in section, name


def test_all_first_party_plugins_are_listed_when_installed():
    from importlib.metadata import PackageNotFoundError, distribution

    wanted = {"cuda": "llmb-cuda", "rocm": "llmb-rocm", "xpu": "llmb-xpu", "xla": "llmb-xla"}
    for dist in wanted.values():
        try:
            distribution(dist)
        except PackageNotFoundError:
            pytest.skip(f"{dist} is not installed here (tox's py env installs all four)")
    result = invoke("plugins", "--json")
    assert result.exit_code == 0, result.output
    described = {p["name"]: p for p in json.loads(result.output)}
    assert {"cpu", *wanted} <= set(described)
    for name, dist in wanted.items():
        assert described[name]["distribution"] == dist
        assert isinstance(described[name]["hardware_available"], bool)
