"""Hostile plugins, found by probing with a plugin whose methods misbehave (2026-11-27), fixed by class: a
declaration of the wrong type is the plugin's one-line error naming its method, wherever llmb asks for it, and
`llmb plugins` still lists every other backend; auto-selection takes a plugin that cannot say whether its hardware is
present as absent, with one warning; what a plugin prints never mixes into llmb's JSON on stdout; a trial that
`llmb run` refuses is one failed point of a sweep, not the end of it."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
from conftest import TINY, TINY_CPU, install_plugin, invoke, plugin_env

from llmb import Backend, CpuBackend, Setting
from llmb.api.errors import PluginError, UsageError
from llmb.registry import plugins, probe_process
from llmb.registry.plugins import call, select_backend
from llmb.run import sweep, sweep_trials

# Outside text as a plugin may send it: markup, an escape sequence, and a line that reads as llmb's own.
HOSTILE = "x[/]y[bold red]z[/]\x1b[2J\nerror: forged line"

# Settings whose declaration is unsound (found by probing, 2026-11-27: each passed until a run used it, then failed
# with a TypeError naming neither the plugin nor its method, or was listed and could never be given).
MALFORMED_SETTINGS = [
    Setting(7, str, "a", "a name that is no str"),
    Setting("", str, "a", "an empty name"),
    Setting("a b=c", str, "a", "a name -O cannot give"),
    Setting("m", "str", "a", "a type given as text"),
    Setting("m", list, [], "a type -O cannot parse"),
    Setting("m", str, "a", None),
    Setting("m", str, "a", "h", "abc"),  # choices as one string: its letters
    Setting("m", str, "a", "h", ()),
    Setting("m", str, "a", "h", (object(),)),
    Setting("m", int, "x", "a default of another type"),
    Setting("m", int, True, "a bool is no int setting's value"),
    Setting("m", float, math.inf, "a default no JSON holds"),
    Setting("m", str, "z", "a default not among the choices", ("a", "b")),
    Setting("m", str, "a", "h", secret="no"),
    # A range: only a number's, of its type, the least no greater than the greatest, the default inside it.
    Setting("m", str, "a", "h", minimum=0),
    Setting("m", bool, False, "h", maximum=1),
    Setting("m", int, 1, "h", minimum=0.5),
    Setting("m", int, 1, "h", maximum="8"),
    Setting("m", int, 1, "h", minimum=True),
    Setting("m", float, 1.0, "h", maximum=math.nan),
    Setting("m", int, 4, "h", minimum=8, maximum=1),
    Setting("m", int, 0, "a default below its minimum", minimum=1),
    Setting("m", float, 2.5, "a default above its maximum", maximum=2),
]

# (method, a value of the wrong type for it): the declarations every command reads.
WRONG = [
    ("device_types", None),
    ("device_types", math.nan),
    ("device_types", 7),
    ("device_types", "cpu"),  # a string is no list of device types, though iterating it "works"
    ("device_types", object()),
    ("device_types", [None]),
    ("precisions", None),
    ("precisions", ("FP32", 16)),
    ("vendor_libraries", None),
    ("vendor_libraries", "acme-kernels"),
    ("settings", None),
    ("settings", ["mode"]),
    ("peak_sources", None),
    ("peak_sources", [("X1", "https://example.com")]),
    ("peak_sources", {"X1": 1e12}),
    ("available", None),
    ("available", math.nan),
    ("available", 1),
    ("available", "yes"),
    # A list of Settings, each of which -O, `llmb plugins` or a record cannot use: every field is checked.
    *[("settings", [declared]) for declared in MALFORMED_SETTINGS],
    ("settings", [Setting("mode", str, "a", "h"), Setting("Mode", int, 1, "h")]),  # one name to -O (any case)
]
# Where `llmb plugins --json` puts each method's answer.
FIELD = {"available": "hardware_available"}


def answering(method: str, value: object, name: str = "wrong") -> Backend:
    """A backend whose one method returns `value` (raises it, where it is an exception)."""

    def answer(self):
        if isinstance(value, BaseException):
            raise value
        return value

    answer.__name__ = method
    return type("Answering", (Backend,), {"name": name, method: answer})()


@pytest.mark.parametrize("method, value", WRONG)
def test_a_declaration_of_the_wrong_type_is_the_plugins_error_naming_its_method(method, value):
    with pytest.raises(PluginError) as info:
        call(getattr(answering(method, value), method))
    assert (info.value.backend, info.value.method) == ("wrong", method)
    assert str(info.value).startswith(f"backend 'wrong' failed in {method}: TypeError: returned ")
    assert "\n" not in str(info.value)


def test_sound_settings_pass_the_check():
    declared = [
        Setting("compile", str, "none", "how", choices=("none", "default")),
        Setting("ratio", float, 1, "an int is a float's value"),
        Setting("threads", int, None, "no default: the plugin's own"),
        Setting("xla.flag-2", bool, False, "dots and dashes"),
        Setting("streams", int, 2, "a range", minimum=1, maximum=8),
        Setting("scale", float, 0.5, "an int bound is a float's", minimum=0, maximum=1),
        Setting("depth", int, None, "no default, a least value", minimum=1),
    ]
    assert call(answering("settings", declared).settings) == declared


def test_the_check_knows_a_method_by_its_place_on_the_class_not_its_name():
    """A lambda (or a decorator without functools.wraps) has another __name__: its value is checked all the same."""
    backend = type("Lambda", (Backend,), {"name": "lambda", "device_types": lambda self: None})()
    with pytest.raises(PluginError, match="failed in device_types: TypeError: returned NoneType, not a list of str"):
        call(backend.device_types)


# Failures of other kinds: raising (llmb's own error too), or a declaration whose contents JSON cannot hold.
FAILING = [
    ("available", RuntimeError(HOSTILE)),
    ("device_types", UsageError(HOSTILE)),
    ("settings", [Setting("ratio", float, math.nan, "a default no JSON holds")]),
    ("settings", [Setting("mode", str, object(), "a default no JSON holds")]),
]


@pytest.mark.parametrize("method, value", [*WRONG, *FAILING])
def test_plugins_lists_every_backend_beside_one_whose_method_failed(register_backend, method, value):
    register_backend(answering(method, value))
    register_backend(answering("device_types", ["cpu"], name="fine"))
    result = invoke("plugins", "--json")
    assert result.exit_code == 0, result.output  # as for a plugin that failed to load: said, not fatal
    described = {b["name"]: b for b in json.loads(result.stdout)}
    assert {"cpu", "fine", "wrong"} <= set(described)
    wrong = described["wrong"]
    assert wrong[FIELD.get(method, method)] is None and list(wrong["errors"]) == [method]
    said = wrong["errors"][method]
    assert said.startswith(f"backend 'wrong' failed in {method}: ") and "\n" not in said
    assert described["fine"]["errors"] == {} and described["cpu"]["errors"] == {}
    warnings = [line for line in result.stderr.splitlines() if "'wrong'" in line]
    assert len(warnings) == 1 and warnings[0].startswith("warning: backend 'wrong' failed in"), result.stderr
    assert "Traceback" not in result.output and "\x1b" not in result.output

    table = invoke("plugins")
    assert table.exit_code == 0, table.output
    text = table.stdout.replace("│", " ")
    assert "fine  (plugin fine" in text and f"failed in {method}" in text, text


# What a run asks as it sets up (not `llmb plugins`): a wrong type was a TypeError or AttributeError naming neither the
# backend nor the method (found by returning 10**5000, a list and a dict from every method, 2026-11-27).
SETUP_WRONG = [
    ("optimizer_options", 10**5000),
    ("optimizer_options", [("fused", True)]),
    ("precision_facts", "BF16"),
    ("precision_facts", [("mylib.fast_math", True)]),
    ("new_event", 10**5000),
    ("new_event", {"record": None}),
]


@pytest.mark.parametrize("method, value", SETUP_WRONG, ids=lambda v: v if isinstance(v, str) else type(v).__name__)
def test_a_run_refuses_a_wrong_setup_answer_in_one_line_naming_the_method(register_backend, tmp_path, method, value):
    def answer(self, *args):
        return value

    register_backend(type("Answering", (CpuBackend,), {"name": "wrong", method: answer})())
    result = invoke("run", *TINY_CPU, "--plugin", "wrong", "--out", tmp_path)
    assert result.exit_code == 1, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(f"error: backend 'wrong' failed in {method}: TypeError: returned ")
    assert result.output.strip().splitlines()[-1] == errors[0] and "Traceback" not in result.output


def test_a_run_refuses_a_declaration_of_the_wrong_type_in_one_line(register_backend, tmp_path):
    register_backend(answering("precisions", None))
    result = invoke("run", *TINY_CPU, "--plugin", "wrong", "--out", tmp_path)
    assert result.exit_code == 1, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert lines == ["error: backend 'wrong' failed in precisions: TypeError: returned NoneType, not a list of str"]


class _FailingEvent:
    """A device event of the plugin's own, whose record() fails (the window's first step calls it)."""

    def record(self):
        raise RuntimeError(HOSTILE)

    def synchronize(self):
        pass

    def elapsed_time(self, other):
        return 1.0


@pytest.mark.parametrize(
    "method, failing_call, named",
    [("synchronize", 1, "synchronize"), ("synchronize", 6, "synchronize"), ("step_end", 3, "step_end"),
     ("new_event", 1, "_FailingEvent.record")],
)  # fmt: skip
def test_a_failure_in_what_the_timed_loop_calls_directly_names_the_plugin_and_the_method(
    register_backend, tmp_path, method, failing_call, named
):
    """The loop calls synchronize, step_end and the events' methods directly, not through `call` (the window stays
    lean): a failure there was the bare "error: RuntimeError: ..." naming neither the plugin nor the method (found by
    probing, 2026-11-27). Now it is the plugin's one-line error, from the warmup's first step or inside a window."""
    calls = []

    def failing(self, device):
        calls.append(method)
        if method == "new_event":
            return _FailingEvent() if len(calls) >= failing_call else None
        if len(calls) >= failing_call:
            raise RuntimeError(HOSTILE)
        return getattr(CpuBackend, method)(self, device)

    register_backend(type("Failing", (CpuBackend,), {"name": "wrong", method: failing})())
    result = invoke("run", *TINY_CPU, "--plugin", "wrong", "--out", tmp_path)
    assert result.exit_code == 1, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(f"error: backend 'wrong' failed in {named}: RuntimeError: x"), (
        result.output
    )
    assert "forged line" not in result.output and "Traceback" not in result.output


class PresentBackend(Backend):
    name = "present"

    def available(self):
        return True


@pytest.mark.parametrize("answer", [RuntimeError(HOSTILE), None, "yes", 1, math.nan])
@pytest.mark.parametrize("method, device", [("available", None), ("device_types", "cpu")])
def test_auto_selection_takes_a_plugin_that_cannot_say_as_absent_with_one_warning(
    register_backend, monkeypatch, capsys, answer, method, device
):
    """Whether its hardware is present, or (where --device names one) which device types it serves."""
    register_backend(answering(method, answer, name="sulky"))
    register_backend(PresentBackend())
    # This machine's installed plugins are left out of the candidates, so the test does not depend on them.
    mine = {"cpu", "sulky", "present"}
    everything = plugins.registrations
    monkeypatch.setattr(plugins, "all_registrations", lambda: {k: v for k, v in everything().items() if k in mine})
    assert select_backend(None, device).name == "present"
    warnings = capsys.readouterr().err.strip().splitlines()
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith("warning: plugin 'sulky' taken as without hardware: backend 'sulky' failed in ")
    assert method in warnings[0] and "\x1b" not in warnings[0]
    mine.discard("present")
    assert select_backend(None, device).name == "cpu"


SULKY_PLUGIN = """
from llmb import Backend, hookimpl


class Sulky(Backend):
    name = "sulky"

    def available(self):
        print("PRINTED")  # on the probe's stdout, where it could pass for the choice
        raise RuntimeError("driver not loaded")


@hookimpl
def register_backends(register):
    register(Sulky())
"""


def test_the_auto_selection_probe_takes_a_plugin_that_raises_as_absent_and_relays_the_warning(
    tmp_path, monkeypatch, capsys
):
    """The probe is the throwaway process that asks every installed plugin (a real subprocess here)."""
    site = install_plugin(tmp_path, "sulky", SULKY_PLUGIN)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p))
    chosen = probe_process.ask()
    assert chosen != "PRINTED" and chosen != "sulky"
    err = capsys.readouterr().err
    assert "warning: plugin 'sulky' taken as without hardware: backend 'sulky' failed in available: RuntimeError: " in (
        err
    )


class PrintingBackend(CpuBackend):
    """The CPU backend, saying things on stdout from its methods (the timed loop's synchronize among them)."""

    name = "printing"

    def device_types(self):
        print("PRINTED [bold]x[/]")
        return super().device_types()

    def synchronize(self, device):
        print("PRINTED in the loop")
        return super().synchronize(device)


def test_what_a_plugin_prints_never_mixes_into_llmbs_json(register_backend):
    register_backend(PrintingBackend())
    listed = invoke("plugins", "--json")
    assert listed.exit_code == 0, listed.output
    assert "printing" in {b["name"] for b in json.loads(listed.stdout)}
    assert "PRINTED" in listed.stderr
    peak = invoke(
        "peak", "--plugin", "printing", "--device", "cpu", "--preset", "tiny", "--precision", "fp32", "--square", 64,
        "--repeats", 1, "--json",
    )  # fmt: skip
    assert peak.exit_code == 0, peak.output
    assert json.loads(peak.stdout)["rooflines"][0]["precision"] == "FP32"
    assert "PRINTED in the loop" in peak.stderr


CHATTY_PLUGIN = """
from llmb import Backend, hookimpl

print("PRINTED as the module is imported")


class Chatty(Backend):
    name = "chatty"


@hookimpl
def register_backends(register):
    print("PRINTED as it registers")
    register(Chatty())
"""


# The same from below Python: straight to file descriptor 1, and C's printf with no newline (held in C stdio's buffer,
# which a pipe flushes only at exit: after llmb's JSON, where it broke the parse of its last line).
CHATTY_C_PLUGIN = """
import ctypes
import os

from llmb import Backend, hookimpl

os.write(1, b"PRINTED to descriptor 1 as the module is imported\\n")


class Chatty(Backend):
    name = "chatty"

    def available(self):
        ctypes.CDLL(None).printf(b"PRINTED by C's printf, no newline")
        return True


@hookimpl
def register_backends(register):
    register(Chatty())
"""


@pytest.mark.parametrize("source", [CHATTY_PLUGIN, CHATTY_C_PLUGIN], ids=["python", "c"])
def test_a_plugin_printing_as_it_loads_leaves_plugins_json_parseable(tmp_path, source):
    site = install_plugin(tmp_path, "chatty", source)
    env = plugin_env(site)
    command = [sys.executable, "-m", "llmb", "plugins", "--json"]
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "chatty" in {b["name"] for b in json.loads(proc.stdout)}
    printed = ["PRINTED as the module is imported", "PRINTED as it registers"] if source == CHATTY_PLUGIN else []
    printed += ["PRINTED to descriptor 1", "PRINTED by C's printf"] if source == CHATTY_C_PLUGIN else []
    assert all(line in proc.stderr for line in printed), proc.stderr[-2000:]


def test_the_auto_selection_probe_answers_past_a_plugin_printing_from_c(tmp_path):
    """The probe's answer is its last stdout line: a printf flushed at exit would have come after it."""
    site = install_plugin(tmp_path, "chatty", CHATTY_C_PLUGIN)
    env = plugin_env(site)
    proc = subprocess.run(
        [sys.executable, "-c", probe_process.PROBE], capture_output=True, text=True, env=env, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert probe_process.answer_of(proc.stdout) is not None and "PRINTED" not in proc.stdout, proc.stdout[-2000:]


def test_a_trial_llmb_run_refuses_is_a_refused_point():
    stderr = "DEBUG RUN, NOT A VALID RESULT\nerror: batch 2 is more than this device takes\n"
    assert sweep_trials.classify(2, stderr, None, 60) == ("refused", "batch 2 is more than this device takes")


# A plugin that takes batches of one only, and refuses a larger one with llmb's usage error (`llmb run` exits 2).
PICKY_PLUGIN = """
from llmb import CpuBackend, UsageError, hookimpl


def refuse_above_one(module, args):
    if args[0].shape[0] > 1:
        raise UsageError(f"batch {args[0].shape[0]} is more than this device takes")


class Picky(CpuBackend):
    name = "picky"

    def available(self):
        return False

    def process_model(self, model, optimizer, device, precision, settings):
        model = super().process_model(model, optimizer, device, precision, settings)
        model.register_forward_pre_hook(refuse_above_one)
        return model


@hookimpl
def register_backends(register):
    register(Picky())
"""


def picky_sweep(tmp_path, batch_sizes: str, *extra: str) -> subprocess.CompletedProcess:
    site = tmp_path / "site-picky"
    if not site.exists():
        install_plugin(tmp_path, "picky", PICKY_PLUGIN)
    env = plugin_env(site)
    command = [sys.executable, "-m", "llmb", "sweep", "--plugin", "picky", "--device", "cpu", *TINY]
    command += ["--precision", "FP32", "--batch-sizes", batch_sizes, "--repeats", "0", "--out", str(tmp_path / "out")]
    return subprocess.run([*command, *extra], capture_output=True, text=True, env=env, timeout=600)


@pytest.mark.slow
def test_a_refused_trial_is_a_failed_point_and_the_sweep_finishes(tmp_path):
    proc = picky_sweep(tmp_path, "1,2")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = tmp_path / "out"
    summary = json.loads((out / sweep.SUMMARY_NAME).read_text())["precisions"]["FP32"]
    assert summary["status"] == "ok" and summary["best_batch_size"] == 1
    (refused,) = [t for t in summary["search"] if t["batch_size"] == 2]
    assert refused["status"] == "refused" and refused["detail"] == "batch 2 is more than this device takes"
    assert (out / "failed" / "FP32-b2-search0.stderr.txt").exists()
    logged = (out / sweep.LOG_NAME).read_text()
    resumed = picky_sweep(tmp_path, "1,2", "--resume")  # the refused point is kept: nothing is run again
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert (out / sweep.LOG_NAME).read_text() == logged


@pytest.mark.slow
def test_a_refused_first_trial_still_stops_the_sweep(tmp_path):
    """Before anything ran, a refusal most likely means the sweep's own request cannot run (a device it cannot check
    without taking it): the sweep stops with the run's reason, as before, and logs no point."""
    proc = picky_sweep(tmp_path, "2,4")
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert lines == [
        "error: FP32 batch 2: llmb run refused the sweep's first trial: batch 2 is more than this device takes"
    ]
    assert not (tmp_path / "out" / sweep.SUMMARY_NAME).exists()
