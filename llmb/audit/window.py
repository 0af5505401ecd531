"""The whole measured window audited, not one moment before it.

The precision audit runs once, after the first warmup step; a plugin can change the backend afterwards (turn on
`set_float32_matmul_precision("medium")` in `step_end`), behave differently once the window opens, drop gradients,
or patch torch late. Around and during the window this module checks:

- the backend state (llmb.audit.precision.backend_state: matmul switches, autocast, default dtype, torch function and
  dispatch modes) equals the audited state at the window's opening, after every step, and at its close;
- one untimed audit step after the last window, on the window's own batch and the model and optimizer as the
  window left them, runs under the dispatch recorder (llmb.audit.dispatch), so the formats the matmul and attention
  operators received at the model's own shapes join the precision evidence. Never inside the window: a compiled
  model that runs one step under any TorchDispatchMode runs every later step eager (dynamo skips its frames for
  good), which cost compiled runs 11-57% of their throughput when the recorder took a random step of the window;
- at the close, every parameter holds a non-zero gradient from the last step, and every parameter changed over the
  window (or, for a 16-bit parameter too coarse to hold an lr-sized update, its AdamW state did): the vectors
  compared element by element with a copy, the others by digest;
- the identity guard (llmb.audit.guard) after the window.

Each failure becomes an invalid reason naming "window" and what happened. Inside the timed window the checks cost
a handful of attribute reads between steps; the reductions at each edge and the audit step lie outside it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from llmb.audit import evidence, guard, precision
from llmb.audit.dispatch import DtypeRecorder

HALF_DTYPES = (torch.float16, torch.bfloat16)


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (FSDP), else the tensor."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def parameter_digests(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, tuple]:
    """Per parameter name: the float64 sum and sum of squares of the parameter and of its AdamW first moment (None
    before the first step), by llmb.audit.evidence.digest. float64, because an AdamW update of lr = 1e-5 on a
    weight near 1 (a norm's) is lost in an FP32 sum, and the sum of squares, because the signs of first updates can
    cancel."""
    named = list(model.named_parameters())
    params = evidence.as_list(evidence.digest([p for _, p in named])) if named else []
    moments = [optimizer.state.get(p, {}).get("exp_avg") for _, p in named]
    present = [m for m in moments if isinstance(m, torch.Tensor)]
    moment_rows = iter(evidence.as_list(evidence.digest(present)) if present else [])
    return {
        name: (tuple(row), tuple(next(moment_rows)) if isinstance(moment, torch.Tensor) else None)
        for (name, _), row, moment in zip(named, params, moments, strict=True)
    }


def vector_copies(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Host copies of the vector parameters (norm weights), by name, to compare element by element at the window's
    close: a norm weight starts as a vector of ones, and updates of opposite signs can cancel exactly in any sum of
    it (seen on XLA: a 2-step window whose norm.weight digest came back unchanged). Matrices start random, where no
    such cancellation happens; the official shape's vectors are 25 x 3,200 values, and nothing stays on the device."""
    return {name: _local(p.detach()).to("cpu", copy=True) for name, p in model.named_parameters() if p.ndim < 2}


def equal_to(model: torch.nn.Module, copies: dict[str, torch.Tensor]) -> dict[str, bool]:
    """Per copied parameter: whether it still equals its copy, element by element."""
    return {
        name: torch.equal(_local(p.detach()).cpu(), copies[name])
        for name, p in model.named_parameters()
        if name in copies
    }


def unchanged_parameters(
    before: dict[str, tuple],
    after: dict[str, tuple],
    dtypes: dict[str, torch.dtype],
    whole: dict[str, bool] | None = None,
) -> list:
    """Parameters that did not change over the window (a 16-bit one passes if its AdamW state moved). `whole` says,
    for the parameters compared element by element, whether they are unchanged; the digests decide for the rest."""
    whole = whole or {}
    stuck = []
    for name, (param, moment) in after.items():
        old_param, old_moment = before.get(name, (None, None))
        if not whole.get(name, param == old_param):
            continue
        if dtypes.get(name) in HALF_DTYPES and moment is not None and moment != old_moment:
            continue
        stuck.append(name)
    return stuck


def gradient_problems(model: torch.nn.Module) -> list[str]:
    """Parameters without a gradient, or with an all-zero one, after the last step."""
    missing, zero = [], []
    for name, p in model.named_parameters():
        if p.grad is None:
            missing.append(name)
        # max(), not amax(): amax's default dim=() reduces nothing on XLA (torch 2.9), leaving a tensor.
        elif _local(p.grad).numel() and not bool(_local(p.grad).detach().abs().max() > 0):
            zero.append(name)
    found = []
    if missing:
        found.append(f"window: {len(missing)} parameters received no gradient (first: {missing[0]})")
    if zero:
        found.append(f"window: {len(zero)} parameters received an all-zero gradient (first: {zero[0]})")
    return found


class WindowAudit:
    """One run's window checks; `problems` collects the invalid reasons, `record()` what goes in the result."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        device_type: str,
        audited_state: tuple,
        steps: int,
    ) -> None:
        self.model, self.optimizer, self.device_type = model, optimizer, device_type
        self.audited_state = audited_state
        self.problems: list[str] = []
        self.steps_checked = 0
        self.window_steps = steps
        self.recorder: DtypeRecorder | None = None
        self.audit_rows: int | None = None  # where the audit step ran fewer rows than the window's
        self._before: dict[str, tuple] | None = None
        self._vectors: dict[str, torch.Tensor] = {}
        self._step = 0

    def _check_state(self, where: str) -> None:
        changes = precision.state_changes(self.audited_state, precision.backend_state(self.device_type))
        if changes and not any(p.startswith("window: backend state changed") for p in self.problems):
            self.problems.append(f"window: backend state changed since the audit ({where}): {'; '.join(changes)}")

    def open(self) -> None:
        """At the opening of the window (before its clock starts)."""
        self._check_state("at the window's opening")
        self._step = 0
        if self._before is None:
            self._before = parameter_digests(self.model, self.optimizer)
            self._vectors = vector_copies(self.model)

    def after_step(self) -> None:
        """After each step of the window: a handful of attribute reads."""
        self.steps_checked += 1
        self._step += 1
        self._check_state(f"after step {self._step} of the window")

    def audit_step(self, step: Callable[[], object], rows: int | None = None) -> None:
        """One untimed step (``step()``, the harness's own) under the dispatch recorder, after the last window
        closed: what the operators received, at the cost of one eager step that no clock sees. `rows`: how many of
        the window's rows it steps, where fewer than the window's (llmb.run.audit_step). The recorder is kept only
        from a step that finished."""
        recorder = DtypeRecorder()
        with recorder:
            step()
        self.recorder, self.audit_rows = recorder, rows
        self._check_state("after the audit step")

    def close(self) -> None:
        """At the close of the last window (after its clock stopped)."""
        self._check_state("at the window's close")
        self.problems += gradient_problems(self.model)
        if self._before is not None:
            after = parameter_digests(self.model, self.optimizer)
            dtypes = {name: p.dtype for name, p in self.model.named_parameters()}
            stuck = unchanged_parameters(self._before, after, dtypes, equal_to(self.model, self._vectors))
            self._vectors = {}
            if stuck:
                self.problems.append(f"window: {len(stuck)} parameters did not change (first: {stuck[0]})")
        self.problems += guard.problems("after the window")
        # Again at the close: a plugin's hook may change the optimizer instance after post-processing was judged.
        self.problems += [f"window: {p}" for p in guard.optimizer_problems(self.optimizer)]

    def dispatch(self) -> dict | None:
        return self.recorder.record.to_dict() if self.recorder is not None else None

    def record(self) -> dict:
        # recorded_step: the audit step's place, the one after the window's last (it is not timed).
        rows = {"audit_rows": self.audit_rows} if self.audit_rows is not None else {}
        return {"steps_checked": self.steps_checked, "recorded_step": self.window_steps + 1, **rows}
