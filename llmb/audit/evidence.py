"""Evidence from the measured run itself, and its clean-room replay.

Each measured window trains on a batch drawn from a challenge that the judging process hands over when its clock
starts, from the run's initial weights and a fresh AdamW state (the warmup's updates are undone before the window,
outside it), so the window's work is known only once the clock runs and every window is replayable from the seed
and its challenge alone. At the close the worker answers with the window's per-step losses and a digest of the
trained parameters computed on the device (per parameter, the float64 sum and sum of squares of its elements), so
the answer depends on every optimizer update and cannot exist before the device has finished.

The replay of a window, by the judge or a reviewer, is llmb.judge.replay's.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

from llmb.model import ModelConfig
from llmb.records import EVIDENCE_SCHEMA as SCHEMA  # noqa: F401  (the evidence section's id, one copy)
from llmb.spec.vocab import DEFAULT_REPLAY_BUDGET, DEFAULT_REPLAY_STEPS, DEFAULT_REPLAY_WHOLE  # noqa: F401

# The batch seeds of windows live far from the warmup's (seed + rank), so no window reuses the warmup's batch.
CHALLENGE_BITS = 62
# What a window's sealed digests cover: the whole model, or (tensor or pipeline parallelism: each rank holds a
# different part) rank 0's part only, which the replay cannot compare. The job's layout decides it, never the seal.
MODEL_SCOPE = "model"
PARTIAL_SCOPE = "rank 0's part"


def digest_scope(layout) -> str:
    """What the digests of a job with this layout cover (a layout object or a record's layout dict)."""
    get = layout.get if isinstance(layout, dict) else (lambda key, default: getattr(layout, key, default))
    try:
        partial = int(get("tp", 1) or 1) > 1 or int(get("pp", 1) or 1) > 1
    except (TypeError, ValueError):
        partial = True  # a layout that cannot be read: nothing to compare the digests with
    return PARTIAL_SCOPE if partial else MODEL_SCOPE


def window_seed(challenge: int, rank: int) -> int:
    """The seed of rank `rank`'s batch in the window opened with `challenge` (hashed: ranks never share one)."""
    digest = hashlib.sha256(f"llmb-window:{int(challenge)}:{int(rank)}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 2


def synthetic_batch(config: ModelConfig, batch_size: int, seed: int, device: torch.device) -> torch.Tensor:
    """Random token ids from a seeded CPU generator (the same on every device), moved to the device once."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, config.vocab_size, (batch_size, config.sequence_length), generator=generator)
    return ids.to(device)


def window_batch(config: ModelConfig, batch_size: int, challenge: int, rank: int, device: torch.device) -> torch.Tensor:
    return synthetic_batch(config, batch_size, window_seed(challenge, rank), device)


def global_batch(config: ModelConfig, batch_size: int, challenge: int, world_size: int) -> torch.Tensor:
    """Every rank's window batch, concatenated: one process on it sees what data parallelism averages over."""
    cpu = torch.device("cpu")
    return torch.cat([window_batch(config, batch_size, challenge, r, cpu) for r in range(world_size)])


def _local(parameter: torch.Tensor) -> torch.Tensor:
    """A sharded (DTensor) parameter's own shard; a plain tensor itself."""
    return parameter.to_local() if hasattr(parameter, "to_local") else parameter


@torch.no_grad()
def digest(parameters: Iterable[torch.Tensor]) -> torch.Tensor:
    """Per parameter, the float64 sum and sum of squares of its elements, as one [n, 2] tensor on the device.

    float64 accumulation so the digest of an update (about 1e-5 per element) is not lost in rounding; both columns
    add over shards, so a sharded model's digest is the sum of its ranks'."""
    rows = []
    for p in parameters:
        local = _local(p.detach())
        # One float32 temporary of the parameter's size at most (never a float64 copy of the whole model).
        rows.append(torch.stack([local.sum(dtype=torch.float64), local.float().square().sum(dtype=torch.float64)]))
    return torch.stack(rows)


def as_list(value: torch.Tensor) -> list[list[float]]:
    return [[float(x) for x in row] for row in value.detach().cpu().tolist()]


class InitialState:
    """The post-processed model's initial weights, kept on the host, and the means to return to them."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.parameters = [p for p in model.parameters()]
        self.saved = [_local(p.detach()).to("cpu", copy=True) for p in self.parameters]

    @torch.no_grad()
    def restore(self, optimizer: torch.optim.Optimizer) -> None:
        """Weights back to the initial ones and AdamW's state zeroed in place (compiled graphs and captured
        addresses stay valid): the state a freshly built AdamW has, so the replay needs no warmup."""
        _reshard(self.model)  # FSDP2 keeps a forward's gathered weights (the audit's): drop them, or they go stale
        for p, saved in zip(self.parameters, self.saved, strict=True):
            _local(p.detach()).copy_(saved)
            p.grad = None
        for state in optimizer.state.values():
            for value in state.values():
                if torch.is_tensor(value):
                    value.zero_()


def _reshard(model: torch.nn.Module) -> None:
    try:
        # Lazy: only a sharded job reaches here, and torch.distributed.fsdp is slow to import.
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        return
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


@dataclass
class Window:
    """What the judge and the worker know of one measured window."""

    challenge: int
    clean_seconds: float
    losses: list[float]
    digest_start: list[list[float]]
    digest_end: list[list[float]]
    worker_seconds: float
    moments_end: list[list[float]] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "challenge": self.challenge,
            "clean_window_seconds": self.clean_seconds,
            "worker_window_seconds": self.worker_seconds,
            "losses": self.losses,
            "digest_start": self.digest_start,
            "digest_end": self.digest_end,
            "moments_end": self.moments_end,
        }


@torch.no_grad()
def moment_digest(parameters: list[torch.Tensor], optimizer: torch.optim.Optimizer) -> torch.Tensor:
    """The digest of AdamW's first moments (exp_avg), in the parameters' order, as one [n, 2] tensor (empty before
    the first step). What moves in a pure 16-bit run even where its weights do not: under lr 1e-5 most BF16 weights
    keep their value, but exp_avg holds a tenth of every gradient, step after step."""
    moments = [optimizer.state.get(p, {}).get("exp_avg") for p in parameters]
    if not moments or any(not isinstance(m, torch.Tensor) for m in moments):
        return torch.zeros(0, 2, dtype=torch.float64)
    return digest(moments)
