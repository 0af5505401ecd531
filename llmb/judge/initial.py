"""The replay's initial model, built by the judge while the worker sets itself up.

The replay starts from the run's initial weights: LlamaModel built on the CPU from the seed, as the run builds its
own. At the official shape that build is most of the replay's fixed cost: on the H100's host the replay took 23-31 s
at batch 8 and 64 alike (16-42% of a 20-step run's wall time, benchmarks/RESULTS.md section 15), where its two FP32
steps take 1-8 s. So where the run is replayed on an accelerator, the judge builds it in a thread once the worker
says its backend is set up (`setup`; the worker builds its own model meanwhile), and the worker, its setup done, says
`ready` and waits, untimed, until the build has finished (llmb.judge.cleanroom.ReplayPreparation): the build never
shares the host with a step the run times, the warmup's included (the thread then warms torch's AdamW:
warm_optimizer). The model stays on the host in FP32, one copy (5.7 GB at the official shape), and each replay on the
accelerator takes a twin of it there, its bytes sent through a small ring of pinned staging buffers (stage), and says
what the twin's allocation and its copy each took (Placement).
"""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import asdict, dataclass

import torch

from llmb.model import LlamaModel, ModelConfig


def build(config: ModelConfig, seed: int) -> LlamaModel:
    """The run's initial weights: LlamaModel built on the CPU from the seed (llmb.run.runner.prepare does the same)."""
    torch.manual_seed(seed)
    return LlamaModel(config)


def warm_optimizer() -> None:
    """Construct an AdamW over one element: a process's first AdamW imports torch._dynamo (1.75 s on a 2-core Xeon),
    which the replay paid inside its seconds and its budget. The judge's build thread pays it beside the worker's
    setup instead, where it builds the initial model."""
    torch.optim.AdamW([torch.zeros(1, requires_grad=True)])


def tensors(model: LlamaModel) -> list[torch.Tensor]:
    """The model's parameters, then its buffers, in the order twin copies them."""
    return list(itertools.chain(model.parameters(), model.buffers()))


# The twin's bytes go to an accelerator through STAGING_BUFFERS pinned host buffers of STAGING_BYTES each (a host
# memcpy into a free one, then an asynchronous copy from it): on one H100 the official shape's 5.73 GB went across at
# 17.7 GB/s that way (0.32 s), where each tensor copied straight from pageable memory went at 4.2 GB/s (1.37 s), with
# 128 MB of pinned memory, not a second host copy of the model (benchmarks/initial_copy.py, RESULTS.md section 29).
STAGING_BYTES = 64 << 20
STAGING_BUFFERS = 2


@dataclass
class Placement:
    """What putting a twin on the replay's device took: its tensors' allocation there, then their bytes' copy (each
    until the device had finished), and the copy's route ("pinned staging" or "direct")."""

    allocate_seconds: float
    copy_seconds: float
    route: str

    def to_dict(self) -> dict:
        return asdict(self)


def empty_twin(model: LlamaModel, device: torch.device, dtype: torch.dtype) -> LlamaModel:
    """The layout of `model` on `device` in `dtype`, its parameters and buffers allocated there and unset (no host
    copy on the way): what twin fills, and benchmarks/initial_copy.py fills by other routes."""
    with torch.device("meta"):
        copy = LlamaModel(model.config).to(dtype)
    return copy.to_empty(device=device)


def twin(model: LlamaModel, device: torch.device, dtype: torch.dtype) -> tuple[LlamaModel, Placement]:
    """A copy of `model` on `device` in `dtype`, and what placing it took: no second copy on the host (5.7 GB at the
    official shape) on the way to an accelerator, where its bytes go through pinned staging buffers (stage); on the
    CPU, or where the host cannot pin memory for the device, straight from the model's."""
    began = time.perf_counter()
    copy = empty_twin(model, device, dtype)
    synchronize(device)
    allocated = time.perf_counter()
    ring = staging_ring(device)
    with torch.no_grad():
        if ring:
            stage(tensors(copy), tensors(model), ring)
        else:  # buffers too: to_empty left them unset
            for target, source in zip(tensors(copy), tensors(model), strict=True):
                target.copy_(source)
    synchronize(device)
    route = "pinned staging" if ring else "direct"
    return copy, Placement(allocated - began, time.perf_counter() - allocated, route)


def staging_ring(device: torch.device) -> list[torch.Tensor]:
    """STAGING_BUFFERS page-locked host buffers of STAGING_BYTES for copies to `device`; none for the CPU, or where
    torch cannot pin host memory for it (then the twin's copy goes direct)."""
    if device.type == "cpu":
        return []
    try:
        return [torch.empty(STAGING_BYTES, dtype=torch.uint8, pin_memory=True) for _ in range(STAGING_BUFFERS)]
    except RuntimeError:
        return []


def stage(targets: list[torch.Tensor], sources: list[torch.Tensor], ring: list[torch.Tensor]) -> None:
    """Copy each host tensor of `sources` into its accelerator tensor of `targets` through the host buffers of
    `ring` (pinned, of bytes): a host copy into a free buffer, in the target's dtype (FP32 to a 16-bit replay's,
    rounded as Tensor.to rounds), then an asynchronous copy from it, the buffer reused once the copy that read it has
    finished (an event per buffer). Returns with the last copies queued; the caller synchronises."""
    device = targets[0].device
    done: list[torch.Event | None] = [None] * len(ring)
    turn = 0
    for target, source in zip(targets, sources, strict=True):
        flat_source, flat_target = source.detach().reshape(-1), target.view(-1)
        elements = max(1, ring[0].numel() // target.element_size())
        for start in range(0, flat_source.numel(), elements):
            count = min(elements, flat_source.numel() - start)
            slot = turn % len(ring)
            if done[slot] is not None:
                done[slot].synchronize()  # the copy that read this buffer last has finished
            staging = ring[slot][: count * target.element_size()].view(target.dtype)
            staging.copy_(flat_source[start : start + count])
            flat_target[start : start + count].copy_(staging, non_blocking=True)
            done[slot] = torch.Event(device=device)
            done[slot].record()
            turn += 1


def synchronize(device: torch.device) -> None:
    """Until `device` has finished what it was given (nothing to wait for on the CPU): the judge's one device wait
    (the replay's timings, the twin's parts, benchmarks/initial_copy.py)."""
    module = getattr(torch, device.type, None)
    if device.type != "cpu" and module is not None and hasattr(module, "synchronize"):
        module.synchronize(device)


def _key(config: ModelConfig, seed: int) -> tuple:
    return (tuple(sorted(config.to_dict().items())), int(seed))


@dataclass
class Prebuilt:
    """What the record says of a prebuilt initial model: its build time in the judge, and how long the worker waited
    for it, untimed, before its warmup (both outside every window)."""

    build_seconds: float
    worker_waited_seconds: float

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Warmed:
    """What the record says of torch's AdamW warmed alone in the judge (InitialModels.warm, where no initial model is
    built beside the worker): the import's seconds, and how long the worker waited for it before its warmup."""

    seconds: float
    worker_waited_seconds: float

    def to_dict(self) -> dict:
        return asdict(self)


class InitialModels:
    """One initial model at a time, built in the background (start), waited for (wait), taken by a replay (model).
    Where none is built (a replay on the CPU), torch's AdamW alone is warmed in the background (warm).

    Builds are serialised with the replays that take them (a build seeds torch's global generator): `start` is
    called on the worker's `setup`, while no replay runs (the worker waits through each replay). `close` ends the
    preparation for good: its threads joined, none started after it."""

    def __init__(self) -> None:
        self._key: tuple | None = None
        self._model: LlamaModel | None = None
        self._thread: threading.Thread | None = None
        self._build_seconds = 0.0
        self._waited = 0.0
        self._warm: threading.Thread | None = None
        self._warmed: Warmed | None = None  # until the first replay after it says it (warmed)
        # Held while a thread starts and while `close` marks the end: the judge's thread starts them (the worker's
        # `setup`), the main thread closes.
        self._starting = threading.Lock()
        self._closed = False

    def start(self, config: ModelConfig, seed: int) -> None:
        """Build the initial model of (config, seed) in a thread, unless it is held or building already."""
        key = _key(config, seed)
        if key == self._key:
            return
        self.wait()
        with self._starting:
            if self._closed:
                return
            self._key, self._model, self._waited = key, None, 0.0
            self._thread = threading.Thread(
                target=self._build, args=(config, seed), name="llmb-initial-model", daemon=True
            )
            self._thread.start()

    def _build(self, config: ModelConfig, seed: int) -> None:
        began = time.perf_counter()
        try:
            self._model = build(config, seed)
            warm_optimizer()
        except Exception:  # none held: the replay builds the model itself, and meets the error there
            self._model = None
        self._build_seconds = time.perf_counter() - began

    def warm(self) -> None:
        """Warm torch's AdamW (warm_optimizer) in a thread, once a process: where the replay runs on the CPU nothing
        is built beside the worker, but the first AdamW's imports still need not fall inside the replay's seconds
        and budget. Called on the worker's `setup`, after the plugin has read the host; the worker waits for it at
        `ready`, before its first warmup step."""
        with self._starting:
            if self._warm is None and not self._closed:
                self._warm = threading.Thread(target=self._warm_optimizer, name="llmb-optimizer-warmup", daemon=True)
                self._warm.start()

    def _warm_optimizer(self) -> None:
        began = time.perf_counter()
        try:
            warm_optimizer()
        except Exception:  # the replay's own AdamW meets the error, if any
            return
        self._warmed = Warmed(time.perf_counter() - began, 0.0)

    def close(self) -> None:
        """No build or warm-up starts after this; the one under way (if any) is waited for. Called once the worker
        has gone, whether it finished or failed between its `setup` and its `ready`: a thread left running torch
        while the interpreter exits aborts the process (a daemon thread that wakes during finalisation is ended
        through torch's C++ frames: "terminate called without an active exception", exit 134 after the run's one
        line)."""
        with self._starting:
            self._closed = True
        self._join()

    def _join(self) -> None:
        """Until the build and the warm-up under way (if any) have both finished."""
        self.wait()
        if self._warm is not None:
            self._warm.join()

    def wait(self) -> None:
        """Until the build under way (if any) has finished."""
        if self._thread is not None:
            self._thread.join()

    def ready(self) -> float:
        """The worker's `ready`: wait for the build or warm-up under way, and count the seconds (the record says
        them)."""
        began = time.perf_counter()
        self._join()
        waited = time.perf_counter() - began
        self._waited += waited
        if self._warmed is not None:
            self._warmed.worker_waited_seconds += waited
        return waited

    def warmed(self) -> Warmed | None:
        """The warm-up's seconds and the worker's waits for it, said once (by the first replay after it); None where
        none ran here or it was said already."""
        warmed, self._warmed = self._warmed, None
        return warmed

    def model(
        self, config: ModelConfig, seed: int, device: torch.device, dtype: torch.dtype, keep: bool
    ) -> tuple[LlamaModel, Prebuilt | None, Placement | None]:
        """The initial model of (config, seed) on `device` in `dtype`, in training mode, what its prebuild cost (None:
        built here), and what placing its twin took (None: the host's own model, no twin). The prebuilt one where it
        matches: a copy where `keep` (another replay or run takes it next), else the one held, which is gone from
        here after. On an accelerator, always a twin: the host's model goes once its bytes are there."""
        self.wait()
        if self._model is None or self._key != _key(config, seed):
            source, prebuilt = build(config, seed), None
        else:
            source, prebuilt = self._model, Prebuilt(self._build_seconds, self._waited)
            if not keep:
                self._model, self._key = None, None
        if device.type == "cpu" and (prebuilt is None or not keep):
            return source.to(dtype=dtype).train(), prebuilt, None
        copy, placement = twin(source, device, dtype)
        return copy.train(), prebuilt, placement

    def held(self) -> bool:
        """Whether a built model is held (after any build under way has finished)."""
        self.wait()
        return self._model is not None
