"""The records llmb writes and reads: every schema id, one envelope, and typed records shared by every writer and
reader (the runner, conformance, commbench, the sweep, submission, verify and report).

Each record type is a dataclass: ``to_dict()`` gives the JSON object that is written, and ``from_dict()`` reads one
back strictly, so it is safe on untrusted input (a bundle, a file someone hands over): a missing field, an unknown
field or a value of the wrong type raises ``RecordError`` naming the field (``timing.step_seconds[2]``). Adding a
field is one line: a field with a default is optional, so records written before it still read.

This module also holds the rules every reader shares: the headline run of a group of runs (always a run that
happened), what makes two runs comparable (never pooled otherwise), and the loss band. It imports nothing that can
run a plugin.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from llmb.bundle.reader import read_regular
from llmb.spec.presets import PRESETS
from llmb.spec.shape import ModelConfig
from llmb.spec.version import __version__

# Every schema id llmb writes, in one place.
RESULT_SCHEMA = "llmb.result/1"
CONFORMANCE_SCHEMA = "llmb.conformance/1"
COMMBENCH_SCHEMA = "llmb.commbench/1"
SWEEP_LOG_SCHEMA = "llmb.sweep/1"
SWEEP_SUMMARY_SCHEMA = "llmb.sweep-summary/1"
SUBMISSION_SCHEMA = "llmb.submission/1"
PLUGIN_SOURCE_SCHEMA = "llmb.plugin-source/1"
CODE_SCHEMA = "llmb.code/1"
RELEASE_MANIFEST_SCHEMA = "llmb.release-manifest/1"
REPORT_SCHEMA = "llmb.report/1"
ROOFLINE_SCHEMA = "llmb.roofline/1"
ATTEMPT_SCHEMA = "llmb.attempt/1"  # a feature-matrix attempt that failed before a result (llmb.run.feature_matrix)

# A freshly initialised model predicts near-uniformly: its first loss sits near ln(vocab). Measured here: tiny
# preset 10.38, small 10.40, official ~11.0 (logit std 0.02 x sqrt(hidden)); a scaled or broken model leaves the band.
LOSS_BAND = (0.8, 1.3)
# A result or a sweep log larger than this is not one llmb wrote: refused unread.
RECORD_LIMIT = 64 * 2**20
# Runs of one headline that spread more than this (max - min over the headline) are flagged as noisy.
SPREAD_WARNING = 0.10


def loss_band(vocab_size: int) -> tuple[float, float]:
    return LOSS_BAND[0] * math.log(vocab_size), LOSS_BAND[1] * math.log(vocab_size)


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def envelope(schema: str) -> dict:
    """The fields every llmb record starts with: what it is, which llmb wrote it, when."""
    return {"schema": schema, "llmb_version": __version__, "created": now()}


# Strict reading


class RecordError(ValueError):
    """A record that does not match its type; the message starts with the field's path."""


def _where(path: str) -> str:
    return path or "record"


def _parse(value: Any, hint: Any, path: str) -> Any:
    """``value`` (from JSON) checked against the type ``hint``; raises RecordError naming ``path``."""
    if hint is Any:
        return value
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None:
            if type(None) in options:
                return None
            raise RecordError(f"{_where(path)}: is null")
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _parse(value, option, path)
            except RecordError as exc:
                errors.append(exc)
        raise errors[0]
    if dataclasses.is_dataclass(hint):
        return _parse_dataclass(hint, value, path)
    if origin is list:
        if not isinstance(value, list):
            raise RecordError(f"{_where(path)}: expected a list, got {_kind(value)}")
        (item,) = typing.get_args(hint)
        return [_parse(v, item, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise RecordError(f"{_where(path)}: expected an object, got {_kind(value)}")
        _, item = typing.get_args(hint)
        return {k: _parse(v, item, f"{path}.{k}") for k, v in value.items()}
    if hint is bool:
        if not isinstance(value, bool):
            raise RecordError(f"{_where(path)}: expected true or false, got {_kind(value)}")
        return value
    if hint is int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise RecordError(f"{_where(path)}: expected an integer, got {_kind(value)}")
        return value
    if hint is float:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise RecordError(f"{_where(path)}: expected a number, got {_kind(value)}")
        return value
    if hint is str:
        if not isinstance(value, str):
            raise RecordError(f"{_where(path)}: expected a string, got {_kind(value)}")
        return value
    raise TypeError(f"records: no reader for the type {hint!r} of {path}")  # a programming error, not bad input


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "a list" if isinstance(value, list) else "an object" if isinstance(value, dict) else type(value).__name__


_hints: dict[type, dict[str, Any]] = {}


def _fields(cls: type) -> list[tuple[dataclasses.Field, str, Any]]:
    """(field, JSON key, type) of a record dataclass; a field's JSON key may differ from its name (``class``)."""
    if cls not in _hints:
        _hints[cls] = typing.get_type_hints(cls)
    return [(f, f.metadata.get("key", f.name), _hints[cls][f.name]) for f in dataclasses.fields(cls) if f.init]


def field_tree(cls: type, prefix: str = "") -> dict[str, bool]:
    """Every JSON key a record type declares, nested ones dotted (``timing.window_seconds``), mapped to whether it
    is required; a list of records is ``checks[]``. The README's field lists are checked against this."""
    tree: dict[str, bool] = {}
    for f, key, hint in _fields(cls):
        name = prefix + key
        tree[name] = not (_has_default(f) and issubclass(cls, Typed))
        union = typing.get_origin(hint) in (typing.Union, types.UnionType)
        inner = [a for a in typing.get_args(hint) if a is not type(None)] if union else [hint]
        for candidate in inner:
            if typing.get_origin(candidate) is list:
                (item,) = typing.get_args(candidate)
                if dataclasses.is_dataclass(item):
                    tree.update(field_tree(item, f"{name}[]."))
            elif dataclasses.is_dataclass(candidate):
                tree.update(field_tree(candidate, f"{name}."))
    return tree


def describe(cls: type) -> str:
    """A record type's fields in the README's notation: ``name`` (``?`` when optional), ``name[]`` a list,
    ``name{...}`` a free-form object, ``name{a, b}`` a nested record, ``name[{a, b}]`` a list of records.
    `python -m llmb.records` prints them; tests/test_records.py checks the README against them."""
    parts = []
    for f, key, hint in _fields(cls):
        name = key + ("?" if _has_default(f) and issubclass(cls, Typed) else "")
        union = typing.get_origin(hint) in (typing.Union, types.UnionType)
        inner = next((a for a in typing.get_args(hint) if a is not type(None)), hint) if union else hint
        origin = typing.get_origin(inner)
        if dataclasses.is_dataclass(inner):
            parts.append(f"{name}{{{describe(inner)}}}")
        elif origin is list:
            (item,) = typing.get_args(inner)
            parts.append(f"{name}[{{{describe(item)}}}]" if dataclasses.is_dataclass(item) else f"{name}[]")
        elif origin is dict or inner is Any:
            parts.append(f"{name}{{...}}" if origin is dict else name)
        else:
            parts.append(name)
    return ", ".join(parts)


def _has_default(f: dataclasses.Field) -> bool:
    """Whether a record may leave the field out (a default that is only a writer's convenience does not count)."""
    if f.metadata.get("required"):
        return False
    return f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING


def _parse_dataclass(cls: type, value: Any, path: str) -> Any:
    if not isinstance(value, dict):
        raise RecordError(f"{_where(path)}: expected an object, got {_kind(value)}")
    known = _fields(cls)
    keys = {key for _, key, _ in known}
    unknown = [k for k in value if k not in keys]
    if unknown:
        raise RecordError(f"{_join(path, str(unknown[0]))}: unknown field")
    kwargs = {}
    for f, key, hint in known:
        if key not in value:
            # Only llmb's own record types have optional fields; another dataclass (ModelConfig) must be complete,
            # or a record missing a dimension would read as the official shape.
            if _has_default(f) and issubclass(cls, Typed):
                continue
            raise RecordError(f"{_join(path, key)}: missing")
        kwargs[f.name] = _parse(value[key], hint, _join(path, key))
    record = cls(**kwargs)
    check = getattr(record, "check", None)
    if check is not None:
        check(path)
    return record


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _dump(value: Any) -> Any:
    if isinstance(value, Typed):
        return value.to_dict()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _dump_dataclass(value)
    if isinstance(value, list):
        return [_dump(v) for v in value]
    if isinstance(value, dict):
        return {k: _dump(v) for k, v in value.items()}
    return value


def _dump_dataclass(record: Any) -> dict:
    out = {}
    for f, key, _ in _fields(type(record)):
        value = getattr(record, f.name)
        if value is None and f.default is None:
            continue  # an optional field left out is absent, as in records written before it existed
        out[key] = _dump(value)
    return out


R = TypeVar("R", bound="Typed")


class Typed:
    """Mixin for the record dataclasses: ``to_dict`` and a strict ``from_dict``."""

    def to_dict(self) -> dict:
        return _dump_dataclass(self)

    @classmethod
    def from_dict(cls: type[R], data: Any) -> R:
        return _parse_dataclass(cls, data, "")


@dataclass(kw_only=True)
class Record(Typed):
    """A top-level record: the envelope, then the record's own fields. ``SCHEMA`` is the id it must carry."""

    SCHEMA: ClassVar[str] = ""
    # Defaults for the writer; a record read from a file must carry all three.
    schema: str = field(default="", metadata={"required": True})
    llmb_version: str = field(default=__version__, metadata={"required": True})
    created: str = field(default_factory=now, metadata={"required": True})

    def __post_init__(self) -> None:
        self.schema = self.schema or self.SCHEMA

    def check(self, path: str) -> None:
        if self.schema != self.SCHEMA:
            raise RecordError(f"{_join(path, 'schema')}: is {self.schema!r}, expected {self.SCHEMA}")

    @classmethod
    def from_dict(cls: type[R], data: Any) -> R:
        # The schema first: a record of another kind is named as such, not by its first odd field.
        if isinstance(data, dict) and data.get("schema") != cls.SCHEMA:
            raise RecordError(f"schema: is {data.get('schema')!r}, expected {cls.SCHEMA}")
        return _parse_dataclass(cls, data, "")


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
    """How a job's ranks divide the work (llmb.distributed.mesh.Layout as written)."""

    world_size: int
    tp: int
    pp: int
    strategy: str
    nodes: int
    microbatches: int
    schedule: str
    grad_accum: int
    sequence_parallel: bool
    dp: int
    dp_replicate: int
    dp_shard: int

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
    global_batch_size: int | None = None
    per_rank: list[float] | None = None
    layout: JobLayout | None = None
    tp: int | None = None
    pp: int | None = None
    dp: int | None = None
    microbatches: int | None = None
    grad_accum: int | None = None
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
    peak_flops: float | None
    peak: PeakInfo | None = None
    mfu: float | None
    fom: float
    peak_memory_bytes: int | None
    loss: Loss
    host: Host | None = None
    # The run's evidence (llmb.audit.evidence: each window's challenge, losses, digests and the replay) and its judge
    # (llmb.judge.cleanroom); checked by llmb/verify/evidence_checks.py, so kept as plain JSON here.
    evidence: dict[str, Any] | None = None
    judge: dict[str, Any] | None = None
    # The matmul rate this device really reached at this run's GEMMs (llmb.run.roofline) and the run's model FLOP/s
    # against it: an efficiency for every device, the CPU included; None for FP8 (no dense matmul of one precision).
    measured_matmul_peak: float | None = None
    measured_model_gemm_flops: float | None = None
    matmul_peak_efficiency: float | None = None
    # None in records written before llmb recorded energy.
    energy: Energy | None = None

    def check(self, path: str) -> None:
        super().check(path)
        if self.precision.audit is None:
            raise RecordError(f"{_join(path, 'precision.audit')}: missing")

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
        if layout is None or (layout.tp, layout.pp, layout.grad_accum, layout.sequence_parallel) == (1, 1, 1, False):
            return self.parallel
        return f"{self.parallel} {layout.label()}"


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


SWEEP_STATUSES = ("ok", "oom", "crash", "timeout", "invalid")
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


def read_sweep_log(path, limit: int = RECORD_LIMIT, skipped: list[str] | None = None) -> tuple[dict, list[SweepTrial]]:
    """The header and the trials of a sweep log (read only); a last line torn by a kill mid-write is left out.
    Raises RecordError naming the line and field of anything else that is not a log line; given a ``skipped``
    list, a bad trial line is named there instead (one line each, with why) and the others are read."""
    from llmb.records import files as record_files  # it imports this module

    try:
        text = read_regular(path, limit).decode("utf-8")  # a FIFO or a giant file is refused, never waited on
    except ValueError as exc:  # not a plain file, too large, not UTF-8
        raise RecordError(f"{path}: not a readable sweep log ({exc})") from None
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


# The headline rule and what may be pooled


@dataclass(frozen=True, order=True)
class RunGroup:
    """What runs must share to be compared under one headline; runs differing in any of these are never pooled.
    The batch size is not among them: the headline rule (best_batch_runs) picks a group's batch."""

    plugin: str
    settings: str
    precision: str  # the effective one
    mode: str
    shape: str
    device: str
    nodes: int
    world_size: int
    parallel: str


def median_index(values: list[float]) -> int:
    """Index of the median value, the lower middle for an even count, so a headline is always a run that happened.

    Called with throughputs (higher is better), an even count takes the slower of the two middle runs."""
    order = sorted(range(len(values)), key=values.__getitem__)
    return order[(len(order) - 1) // 2]


@dataclass
class Headline:
    """A group's headline: its median run (a run that happened) and the runs that median is over (best_batch_runs)."""

    run: Result
    runs: list[Result]

    @property
    def low(self) -> float:
        return min(r.tokens_per_second for r in self.runs)

    @property
    def high(self) -> float:
        return max(r.tokens_per_second for r in self.runs)

    @property
    def spread(self) -> float:
        """(max - min) / headline of the runs' tokens/s."""
        return (self.high - self.low) / self.run.tokens_per_second

    @property
    def noisy(self) -> bool:
        return self.spread > SPREAD_WARNING


T = TypeVar("T")
REPEAT_PHASE = "repeat"  # a sweep's re-runs of its best batch (SweepTrial.phase)
# Runs at one batch size for its median to head a group ahead of a faster batch with fewer (a median, not one lucky
# run); the packager asks for this many at the headline's batch of each precision.
MIN_RUNS = 3


def _no_phase(run: Any) -> str | None:
    return None


def counted_runs(runs: Sequence[T], phase: Callable[[T], str | None]) -> list[T]:
    """The runs a figure may be the median of: a sweep's re-runs where there are any, else all the runs. The search
    trials that picked a batch are never pooled with its re-runs."""
    repeats = [r for r in runs if phase(r) == REPEAT_PHASE]
    return repeats or list(runs)


def best_batch_runs(runs: Sequence[T], phase: Callable[[T], str | None] = _no_phase) -> tuple[T, list[T]] | None:
    """The headline rule, the one every reader calls: (the headline run, the runs its median is over) of one group's
    finished runs (a RunGroup: all they share but the batch size), or None for no runs. `runs` are results, report
    points or sweep trials: anything with `batch_size` and `tokens_per_second`; `phase` names a run's sweep phase
    where it is known (a sweep log's), else None.

    Per batch size, the runs that count are its re-runs where it has any (counted_runs). Batches then compete in
    this order: a batch a sweep re-ran over one it only searched (the re-runs are the sweep's verdict), a batch with
    MIN_RUNS runs over one with fewer, then the fastest median run (median_index: a run that happened), the smaller
    batch on a tie. The sweep's summary and live line, `llmb report`, a bundle's summary.md and `llmb reproduce` all
    show this run, and the packager keeps only a group's re-runs where a sweep made any, so a bundle read without its
    sweep log still leads here to the same run."""
    by_batch: dict[int, list[T]] = {}
    for run in runs:
        by_batch.setdefault(run.batch_size, []).append(run)
    counted = {batch: counted_runs(members, phase) for batch, members in sorted(by_batch.items())}
    reran = {batch: members for batch, members in counted.items() if phase(members[0]) == REPEAT_PHASE}
    competing = reran or counted
    competing = {b: members for b, members in competing.items() if len(members) >= MIN_RUNS} or competing
    best: tuple[T, list[T]] | None = None
    for members in competing.values():  # ascending batch sizes: a tie keeps the smaller
        run = members[median_index([m.tokens_per_second for m in members])]
        if best is None or run.tokens_per_second > best[0].tokens_per_second:
            best = run, members
    return best


def headline(runs: list[Result], phase: Callable[[Result], str | None] = _no_phase) -> Headline:
    """The headline of one group's results by the headline rule (best_batch_runs): its figures are all its median
    run's, its spread that of the runs the median is over."""
    if len({r.group for r in runs}) > 1:
        raise ValueError("runs of different groups cannot share a headline")
    chosen = best_batch_runs(runs, phase)
    if chosen is None:
        raise ValueError("a headline needs at least one run")
    return Headline(*chosen)


def group_runs(runs: list[Result]) -> dict[RunGroup, list[Result]]:
    """Results by the group they may be compared in (every batch size of it), in RunGroup order."""
    groups: dict[RunGroup, list[Result]] = {}
    for run in runs:
        groups.setdefault(run.group, []).append(run)
    return dict(sorted(groups.items()))


def spread_warning(h: Headline) -> str | None:
    """A one-line warning when the runs of a headline spread more than SPREAD_WARNING, else None."""
    if not h.noisy:
        return None
    return (
        f"the {len(h.runs)} runs of {h.run.precision.effective} batch {h.run.batch_size} spread "
        f"{h.spread:.1%} ({h.low:,.1f}-{h.high:,.1f} tokens/s, more than {SPREAD_WARNING:.0%}): a noisy host?"
    )


if __name__ == "__main__":  # the README's field lists: python -m llmb.records
    for record_type in (Result, Conformance, Commbench, SweepTrial):
        print(f"{record_type.__name__}: `{describe(record_type)}`\n")
