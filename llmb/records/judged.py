"""The judge's sections of a result: the evidence of every measured window with the replay of one
(llmb.audit.evidence, llmb.judge.replay), and who judged it (llmb.judge.cleanroom). llmb/verify/evidence_checks.py
checks them against the result's own figures."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from llmb.records.codec import EVIDENCE_SCHEMA, RecordError, Typed, _join
from llmb.records.parts import Check


@dataclass(kw_only=True)
class EvidenceWindow(Typed):
    """One measured window: the judge's challenge (the window's data seed), its time on the judge's clock and on the
    worker's, each step's loss, and the parameter digests (and AdamW's first moments) at its start and end."""

    challenge: int
    clean_window_seconds: float | None
    worker_window_seconds: float | None
    losses: list[float]
    digest_start: list[list[float]]
    digest_end: list[list[float]]
    digest_scope: str | None = None  # "model", or a rank's shard; absent where the plugin's own process judged
    moments_end: list[list[float]] | None = None  # absent in records written before the moments were recorded
    # The judge's key, handed over after the clock stopped, and AdamW's first moments projected onto the directions it
    # draws (llmb.audit.evidence.moment_seal); both absent in records written before the projection.
    seal_key: int | None = None
    moments_projection: list[list[float]] | None = None


@dataclass(kw_only=True)
class ReplayDraw(Typed):
    """How deep the judge drew the replay, after every step was answered: the floor, and whether the whole window;
    else the share of the run's wall time (on the judge's clock) it could spend past the floor."""

    floor_steps: int
    whole_window_probability: float
    whole: bool
    budget_share: float | None = None  # absent in records written before the replay had a budget
    run_seconds: float | None = None

    def check(self, path: str) -> None:
        # A probability and a share no run's options can give (llmb run refuses them) are no draw.
        for name in ("whole_window_probability", "budget_share"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= 1:
                raise RecordError(f"{_join(path, name)}: {value!r} is not a share from 0 to 1")
        if self.floor_steps < 0:
            raise RecordError(f"{_join(path, 'floor_steps')}: {self.floor_steps} (0 or more)")


@dataclass(kw_only=True)
class SamePrecision(Typed):
    """A window's second replay, in the run's own format: a pure 16-bit window's (llmb.judge.replay.
    same_precision_checks), the whole window or as many steps as the budget afforded; or an AMP window's on the CPU,
    drawn whole, under autocast (autocast_checks)."""

    dtype: str  # the parameters'
    seconds: float
    steps: int | None = None  # absent in records written before it could stop short of the whole window
    autocast: str | None = None  # the autocast dtype of an AMP window's replay (absent: none, or before 2026-11-27)


@dataclass(kw_only=True)
class InitialModel(Typed):
    """The replay's initial model where the judge built it while the worker set itself up (llmb.judge.initial):
    the build's seconds, and how long the worker then waited for it before its warmup (untimed)."""

    build_seconds: float
    worker_waited_seconds: float


@dataclass(kw_only=True)
class OptimizerWarmup(Typed):
    """Where the judge built no initial model beside the worker (a replay on the CPU): torch's first AdamW, whose
    imports it paid in a thread while the worker set itself up (llmb.judge.initial.InitialModels.warm) rather than
    inside the replay, its seconds, and how long the worker then waited for it before its warmup (untimed)."""

    seconds: float
    worker_waited_seconds: float


@dataclass(kw_only=True)
class Placement(Typed):
    """One replay's twin of the initial model put on its device (llmb.judge.initial.Placement): its tensors'
    allocation there, then their bytes' copy, each until the device had finished, and the copy's route."""

    allocate_seconds: float
    copy_seconds: float
    route: str  # "pinned staging" (an accelerator) or "direct" (the CPU)


@dataclass(kw_only=True)
class Replay(Typed):
    """The window replayed in FP32 from the seed and the challenge, and its checks against the recorded losses and
    digests. A replay with nothing to replay has only its verdict and the check that says why."""

    passed: bool
    checks: list[Check]
    window: int | None = None
    steps: int | None = None
    whole_window: bool | None = None
    moments_compared: bool | None = None
    seconds: float | None = None
    build_seconds: float | None = None  # of `seconds`: the initial model built from the seed, placed on the device
    device_init_seconds: float | None = None  # of `seconds`: the device brought up in the judge's process (0: the CPU)
    # The FP32 replay's matmuls: "FP32" (IEEE) or, on a CUDA device for a BF16 or lower window, "TF32"
    # (llmb.judge.replay.reference_matmuls); absent in records written before the choice existed (IEEE)
    matmuls: str | None = None
    peak_rss_bytes: int | None = None
    device: str | None = None  # where it ran (llmb.judge.replay.replay_device)
    device_fallback: str | None = None  # why the device it was tried on left it to the CPU
    drawn: ReplayDraw | None = None  # absent in records written before the depth was drawn
    budget_seconds: float | None = None  # the seconds the whole replay could take (ReplayDraw.budget_share)
    same_precision: SamePrecision | None = None  # a pure 16-bit or CPU AMP window's replay in its own format
    unreplayed: str | None = None  # why a pure window's later steps had none (FP8 matmuls: no replay in that format)
    initial_model: InitialModel | None = None  # absent where the replay built its initial model itself
    # absent where an initial model was built beside the worker (that build warmed AdamW too), where the judge's
    # process had warmed it for an earlier run, and in records written before the warm-up (2026-11-27)
    optimizer_warmup: OptimizerWarmup | None = None
    # of build_seconds: each replay's twin of the initial model on its device, in the order they ran; absent where
    # none made one (a CPU replay of its own model) and in records written before they were timed (2026-11-26)
    placements: list[Placement] | None = None


@dataclass(kw_only=True)
class Evidence(Typed):
    """Every measured window's evidence, which of them is the headline's, and the replay (None: not run)."""

    SCHEMA: ClassVar[str] = EVIDENCE_SCHEMA

    schema: str
    windows: list[EvidenceWindow]
    headline_window: int
    replay: Replay | None  # None: not run (--replay-steps 0), or not yet (a record saved while the judge replays)
    digest: str | None = None  # how a digest is made, in words

    def check(self, path: str) -> None:
        if self.schema != self.SCHEMA:
            raise RecordError(f"{_join(path, 'schema')}: is {self.schema!r}, expected {self.SCHEMA}")


@dataclass(kw_only=True)
class InstalledPlugin(Typed):
    """An llmb plugin installed beside the run, read from its distribution's metadata (nothing imported)."""

    name: str
    distribution: str
    version: str


@dataclass(kw_only=True)
class Judge(Typed):
    """Who judged the run: a clean room (a process that imported no plugin, with its clock and the plugins installed
    beside it), or the plugin's own process (``clean_room`` false, and the result is not valid)."""

    clean_room: bool
    clock: str | None = None
    pid: int | None = None
    installed_plugins: list[InstalledPlugin] | None = None
