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


def digest_scope(layout: object) -> str:
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
    return torch.stack([_sums(_local(p.detach())) for p in parameters])


# Elements per float64 chunk of a digest (_sums): on the CPU a chunk that stays in cache, elsewhere fewer kernels.
DIGEST_CHUNK_ELEMENTS = {"cpu": 1 << 20}
DIGEST_CHUNK_DEFAULT = 1 << 24


def _sums(tensor: torch.Tensor) -> torch.Tensor:
    """[sum, sum of squares] of a tensor's elements in float64, one float64 chunk of it at a time (never a float64
    copy of the tensor). Widened once per chunk, summed and dotted with itself: on one CPU thread the small preset's
    43M parameters took 0.07 s, where a float64-dtype sum and a float32 square's per tensor took 0.35-0.40 s, five
    times as long, and the seal that follows the clock is bounded by a few of the window's steps."""
    flat = tensor.reshape(-1)
    total = flat.new_zeros(2, dtype=torch.float64)
    for chunk in flat.split(DIGEST_CHUNK_ELEMENTS.get(flat.device.type, DIGEST_CHUNK_DEFAULT)):
        wide = chunk.double()
        total += torch.stack([wide.sum(), wide.dot(wide)])
    return total


# How many random directions each parameter's AdamW first moments are projected onto (moment_seal).
MOMENT_PROJECTIONS = 4


@torch.no_grad()
def moment_seal(
    parameters: list[torch.Tensor], optimizer: torch.optim.Optimizer, key: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """moment_digest, and AdamW's first moments projected onto MOMENT_PROJECTIONS random directions per parameter
    drawn from `key` (one [n, MOMENT_PROJECTIONS] float64 tensor): what the worker seals after the clock, where every
    pass over the model's size is a cost the seal's bound must hold (the digest's chunked passes, _sums, and one
    float32 matrix-vector pass per moment). The judge hands `key` over only once the window's clock has stopped.

    What the sums of squares cannot see: moments of the right size pointing elsewhere. A window that reused step 1's
    gradients for every later step keeps moments as large as the honest ones, and on some batches its squares part
    by less than their tolerance; its moments' directions part by 0.34-0.60 where an honest compiled window's part by
    0.005 (benchmarks/RESULTS.md section 33). Each direction is rank one, u v^T (u over the parameter's rows, v over
    the rest), so a projection costs one pass over the moments and vectors of its rows' and columns' size, and adds
    over the row shards of a sharded model as the digest's columns do. The key comes after the clock: a plugin
    cannot shape its moments to directions it does not know."""
    moments = _first_moments(parameters, optimizer)
    if moments is None:
        return torch.zeros(0, 2, dtype=torch.float64), torch.zeros(0, MOMENT_PROJECTIONS, dtype=torch.float64)
    digests = [_sums(_local(moment.detach())) for moment in moments]
    projections = [project(moment, key, index) for index, moment in enumerate(moments)]
    return torch.stack(digests), torch.stack(projections)


def project(tensor: torch.Tensor, key: int, index: int) -> torch.Tensor:
    """Parameter `index`'s projection onto its MOMENT_PROJECTIONS directions drawn from `key`: this rank's rows'
    part of it where the tensor is sharded by rows (summed over the ranks, the whole tensor's)."""
    rows = tensor.shape[0] if tensor.dim() else 1
    columns = tensor.numel() // rows if rows else 0
    u, v = projection_vectors(key, index, rows, columns)
    # One float32 temporary of the tensor's size at most (none where the moments are float32).
    local = _local(tensor.detach()).float()
    local = local.reshape(local.shape[0] if local.dim() else 1, columns)
    offset = row_offset(tensor)
    u = u[offset : offset + local.shape[0]].to(local.device)
    return ((local @ v.to(local.device)) * u).sum(0, dtype=torch.float64)


def projection_vectors(key: int, index: int, rows: int, columns: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The rank-one directions of parameter `index` under `key`, from a seeded CPU generator (the same on every
    device and every machine): u [rows, k] and v [columns, k], standard normal."""
    name = f"llmb-moment-projection:{int(key)}:{int(index)}".encode()
    generator = torch.Generator().manual_seed(int.from_bytes(hashlib.sha256(name).digest()[:8], "big") >> 1)
    u = torch.randn(rows, MOMENT_PROJECTIONS, generator=generator)
    v = torch.randn(columns, MOMENT_PROJECTIONS, generator=generator)
    return u, v


def row_offset(tensor: torch.Tensor) -> int:
    """The first global row of this rank's shard of a tensor sharded by rows (FSDP2's Shard(0), torch.chunk's
    split: every shard but the last ceil(rows / shards) rows); 0 for a plain or replicated tensor."""
    placements, mesh = getattr(tensor, "placements", None), getattr(tensor, "device_mesh", None)
    coordinate = mesh.get_coordinate() if mesh is not None and placements else None
    if not coordinate:
        return 0
    offset, rows = 0, tensor.shape[0]
    for dim, placement in enumerate(placements):
        if placement.is_shard() and getattr(placement, "dim", None) == 0:
            chunk = -(-rows // mesh.size(dim))
            start = min(coordinate[dim] * chunk, rows)
            offset, rows = offset + start, min(chunk, rows - start)
    return offset


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
    # The judge's key of the moments' projection, handed over after the clock stopped, and the projection.
    seal_key: int | None = None
    moments_projection: list[list[float]] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "challenge": self.challenge,
            "clean_window_seconds": self.clean_seconds,
            "worker_window_seconds": self.worker_seconds,
            "losses": self.losses,
            "digest_start": self.digest_start,
            "digest_end": self.digest_end,
            "moments_end": self.moments_end,
            "seal_key": self.seal_key,
            "moments_projection": self.moments_projection,
        }


@torch.no_grad()
def moment_digest(parameters: list[torch.Tensor], optimizer: torch.optim.Optimizer) -> torch.Tensor:
    """The digest of AdamW's first moments (exp_avg), in the parameters' order, as one [n, 2] tensor (empty before
    the first step). What moves in a pure 16-bit run even where its weights do not: under lr 1e-5 most BF16 weights
    keep their value, but exp_avg holds a tenth of every gradient, step after step."""
    moments = _first_moments(parameters, optimizer)
    return torch.zeros(0, 2, dtype=torch.float64) if moments is None else digest(moments)


def _first_moments(parameters: list[torch.Tensor], optimizer: torch.optim.Optimizer) -> list[torch.Tensor] | None:
    """AdamW's exp_avg of each parameter, in the parameters' order; None before the first step (or where one lacks
    it)."""
    moments = [optimizer.state.get(p, {}).get("exp_avg") for p in parameters]
    if not moments or any(not isinstance(m, torch.Tensor) for m in moments):
        return None
    return moments
