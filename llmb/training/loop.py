"""The fixed training loop: synthetic data, torch.optim.AdamW, and a device-synchronised timer.

The harness owns this loop. Plugins change the model instance and the backend, never what happens here.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from llmb.api.backend import Backend
from llmb.api.errors import PluginError
from llmb.api.protocols import WindowJudge
from llmb.audit import evidence, guard
from llmb.audit.precision import Recipe
from llmb.records import energy, median_index
from llmb.registry.state import with_state
from llmb.spec.presets import ADAMW_HYPERPARAMETERS

# The benchmark's optimizer: torch.optim.AdamW with llmb.spec.presets.ADAMW_HYPERPARAMETERS (imported above).
# What a plugin may choose: AdamW's implementation, never its mathematics.
OPTIMIZER_OPTIONS = ("foreach", "fused", "capturable")


def parameter_groups(model: torch.nn.Module) -> list[dict]:
    """Weight decay for matrices, none for 1-D parameters (the norm weights)."""
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    return [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(model: torch.nn.Module, options: dict | None) -> torch.optim.AdamW:
    """torch.optim.AdamW with the fixed hyperparameters; plugin options may only pick the implementation."""
    options = dict(options or {})
    refused = sorted(set(options) - set(OPTIMIZER_OPTIONS))
    if refused:
        raise ValueError(
            f"optimizer options {', '.join(refused)} refused: only {', '.join(OPTIMIZER_OPTIONS)} may be set"
        )
    return torch.optim.AdamW(parameter_groups(model), **ADAMW_HYPERPARAMETERS, **options)


def optimizer_problems(optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> list[str]:
    """Why the optimizer is not the benchmark's AdamW over every model parameter (empty when it is)."""
    problems = []
    if type(optimizer) is not torch.optim.AdamW:
        problems.append(f"optimizer is {type(optimizer).__module__}.{type(optimizer).__qualname__}, not AdamW")
        return problems
    problems += guard.optimizer_problems(optimizer)
    for index, group in enumerate(optimizer.param_groups):
        expected = dict(ADAMW_HYPERPARAMETERS, weight_decay=ADAMW_HYPERPARAMETERS["weight_decay"] if index == 0 else 0)
        for key, value in expected.items():
            got = group.get(key)
            if (tuple(got) if isinstance(got, (list, tuple)) else got) != value:
                problems.append(f"optimizer {key} is {got!r}, fixed value is {value!r}")
    in_optimizer = {id(p) for group in optimizer.param_groups for p in group["params"]}
    missing = [name for name, p in model.named_parameters() if id(p) not in in_optimizer]
    if missing:
        problems.append(f"{len(missing)} model parameters are not optimised (first: {missing[0]})")
    frozen = [name for name, p in model.named_parameters() if not p.requires_grad]
    if frozen:
        problems.append(f"{len(frozen)} model parameters are frozen (first: {frozen[0]})")
    return problems


@dataclass
class Measurement:
    window_seconds: float
    step_seconds: list[float]
    method: str
    loss_first: float
    loss_last: float
    # This rank's own window, before the closing barrier (in a multi-process run window_seconds waits for all ranks).
    rank_window_seconds: float | None = None
    # The evidence of the window: the judge's challenge, every step's loss, the parameter digest at both edges.
    challenge: int | None = None
    losses: list[float] = field(default_factory=list)
    digest_start: list[list[float]] = field(default_factory=list)
    digest_end: list[list[float]] = field(default_factory=list)
    moments_end: list[list[float]] = field(default_factory=list)
    # The device's energy counter at the window's two edges in joules (llmb.records.energy), None without one.
    energy_joules: list[float] | None = None
    # The judge's key at the close and AdamW's first moments projected onto its directions (moment_seal).
    seal_key: int | None = None
    moments_projection: list[list[float]] = field(default_factory=list)


class LocalJudge:
    """The window's judge inside the run's own process (library use and tests): a fresh challenge per window and
    this process's clock. `llmb run` judges from a process that has imported no plugin (llmb.judge.cleanroom)."""

    clean = False

    def setup(self, device: str) -> None: ...

    def ready(self) -> None: ...

    def open(self, digest_start: list[list[float]]) -> int:
        return secrets.randbits(evidence.CHALLENGE_BITS)

    def close(self, answer: dict) -> int:
        return secrets.randbits(evidence.CHALLENGE_BITS)

    def seal(self, evidence: dict) -> None: ...


class Trainer:
    """One model, its optimizer and its batch, stepped by the harness's loop."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        batch: torch.Tensor,
        recipe: Recipe,
        backend: Backend,
        device: torch.device,
        barrier: Callable[[], None] | None = None,
        window_batch: Callable[[int], torch.Tensor] | None = None,
        judge: WindowJudge | None = None,
    ) -> None:
        self.model, self.optimizer, self.batch, self.recipe = model, optimizer, batch, recipe
        self.backend, self.device = backend, device
        # Bound once, before any clock runs: the backend's step_end, with this run's state where it names one.
        self.step_end = with_state(backend.step_end)
        # Asked once: a backend without device events is timed on the host with a sync after each step.
        self.has_events = _checked_event(backend, backend.new_event(device)) is not None
        self.energy = energy.Meter(backend, device)
        # In a multi-process run, every rank waits for all the others at both window edges.
        self.barrier = barrier or (lambda: None)
        # A measured window trains on the batch drawn from the judge's challenge, handed over as its clock starts.
        self.window_batch = window_batch or (lambda challenge: self.batch)
        self.judge = judge or LocalJudge()
        self.scaler = torch.amp.GradScaler(device.type) if recipe.grad_scaler else None
        self.harness_steps = 0
        self.optimizer_steps = 0
        # Counts real AdamW.step() calls, so a plugin that bypasses the harness's step shows up.
        optimizer.register_step_post_hook(self._count_step)

    def _count_step(self, optimizer, args, kwargs) -> None:
        self.optimizer_steps += 1

    def _autocast(self):
        if self.recipe.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.recipe.autocast_dtype)

    def loss_of(self, batch: torch.Tensor) -> torch.Tensor:
        """The forward's loss alone. The logits it also returns are dropped here, before the backward: a name kept
        on them (``loss, _ = model(...)``) holds batch x sequence x vocab floats through backward and AdamW, which no
        hand-written loop does (at batch 16 of the small preset, 0.5 GB more at the step's peak, and every step's
        gradient buffers placed anew around it)."""
        return self.model(batch, labels=batch)[0]

    def step(self) -> torch.Tensor:
        """One training step, all from Python: zero_grad, forward, backward, optimizer.step()."""
        self.optimizer.zero_grad(set_to_none=True)
        with self._autocast():
            loss = self.loss_of(self.batch)
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            self.scaler.step(self.optimizer)  # calls optimizer.step() unless the gradients overflowed
            self.scaler.update()
        else:
            loss.backward()
            self.optimizer.step()
        self.step_end(self.device)
        self.harness_steps += 1
        return loss.detach()

    def timed_step(self) -> tuple[torch.Tensor, float]:
        """One step between two device synchronisations: the warmup's steps, where compilers trace and compile,
        timed apart from the measured window."""
        self.backend.synchronize(self.device)
        start = time.perf_counter()
        loss = self.step()
        self.backend.synchronize(self.device)
        return loss, time.perf_counter() - start

    def measure(
        self,
        steps: int,
        on_step: Callable[[], None] | None = None,
    ) -> Measurement:
        """Time `steps` steps in one window synchronised on the device at both ends, plus per-step times.

        The judge's clock brackets the window: it hands over the challenge (the seed of the window's batch) as it
        starts, and stops on the answer, which holds every step's loss, brought to the host after the device
        synchronised: the answer cannot exist before the device has computed the last forward. The digest of the
        trained parameters (llmb.audit.evidence.digest) follows in a second message, `seal`, once the clock has
        stopped: at the small preset on one CPU thread it costs 0.3-0.7 s, which inside the window cost a 5-step window
        10-20% of its throughput. ``on_step`` runs between steps (the window audit's attribute reads); nothing wraps a
        step, since any mode pushed around one would change how a compiled model runs (llmb.audit.window)."""
        backend, device = self.backend, self.device
        pairs = steps if self.has_events else 0
        events = [(backend.new_event(device), backend.new_event(device)) for _ in range(pairs)]
        losses = []
        host_steps = []
        parameters = list(self.model.parameters())
        backend.synchronize(device)
        digest_start = evidence.as_list(evidence.digest(parameters))
        self.barrier()
        # Read at the edge, the device idle: the one read before the judge's clock starts, the other inside it.
        energy_start = self.energy.read()
        challenge = self.judge.open(digest_start)
        start = time.perf_counter()
        self.batch = self.window_batch(challenge)
        for index in range(steps):
            if events:
                events[index][0].record()
            else:
                step_start = time.perf_counter()
            losses.append(self.step())
            if events:
                events[index][1].record()
            else:
                backend.synchronize(device)
                host_steps.append(time.perf_counter() - step_start)
            if on_step:
                on_step()
        step_losses = [float(v) for v in torch.stack(losses).float().cpu().tolist()]  # waits for every forward
        backend.synchronize(device)
        end = time.perf_counter()
        energy_end = self.energy.read()
        own_window = end - start
        readings = [energy_start, energy_end] if energy_start is not None and energy_end is not None else None
        self.barrier()
        window = time.perf_counter() - start
        seal_key = self.judge.close(
            {
                "losses": step_losses,
                "worker_start": start,
                "worker_end": end,
                "worker_window_seconds": own_window,
                "energy_joules": readings,
            }
        )
        # After every clock: the digest of what the window trained, for the replay and the window audit.
        digest_end = evidence.as_list(evidence.digest(parameters))
        moments, projected = evidence.moment_seal(parameters, self.optimizer, seal_key)
        moments_end, projection = evidence.as_list(moments), evidence.as_list(projected)
        self.judge.seal(
            {
                "digest_start": digest_start,
                "digest_end": digest_end,
                "moments_end": moments_end,
                "moments_projection": projection,
            }
        )
        if events:
            step_seconds = [first.elapsed_time(last) / 1000.0 for first, last in events]
            method = "device-events"
        else:
            step_seconds, method = host_steps, "host-synchronised"
        return Measurement(
            window,
            step_seconds,
            method,
            step_losses[0],
            step_losses[-1],
            own_window,
            challenge,
            step_losses,
            digest_start,
            digest_end,
            moments_end,
            readings,
            seal_key,
            projection,
        )


def median_measurement(measurements: list[Measurement]) -> Measurement:
    """The run whose throughput is the median one (the slower middle for an even count): the headline rule."""
    return measurements[median_index([1 / m.window_seconds for m in measurements])]


EVENT_METHODS = ("record", "synchronize", "elapsed_time")


def _checked_event(backend: Backend, event: Any) -> Any:
    """The backend's first event, checked before any window: one without the methods the timer calls is the
    plugin's error naming new_event (it was an AttributeError inside the first window, naming neither)."""
    if event is not None and not all(callable(getattr(event, name, None)) for name in EVENT_METHODS):
        said = TypeError(f"returned {type(event).__name__}, not an event with {', '.join(EVENT_METHODS)} methods")
        raise PluginError(getattr(backend, "name", "?"), "new_event", said)
    return event
