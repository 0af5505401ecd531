"""A job's windows as one judge: rank 0 talks to the run's judge (the clean room's link, or a LocalJudge), every rank
trains on its share of the challenge, and the digests each rank seals are made the model's (summed over shards)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch.distributed as dist

from llmb.audit.evidence import MODEL_SCOPE, PARTIAL_SCOPE
from llmb.distributed.job import World
from llmb.training.loop import LocalJudge

if TYPE_CHECKING:
    from llmb.api.protocols import WindowJudge
    from llmb.distributed.mesh import Layout


class JobJudge:
    """A job's windows as one: rank 0 talks to the run's judge, every rank trains on its share of the challenge,
    and the answer holds the job's mean loss per step (what one process on the global batch would see: tensor and
    pipeline peers report their group's loss) and the model's digest: rank 0's where the parameters are replicated
    (DDP), summed over the shards (FSDP; HSDP divides by its replicas); with tensor or pipeline parallelism each rank
    holds a different part, so the digest is rank 0's part only and says so (`digest_scope`)."""

    def __init__(self, inner: WindowJudge | None, world: World, layout: Layout) -> None:
        self.inner = inner if inner is not None else LocalJudge()
        self.world = world
        self.clean = getattr(self.inner, "clean", False)
        strategy = getattr(layout, "strategy", "ddp")
        self.partial = getattr(layout, "tp", 1) > 1 or getattr(layout, "pp", 1) > 1
        self.sharded = strategy in ("fsdp", "hsdp") and not self.partial
        self.replicas = getattr(layout, "dp_replicate", 1) if strategy == "hsdp" else 1

    def _whole(self, digest: list[list[float]]) -> list[list[float]]:
        if not self.sharded:
            return digest
        parts = [None] * self.world.world_size
        dist.all_gather_object(parts, digest)
        return _summed(parts, self.replicas)

    def setup(self, device: str) -> None:
        if self.world.rank == 0:
            self.inner.setup(device)

    def ready(self) -> None:
        """Every rank waits for the judge's preparation: a rank's warmup would share the host with it."""
        if self.world.rank == 0:
            self.inner.ready()
        dist.broadcast_object_list([None], src=0)

    def open(self, digest_start: list[list[float]]) -> int:
        digest_start = self._whole(digest_start)
        box = [self.inner.open(digest_start) if self.world.rank == 0 else None]
        dist.broadcast_object_list(box, src=0)
        return int(box[0])

    def close(self, answer: dict) -> int:
        """The job's answer through rank 0; every rank gets the judge's seal key back."""
        parts = [None] * self.world.world_size
        dist.all_gather_object(parts, answer["losses"])
        box = [None]
        if self.world.rank == 0:
            losses = [sum(part[k] for part in parts) / len(parts) for k in range(len(answer["losses"]))]
            box[0] = self.inner.close({**answer, "losses": losses})
        dist.broadcast_object_list(box, src=0)
        return int(box[0])

    def seal(self, evidence: dict) -> None:
        """The digests after the clock stopped: summed over the shards of a sharded model."""
        parts = [None] * self.world.world_size
        keys = ("digest_start", "digest_end", "moments_end", "moments_projection")
        digests = [evidence.get(key) or [] for key in keys]
        dist.all_gather_object(parts, digests)
        if self.world.rank != 0:
            return
        if self.sharded:
            # Each rank projects its own rows (llmb.audit.evidence.project): the projection adds over shards too.
            digests = [_summed([p[k] for p in parts], self.replicas) for k in range(len(keys))]
        scope = PARTIAL_SCOPE if self.partial else MODEL_SCOPE
        self.inner.seal({**dict(zip(keys, digests, strict=True)), "digest_scope": scope})


def _summed(parts: list, replicas: int) -> list[list[float]]:
    return [[sum(part[i][j] for part in parts) / replicas for j in range(len(row))] for i, row in enumerate(parts[0])]
