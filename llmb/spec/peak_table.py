"""Peak dense FLOP/s, owned by llmb: the denominator of MFU is not the plugin's to choose.

The table is keyed by device name (a pattern on the name torch or the plugin reports) and by the precision that
really ran (the audit's label). Figures are dense (sparse 2:4 figures are twice these and never used), per torch
device, each with its public source. A plugin may declare a peak (its backend's `peak_flops`) only for a device
this table lacks; such a peak is recorded and reported as "declared by plugin" with the plugin's source. For a
device in the table the table's figure is used, and a plugin that declares a lower one than the table's makes the
run invalid (a lower denominator would only inflate MFU). A declared peak below the matmul rate the run measured on
the device (a ceiling under what ran) makes it invalid too, and an MFU above 100% is invalid whatever the peak's
origin.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from types import MappingProxyType

ORIGIN_TABLE = "llmb table"
ORIGIN_DECLARED = "declared by plugin"
NVIDIA_DATASHEET = "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet"
HOPPER_WHITEPAPER = "https://resources.nvidia.com/en-us-tensor-core/gtc22-whitepaper-hopper"


@dataclass(frozen=True)
class PeakEntry:
    """One device model: a pattern on its name, names that look alike but differ, dense peaks, and the source."""

    label: str
    pattern: str
    exclude: str | None
    peaks: MappingProxyType
    source: str

    def matches(self, name: str) -> bool:
        if not re.search(self.pattern, name, re.IGNORECASE):
            return False
        return not (self.exclude and re.search(self.exclude, name, re.IGNORECASE))


def _entry(label: str, pattern: str, exclude: str | None, peaks: dict[str, float], source: str) -> PeakEntry:
    return PeakEntry(label, pattern, exclude, MappingProxyType(peaks), source)


TABLE: tuple[PeakEntry, ...] = (
    # Torch names: "NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe", "NVIDIA A100-PCIE-40GB" (same rates).
    _entry(
        "NVIDIA A100",
        r"\bA100\b",
        None,
        {"FP32": 19.5e12, "TF32": 156e12, "FP16": 312e12, "BF16": 312e12},
        "NVIDIA A100 datasheet: FP32 19.5, TF32 156, BF16/FP16 312 TFLOPS dense "
        "(https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
        "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf)",
    ),
    # Torch name: "NVIDIA H100 80GB HBM3" (the SXM part). H100 NVL has other figures: excluded.
    _entry(
        "NVIDIA H100 SXM",
        r"\bH100\b.*\b(SXM\d*|HBM3)\b",
        r"\b(PCIe|NVL)\b",
        {"FP32": 66.9e12, "TF32": 494.7e12, "FP16": 989.4e12, "BF16": 989.4e12},
        f"NVIDIA Hopper whitepaper dense rates 66.9 / 494.7 / 989.4 TFLOPS ({HOPPER_WHITEPAPER}); "
        f"datasheet 67 / 989* / 1,979* with sparsity ({NVIDIA_DATASHEET})",
    ),
    _entry(
        "NVIDIA H100 PCIe",
        r"\bH100\b.*\bPCIe\b",
        r"\bNVL\b",
        {"FP32": 51.2e12, "TF32": 378e12, "FP16": 756e12, "BF16": 756e12},
        f"NVIDIA Hopper whitepaper dense rates 51.2 / 378 / 756 TFLOPS ({HOPPER_WHITEPAPER})",
    ),
    # Torch name: "NVIDIA H200": the H100 SXM's GH100 silicon and clocks with more memory. H200 NVL excluded.
    _entry(
        "NVIDIA H200",
        r"\bH200\b",
        r"\bNVL\b",
        {"FP32": 66.9e12, "TF32": 494.7e12, "FP16": 989.4e12, "BF16": 989.4e12},
        "NVIDIA H200 datasheet: FP32 67, TF32 989*, BF16/FP16 1,979* TFLOPS (* with sparsity; dense is half) "
        "(https://www.nvidia.com/en-us/data-center/h200/)",
    ),
    # Torch name: "NVIDIA B200". GB200 runs at other clocks and does not match.
    _entry(
        "NVIDIA B200",
        r"\bB200\b",
        None,
        {"FP32": 80e12, "TF32": 1100e12, "FP16": 2250e12, "BF16": 2250e12},
        "NVIDIA Blackwell datasheet: FP32 80, TF32 2.2 P*, BF16/FP16 4.5 P* FLOPS (* with sparsity; dense is half) "
        "(https://resources.nvidia.com/en-us-blackwell-architecture/datasheet)",
    ),
    # Each MI250X GCD is its own torch device: the package's figures halved. No TF32 rate. A name that also says
    # MI250 (rocm-smi's "MI250X / MI250") is ambiguous (MI250 is slower): no peak.
    _entry(
        "AMD Instinct MI250X (per GCD)",
        r"\bMI250X\b",
        r"\bMI250\b",
        {"FP32": 47.85e12, "FP16": 191.5e12, "BF16": 191.5e12},
        "AMD MI250X brochure: peak FP32 matrix 95.7, FP16/BF16 383.0 TFLOPS per package of 2 GCDs "
        "(https://www.amd.com/content/dam/amd/en/documents/instinct-business-docs/product-briefs/"
        "instinct-mi250x-brochure.pdf)",
    ),
    _entry(
        "AMD Instinct MI300X",
        r"\bMI300X\b",
        None,
        {"FP32": 163.4e12, "TF32": 653.7e12, "FP16": 1307.4e12, "BF16": 1307.4e12},
        "AMD MI300X data sheet: peak FP32 matrix 163.4, TF32 653.7, FP16/BF16 1,307.4 TFLOPS dense "
        "(https://www.amd.com/content/dam/amd/en/documents/instinct-tech-docs/data-sheets/"
        "amd-instinct-mi300x-data-sheet.pdf)",
    ),
    # PJRT device kinds. Google publishes no FP32 peak (FP32 matmuls are multi-pass BF16).
    # "TPU v4 lite" (v4i, an inference chip) has other figures: excluded.
    _entry("Google TPU v4", r"^TPU v4\b", r"\blite\b", {"BF16": 275e12}, "https://cloud.google.com/tpu/docs/v4"),
    _entry("Google TPU v5e", r"^TPU v5(e| lite)\b", None, {"BF16": 197e12}, "https://cloud.google.com/tpu/docs/v5e"),
    _entry("Google TPU v5p", r"^TPU v5p?$", None, {"BF16": 459e12}, "https://cloud.google.com/tpu/docs/v5p"),
)


def match(device_name: str, table: tuple[PeakEntry, ...] = TABLE) -> PeakEntry | None:
    """The table entry for a device name; None when none or more than one matches (never guess)."""
    found = [entry for entry in table if entry.matches(device_name)]
    return found[0] if len(found) == 1 else None


@dataclass(frozen=True)
class PeakChoice:
    """The peak a run's MFU uses, where it comes from, and what is wrong with what the plugin declared."""

    flops: float | None
    source: str | None
    origin: str | None
    problems: tuple[str, ...] = ()
    declared: float | None = None

    def to_dict(self) -> dict:
        return {"flops": self.flops, "source": self.source, "origin": self.origin, "declared_flops": self.declared}


def matches(device_name: str, table: tuple[PeakEntry, ...] = TABLE) -> list[PeakEntry]:
    """Every table entry whose pattern the device name matches."""
    return [entry for entry in table if entry.matches(device_name)]


def hidden_characters(device_name: str) -> list[str]:
    """The characters of a device name that a reader cannot tell apart from plain ASCII or cannot see at all (a
    Cyrillic or Greek look-alike, a fullwidth letter, a zero-width space, a control character), each as
    "U+041D CYRILLIC CAPITAL LETTER EN at 7". Vendors' device names are printable ASCII; a name spelt otherwise can
    miss every row of the table while it reads, in every report, as a device the table has."""
    return [
        f"U+{ord(char):04X} {unicodedata.name(char, 'unnamed')} at {index}"
        for index, char in enumerate(device_name)
        if not (char.isascii() and char.isprintable())
    ]


def below_measured(device_name: str, precision: str, declared: float | None, measured: float | None) -> list[str]:
    """A declared peak is a ceiling: one below the dense matmul rate the device's own GEMMs reached in the same run
    (llmb.run.roofline, synchronised, median of repeats) is not the device's peak, whatever its source says."""
    if declared is None or not measured or not declared < measured:
        return []
    return [
        f"peak: the plugin declared {declared:.4g} FLOP/s for {device_name} {precision}, below the {measured:.4g} "
        "FLOP/s its matmuls reached in this run (llmb's roofline): a peak is a ceiling, not a figure under what ran"
    ]


def choose(
    device_name: str,
    precision: str,
    declared: float | None = None,
    declared_source: str | None = None,
    measured: float | None = None,
) -> PeakChoice:
    """The peak for a device and the precision that ran: llmb's table first, a plugin's declaration otherwise.

    A name that matches more than one row is never resolved, least of all by the plugin's declaration: the run has
    no peak and is invalid, naming the rows (a plugin could otherwise pick its name so that its own low figure is
    used). A declared peak below any row the name matches is invalid too. A name that matches no row takes the
    plugin's declaration only where it is spelt in printable ASCII (hidden_characters): a look-alike or invisible
    character would let a device the table has read as itself while its declared low peak is used. A declaration
    that is used and lies below `measured` (the matmul rate the run measured on the device at this precision) makes
    the run invalid (below_measured); the figure stays as declared, so the reports show what the plugin said."""
    declared = float(declared) if declared else None
    found = matches(device_name)
    problems = []
    for row in found:
        known = row.peaks.get(precision)
        if declared is not None and known is not None and declared < known:
            problems.append(
                f"peak: the plugin declared {declared:.4g} FLOP/s for {device_name} {precision}, below llmb's "
                f"table entry {known:.4g} ({row.label})"
            )
    if len(found) > 1:
        rows = ", ".join(row.label for row in found)
        problems.append(f"peak: the device name {device_name!r} matches {len(found)} rows of llmb's peak table "
                        f"({rows}): ambiguous, so no peak is used")  # fmt: skip
        return PeakChoice(None, None, None, tuple(problems), declared)
    if found:
        entry = found[0]
        known = entry.peaks.get(precision)
        if known is None:
            # The table knows the device and has no rate for this precision on purpose (MI250X has no TF32).
            return PeakChoice(None, None, None, tuple(problems), declared)
        return PeakChoice(known, entry.source, ORIGIN_TABLE, tuple(problems), declared)
    if declared is None:
        return PeakChoice(None, None, None)
    hidden = hidden_characters(device_name)
    if hidden:
        problem = (
            f"peak: the device name {device_name!r} matches no row of llmb's peak table and holds characters that "
            f"are not printable ASCII ({'; '.join(hidden[:3])}{'; ...' if len(hidden) > 3 else ''}): the plugin's "
            "declared peak is not used for it"
        )
        return PeakChoice(None, None, None, (problem,), declared)
    if not (declared_source or "").strip():
        return PeakChoice(None, None, None, (), declared)  # no source, no MFU: nobody could check it
    problems = below_measured(device_name, precision, declared, measured)
    return PeakChoice(declared, declared_source, ORIGIN_DECLARED, tuple(problems), declared)


def mfu_problems(mfu: float | None) -> list[str]:
    """An MFU above 100% is not a measurement: the peak or the time is wrong."""
    if mfu is not None and mfu > 1.0:
        return [f"MFU {mfu:.1%} is above 100%: the peak (or the time) is wrong"]
    return []


def _peak_of(record) -> dict:
    """A record's peak, as a dict, from a typed record (llmb.records.Result) or its JSON form."""
    peak = record.get("peak") if isinstance(record, dict) else getattr(record, "peak", None)
    if peak is not None and hasattr(peak, "to_dict"):
        peak = peak.to_dict()
    return peak if isinstance(peak, dict) else {}


def peak_note(record: object) -> str:
    """How a record's MFU peak is described wherever the MFU is shown: its origin and source ("" when no peak)."""
    peak = _peak_of(record)
    if not peak.get("flops"):
        return ""
    origin = peak.get("origin") or "of unknown origin"
    return f"peak {peak['flops'] / 1e12:.4g} TFLOP/s, {origin}: {peak.get('source')}"


def declared(record: object) -> bool:
    """Whether a record's MFU is against a peak the plugin declared (reports mark it)."""
    return _peak_of(record).get("origin") == ORIGIN_DECLARED
