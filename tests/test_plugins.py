"""The plugin system with in-memory backends (llm style): listing, selection, settings, failures, limits."""

import json

import pytest
from click.testing import CliRunner
from conftest import TINY, invoke, run_record

from llmb import Backend, Peak, Setting, hookimpl
from llmb.api.backend import overridden, public_methods
from llmb.api.errors import PluginError, UsageError
from llmb.cli import cli
from llmb.registry import plugins, probe_process
from llmb.registry.plugins import call, get_backend, resolve_settings, select_backend


class HostBackend(Backend):
    """Serves the host CPU like the built-in backend; subclasses change one behaviour each."""

    name = "host"
    present = False

    def precisions(self):
        return ["FP32", "BF16"]

    def available(self):
        return self.present

    def settings(self):
        return [
            Setting("mode", str, "off", "a choice", ("off", "on")),
            Setting("threads", int, 0, "an int"),
            Setting("fast", bool, False, "a bool"),
        ]


class PresentBackend(HostBackend):
    name = "present"
    present = True

    def optimizer_options(self, device, precision, settings):
        return {"foreach": False}

    def peak_flops(self, device, precision):
        # An invented peak with a source for this in-memory device (not in llmb's table), so MFU has a denominator.
        return Peak(5e11, "tests/test_plugins.py (invented)")


class BrokenBackend(HostBackend):
    name = "broken"

    def process_model(self, model, optimizer, device, precision, settings):
        raise RuntimeError("kernel library missing\nsecond line of detail")


class GreedyOptimizerBackend(HostBackend):
    name = "greedy"

    def optimizer_options(self, device, precision, settings):
        return {"fused": False, "lr": 1.0}


class TamperingBackend(HostBackend):
    name = "tampering"

    def process_model(self, model, optimizer, device, precision, settings):
        optimizer.param_groups[0]["lr"] = 1.0  # post-processing must not change the benchmark's hyperparameters
        return model


class FloatPeakBackend(HostBackend):
    name = "floatpeak"

    def peak_flops(self, device, precision):
        return 5e11  # a bare number: no source, so refused


def test_every_public_method_has_a_docstring_and_a_default():
    methods = public_methods()
    assert len(methods) >= 18
    base = Backend()
    for name in methods:
        assert (getattr(Backend, name).__doc__ or "").strip(), name
    assert base.device_types() == ["cpu"] and base.precisions() == ["FP32"] and base.available() is False
    assert overridden(base) == []
    assert overridden(PresentBackend()) == ["precisions", "available", "settings", "optimizer_options", "peak_flops"]


def test_a_peak_needs_a_positive_figure_and_a_source():
    assert Peak(1e12, "https://example.com/datasheet").flops == 1e12
    with pytest.raises(ValueError, match="public source"):
        Peak(1e12, " ")
    with pytest.raises(ValueError, match="positive"):
        Peak(0.0, "https://example.com")


def test_plugins_json_describes_each_backend(register_backend):
    register_backend(HostBackend())
    result = invoke("plugins", "--json")
    assert result.exit_code == 0, result.output
    described = {p["name"]: p for p in json.loads(result.stdout)}
    assert list(described)[0] == "cpu"
    cpu = described["cpu"]
    assert (cpu["distribution"], cpu["device_types"], cpu["hardware_available"]) == ("llmb", ["cpu"], True)
    assert "process_model" in cpu["methods_overridden"] and "new_event" not in cpu["methods_overridden"]
    host = described["host"]
    assert (host["plugin"], host["precisions"]) == ("host", ["FP32", "BF16"])
    assert host["methods_overridden"] == ["precisions", "available", "settings"]
    assert host["settings"][0] == {
        "name": "mode",
        "type": "str",
        "default": "off",
        "help": "a choice",
        "choices": ["off", "on"],
        "secret": False,
        "minimum": None,
        "maximum": None,
    }
    assert [s["type"] for s in host["settings"]] == ["str", "int", "bool"]
    threads = next(s for s in cpu["settings"] if s["name"] == "threads")
    assert (threads["minimum"], threads["maximum"]) == (0, None)  # the greatest is the host's, checked in setup
    assert host["peak_sources"] == {}
    assert host["vendor_libraries"] == [] and cpu["vendor_libraries"] == []


def test_plugins_table_lists_backends_methods_settings_choices_and_peak_sources(register_backend):
    class Sourced(HostBackend):
        name = "sourced"

        def peak_sources(self):
            return {"Sourced X1": "https://example.com/x1-datasheet.pdf"}

    register_backend(Sourced())
    result = invoke("plugins")
    assert result.exit_code == 0, result.output
    text = result.output
    assert "sourced" in text and "cpu" in text and "absent" in text
    assert "methods overridden" in text and "peak_sources" in text
    assert "(one of off, on)" in text
    assert "Sourced X1: https://example.com/x1-datasheet.pdf" in text.replace("│", "").replace("\n", "")
    assert "vendor libraries" in text


def test_plugins_names_the_vendor_libraries_a_backend_names(register_backend):
    class Vendor(HostBackend):
        name = "vendored"

        def vendor_libraries(self):
            return ["acme-kernels"]

    register_backend(Vendor())
    described = {p["name"]: p for p in json.loads(invoke("plugins", "--json").stdout)}
    assert described["vendored"]["vendor_libraries"] == ["acme-kernels"]
    if "xpu" in described:  # the first-party xpu plugin (installed by the test env) names IPEX
        assert described["xpu"]["vendor_libraries"] == ["intel-extension-for-pytorch"]
    table = invoke("plugins").output.replace("│", " ")
    assert any("vendor libraries" in line and "acme-kernels" in line for line in table.splitlines()), table


def test_plugins_command_reports_plugins_that_failed_to_load(monkeypatch):
    plugins.load()
    monkeypatch.setitem(plugins.load_errors, "halfbaked", "ImportError: no module named vendor_sdk")
    result = invoke("plugins", "--json")
    assert result.exit_code == 0
    assert "halfbaked" not in {p["name"] for p in json.loads(result.stdout)}
    assert "plugin 'halfbaked' failed to load: ImportError: no module named vendor_sdk" in result.stderr
    halfbaked = plugins.PluginInfo("halfbaked", "llmb-halfbaked", "1.0", "halfbaked_module")
    monkeypatch.setattr(plugins, "installed", lambda: [halfbaked])
    with pytest.raises(Exception, match="plugin 'halfbaked' failed to load: ImportError"):
        get_backend("halfbaked")


def test_a_bad_registration_is_charged_to_its_plugin(register_backend):
    class Misnamed(HostBackend):
        name = "other"

    class Plugin:
        @hookimpl
        def register_backends(self, register):
            register(Misnamed())

    plugins.pm.register(Plugin(), name="misnamer")
    try:
        found = plugins.registrations()
        assert "other" not in found and "cpu" in found
        assert "must be the entry point's name 'misnamer'" in plugins.load_errors.pop("misnamer")
    finally:
        plugins.pm.unregister(name="misnamer")


def test_auto_selection_takes_the_first_backend_with_hardware_present(register_backend, monkeypatch):
    class Absent(HostBackend):
        name = "absent"

    class PresentToo(PresentBackend):
        name = "present_too"

    for backend in (Absent(), PresentBackend(), PresentToo()):
        register_backend(backend)
    # This machine's installed plugins are left out of the candidates, so the test does not depend on them.
    mine = {"cpu", "absent", "present", "present_too"}
    everything = plugins.registrations
    monkeypatch.setattr(plugins, "all_registrations", lambda: {k: v for k, v in everything().items() if k in mine})
    assert select_backend(None).name == "present"
    assert select_backend("absent").name == "absent"
    mine -= {"present", "present_too"}
    assert select_backend(None).name == "cpu"


def test_auto_selection_takes_only_a_backend_serving_the_device_asked_for(register_backend, monkeypatch):
    """`llmb run --device cpu` on a host where a GPU plugin's hardware is present runs on the CPU: auto-selection
    took the GPU plugin, and the run was refused ("serves cuda, not 'cpu'"; found 2026-11-28)."""

    class PresentGpu(PresentBackend):
        name = "present_gpu"

        def device_types(self):
            return ["cuda"]

    for backend in (PresentGpu(), PresentBackend()):
        register_backend(backend)
    mine = {"cpu", "present_gpu"}
    everything = plugins.registrations
    monkeypatch.setattr(plugins, "all_registrations", lambda: {k: v for k, v in everything().items() if k in mine})
    assert select_backend(None).name == "present_gpu"  # no device asked: the first with its hardware present
    assert select_backend(None, "cuda:1").name == "present_gpu"
    assert select_backend(None, "cpu").name == "cpu"
    assert select_backend(None, "no such device").name == "present_gpu"  # the run's own parse refuses it
    mine.add("present")  # a plugin serving the CPU with its hardware present still comes before the built-in one
    assert select_backend(None, "cpu").name == "present"


def test_settings_are_validated_and_parsed():
    backend = HostBackend()
    assert resolve_settings(backend, {}) == {"mode": "off", "threads": 0, "fast": False}
    assert resolve_settings(backend, {"mode": "on", "threads": "4", "fast": "yes"}) == {
        "mode": "on",
        "threads": 4,
        "fast": True,
    }
    for raw, value in (("true", True), ("1", True), ("on", True), ("FALSE", False), ("0", False), ("no", False)):
        assert resolve_settings(backend, {"fast": raw})["fast"] is value
    for given, message in (
        ({"colour": "red"}, "plugin 'host' has no setting 'colour' (settings: fast, mode, threads)"),
        ({"mode": "turbo"}, "expected one of off, on"),
        ({"threads": "four"}, "setting threads='four'"),
        ({"fast": "maybe"}, "expected one of true/false/yes/no/on/off/1/0"),
    ):
        with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
            resolve_settings(backend, given)


def refused_run(tmp_path, exit_code: int, *args: str) -> str:
    """`llmb run ARGS` on the tiny shape that must fail with `exit_code` and write no record; its output."""
    result = CliRunner().invoke(cli, ["run", *TINY, *args, "--out", str(tmp_path)])
    assert result.exit_code == exit_code, result.output
    assert not list(tmp_path.glob("*.json"))
    return result.output


@pytest.mark.parametrize(
    "option, message",
    [
        ("colour=red", "has no setting 'colour'"),
        ("fast=maybe", "expected one of true/false/yes/no/on/off/1/0"),
        ("fast", "expects key=value"),
    ],
)
def test_bad_settings_on_the_command_line_are_usage_errors(register_backend, tmp_path, option, message):
    register_backend(HostBackend())
    output = refused_run(tmp_path, 2, "--plugin", "host", "-O", option)
    assert message in output and "Traceback" not in output


def test_auto_selected_backend_runs_and_its_settings_peak_and_options_are_recorded(
    register_backend, monkeypatch, tmp_path
):
    register_backend(PresentBackend())
    everything = plugins.registrations
    keep = {"cpu", "present"}
    monkeypatch.setattr(plugins, "all_registrations", lambda: {k: v for k, v in everything().items() if k in keep})
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
    assert (record["peak"]["flops"], record["peak"]["source"]) == (5e11, "tests/test_plugins.py (invented)")
    assert record["peak"]["origin"] == "declared by plugin"
    assert record["mfu"] == pytest.approx(record["tflops"] * 1e12 / 5e11)
    assert record["mfu"] > 0


def test_a_backend_without_a_peak_gets_no_mfu(register_backend, tmp_path):
    register_backend(HostBackend())
    record = run_record(tmp_path, "--plugin", "host")
    assert record["plugin"]["settings"] == {"mode": "off", "threads": 0, "fast": False}
    assert record["peak"]["flops"] is None and record["peak"]["source"] is None and record["mfu"] is None
    assert record["tflops"] > 0


def test_a_peak_without_its_source_is_refused(register_backend, tmp_path):
    register_backend(FloatPeakBackend())
    output = refused_run(tmp_path, 1, "--plugin", "floatpeak")
    assert "peak_flops must return llmb.Peak(flops, source) or None" in output


def test_a_backend_raising_in_a_method_is_one_line_naming_backend_and_method(register_backend, tmp_path):
    register_backend(BrokenBackend())
    lines = refused_run(tmp_path, 1, "--plugin", "broken").strip().splitlines()
    assert lines == ["error: backend 'broken' failed in process_model: RuntimeError: kernel library missing"]


def test_call_wraps_the_error():
    backend = BrokenBackend()
    with pytest.raises(PluginError) as info:
        call(backend.process_model, None, None, None, "FP32", {})
    assert (info.value.backend, info.value.method) == ("broken", "process_model")


def test_optimizer_options_beyond_the_implementation_are_refused(register_backend, tmp_path):
    register_backend(GreedyOptimizerBackend())
    output = refused_run(tmp_path, 1, "--plugin", "greedy")
    assert "plugin 'greedy': optimizer options lr refused: only foreach, fused, capturable may be set" in output


def test_post_processing_that_changes_the_optimizer_makes_the_run_invalid(register_backend, tmp_path):
    register_backend(TamperingBackend())
    record = run_record(tmp_path, "--plugin", "tampering")
    assert "optimizer: optimizer lr is 1.0, fixed value is 1e-05" in record["invalid_reasons"]


def test_each_backend_answers_for_itself(register_backend):
    register_backend(PresentBackend())
    # cpu has no peak; another registered backend's answer must not leak into cpu's.
    assert get_backend("cpu").backend.peak_flops(None, "FP32") is None
    assert get_backend("present").backend.peak_flops(None, "FP32").flops == 5e11


def test_installed_plugins_are_listed_from_metadata_without_importing_them(monkeypatch):
    import sys

    before = set(sys.modules)
    listed = plugins.installed()
    assert listed[0] == plugins.PluginInfo("cpu", "llmb", listed[0].version, "llmb.default_plugins.cpu")
    assert len({info.name for info in listed}) == len(listed)
    assert set(sys.modules) == before  # nothing imported to list them
    assert plugins.installed_records()[0] == {"name": "cpu", "distribution": "llmb", "version": listed[0].version}


def test_a_run_records_every_installed_plugin(tmp_path):
    record = run_record(tmp_path, "--plugin", "cpu", "--device", "cpu")
    assert record["judge"]["installed_plugins"] == plugins.installed_records()


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
    assert described["cuda"]["peak_sources"] == {} == described["rocm"]["peak_sources"]  # llmb's table has theirs
    assert described["rocm"]["methods_overridden"] == described["cuda"]["methods_overridden"]  # inherited


def test_the_docs_document_every_backend_method_with_its_parameters_and_an_example():
    import inspect
    import re
    from pathlib import Path

    section = (Path(__file__).parent.parent / "docs" / "vendors" / "backend-methods.md").read_text()
    documented = re.findall(r"^### `(\w+)\(([^)]*)\)`$", section, re.MULTILINE)
    assert [name for name, _ in documented] == public_methods()
    for name, params in documented:
        expected = [p for p in inspect.signature(getattr(Backend, name)).parameters if p != "self"]
        assert [p.strip() for p in params.split(",") if p.strip()] == expected, name
        body = section.split(f"### `{name}(", 1)[1].split("\n### ", 1)[0]
        prose, _, rest = body.partition("```python\n")
        assert prose.count("\n") >= 2 and rest, f"{name}: a description and then an example"
        assert f"def {name}(self" in rest.split("```", 1)[0], f"{name}: the example overrides the method"


NOISY_PLUGIN = '''
"""A plugin whose import leaves a mark: llmb must import it only when it is asked for."""
import os
from pathlib import Path

from llmb import Backend, hookimpl

Path(os.environ["NOISY_MARK"]).write_text("imported")


class Noisy(Backend):
    name = "noisy"


@hookimpl
def register_backends(register):
    register(Noisy())
'''


def test_a_run_imports_only_the_selected_plugin(tmp_path):
    import os
    import subprocess
    import sys

    from conftest import install_plugin

    site = install_plugin(tmp_path, "noisy", NOISY_PLUGIN, version="2.0")
    mark = tmp_path / "mark"
    env = dict(os.environ, PYTHONPATH=str(site), NOISY_MARK=str(mark))

    def llmb(*args):
        command = [sys.executable, "-m", "llmb", *args]
        proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]

    out = tmp_path / "out"
    llmb("run", "--plugin", "cpu", "--device", "cpu", *TINY, "--out", str(out))
    assert not mark.exists(), "an installed plugin that was not selected was imported during the run"
    (record,) = [json.loads(p.read_text()) for p in out.glob("*.json")]
    assert {"name": "noisy", "distribution": "llmb-noisy", "version": "2.0"} in record["judge"]["installed_plugins"]
    llmb("plugins", "--json")
    assert mark.read_text() == "imported"  # listing loads every plugin


def test_an_installed_plugin_without_a_backend_is_named_as_such(tmp_path):
    """A plugin written to the old hook-per-method contract loads but registers nothing: the error says that, not
    "no plugin named" beside a list that names it."""
    import os
    import subprocess
    import sys

    from conftest import install_plugin

    site = install_plugin(
        tmp_path, "legacy", "from llmb import hookimpl\n\n@hookimpl\ndef step_end(device):\n    pass\n"
    )
    env = dict(os.environ, PYTHONPATH=str(site))
    command = [sys.executable, "-m", "llmb", "run", "--plugin", "legacy", *TINY, "--out", str(tmp_path / "out")]
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 2, proc.stderr[-2000:]
    (line,) = proc.stderr.strip().splitlines()
    assert "plugin 'legacy' has no backend named 'legacy'" in line and "register_backends" in line


ARGV_PLUGIN = '''
"""A plugin that notes, at each import, the command line of the process importing it."""
import json, os, sys

from llmb import Backend, hookimpl

with open(os.environ["ARGV_MARK"], "a") as mark:
    mark.write(json.dumps(sys.argv) + "\\n")


class Argv(Backend):
    name = "argv"


@hookimpl
def register_backends(register):
    register(Argv())
'''


def test_auto_selection_imports_the_plugins_in_a_throwaway_process_only(tmp_path):
    """Without --plugin every plugin must be asked whether its hardware is present, which imports it: that happens
    in a probe process (`python -c`), and the run's own processes import only the chosen plugin (cpu here)."""
    import os
    import subprocess
    import sys

    from conftest import install_plugin

    site = install_plugin(tmp_path, "argv", ARGV_PLUGIN)
    mark = tmp_path / "mark"
    env = dict(os.environ, PYTHONPATH=str(site), ARGV_MARK=str(mark))
    env.pop("LLMB_IN_PROCESS", None)
    out = tmp_path / "out"
    command = [sys.executable, "-m", "llmb", "run", "--device", "cpu", *TINY, "--out", str(out)]
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (record,) = [json.loads(p.read_text()) for p in out.glob("*.json")]
    assert record["plugin"]["name"] == "cpu"  # argv has no hardware
    imports = [json.loads(line) for line in mark.read_text().splitlines()]
    assert imports and all(argv[0] == "-c" for argv in imports), imports


GPU_PLUGIN = '''
from llmb import Backend, hookimpl


class Gpu(Backend):
    """A GPU plugin on a host where its GPU is present (it says so; nothing here touches a GPU)."""

    name = "gpu"

    def device_types(self):
        return ["cuda"]

    def available(self):
        return True


@hookimpl
def register_backends(register):
    register(Gpu())
'''


def test_the_auto_selection_probe_takes_the_device_asked_for(tmp_path, monkeypatch):
    """The throwaway process that asks every installed plugin (a real subprocess) is told the device type asked for."""
    import os

    from conftest import install_plugin

    site = install_plugin(tmp_path, "gpu", GPU_PLUGIN)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p))
    assert probe_process.ask("cpu") == "cpu"
    assert probe_process.ask("cuda") == "gpu"


def test_auto_selection_starts_one_probe_process_per_device_type(tmp_path, monkeypatch):
    """One command asks once: `--precision all` without --plugin started a probe process (a fresh interpreter
    importing torch and every plugin, about 7 s here) for its expansion and again for each precision, 4 on the CPU.
    The answer is kept per device type, and asked again where what the probe would see changes (PYTHONPATH)."""
    import os
    import subprocess

    from conftest import install_plugin

    site = install_plugin(tmp_path, "gpu", GPU_PLUGIN)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p))
    monkeypatch.syspath_prepend(str(site))  # installed() here sees the plugin the probe process will load
    started = []
    real_run = subprocess.run

    def counting_run(command, *args, **kwargs):
        started.append(command)
        return real_run(command, *args, **kwargs)

    monkeypatch.setattr(subprocess, "run", counting_run)
    assert [select_backend(None, device).name for device in ("cuda", "cuda:0", "cuda")] == ["gpu"] * 3
    assert len(started) == 1, started
    assert select_backend(None, "cpu").name == "cpu"
    assert len(started) == 2, started
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join((os.environ["PYTHONPATH"], str(tmp_path))))
    assert select_backend(None, "cuda").name == "gpu"
    assert len(started) == 3, started
