"""The dtype census: which dtypes the model's operators really produce in one forward pass.

Parameter and gradient dtypes do not show a format that exists only inside a GEMM (torchao's float8 casts its
inputs on the fly; the parameters stay FP32 or BF16). Every operator's output dtype is counted under a dispatch mode,
so a float8 tensor anywhere in the forward pass is evidence the precision audit cannot miss. The counting is the
dispatch audit's recorder (llmb.audit.dispatch), told to count outputs too.
"""

from __future__ import annotations

import torch
from torch import nn

from llmb.audit import precision
from llmb.audit.dispatch import DtypeRecorder

# Wrappers whose inner module runs the same operators eagerly: torch.compile's, Thunder's, DDP's. A compiled graph
# hides its operators from a dispatch mode, so the census runs the module it was made from.
_INNER = ("_orig_mod", "_model", "module")


def eager_module(model: nn.Module) -> nn.Module:
    """The module under torch.compile's, Thunder's and DDP's wrappers."""
    while True:
        inner = next(
            (getattr(model, name) for name in _INNER if isinstance(getattr(model, name, None), nn.Module)), None
        )
        if inner is None:
            return model
        model = inner


def forward_dtypes(model: nn.Module, batch: torch.Tensor, autocast_dtype: torch.dtype | None = None) -> dict[str, int]:
    """Output dtypes of every operator in one forward pass of the eager model (no gradients kept)."""
    recorder = DtypeRecorder(outputs=True)
    autocast = torch.autocast(batch.device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None)
    with torch.no_grad(), autocast, recorder:
        eager_module(model)(batch)
    return dict(sorted(recorder.outputs.items()))


def add_evidence(audit: dict, counts: dict[str, int]) -> dict:
    """The audit with the census as one more piece of evidence: the lowest format any operator produced."""
    formats = [precision.DTYPE_FORMAT.get(getattr(torch, name, None)) for name in counts]
    found = precision.lowest(formats)
    evidence = dict(audit.get("evidence", {}))
    evidence["operator_outputs"] = found
    return {
        **audit,
        "effective": precision.lowest([audit["effective"], found]),
        "operator_dtypes": counts,
        "evidence": evidence,
    }
