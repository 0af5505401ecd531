"""A dispatch-level recorder: the dtypes that matmul, linear and attention operators really receive in a step (and,
for the dtype census of llmb.audit.census, the dtypes every operator returns).

The precision audit's other evidence is about state (tensor dtypes at rest, backend switches, one probe matmul);
this is about what ran. A `TorchDispatchMode` sits below autograd and autocast, so it sees each aten operator with
the tensors it is really given: a Linear that casts its FP32 inputs to BF16, an `autocast(bf16)` wrapped around
forward by a plugin, or SDPA fed FP16 all show here at the model's own shapes. Operators outside the aten and
prims namespaces (a plugin's own kernels) are listed as unknown, since nothing tells what precision they compute
in. A kernel overridden *under* the dispatcher (`torch.library` on aten::mm's CPU key) is not visible here; the
identity guard (llmb.audit.guard) catches that by comparing the dispatcher's table.

Compiled graphs whose kernels never reach the dispatcher (fused Triton/C++ kernels, CUDA graph replays) record
fewer operators or none: the record says how many matmul-family calls it saw, and zero is flagged as opaque.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from llmb.audit.precision import DTYPE_FORMAT, lowest

# Operators whose input dtypes decide the numeric format of the model's matmuls (aten names, any overload).
MATMUL_OPS = frozenset(
    {
        "mm",
        "addmm",
        "bmm",
        "baddbmm",
        "addbmm",
        "matmul",
        "linear",
        "mv",
        "addmv",
        "dot",
        "vdot",
        "_addmm_activation",
        "_scaled_mm",
        "_int_mm",
        "convolution",
        "_convolution",
        "cudnn_convolution",
    }
)
# Known namespaces: torch's own operators. Anything else ran a kernel llmb cannot characterise.
KNOWN_NAMESPACES = frozenset({"aten", "prims", "_c10d_functional", "c10d", "profiler", "_dtensor", "inductor"})


def _is_matmul_family(name: str) -> bool:
    return name in MATMUL_OPS or "scaled_dot_product" in name or "attention" in name or name.endswith("_mm")


@dataclass
class DispatchRecord:
    """Per operator: how many calls saw each combination of floating input dtypes."""

    calls: dict[str, Counter] = field(default_factory=dict)
    unknown: Counter = field(default_factory=Counter)
    operators: int = 0

    def formats(self) -> dict[str, str]:
        """The lowest format each matmul-family operator computed in."""
        result = {}
        for op, combos in self.calls.items():
            names = [dtype for combo in combos for dtype in combo.split(",") if dtype]
            result[op] = lowest([DTYPE_FORMAT.get(getattr(torch, n, None)) for n in names])
        return result

    def effective(self) -> str | None:
        """The lowest format among all matmul-family calls (None when none were seen)."""
        formats = self.formats()
        return lowest(list(formats.values())) if formats else None

    def to_dict(self) -> dict:
        matmuls = sum(sum(c.values()) for c in self.calls.values())
        return {
            "operators": self.operators,
            "matmul_calls": matmuls,
            "calls": {op: dict(sorted(c.items())) for op, c in sorted(self.calls.items())},
            "formats": self.formats(),
            "effective": self.effective(),
            "unknown_operators": dict(sorted(self.unknown.items())),
            "opaque": matmuls == 0,
        }


def _float_dtypes(args, kwargs) -> str:
    seen: list[str] = []
    for value in (*args, *kwargs.values()):
        items = value if isinstance(value, (list, tuple)) else (value,)
        for item in items:
            if isinstance(item, torch.Tensor) and item.is_floating_point():
                name = str(item.dtype).removeprefix("torch.")
                if name not in seen:
                    seen.append(name)
    return ",".join(seen)


class DtypeRecorder(TorchDispatchMode):
    """Records matmul-family operators and their input dtypes; every operator runs unchanged. With `outputs`, it
    also counts the dtype of every tensor each operator returns (the dtype census, llmb.audit.census): off by default,
    since the window audit's recorder runs inside a measured step."""

    def __init__(self, outputs: bool = False) -> None:
        super().__init__()
        self.record = DispatchRecord()
        self.outputs: Counter[str] | None = Counter() if outputs else None

    def __torch_dispatch__(
        self,
        func: torch._ops.OpOverload,
        types: tuple[type, ...],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        self.record.operators += 1
        namespace = getattr(func, "namespace", "aten")
        packet = func._schema.name.split("::")[-1] if hasattr(func, "_schema") else str(func)
        if namespace not in KNOWN_NAMESPACES:
            self.record.unknown[f"{namespace}::{packet}"] += 1
        elif _is_matmul_family(packet):
            self.record.calls.setdefault(f"aten.{packet}", Counter())[_float_dtypes(args, kwargs)] += 1
        out = func(*args, **kwargs)
        if self.outputs is not None:
            for leaf in tree_leaves(out):
                if isinstance(leaf, torch.Tensor):
                    self.outputs[str(leaf.dtype).removeprefix("torch.")] += 1
        return out
