"""The numeric formats and the rules' lowest-bit principle, torch-free: what reads a record's audit (verify, the
report) ranks formats without importing torch. llmb.audit.precision maps torch's dtypes through the same names.

Formats are ranked by mantissa bits, most first: FP32 (24) > TF32 (11) > FP16 (11, narrow range) > BF16 (8) > FP8.
"""

from __future__ import annotations

from types import MappingProxyType

# Lowest format last. FP8 is not a benchmark precision: a run that shows it cannot be labelled with any of the four.
RANK = MappingProxyType({"FP32": 0, "TF32": 1, "FP16": 2, "BF16": 3, "FP8": 4})
# The format of each floating dtype, by torch's name for it (an audit records dtypes by these names).
DTYPE_NAME_FORMAT = MappingProxyType(
    {
        "float64": "FP32",
        "float32": "FP32",
        "float16": "FP16",
        "bfloat16": "BF16",
        **dict.fromkeys(("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"), "FP8"),
    }
)


def lowest(formats: list[str | None]) -> str:
    """The lowest-bit format among the given ones (FP32 if none)."""
    present = [f for f in formats if f]
    return max(present, key=RANK.__getitem__) if present else "FP32"
