"""Activation checkpointing that plugins may apply to the model instance: two kinds, named apart.

- Layer-wise: whole decoder layers are recomputed in the backward pass ("selective-layers": every other layer,
  torchtitan's layer-selective mode with frequency 2; "full": every layer).
- Operator-wise ("selective-ops"): every decoder layer is checkpointed with torch's selective-checkpoint policy,
  which keeps the outputs of matmuls and attention (costly to recompute) and recomputes the cheap elementwise ops
  (norms, rotary, SiLU, products) in the backward pass.

The parameters stay the same objects, so the optimizer built before post-processing still holds them.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

if TYPE_CHECKING:
    from torch.utils.checkpoint import SelectiveCheckpointContext

MODES = ("none", "selective-layers", "selective-ops", "full")
HELP = (
    "recompute activations in the backward pass: selective-layers = every other decoder layer whole, full = every "
    "layer whole, selective-ops = every layer, keeping matmul and attention outputs and recomputing elementwise ops"
)


def _ops(*names: str) -> set:
    """The aten overloads this torch has among the named ones (attention kernels differ by version and device)."""
    found = set()
    for name in names:
        packet = getattr(torch.ops.aten, name, None)
        if packet is not None and hasattr(packet, "default"):
            found.add(packet.default)
    return found


# Outputs kept by the per-operator policy: the GEMMs (the bulk of the FLOPs) and attention kernels; FP8 GEMMs too.
SAVED_OPS = _ops(
    "mm",
    "addmm",
    "bmm",
    "baddbmm",
    "_scaled_mm",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
)


def save_matmuls_policy(
    ctx: SelectiveCheckpointContext, op: torch._ops.OpOverload, *args: Any, **kwargs: Any
) -> CheckpointPolicy:
    """torch's selective-checkpoint policy: save what is costly to recompute, recompute the rest."""
    return CheckpointPolicy.MUST_SAVE if op in SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


class CheckpointedLayer(nn.Module):
    """A decoder layer whose activations are recomputed in the backward pass (all of them, or per the policy)."""

    def __init__(self, layer: nn.Module, per_op: bool = False) -> None:
        super().__init__()
        # torch's checkpoint_wrapper's attribute name: `llmb check-plugin` drops this segment from parameter names.
        self._checkpoint_wrapped_module = layer
        self.per_op = per_op

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self.per_op:
            context_fn = functools.partial(create_selective_checkpoint_contexts, save_matmuls_policy)
            return checkpoint(
                self._checkpoint_wrapped_module, *args, use_reentrant=False, context_fn=context_fn, **kwargs
            )
        return checkpoint(self._checkpoint_wrapped_module, *args, use_reentrant=False, **kwargs)


def checkpointed_layers(mode: str, count: int) -> list[int]:
    """Which decoder layers to wrap: every other one starting at 0 (selective-layers), all (full, selective-ops)."""
    if mode not in MODES:
        raise ValueError(f"unknown activation checkpointing mode {mode!r} (choose from {', '.join(MODES)})")
    if mode in ("full", "selective-ops"):
        return list(range(count))
    if mode == "selective-layers":
        return list(range(0, count, 2))
    return []


def apply_activation_checkpointing(model: nn.Module, mode: str) -> nn.Module:
    """Wrap the model's decoder layers in place for the mode; returns the same model."""
    for index in checkpointed_layers(mode, len(model.layers)):
        model.layers[index] = CheckpointedLayer(model.layers[index], per_op=mode == "selective-ops")
    return model
