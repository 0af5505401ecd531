"""What a plugin's methods return for the record, fixed by class: no returned value ends a measured run, and every
record `llmb run` writes reads back through llmb's own readers (llmb.run.plugin_returns, as_record_value).

The backend here is the real cpu plugin with one method at a time returning what a careless or hostile plugin might:
a value of the wrong type or range (the run keeps its windows and is invalid, naming the method), text no reader
takes (a lone surrogate, 70 MB, a line break), a number no reader takes (10**400, NaN), a structure nested past any
record, an object whose __str__ raises, and an energy counter that barely moves (tokens per joule made up).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from llmb import CpuBackend
from llmb.api.backend import EnergyCounter
from llmb.records import Result, energy
from llmb.records.files import as_record_value, read_object
from llmb.records.result_files import write_result
from llmb.run import runner
from llmb.spec.presets import PRESETS


class BadStr:
    def __str__(self) -> str:
        raise RuntimeError("__str__ exploded")

    __repr__ = __str__


def _nested(depth: int) -> dict:
    value: dict = {}
    for _ in range(depth):
        value = {"d": value}
    return value


class Returning(CpuBackend):
    """The cpu plugin with the methods named in `returns` returning those values (a stand-in for a plugin's bug)."""

    name = "returning"

    def __init__(self, returns: dict) -> None:
        super().__init__()
        self.returns = returns

    def available(self) -> bool:
        return False

    def device_name(self, device):
        return self.returns.get("device_name", super().device_name(device))

    def device_count(self, device):
        return self.returns.get("device_count", super().device_count(device))

    def peak_memory_bytes(self, device):
        return self.returns.get("peak_memory_bytes", super().peak_memory_bytes(device))

    def run_facts(self, device):
        return self.returns.get("run_facts", super().run_facts(device))

    def energy_counter(self, device):
        return self.returns.get("energy_counter", super().energy_counter(device))

    def device_memory_bytes(self, device):
        return self.returns.get("device_memory_bytes", super().device_memory_bytes(device))


def _run(register_backend, tmp_path: Path, returns: dict) -> tuple[Result, dict]:
    register_backend(Returning(returns))
    options = runner.RunOptions(
        config=PRESETS["tiny"], preset="tiny", plugin="returning", device="cpu", batch_size=1, steps=2,
        warmup_steps=1, repeats=1,
    )  # fmt: skip
    record = runner.run(options)
    path = write_result(record, tmp_path)
    data = read_object(path)  # llmb's own reader: what report, features and package-submission read through
    return Result.from_dict(data), data


WRONG = {
    "device_name": [BadStr(), None, 42, "   "],
    "device_count": [math.nan, -5, "2", True, 10**400, 10**5000],  # 5000 digits: past Python's str() of an int
    "peak_memory_bytes": [math.nan, -5, "abc", BadStr(), 2**70, 10**5000],
    "run_facts": ["not an object", BadStr(), [1, 2]],
    "device_memory_bytes": [math.nan, -5, "abc", 10**5000],
}


@pytest.mark.parametrize(
    "method,value", [(m, v) for m, values in WRONG.items() for v in values], ids=lambda v: type(v).__name__
)
def test_a_wrong_return_keeps_the_run_and_makes_it_invalid_naming_the_method(register_backend, tmp_path, method, value):
    record, _ = _run(register_backend, tmp_path, {method: value})
    assert record.tokens_per_second > 0 and record.timing.step_seconds  # the measured windows are kept
    named = [r for r in record.invalid_reasons if f"{method} returned" in r and "'returning'" in r]
    assert len(named) == 1, record.invalid_reasons
    assert "__str__ exploded" not in named[0]


@pytest.mark.parametrize(
    "facts",
    [
        {"huge": 10**400},
        _nested(70),
        {"surrogate": "a\ud800b", "\udfffkey": 1},
        {"big": "x" * (70 * 2**20)},
        {"nan": math.nan, "inf": -math.inf},
        {"object": BadStr(), "bytes": b"\xff", "tuple": (1, 2)},
        {BadStr(): 1},
        {"many": list(range(100_000))},
    ],
    ids=["huge-int", "nested-70", "surrogate", "70MB", "nan-inf", "objects", "object-key", "many-items"],
)
def test_any_facts_a_plugin_returns_are_kept_as_a_record_that_reads_back(register_backend, tmp_path, facts):
    record, data = _run(register_backend, tmp_path, {"run_facts": facts})
    assert not [r for r in record.invalid_reasons if "run_facts" in r]  # free text: kept, not held against the run
    assert len(str(data["facts"])) < 2**20


@pytest.mark.parametrize("name", ["CPU\ud800", "Acme X1\nerror: forged line", "x" * 10**6])
def test_a_device_name_is_kept_on_one_line_and_reads_back(register_backend, tmp_path, name):
    record, _ = _run(register_backend, tmp_path, {"device_name": name})
    assert "\n" not in record.device.name and "\ud800" not in record.device.name and len(record.device.name) < 300


def test_an_energy_counter_that_barely_moves_gives_no_figure_and_an_invalid_run(register_backend, tmp_path):
    ticks = iter(range(10**9))
    counter = EnergyCounter(read=lambda: next(ticks) * 1e-9, scope="made up", limit_watts="abc")
    record, data = _run(register_backend, tmp_path, {"energy_counter": counter})
    assert data["energy"].get("tokens_per_joule") is None
    assert any(f"below the {energy.FLOOR_WATTS:.0f} W" in r for r in record.invalid_reasons), record.invalid_reasons
    assert data["energy"].get("limit_watts") is None  # "abc" is no limit, and no longer ends the run


@pytest.mark.parametrize(
    "offered", [10**5000, None, BadStr(), "no counter\non this board"], ids=lambda v: type(v).__name__
)
def test_an_energy_counter_that_is_neither_counter_nor_reason_keeps_the_run(register_backend, tmp_path, offered):
    record, data = _run(register_backend, tmp_path, {"energy_counter": offered})
    assert record.tokens_per_second > 0 and data["energy"].get("tokens_per_joule") is None
    assert isinstance(data["energy"]["reason"], str) and "exploded" not in data["energy"]["reason"]


def test_a_plausible_counter_still_gives_its_figure():
    section, problems = energy.summarise({"scope": "one device", "limit_watts": 700}, [[0.0, 300.0]], [1.0], 1000)
    assert not problems and section["watts"] == 300.0 and section["tokens_per_joule"] == pytest.approx(1000 / 300)


def test_as_record_value_leaves_a_plain_value_alone():
    plain = {"driver": "550.54", "graphs": 3, "ratio": 0.5, "ok": True, "none": None, "list": [1, "a", [2.5]]}
    assert as_record_value(plain) == plain
