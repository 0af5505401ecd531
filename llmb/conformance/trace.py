"""What check-plugin compares: the trace of one prepared model (a forward pass, K harness steps, its optimizer's
record), taken in the worker, and its transport to the judge as tensors and plain data checked as untrusted."""

from __future__ import annotations

import io
from dataclasses import dataclass, fields

import torch

from llmb.api.errors import LlmbError, describe
from llmb.audit import guard, precision
from llmb.audit.dispatch import DtypeRecorder
from llmb.model import count_parameters
from llmb.records import DeviceRef, PluginRef
from llmb.run.runner import Session, audit_session
from llmb.training.loop import optimizer_problems

WRAPPER_SEGMENTS = frozenset(
    {"_orig_mod", "_checkpoint_wrapped_module", "_fsdp_wrapped_module", "_offload_wrapped_module", "module"}
)


def normalise_name(name: str) -> str:
    """A parameter name without the segments that wrappers insert (torch.compile, checkpointing, DDP, FSDP)."""
    return ".".join(part for part in name.split(".") if part not in WRAPPER_SEGMENTS)


@dataclass
class Trace:
    """What one prepared model did: a forward pass, K harness steps, and its optimizer's record."""

    count: int
    names: list[str]
    shapes: dict[str, tuple[int, ...]]
    loss: float
    logits: torch.Tensor | None
    losses: list[float]
    gradients: dict[str, torch.Tensor | None]
    initial: dict[str, torch.Tensor]
    trained: dict[str, torch.Tensor]
    master_fp32: bool
    audit: dict
    optimizer_problems: list[str]
    optimizer_steps: int
    harness_steps: int
    identity_problems: list[str]


def _host(tensor: torch.Tensor) -> torch.Tensor:
    """A detached CPU copy (for a lazy device such as XLA this also runs the pending graph)."""
    return tensor.detach().to("cpu", copy=True)


def _named_parameters(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    return [(normalise_name(name), p) for name, p in model.named_parameters()]


def trace(session: Session, steps: int) -> Trace:
    """Run the forward pass and K steps of the harness's loop on a prepared session, copying what is compared."""
    model, trainer = session.model, session.trainer
    named = _named_parameters(model)
    initial = {name: _host(p) for name, p in named}
    with trainer._autocast():  # the run's own autocast, so the forward is the one the loop runs
        output = model(trainer.batch, labels=trainer.batch)
    # A forward that returns no logits fails forward-logits below; it must not crash the check.
    loss, logits = output if isinstance(output, tuple) and len(output) == 2 else (output, None)
    loss, logits = float(loss.detach()), (_host(logits) if isinstance(logits, torch.Tensor) else None)
    recorder = DtypeRecorder()  # what the matmuls of this first step really computed in, at this shape
    with recorder:
        losses = [float(trainer.step())]
    # After the first step the gradients are still there (zero_grad comes at the start of the next step), and a
    # GradScaler has unscaled them in place before AdamW ran.
    gradients = {name: (_host(p.grad) if p.grad is not None else None) for name, p in named}
    audit = precision.with_dispatch(audit_session(session), recorder.record.to_dict())
    losses += [float(trainer.step()) for _ in range(steps - 1)]
    session.backend.synchronize(session.device)
    problems = [p.removeprefix("optimizer: ") for p in session.invalid if p.startswith("optimizer: ")]
    # Again after the steps (a forward may change it): a step set on the instance is one of them (guard's).
    problems += optimizer_problems(session.optimizer, model)
    identity = [p for p in session.invalid if p.startswith("identity ")] + guard.problems("after the steps")
    return Trace(
        count=count_parameters(model),
        names=[name for name, _ in named],
        shapes={name: tuple(p.shape) for name, p in named},
        loss=loss,
        logits=logits,
        losses=losses,
        gradients=gradients,
        initial=initial,
        trained={name: _host(p) for name, p in named},
        master_fp32=all(p.dtype in (torch.float32, torch.float64) for _, p in named),  # what ran, not the recipe
        audit=audit,
        optimizer_problems=list(dict.fromkeys(problems)),
        optimizer_steps=trainer.optimizer_steps,
        harness_steps=trainer.harness_steps,
        identity_problems=list(dict.fromkeys(identity)),
    )


def pack(found: dict) -> bytes:
    """A candidate as torch.save bytes: tensors and plain data only, so the judge loads it with weights_only (the
    plugin's process cannot make it run code)."""
    buffer = io.BytesIO()
    trace_data = {f.name: getattr(found["trace"], f.name) for f in fields(Trace)}
    plain = {"device": found["device"].to_dict(), "plugin": found["plugin"].to_dict(), "trace": trace_data}
    torch.save({**found, **plain}, buffer)
    return buffer.getvalue()


_TRACE_TYPES = {  # field -> what the judge accepts from the plugin's process
    "count": int,
    "names": list,
    "shapes": dict,
    "loss": float,
    "logits": (torch.Tensor, type(None)),
    "losses": list,
    "gradients": dict,
    "initial": dict,
    "trained": dict,
    "master_fp32": bool,
    "audit": dict,
    "optimizer_problems": list,
    "optimizer_steps": int,
    "harness_steps": int,
    "identity_problems": list,
}


def unpack(data: object, requested: str) -> dict:
    """The worker's candidate, checked as untrusted data; a one-line error if it is not a candidate's trace."""
    try:
        if not isinstance(data, bytes):
            raise TypeError(f"{type(data).__name__}, not bytes")
        found = torch.load(io.BytesIO(data), weights_only=True)
        raw = found["trace"]
        for name, kind in _TRACE_TYPES.items():
            if not isinstance(raw[name], kind):
                raise TypeError(f"trace.{name} is {type(raw[name]).__name__}")
        tensors = [*raw["initial"].values(), *raw["trained"].values()]
        tensors += [g for g in raw["gradients"].values() if g is not None]
        if not all(isinstance(t, torch.Tensor) for t in tensors):
            raise TypeError("a parameter or gradient is not a tensor")
        if not all(isinstance(x, float) for x in raw["losses"]) or not isinstance(raw["audit"].get("effective"), str):
            raise TypeError("losses or audit malformed")
        if requested not in ("ALL", found["precision"]) or found["precision"] not in precision.PRECISIONS:
            raise ValueError(f"a trace for {found['precision']!r} where {requested} was requested")
        found["trace"] = Trace(**{name: raw[name] for name in _TRACE_TYPES})
        found["plugin"] = PluginRef.from_dict(found["plugin"])
        found["device"] = DeviceRef.from_dict(found["device"])
        found["mode"] = str(found["mode"])
    except Exception as exc:
        raise LlmbError(f"the plugin's process sent no valid trace ({describe(exc)[:200]})") from None
    return found
