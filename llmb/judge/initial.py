"""The replay's initial model, built by the judge while the worker sets itself up.

The replay starts from the run's initial weights: LlamaModel built on the CPU from the seed, as the run builds its
own. At the official shape that build is most of the replay's fixed cost: on the H100's host the replay took 23-31 s
at batch 8 and 64 alike (16-42% of a 20-step run's wall time, benchmarks/RESULTS.md section 15), where its two FP32
steps take 1-8 s. So where the run is replayed on an accelerator, the judge builds it in a thread once the worker
says its backend is set up (`setup`; the worker builds its own model meanwhile), and the worker, its setup done, says
`ready` and waits, untimed, until the build has finished (llmb.judge.cleanroom.ReplayPreparation): the build never
shares the host with a step the run times, the warmup's included. The model stays on the host in FP32, one copy
(5.7 GB at the official shape), and each replay on the accelerator takes a twin of it there.
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


def tensors(model: LlamaModel) -> list[torch.Tensor]:
    """The model's parameters, then its buffers, in the order twin copies them."""
    return list(itertools.chain(model.parameters(), model.buffers()))


def empty_twin(model: LlamaModel, device: torch.device, dtype: torch.dtype) -> LlamaModel:
    """The layout of `model` on `device` in `dtype`, its parameters and buffers allocated there and unset (no host
    copy on the way): what twin fills, and benchmarks/initial_copy.py fills by other routes."""
    with torch.device("meta"):
        copy = LlamaModel(model.config).to(dtype)
    return copy.to_empty(device=device)


def twin(model: LlamaModel, device: torch.device, dtype: torch.dtype) -> LlamaModel:
    """A copy of `model` on `device` in `dtype`, its parameters and buffers copied straight there: no second copy on
    the host (5.7 GB at the official shape) on the way to an accelerator."""
    copy = empty_twin(model, device, dtype)
    with torch.no_grad():
        # buffers too: to_empty leaves them unset
        for target, source in zip(tensors(copy), tensors(model), strict=True):
            target.copy_(source)
    return copy


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


class InitialModels:
    """One initial model at a time, built in the background (start), waited for (wait), taken by a replay (model).

    Builds are serialised with the replays that take them (a build seeds torch's global generator): `start` is
    called on the worker's `setup`, while no replay runs (the worker waits through each replay)."""

    def __init__(self) -> None:
        self._key: tuple | None = None
        self._model: LlamaModel | None = None
        self._thread: threading.Thread | None = None
        self._build_seconds = 0.0
        self._waited = 0.0

    def start(self, config: ModelConfig, seed: int) -> None:
        """Build the initial model of (config, seed) in a thread, unless it is held or building already."""
        key = _key(config, seed)
        if key == self._key:
            return
        self.wait()
        self._key, self._model, self._waited = key, None, 0.0
        self._thread = threading.Thread(target=self._build, args=(config, seed), name="llmb-initial-model", daemon=True)
        self._thread.start()

    def _build(self, config: ModelConfig, seed: int) -> None:
        began = time.perf_counter()
        try:
            self._model = build(config, seed)
        except Exception:  # none held: the replay builds the model itself, and meets the error there
            self._model = None
        self._build_seconds = time.perf_counter() - began

    def wait(self) -> None:
        """Until the build under way (if any) has finished."""
        if self._thread is not None:
            self._thread.join()

    def ready(self) -> float:
        """The worker's `ready`: wait for the build under way, and count the seconds (the record says them)."""
        began = time.perf_counter()
        self.wait()
        waited = time.perf_counter() - began
        self._waited += waited
        return waited

    def model(
        self, config: ModelConfig, seed: int, device: torch.device, dtype: torch.dtype, keep: bool
    ) -> tuple[LlamaModel, Prebuilt | None]:
        """The initial model of (config, seed) on `device` in `dtype`, in training mode, and what its prebuild cost
        (None: built here). The prebuilt one where it matches: a copy where `keep` (another replay or run takes it
        next), else the one held, which is gone from here after."""
        self.wait()
        if self._model is None or self._key != _key(config, seed):
            model = build(config, seed)
            prebuilt = None
        else:
            prebuilt = Prebuilt(self._build_seconds, self._waited)
            if keep:
                return twin(self._model, device, dtype).train(), prebuilt
            model, self._model, self._key = self._model, None, None
        return model.to(device=device, dtype=dtype).train(), prebuilt

    def held(self) -> bool:
        """Whether a built model is held (after any build under way has finished)."""
        self.wait()
        return self._model is not None
