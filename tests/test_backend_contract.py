"""The vendor contract's typed parts: a backend's settings as one dataclass (llmb.api.settings.PluginSettings, each
default declared once) and the per-run state its setup returns (llmb.registry.plugins.setup / with_state)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from llmb import Backend, CpuBackend, Setting
from llmb.api.errors import UsageError
from llmb.api.settings import PluginSettings, option, recorded
from llmb.default_plugins.cpu import CpuSettings
from llmb.registry import plugins
from llmb.registry.plugins import resolve_settings
from llmb.registry.state import with_state
from llmb.toolkit import features


@dataclass(frozen=True, eq=False)
class AcmeSettings(features.FeatureSettings):
    compile: str = option("default", "torch.compile mode", choices=("none", "default"))
    streams: int = option(2, "copy streams", minimum=1, maximum=8)
    scale: float = option(0.5, "a fraction", minimum=0.0)
    pin: int = option(0, "a secret number", minimum=0, secret=True)
    license_key: str = option("", "the vendor library's licence", secret=True)


class AcmeBackend(Backend):
    name = "acme"
    Settings = AcmeSettings


def test_typed_settings_are_declared_once_and_resolved_into_an_instance():
    backend = AcmeBackend()
    names = [s.name for s in backend.settings()]
    # The shared features first, in their order, then the plugin's own; a redeclared field keeps its place.
    assert names == [
        "compile",
        "activation_checkpointing",
        "fp8",
        "fp8_emulate",
        "streams",
        "scale",
        "pin",
        "license_key",
    ]
    assert {s.name: s.default for s in backend.settings()}["compile"] == "default"
    settings = resolve_settings(backend, {"streams": "4", "compile": "NONE"})
    assert isinstance(settings, AcmeSettings)
    assert (settings.streams, settings.compile, settings.fp8) == (4, "none", "none")
    # It reads as the mapping plugins written before it use, and equals the dict of its values.
    assert settings["streams"] == 4 and settings.get("missing", "x") == "x" and "fp8" in settings
    assert settings == dict(settings) and len(settings) == len(names)
    assert features.value(settings, "compile") == "none"
    with pytest.raises(UsageError, match="setting streams='many'"):
        resolve_settings(backend, {"streams": "many"})
    with pytest.raises(UsageError, match="has no setting 'colour'"):
        resolve_settings(backend, {"colour": "red"})


@pytest.mark.parametrize(
    "given, expected",
    [
        ({"streams": "0"}, "setting streams='0': expected 1 to 8"),
        ({"streams": "9"}, "setting streams='9': expected 1 to 8"),
        ({"scale": "-0.25"}, "setting scale='-0.25': expected at least 0.0"),
        ({"pin": "-7"}, "setting pin=<redacted>: expected at least 0"),  # the range, never the secret's value
    ],
)
def test_a_number_outside_its_declared_range_is_refused_as_the_command_line_is_read(given, expected):
    with pytest.raises(UsageError) as info:
        resolve_settings(AcmeBackend(), given)
    assert str(info.value) == f"plugin 'acme' {expected}"
    # The bounds themselves are in range, and `llmb plugins` states the range.
    assert resolve_settings(AcmeBackend(), {"streams": "1", "scale": "0"}).streams == 1
    assert resolve_settings(AcmeBackend(), {"streams": "8"}).streams == 8
    described = {s.name: s.describe() for s in AcmeBackend().settings()}
    assert (described["streams"]["minimum"], described["streams"]["maximum"]) == (1, 8)
    assert (described["scale"]["minimum"], described["scale"]["maximum"]) == (0.0, None)


def test_a_secret_typed_setting_is_never_recorded_nor_shown():
    settings = resolve_settings(AcmeBackend(), {"license_key": "s3cr3t-token"})
    assert settings.license_key == "s3cr3t-token"
    assert recorded(settings)["license_key"] == "<redacted>"
    assert "s3cr3t" not in repr(settings) and "s3cr3t" not in str(settings)


def test_a_setting_may_not_take_a_name_the_mapping_answers_itself():
    @dataclass(frozen=True, eq=False)
    class Clashing(PluginSettings):
        items: int = option(1, "clashes with Mapping.items")

    with pytest.raises(TypeError, match="Clashing.items"):
        Clashing.declared()


def test_a_subclass_that_lists_its_own_settings_gets_a_dict_and_the_features_off():
    """A vendor backend on llmb.CpuBackend that lists its settings itself: a dict, the typed class not forced on it."""

    class Listed(CpuBackend):
        name = "listed"

        def settings(self):
            return [Setting("depth", int, 3, "a vendor setting")]

    settings = resolve_settings(Listed(), {})
    assert type(settings) is not CpuSettings and settings == {"depth": 3}
    assert features.value(settings, "compile") == "none"
    assert isinstance(resolve_settings(CpuBackend(), {}), CpuSettings)


class StatefulBackend(CpuBackend):
    name = "stateful"

    def setup(self, device, precision, settings):
        return {"precision": precision}

    def run_facts(self, device, state=None):
        return {"state": state}

    def step_end(self, device, state=None):
        state["steps"] = state.get("steps", 0) + 1


def test_the_state_setup_returns_reaches_the_methods_that_name_it():
    first, second, device = StatefulBackend(), StatefulBackend(), torch.device("cpu")
    settings = resolve_settings(first, {})
    plugins.setup(first, device, "FP32", settings)
    plugins.setup(second, device, "BF16", settings)  # another run in the same process keeps its own
    assert plugins.call(first.run_facts, device) == {"state": {"precision": "FP32"}}
    assert plugins.call(second.run_facts, device) == {"state": {"precision": "BF16"}}
    step_end = with_state(first.step_end)  # the loops bind it once, before the clock runs
    step_end(device)
    step_end(device)
    assert plugins.call(first.run_facts, device)["state"]["steps"] == 2
    # A method that names no state is called as it is; so is every method of a backend whose setup returned none.
    assert with_state(first.device_types) == first.device_types
    plugins.setup(first, device, "FP16", settings)  # a new run's setup replaces the state
    assert plugins.call(first.run_facts, device) == {"state": {"precision": "FP16"}}


def test_a_run_hands_the_state_to_the_loop_and_the_record(register_backend):
    """Through llmb's own runner: the state setup returned reaches step_end in the timed loop and run_facts in the
    record, without a module global or an attribute on the backend."""
    from llmb.run.runner import RunOptions, run
    from llmb.spec.presets import PRESETS

    backend = register_backend(StatefulBackend())
    options = RunOptions(
        config=PRESETS["tiny"], preset="tiny", plugin="stateful", device="cpu", precision="FP32", steps=2,
        warmup_steps=1,
    )  # fmt: skip
    result = run(options)
    assert result.facts["state"]["precision"] == "FP32"
    assert result.facts["state"]["steps"] >= 3  # the warmup's steps and the window's
    assert "state" not in vars(backend) and not [k for k in vars(backend) if k != "name"]


def test_the_window_judges_and_progress_displays_meet_their_protocols():
    """Three window judges and two progress displays, one protocol each (llmb.api.protocols): the same members with
    the same parameters, so a fourth cannot drift from them unnoticed."""
    import inspect

    from llmb.api.protocols import RunProgress, WindowJudge
    from llmb.distributed.job_judge import JobJudge
    from llmb.run.clean_worker import Link
    from llmb.run.options import Progress
    from llmb.terminal.progress import RichProgress
    from llmb.training.loop import LocalJudge

    def members(protocol):
        return [name for name in vars(protocol) if not name.startswith("_") and callable(vars(protocol)[name])]

    for protocol, implementations in (
        (WindowJudge, (LocalJudge, Link, JobJudge)),
        (RunProgress, (Progress, RichProgress)),
    ):
        assert members(protocol)
        for cls in implementations:
            for name in members(protocol):
                wanted = list(inspect.signature(getattr(protocol, name)).parameters)
                assert list(inspect.signature(getattr(cls, name)).parameters) == wanted, (cls.__name__, name)
    assert isinstance(LocalJudge(), WindowJudge) and LocalJudge.clean is False and Link.clean is True
    assert isinstance(Progress(), RunProgress)
