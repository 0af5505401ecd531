"""The records llmb writes: Result, Conformance, Commbench and the sweep log's trials, each with its schema id."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from llmb.records.codec import (
    COMMBENCH_SCHEMA,
    CONFORMANCE_SCHEMA,
    RECORD_LIMIT,
    RESULT_SCHEMA,
    RESULT_SCHEMAS,
    SPREAD_WARNING,
    SWEEP_LOG_SCHEMA,
    Record,
    RecordError,
    Typed,
    _join,
)
from llmb.records.headline import RunGroup
from llmb.records.judged import Evidence, Judge
from llmb.records.parts import (
    Check,
    DeviceRef,
    Energy,
    Host,
    JobLayout,
    Loss,
    OptimizerInfo,
    PeakInfo,
    PluginRef,
    Precision,
    Software,
    Timing,
)
from llmb.spec.presets import PRESETS
from llmb.spec.shape import ModelConfig
from llmb.spec.vocab import SEED_MAX

if TYPE_CHECKING:
    from pathlib import Path

# The records


@dataclass(kw_only=True)
class Result(Record):
    """One `llmb run`: the measurement, everything needed to recompute its figures, and what ran."""

    SCHEMA: ClassVar[str] = RESULT_SCHEMA
    run_id: str
    official: bool
    valid: bool
    debug_reasons: list[str]
    invalid_reasons: list[str]
    model_fingerprint: str
    preset: str
    config: ModelConfig
    parameters: int
    batch_size: int
    sequence_length: int
    warmup_steps: int
    steps: int
    repeats: int
    seed: int
    plugin: PluginRef
    device: DeviceRef
    software: Software
    facts: dict[str, Any]
    optimizer: OptimizerInfo
    precision: Precision
    timing: Timing
    world_size: int = 1
    nodes: int = 1
    parallel: str = "none"
    layout: JobLayout  # how the ranks divide the work: tensor, pipeline and data parallel degrees, accumulation
    global_batch_size: int | None = None
    per_rank: list[float] | None = None
    threads_per_rank: list[int] | None = None
    per_rank_busy_seconds: list[float | None] | None = None
    per_rank_step_seconds: list[list[float]] | None = None
    stragglers: list[str] | None = None
    launcher: str | None = None
    tokens_per_second: float
    tokens_per_second_per_device: float | None = None
    samples_per_second: float
    model_flops_per_token: int
    tflops: float
    peak: PeakInfo  # the peak behind the MFU (its flops None where llmb knows none for the device)
    mfu: float | None
    fom: float
    peak_memory_bytes: int | None
    loss: Loss
    host: Host | None = None
    # The run's evidence (llmb.audit.evidence: each window's challenge, losses, digests and the replay) and who judged
    # it (llmb.judge.cleanroom); checked against the figures by llmb/verify/evidence_checks.py.
    evidence: Evidence | None = None
    judge: Judge | None = None
    # The matmul rate this device really reached at this run's GEMMs (llmb.run.roofline) and the run's model FLOP/s
    # against it: an efficiency for every device, the CPU included; None for FP8 (no dense matmul of one precision).
    measured_matmul_peak: float | None = None
    measured_model_gemm_flops: float | None = None
    matmul_peak_efficiency: float | None = None
    # None in records written before llmb recorded energy.
    energy: Energy | None = None

    @classmethod
    def from_dict(cls, data: Any) -> Result:
        """A result of any schema llmb reads (RESULT_SCHEMAS), as the current one."""
        if isinstance(data, dict) and data.get("schema") == RESULT_SCHEMAS[0]:
            data = upgrade_v1(data)
        return super().from_dict(data)

    # The figures every reader shows, sums or divides by: a measurement of a number no run can give (NaN, infinite,
    # negative; a batch of none) is no result, whatever its type. Losses may be non-finite (a diverged run records
    # them so, and is invalid for it).
    FIGURES: ClassVar[tuple[str, ...]] = (
        "tokens_per_second", "tokens_per_second_per_device", "samples_per_second", "tflops", "mfu", "fom",
        "measured_matmul_peak", "measured_model_gemm_flops", "matmul_peak_efficiency",
    )  # fmt: skip
    COUNTS: ClassVar[tuple[str, ...]] = ("batch_size", "sequence_length", "steps", "repeats", "world_size", "nodes")

    def check(self, path: str) -> None:
        super().check(path)
        if self.precision.audit is None:
            raise RecordError(f"{_join(path, 'precision.audit')}: missing")
        if not self.run_id.strip():
            raise RecordError(f"{_join(path, 'run_id')}: empty")
        for name in self.FIGURES:
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise RecordError(f"{_join(path, name)}: {value!r} is no measurement (a finite number, 0 or more)")
        timing = self.timing
        for name, values in (
            ("timing.window_seconds", [timing.window_seconds]),
            ("timing.step_seconds", timing.step_seconds),
            ("timing.repeat_window_seconds", timing.repeat_window_seconds),
        ):
            if not all(math.isfinite(v) and v >= 0 for v in values):
                raise RecordError(f"{_join(path, name)}: holds no time (a finite number of seconds, 0 or more)")
        for name in self.COUNTS:
            if getattr(self, name) < 1:
                raise RecordError(f"{_join(path, name)}: {getattr(self, name)} (at least 1)")
        if not 0 <= self.seed <= SEED_MAX:
            raise RecordError(f"{_join(path, 'seed')}: {self.seed} (a seed llmb runs with is 0 to {SEED_MAX})")
        for name in ("warmup_steps", "parameters", "model_flops_per_token", "peak_memory_bytes"):
            if (getattr(self, name) or 0) < 0:  # peak_memory_bytes: None where the device's is unknown
                raise RecordError(f"{_join(path, name)}: {getattr(self, name)} (0 or more)")

    @property
    def shape(self) -> str:
        """The shape as a reader names it: the preset, or its dimensions where they differ, and the parameters."""
        base = PRESETS.get(self.preset)
        changed = (
            [] if base is None else [f"{k}={v}" for k, v in self.config.to_dict().items() if getattr(base, k) != v]
        )
        name = self.preset if base is not None and not changed else " ".join([self.preset, *changed])
        return f"{name} ({_millions(self.parameters)})"

    def repeat_throughputs(self) -> list[float]:
        """Tokens/s of each repeat of the run (the headline is the median of these)."""
        tokens = (self.global_batch_size or self.batch_size * self.world_size) * self.sequence_length * self.steps
        return [tokens / w for w in self.timing.repeat_window_seconds if w > 0]

    def repeat_spread_warning(self) -> str | None:
        """A warning when this run's repeats spread more than SPREAD_WARNING around its headline, else None."""
        values = self.repeat_throughputs()
        if len(values) < 2:
            return None
        spread = (max(values) - min(values)) / self.tokens_per_second
        if spread <= SPREAD_WARNING:
            return None
        return (
            f"the {len(values)} repeats spread {spread:.1%} ({min(values):,.1f}-{max(values):,.1f} tokens/s, "
            f"more than {SPREAD_WARNING:.0%}): a loaded host? (load average {self._load()})"
        )

    def matmul_peak_warning(self) -> str | None:
        """A warning when the run's model GEMM FLOP/s exceed the matmul peak measured in the same run, else None."""
        return over_peak_warning(self.matmul_peak_efficiency, self._load())

    def _load(self) -> str:
        if self.host is None or not self.host.load_average_end:
            return "not recorded"
        return f"{self.host.load_average_end[0]:.2f}"

    @property
    def group(self) -> RunGroup:
        return RunGroup(
            plugin=self.plugin.name,
            settings=self.plugin.settings_label(),
            precision=self.precision.effective,
            mode=self.precision.mode,
            shape=self.shape,
            device=self.device.name,
            nodes=self.nodes,
            world_size=self.world_size,
            parallel=self.strategy,
        )

    @property
    def strategy(self) -> str:
        """The parallel strategy with the layout's own parts where it has any (tensor, pipeline, accumulation)."""
        layout = self.layout
        if (layout.tp, layout.pp, layout.grad_accum, layout.sequence_parallel) == (1, 1, 1, False):
            return self.parallel
        return f"{self.parallel} {layout.label()}"


def upgrade_v1(data: dict) -> dict:
    """A llmb.result/1 record as a /2 one. /1 repeated the layout's degrees (tp, pp, dp, microbatches, grad_accum) at
    its top level and the peak's figure as ``peak_flops``, and held the world size, node count and strategy in its
    layout too: /2 holds each once. A /1 record with no layout (before jobs recorded one) ran every rank as a data
    replica; one with no ``peak`` section gets its ``peak_flops`` as the peak, with no source."""
    data = dict(data, schema=RESULT_SCHEMA)
    flat = {key: data.pop(key, None) for key in ("tp", "pp", "dp", "microbatches", "grad_accum")}
    peak_flops = data.pop("peak_flops", None)
    layout = data.get("layout")
    if isinstance(layout, dict):
        data["layout"] = {k: v for k, v in layout.items() if k not in JobLayout.TOP_LEVEL}
    else:
        world = data.get("world_size", 1)
        single = JobLayout.data_parallel(world if isinstance(world, int) else 1).to_dict()
        data["layout"] = single | {k: v for k, v in flat.items() if v is not None}
    if data.get("peak") is None:
        data["peak"] = {"flops": peak_flops, "source": None, "origin": None}
    return data


def over_peak_warning(efficiency: float | None, load: str) -> str | None:
    """The model's GEMMs cannot run faster than the dense matmul peak measured beside them: over 100%, that peak was
    measured low (a busy host, or a clock that changed), so the ratio is no efficiency. None when it is not over."""
    if efficiency is None or efficiency <= 1.0:
        return None
    return (
        f"model GEMM FLOP/s at {efficiency:.0%} of the matmul peak measured in the run: that peak was measured low "
        f"(a busy host? load average {load}), so the ratio is no efficiency; re-run on a quieter host"
    )


def _millions(parameters: int) -> str:
    return f"{parameters / 1e9:.2f}B params" if parameters >= 1e9 else f"{parameters / 1e6:.1f}M params"


@dataclass(kw_only=True)
class Conformance(Record):
    """`llmb check-plugin`: a plugin's model against the FP32 CPU reference."""

    SCHEMA: ClassVar[str] = CONFORMANCE_SCHEMA
    passed: bool
    plugin: PluginRef
    device: DeviceRef
    precision: Precision
    preset: str
    config: ModelConfig
    seed: int
    steps: int
    batch_size: int
    model_fingerprint: str
    checks: list[Check]

    def failed(self) -> list[str]:
        return [c.name for c in self.checks if not c.passed]


@dataclass(kw_only=True)
class CommRow(Typed):
    bytes: int
    elements: int
    seconds: float
    algbw_bytes_per_second: float
    busbw_bytes_per_second: float


@dataclass(kw_only=True)
class Commbench(Record):
    """`llmb commbench`: all-reduce time and bandwidth per message size."""

    SCHEMA: ClassVar[str] = COMMBENCH_SCHEMA
    operation: str
    plugin: PluginRef
    device: DeviceRef
    backend: str
    world_size: int
    nodes: int
    dtype: str
    iters: int
    warmup: int
    timing: str
    results: list[CommRow]
    torch: str


# "refused": the trial's `llmb run` exited 2, refusing that point (the sweep's own options are checked before any).
SWEEP_STATUSES = ("ok", "oom", "crash", "timeout", "invalid", "refused")
SWEEP_LOG_NAME = "sweep.jsonl"
SWEEP_SUMMARY_NAME = "sweep-summary.json"  # written beside the log as each precision's search ends


@dataclass
class SweepTrial(Typed):
    """One finished point of a sweep: a `llmb run` subprocess at one precision and batch size (a log line)."""

    precision: str
    batch_size: int
    phase: str  # "search" (the search and its confirmations), or "repeat" for the re-runs of the best batch
    index: int  # which trial of this batch size and phase
    status: str  # one of SWEEP_STATUSES
    tokens_per_second: float | None = None
    peak_memory_bytes: int | None = None
    result: str | None = None  # the result JSON's file name in the sweep directory
    run_id: str | None = None
    seconds: float = 0.0
    detail: str = ""

    def to_dict(self) -> dict:
        data = super().to_dict()
        return {k: getattr(self, k) for k in self.__dataclass_fields__} | data  # nulls kept: one shape per line

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def key(self) -> tuple:
        return (self.precision, self.phase, self.batch_size, self.index)


def read_sweep_log(
    path: Path, limit: int = RECORD_LIMIT, skipped: list[str] | None = None
) -> tuple[dict, list[SweepTrial]]:
    """The header and the trials of a sweep log (read only); a last line torn by a kill mid-write is left out.
    Raises RecordError naming the line and field of anything else that is not a log line; given a ``skipped``
    list, a bad trial line is named there instead (one line each, with why) and the others are read."""
    from llmb.records import files as record_files  # it imports this module

    try:
        # A FIFO or a giant file is refused, never waited on.
        text = record_files.read_regular(path, limit).decode("utf-8")
    except ValueError as exc:  # not a plain file, too large, not UTF-8 (IrregularFile names the file: the why kept)
        raise RecordError(f"{path}: not a readable sweep log ({str(exc).removeprefix(f'{path}: ')})") from None
    if text and not text.endswith("\n"):
        text = text[: text.rfind("\n") + 1]
    header: dict = {}
    trials = []
    for number, line in enumerate(text.splitlines(), 1):
        try:
            entry = record_files.loads(line)
            if not isinstance(entry, dict):
                raise record_files.Unreadable("not a JSON object")
            kind = entry.pop("type", None)
            if kind == "sweep":
                header = entry
            elif kind == "trial":
                trials.append(record_files.parse(SweepTrial, entry))
        except record_files.Unreadable as exc:
            if skipped is None or number == 1:  # the header is the log's identity: without it nothing reads
                raise RecordError(f"{path}:{number}: {exc}") from None
            skipped.append(record_files.skipped_line(f"{path}:{number}", exc))
    if header.get("schema") != SWEEP_LOG_SCHEMA:
        raise RecordError(f"{path}: not a sweep log (schema {header.get('schema')!r})")
    return header, trials
