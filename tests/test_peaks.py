"""llmb's peak table (llmb/spec/peak_table.py), the one copy of every device's dense peak FLOP/s: device names match
one row or none (never a neighbour's figure), figures are dense and per torch device, and the first-party plugins
declare no peak for a device the table has (a plugin's own table is only for devices llmb's lacks)."""

from __future__ import annotations

import llmb_cuda
import llmb_rocm
import llmb_xla
import pytest

from llmb.spec import peak_table as peaks

PRECISIONS = ("FP32", "TF32", "FP16", "BF16")
NAMES = [
    # Torch's names for NVIDIA GPUs.
    ("NVIDIA A100-SXM4-80GB", "NVIDIA A100"),
    ("NVIDIA A100-SXM4-40GB", "NVIDIA A100"),
    ("NVIDIA A100 80GB PCIe", "NVIDIA A100"),
    ("NVIDIA A100-PCIE-40GB", "NVIDIA A100"),
    ("NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM"),
    ("NVIDIA H100 SXM5 80GB", "NVIDIA H100 SXM"),
    ("NVIDIA H100 PCIe", "NVIDIA H100 PCIe"),
    ("NVIDIA H200", "NVIDIA H200"),
    ("NVIDIA B200", "NVIDIA B200"),
    # AMD GPUs are torch "cuda" devices under ROCm; each MI250X GCD is one.
    ("AMD Instinct MI300X", "AMD Instinct MI300X"),
    ("AMD Instinct MI300X OAM", "AMD Instinct MI300X"),
    ("AMD Instinct MI250X", "AMD Instinct MI250X (per GCD)"),
    # PJRT device kinds of TPUs.
    ("TPU v4", "Google TPU v4"),
    ("TPU v5 lite", "Google TPU v5e"),
    ("TPU v5e", "Google TPU v5e"),
    ("TPU v5p", "Google TPU v5p"),
    ("TPU v5", "Google TPU v5p"),
    # Other clocks, power or silicon: no figure rather than a neighbour's.
    ("NVIDIA H100 NVL", None),
    ("NVIDIA H100", None),
    ("NVIDIA H200 NVL", None),
    ("NVIDIA GH200 480GB", None),
    ("NVIDIA GB200", None),
    ("NVIDIA H800", None),
    ("NVIDIA A100X", None),
    ("NVIDIA GeForce RTX 4090", None),
    ("AMD Instinct MI250X / MI250", None),  # MI250 is slower: an ambiguous name gets no peak
    ("AMD Instinct MI250", None),
    ("AMD Instinct MI300A", None),
    ("AMD Instinct MI325X", None),
    ("AMD Radeon RX 7900 XTX", None),
    ("TPU v4 lite", None),  # v4i, an inference chip
    ("cpu", None),
    ("", None),
]


@pytest.mark.parametrize("name, label", NAMES)
def test_device_names_match_one_row_or_none(name, label):
    row = peaks.match(name)
    assert (row.label if row else None) == label
    if label is None:
        assert all(peaks.choose(name, p).flops is None for p in PRECISIONS)


@pytest.mark.parametrize(
    "name, sparse_bf16_tflops",
    # The datasheets' BF16 tensor figures are quoted with 2:4 sparsity; the table holds the dense half.
    [
        ("NVIDIA A100-SXM4-80GB", 624),
        ("NVIDIA H100 80GB HBM3", 1979),
        ("NVIDIA H100 PCIe", 1513),
        ("NVIDIA H200", 1979),
        ("NVIDIA B200", 4500),
        ("AMD Instinct MI300X", 2614.9),
    ],
)
def test_gpu_peaks_are_dense_figures(name, sparse_bf16_tflops):
    figure = peaks.match(name).peaks
    assert figure["BF16"] == pytest.approx(sparse_bf16_tflops * 1e12 / 2, rel=1e-3)
    assert figure["FP16"] == figure["BF16"]
    assert figure["FP32"] < figure["TF32"] < figure["BF16"]
    assert "FP8" not in figure  # not a benchmark precision: never a peak


def test_an_mi250x_figure_is_per_gcd_and_has_no_tf32():
    figure = peaks.match("AMD Instinct MI250X").peaks
    assert figure["BF16"] == pytest.approx(383e12 / 2, rel=1e-3)  # 383 TFLOPS per package of two GCDs
    assert "TF32" not in figure


def test_tpus_have_a_bf16_peak_only():
    for kind, tflops in (("TPU v4", 275), ("TPU v5e", 197), ("TPU v5p", 459)):
        assert dict(peaks.match(kind).peaks) == {"BF16": tflops * 1e12}  # Google publishes no FP32 peak


def test_every_row_names_its_public_source():
    assert all("https://" in row.source for row in peaks.TABLE)


def test_the_first_party_plugins_declare_no_peak_for_a_device_llmbs_table_has():
    """One copy of each peak: a plugin's table holds only devices llmb's lacks (the table wins for the others, so a
    copy there is never used and drifts untested)."""
    known = [name for name, label in NAMES if label is not None]
    for table in (llmb_cuda.PEAKS, llmb_rocm.PEAKS):
        for entry in table:
            assert not [name for name in known if entry.matches(name)], entry.label
            assert not [row.label for row in peaks.TABLE if row.matches(entry.label)], entry.label
    for kind in llmb_xla.PEAK_BF16_TFLOPS:
        assert peaks.match(kind) is None, kind
