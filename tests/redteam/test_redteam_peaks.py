"""Red team, class 6 of the second round: a peak chosen by the device's name. A plugin names its device so that the
name matches two rows of llmb's peak table (or, spelt with a look-alike character, none while it reads as one) and
declares a low peak of its own, hoping its declaration is used (an inflated MFU); on a host whose devices the judge
reads through torch, it names another device than the one that ran. Stage: run (and verify's peak check); reasons:
"matches 2 rows", "not printable ASCII", "device: the plugin names its device"."""

import pytest
import torch
from redteam_kit import install, reasons, run

from llmb.judge import verdict
from llmb.spec import peak_table as peaks


def named_device(name: str, declared: float) -> str:
    """A plugin's code that names its device `name` and declares `declared` FLOP/s for it (escaped: any character)."""
    return (
        f"\ndef _device_name(device):\n    return {ascii(name)}\n\n\n"
        f'def _peak(device, precision):\n    return Peak({declared!r}, "the vendor\'s own measurement")\n'
    )


AMBIGUOUS_NAME = named_device("AMD Instinct MI250X / MI300X (CPU emulation)", 2e9)


def test_an_ambiguous_device_name_is_never_resolved_by_the_plugins_declaration(tmp_path):
    proc, record = run(install(tmp_path / "site", "ambiguous", AMBIGUOUS_NAME), tmp_path, "--plugin", "ambiguous")
    assert record is not None, proc.stderr[-2000:]
    assert record["mfu"] is None and record["peak"]["flops"] is None, (record["mfu"], record["peak"])
    assert reasons(record, "peak: the device name 'AMD Instinct MI250X / MI300X (CPU emulation)' matches 2 rows")


@pytest.mark.parametrize(
    "name, declared, problem",
    [
        ("NVIDIA H100 80GB HBM3 A100", None, "matches 2 rows"),  # ambiguous: no peak at all
        ("NVIDIA H100 80GB HBM3", 1e12, "below llmb's table entry"),  # one row: a lower declaration is invalid
        ("Acme A1", 1e12, None),  # no row: the declaration (with its source) is the peak
    ],
)
def test_peak_choice_per_class_of_name(name, declared, problem):
    choice = peaks.choose(name, "BF16", declared, "a datasheet")
    if problem is None:
        assert choice.flops == declared and not choice.problems
    else:
        assert any(problem in p for p in choice.problems), choice.problems
        if "2 rows" in problem:
            assert choice.flops is None


# The H100's name with a Cyrillic EN for the H: it reads as the table's H100 in every report and matches no row, so
# the declared peak (a thousandth of the H100's) would be the MFU's denominator.
LOOK_ALIKE_NAME = named_device("NVIDIA \u041d100 80GB HBM3", 1e12)


def test_a_look_alike_device_name_never_takes_the_plugins_declared_peak(tmp_path):
    proc, record = run(install(tmp_path / "site", "lookalike", LOOK_ALIKE_NAME), tmp_path, "--plugin", "lookalike")
    assert record is not None, proc.stderr[-2000:]
    assert record["valid"] is False
    assert record["mfu"] is None and record["peak"]["flops"] is None, (record["mfu"], record["peak"])
    said = "peak: the device name 'NVIDIA \u041d100 80GB HBM3' matches no row"
    assert reasons(record, said), record["invalid_reasons"]
    assert any("U+041D CYRILLIC CAPITAL LETTER EN at 7" in r for r in record["invalid_reasons"])


@pytest.mark.parametrize(
    "name",
    [
        "NVIDIA \u041d100 80GB HBM3",
        "NVIDIA H\u200b100 80GB HBM3",
        "NVIDIA \uff22200",  # a fullwidth B
        "Acme\tA1",
    ],
)
def test_a_name_spelt_outside_printable_ascii_takes_no_declaration(name):
    choice = peaks.choose(name, "BF16", 1e12, "a datasheet")
    assert choice.flops is None and choice.declared == 1e12
    assert any("not printable ASCII" in p for p in choice.problems), choice.problems
    assert peaks.choose("Acme A1", "BF16", 1e12, "a datasheet").flops == 1e12  # the ASCII twin keeps its declaration


def _record(spec: str, name: str, declared: float | None = None) -> dict:
    peak = {"flops": declared, "origin": peaks.ORIGIN_DECLARED, "source": "a datasheet", "declared_flops": declared}
    return {"device": {"type": spec.split(":")[0], "spec": spec, "name": name}, "peak": peak,
            "precision": {"effective": "BF16"}}  # fmt: skip


def _cuda_host(monkeypatch, names: list[str]) -> None:
    """A mock: this CPU-only host has no CUDA device, so torch.cuda answers for the H100s the judge would read on a
    GPU host (the calls llmb.judge.hardware makes, nothing else)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(names))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: names[index])


def test_on_a_host_whose_devices_the_judge_reads_the_peak_follows_the_device_that_is_there(monkeypatch):
    _cuda_host(monkeypatch, ["NVIDIA H100 80GB HBM3"] * 2)
    # ASCII look-alikes (O for 0) pass the spelling rule; the judge's own reading of cuda:1 does not let them through.
    device, known, problems = verdict.judged_device(_record("cuda:1", "NVIDIA H1OO 80GB HBM3", 1e12))
    assert known and device["name"] == "NVIDIA H100 80GB HBM3"
    assert problems and problems[0].startswith("device: the plugin names its device 'NVIDIA H1OO 80GB HBM3'")
    peak, peak_problems = verdict.judged_peak({**_record("cuda:1", "", 1e12), "device": device}, known)
    assert peak["flops"] == 989.4e12 and peak["origin"] == peaks.ORIGIN_TABLE
    assert any("below llmb's table entry" in p for p in peak_problems)  # the declaration under the row's figure
    # The honest name is one of the host's: nothing to say, the plugin's word stands.
    device, known, problems = verdict.judged_device(_record("cuda:0", "NVIDIA H100 80GB HBM3"))
    assert known and not problems and device["name"] == "NVIDIA H100 80GB HBM3"


def test_a_device_the_judge_cannot_place_gets_no_peak(monkeypatch):
    _cuda_host(monkeypatch, ["NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"])  # a mixed host, a mock as above
    record = _record("cuda:5", "Acme A1", 1e12)  # index 5 of a 2-device host, under a name of neither
    device, known, problems = verdict.judged_device(record)
    assert not known and device["name"] == "Acme A1" and "no peak is used" in problems[0]
    peak, _ = verdict.judged_peak({**record, "device": device}, known)
    assert peak["flops"] is None


def test_where_torch_cannot_name_the_device_the_plugins_word_stands():
    # The CPU (no rows; the cpu plugin reads the OS's name) and a type only a plugin's library drives.
    for spec in ("cpu", "xla:0"):
        device, known, problems = verdict.judged_device(_record(spec, "NVIDIA H100 80GB HBM3"))
        assert known and not problems and device["name"] == "NVIDIA H100 80GB HBM3"


# A name the table lacks, in plain ASCII, with a peak the plugin derives from its own device: half of what a 512x512
# matmul reaches here. Above the model's achieved rate (so the MFU stays under 100% where this CPU's small GEMMs are
# slow beside a square one) and below every rate llmb's roofline measures on the device after the window.
UNDER_ITS_OWN_MATMULS = """
import time

import torch


def _device_name(device):
    return "Acme A1"


def _peak(device, precision):
    a = torch.randn(512, 512)
    a @ a
    start, runs = time.perf_counter(), 0
    while time.perf_counter() - start < 0.2:
        a @ a
        runs += 1
    return Peak(0.5 * 2 * 512**3 * runs / (time.perf_counter() - start), "the vendor's own measurement")
"""


def test_a_declared_peak_below_what_the_device_just_did_is_invalid(tmp_path):
    plugin = install(tmp_path / "site", "underpeak", UNDER_ITS_OWN_MATMULS)
    proc, record = run(plugin, tmp_path, "--plugin", "underpeak")
    assert record is not None, proc.stderr[-2000:]
    assert record["valid"] is False
    declared, measured = record["peak"]["declared_flops"], record["measured_matmul_peak"]
    assert record["peak"]["origin"] == peaks.ORIGIN_DECLARED and declared < measured, (declared, measured)
    said = "peak: the plugin declared"
    assert any(r.startswith(said) and "FLOP/s its matmuls reached in this run" in r for r in record["invalid_reasons"])


def test_a_declaration_is_held_to_the_matmul_rate_measured_on_the_device():
    below = peaks.choose("Acme A1", "BF16", 1e12, "a datasheet", measured=2e12)
    assert below.flops == 1e12 and below.origin == peaks.ORIGIN_DECLARED  # kept, so the reports show what was said
    assert any("below the 2e+12 FLOP/s its matmuls reached" in p for p in below.problems), below.problems
    assert not peaks.choose("Acme A1", "BF16", 3e12, "a datasheet", measured=2e12).problems  # a ceiling above: fine
    assert not peaks.choose("Acme A1", "BF16", 1e12, "a datasheet").problems  # nothing measured: the word stands
    # A device in the table keeps the table's figure; the rule is for what only the plugin says.
    row = peaks.choose("NVIDIA H100 80GB HBM3", "BF16", None, None, measured=2e15)
    assert row.origin == peaks.ORIGIN_TABLE and not row.problems
