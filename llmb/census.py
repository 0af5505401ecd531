"""The dtype census: which dtypes the model's operators really produce in one forward pass.

Parameter and gradient dtypes do not show a format that exists only inside a GEMM (torchao's float8 casts its
inputs on the fly; the parameters stay FP32 or BF16). Every operator's output dtype is counted under a dispatch mode,
so a float8 tensor anywhere in the forward pass is evidence the precision audit cannot miss.
"""

from __future__ import annotations

from collections import Counter

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from llmb import precision

# Wrappers whose inner module runs the same operators eagerly: torch.compile's, Thunder's, DDP's. A compiled graph
# hides its operators from a dispatch mode, so the census runs the module it was made from.
_INNER = ("_orig_mod", "_model", "module")


class _Census(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor):
                self.counts[str(leaf.dtype).replace("torch.", "")] += 1
        return out


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
    census = _Census()
    autocast = torch.autocast(batch.device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None)
    with torch.no_grad(), autocast, census:
        eager_module(model)(batch)
    return dict(sorted(census.counts.items()))


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
