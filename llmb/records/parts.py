"""The parts of a record: the plugin, device, software, optimizer, audit, precision, timing, loss, host, job
layout and energy sections a result holds."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from llmb.records.codec import Typed

# The parts of a record


@dataclass(kw_only=True)
class PluginRef(Typed):
    """Which plugin made a record, and with what settings: all of them, defaults included, as resolved."""

    name: str
    version: str
    distribution: str
    settings: dict[str, Any]
    # The plugin's own defaults (settings resolved from nothing), so a reader can tell what was changed without
    # asking an installed plugin. Absent in records written before it was recorded.
    defaults: dict[str, Any] | None = None
    precisions: list[str] | None = None  # what the plugin supports (so a summary can say "not supported")

    def changed_settings(self) -> dict[str, Any]:
        """The settings that differ from the plugin's defaults (all of them when the defaults are not recorded)."""
        if self.defaults is None:
            return dict(self.settings)
        return {k: v for k, v in self.settings.items() if self.defaults.get(k, object()) != v}

    def settings_label(self) -> str:
        """``key=value`` of each changed setting, or "defaults"."""
        changed = self.changed_settings()
        return " ".join(f"{k}={_setting_text(v)}" for k, v in sorted(changed.items())) or "defaults"


def _setting_text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


@dataclass(kw_only=True)
class DeviceRef(Typed):
    type: str
    spec: str | None = None
    name: str
    count: int | None = None
    memory_bytes: int | None = None  # the device's total memory, from the backend (None: the host CPU, or unknown)

    @property
    def label(self) -> str:
        return device_label(self.spec or self.type, self.name)


def device_label(spec: str, name: str) -> str:
    """How every command names a device in its output (run, check-plugin, peak): the plugin's name for it, then the
    torch device it ran on, e.g. "AMD EPYC (cpu)"."""
    return f"{name} ({spec})" if name and name != spec else spec


@dataclass(kw_only=True)
class Software(Typed):
    python: str
    torch: str
    platform: str


@dataclass(kw_only=True)
class OptimizerInfo(Typed):
    class_name: str = field(metadata={"key": "class"})
    defaults: dict[str, Any]
    harness_steps: int
    optimizer_steps: int


@dataclass(kw_only=True)
class BackendFact(Typed):
    name: str
    value: Any
    implies: str | None


@dataclass(kw_only=True)
class MatmulProbe(Typed):
    relative_error: float
    fp16_range_overflow: bool
    verdict: str
    errors: dict[str, float] | None = None  # per probed shape (256x256x256 and the model's own), the worse decides


@dataclass(kw_only=True)
class DispatchAudit(Typed):
    """What the matmul, linear and attention operators of one measured step received (llmb.audit.dispatch)."""

    operators: int
    matmul_calls: int
    calls: dict[str, dict[str, int]]
    formats: dict[str, str]
    effective: str | None
    unknown_operators: dict[str, int]
    opaque: bool


@dataclass(kw_only=True)
class WindowChecks(Typed):
    """The whole-window audit (llmb.audit.window): steps whose backend state was checked, the recorded step."""

    steps_checked: int
    recorded_step: int
    # The rows of the window's batch the audit step ran, where the window's own ran out of memory eager under the
    # recorder (llmb.run.audit_step); absent where it ran them all.
    audit_rows: int | None = None


@dataclass(kw_only=True)
class PeakInfo(Typed):
    """The peak behind the MFU (llmb.spec.peak_table): its figure, its public source, and whether llmb's table or the
    plugin gave it ("llmb table", "declared by plugin"); what the plugin declared, whether used or not."""

    flops: float | None
    source: str | None
    origin: str | None
    declared_flops: float | None = None


@dataclass(kw_only=True)
class Audit(Typed):
    """The precision audit (llmb.audit.precision.audit): the evidence of the format that really ran."""

    effective: str
    parameter_dtypes: dict[str, int]
    gradient_dtypes: dict[str, int]
    optimizer_state_dtypes: dict[str, int]
    autocast_dtype: str | None
    grad_scaler: bool
    backend: list[BackendFact]
    matmul_probe: MatmulProbe
    evidence: dict[str, str]
    operator_dtypes: dict[str, int] | None = None  # the dtype census of one forward pass (llmb.audit.census)
    buffer_dtypes: dict[str, int] | None = None  # the model's floating buffers (rotary tables); None before release 3
    rank_effective: list[str] | None = None  # a multi-process job: every rank's own verdict
    switches_vs_probe: dict[str, Any] | None = None  # matmul switches that allow less than the probe found
    dispatch: DispatchAudit | None = None  # one measured step's matmul operators and their input dtypes
    window: WindowChecks | None = None


@dataclass(kw_only=True)
class Precision(Typed):
    requested: str
    effective: str
    mode: str
    audit: Audit | None = None  # a result's; a conformance record names the labels only


@dataclass(kw_only=True)
class Timing(Typed):
    window_seconds: float
    step_seconds: list[float]
    method: str
    repeat_window_seconds: list[float]
    # Under the clean room (llmb.judge.cleanroom): "judge", and the plugin's process's own figures beside the judge's.
    clock: str | None = None
    worker_window_seconds: float | None = None
    worker_repeat_window_seconds: list[float] | None = None
    # Per window, the judge's seconds from its close to its seal (the digests), where every window was sealed:
    # work done after the clock stopped shows there (llmb.judge.verdict.seal_problems bounds it).
    seal_seconds: list[float] | None = None
    # The warmup steps, each between two syncs, and their cost beyond steady-state steps (tracing, compilation).
    warmup_step_seconds: list[float] = field(default_factory=list)
    compile_seconds: float | None = None


@dataclass(kw_only=True)
class Loss(Typed):
    initial: float
    first: float
    last: float


@dataclass(kw_only=True)
class Host(Typed):
    """The host while the run measured: a loaded or narrowed host is visible in the record."""

    load_average_start: list[float]  # 1, 5 and 15 minute load averages when the first timed repeat began
    load_average_end: list[float]  # and when the last one ended
    cpu_affinity: list[int] | None  # the CPUs the process may run on (None where the OS does not say)
    cpu_count: int | None


@dataclass(kw_only=True)
class JobLayout(Typed):
    """How a job's ranks divide the work (llmb.distributed.mesh.Layout as written, less the world size, node count and
    strategy, which a result holds once, at its top level)."""

    # Layout's fields that a result keeps at its top level (strategy as ``parallel``), not in its layout.
    TOP_LEVEL: ClassVar[tuple[str, ...]] = ("world_size", "nodes", "strategy")

    tp: int
    pp: int
    dp: int
    dp_replicate: int
    dp_shard: int
    microbatches: int
    schedule: str
    grad_accum: int
    sequence_parallel: bool

    @classmethod
    def of(cls, layout: dict[str, Any]) -> JobLayout:
        """The section from a whole layout (``mesh.Layout.to_dict()``), its top-level fields left out."""
        return cls.from_dict({k: v for k, v in layout.items() if k not in cls.TOP_LEVEL})

    @classmethod
    def data_parallel(cls, world_size: int = 1) -> JobLayout:
        """Every rank a data-parallel replica: one process, or a DDP job."""
        return cls(
            tp=1,
            pp=1,
            dp=world_size,
            dp_replicate=world_size,
            dp_shard=1,
            microbatches=1,
            schedule="gpipe",
            grad_accum=1,
            sequence_parallel=False,
        )

    def label(self) -> str:
        """What sets one layout apart from another with the same world size and strategy."""
        parts = [f"tp{self.tp}", f"pp{self.pp}", f"dp{self.dp}"]
        if self.pp > 1:
            parts.append(f"{self.schedule} x{self.microbatches}")
        if self.grad_accum > 1:
            parts.append(f"accum {self.grad_accum}")
        if self.sequence_parallel:
            parts.append("sp")
        return " ".join(parts)


@dataclass(kw_only=True)
class Energy(Typed):
    """The device's energy over the measured windows (llmb.records.energy): the counter's scope, the joules,
    average watts and tokens per joule of one device; or, with no figure, the reason."""

    scope: str | None = None
    reason: str | None = None
    limit_watts: float | None = None
    window_joules: list[float] | None = None
    joules: float | None = None
    seconds: float | None = None
    watts: float | None = None
    tokens_per_joule: float | None = None


@dataclass
class Check(Typed):
    """One conformance check."""

    name: str
    passed: bool
    detail: str
    measured: float | str | None = None  # an int is a number; JSON has no inf or nan, so they are written as text
    tolerance: float | str | None = None

    def to_dict(self) -> dict:
        data = super().to_dict()
        for key in ("measured", "tolerance"):  # always written, null included, as the table shows them
            value = getattr(self, key)
            data[key] = str(value) if isinstance(value, float) and not math.isfinite(value) else value
        return data
