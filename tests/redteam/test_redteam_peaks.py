"""Red team, class 6 of the second round: a peak chosen by an ambiguous name. A plugin names its device so that the
name matches two rows of llmb's peak table and declares a low peak of its own, hoping the ambiguity is settled by
its declaration (an inflated MFU). Stage: run (and verify's peak check); reason: "matches 2 rows"."""

import pytest
from redteam_kit import install, reasons, run

from llmb.spec import peak_table as peaks

AMBIGUOUS_NAME = """
def _device_name(device):
    return "AMD Instinct MI250X / MI300X (CPU emulation)"


def _peak(device, precision):
    return Peak(2e9, "the vendor's own measurement")
"""


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
