"""Reports from result files, sweeps and submission bundles: tables (console, markdown, HTML, CSV, JSON) and plots.

Every figure comes from a result record or a sweep log as written; the report measures nothing and never asks an
installed plugin (a record names its plugin's settings and defaults). Runs are grouped by plugin, settings, device,
precision, mode, shape and job layout (devices, nodes, strategy), and within a group by batch size; runs that differ
in any of these are never pooled. A batch's figure is its median run (records.median_index: a run that happened);
the headline of a group is its best batch's by the rule the sweep and summary.md share (records.best_batch_runs):
where a sweep re-ran its best batch, that batch and its re-runs decide (the search trials that picked it are not
counted again); otherwise a batch with enough runs for a median, the fastest of those.
"""

from __future__ import annotations

import base64
import csv
import datetime as dt
import html
import io
import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rich.console import Console

from llmb.api.errors import LlmbError, UsageError
from llmb.bundle.reader import read_regular
from llmb.records import (
    RECORD_LIMIT,
    REPORT_SCHEMA,
    RESULT_SCHEMA,
    SPREAD_WARNING,
    SWEEP_LOG_NAME,
    SWEEP_SUMMARY_NAME,
    SWEEP_SUMMARY_SCHEMA,
    PluginRef,
    Result,
    best_batch_runs,
    counted_runs,
    envelope,
    median_index,
    outputs,
    over_peak_warning,
    read_sweep_log,
)
from llmb.records import files as record_files
from llmb.records.result_files import write_bytes_atomic
from llmb.spec import flops
from llmb.spec import peak_table as peaks
from llmb.spec.version import __version__
from llmb.spec.vocab import PRECISIONS, REPORT_FORMATS
from llmb.terminal import console as term

FORMATS = REPORT_FORMATS
SUFFIX_FORMATS = {".md": "md", ".markdown": "md", ".html": "html", ".htm": "html", ".csv": "csv", ".json": "json"}


@dataclass
class Point:
    """One run (or one failed sweep trial) as the report sees it."""

    method: str  # the plugin
    settings: str  # its settings that differ from its defaults ("defaults" when none)
    device: str
    precision: str
    mode: str
    shape: str  # the preset or its dimensions, and the parameter count
    batch_size: int
    status: str = "ok"
    phase: str | None = None  # "search" or "repeat" for sweep trials, None for plain runs
    world_size: int = 1
    nodes: int = 1
    parallel: str | None = None
    tokens_per_second: float | None = None
    tokens_per_second_per_device: float | None = None
    tokens_per_joule: float | None = None  # per device, over the measured windows (llmb.records.energy)
    tflops_per_device: float | None = None
    mfu: float | None = None  # None for a precision outside the closed four (FP8): no MFU against a BF16 peak
    matmul_peak_efficiency: float | None = None  # model GEMM FLOP/s against the matmul peak measured in the run
    peak: str = ""  # the MFU's peak: its figure, origin ("llmb table" or "declared by plugin") and source
    peak_memory_bytes: int | None = None
    step_seconds: float | None = None
    load_average: float | None = None  # the host's 1-minute load when the run ended
    validity: str = ""
    detail: str = ""
    run_id: str | None = None
    source: str = ""
    threads: tuple[int, ...] = ()  # intra-op threads of each rank (a scaling baseline must have run the same)
    global_batch: int | None = None
    torch: str = ""  # the torch version that ran it
    steps: str = ""  # measured and warmup steps, as "50 + 5 warmup"
    reference: bool = False  # chosen with --reference: the "x vs reference" ratios are against it
    unfinished: bool = False  # a trial of a sweep whose search of this precision has not ended (interrupted)

    @property
    def closed(self) -> bool:
        """Whether it ran one of the benchmark's four precisions (FP8 and anything lower did not)."""
        return self.precision in PRECISIONS

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def group(self) -> tuple:
        """What runs must share to be compared at all (the batch size varies within a group)."""
        return (
            self.method,
            self.settings,
            self.device,
            self.precision,
            self.mode,
            self.shape,
            self.world_size,
            self.nodes,
            self.parallel,
        )

    @property
    def label(self) -> str:
        return self.method if self.settings == "defaults" else f"{self.method} {self.settings}"


# Loading


@dataclass
class Inputs:
    points: list[Point] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def load(paths: list[Path]) -> Inputs:
    """Result JSON files, directories of them, sweep directories and submission bundles (searched recursively)."""
    if not paths:
        raise UsageError("give at least one result file or directory")
    records: dict[str, tuple[Result, Path]] = {}
    logs, log_files = [], []
    inputs = Inputs()
    for path in paths:
        path = _usable(path)
        if not path.exists():
            raise UsageError(f"{path} does not exist")
        inputs.sources.append(str(path))
        explicit = path.is_file()
        for file in [path] if explicit else _files(path):
            try:
                if file.suffix == ".jsonl":
                    logs.append(read_sweep_log(file, RECORD_LIMIT, skipped=inputs.skipped))
                    log_files.append(file)
                    continue
                data = record_files.read_object(file, RECORD_LIMIT)  # FIFO, giant, deep, torn: named, skipped
                schema = data.get("schema")
                record = record_files.parse(Result, data) if schema == RESULT_SCHEMA else None
            except ValueError as exc:  # Unreadable says why; RecordError: a log that is no sweep log
                inputs.skipped.append(record_files.skipped_line(file, exc))
                continue
            if record is not None:
                if record.run_id in records:  # one run read twice (a copy): the first read is kept, the copy named
                    inputs.skipped.append(record_files.duplicate_line(file, record.run_id, records[record.run_id][1]))
                else:
                    records[record.run_id] = (record, file)
            elif explicit and schema != SWEEP_SUMMARY_SCHEMA:
                raise UsageError(f"{file} is not an llmb result (schema {schema!r})")
    phases = {t.run_id: t.phase for _, trials in logs for t in trials if t.run_id}
    unfinished = {
        t.run_id for (_, trials), file in zip(logs, log_files, strict=True) for t in trials
        if t.precision not in _finished_precisions(file.parent)
    }  # fmt: skip
    for record, file in records.values():
        inputs.points.append(point_from_record(record, phases.get(record.run_id), str(file)))
        inputs.points[-1].unfinished = record.run_id in unfinished
    for (header, trials), file in zip(logs, log_files, strict=True):
        try:
            inputs.points.extend(failed_points(header, trials, records))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:  # the header is not typed
            inputs.skipped.append(f"{file}: incomplete sweep log ({exc.__class__.__name__}: {exc})")
    if not inputs.points:
        skipped = f" (skipped: {'; '.join(inputs.skipped[:3])})" if inputs.skipped else ""
        raise LlmbError(f"no llmb results found in {', '.join(map(str, paths))}{skipped}")
    return inputs


def _finished_precisions(folder: Path) -> set[str]:
    """The precisions whose search a sweep folder's summary says ended; none where it has no readable summary (a
    sweep interrupted before its first precision ended)."""
    try:
        summary = json.loads(read_regular(folder / SWEEP_SUMMARY_NAME, RECORD_LIMIT))
        entries = summary["precisions"].items()
        return {name for name, entry in entries if entry.get("status") != "not run yet"}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return set()


def _usable(path: Path | str) -> Path:
    """A path given on the command line, refused in one line when no file system takes it (too long, a NUL)."""
    problem = outputs.path_problem(path)
    if problem:
        raise UsageError(f"{term.clean(path, limit=80)}: not a usable path ({problem})")
    return Path(path)


def mark_reference(inputs: Inputs, selector: str) -> None:
    """Mark the reference's points: a run id (or a unique start of one) among the inputs, or a result file, sweep
    directory or submission bundle, read and added to the inputs where its runs are not among them already."""
    if not selector.strip():
        raise UsageError("--reference is empty: give a run id, a result file, a sweep directory or a bundle")
    problem = outputs.path_problem(selector)
    if problem:  # a value no file system takes as a path (too long, a NUL) is no run id either
        shown = selector if len(selector) <= 80 else f"{selector[:80]}... ({len(selector):,} characters)"
        raise UsageError(f"--reference {shown!r} is no run id, and no path ({problem})")
    path = Path(selector)
    if path.exists():
        found = load([path])
        ids = {p.run_id for p in found.points if p.run_id}
        if not ids:
            raise UsageError(f"--reference {selector}: no finished run in it")
        known = {p.run_id for p in inputs.points if p.run_id}
        if not ids <= known:  # not among the inputs: shown beside them (its failed trials too)
            added = [p for p in found.points if p.run_id not in known]
            for p in added:
                p.reference = True
            inputs.points.extend(added)
            inputs.sources.extend(s for s in found.sources if s not in inputs.sources)
            inputs.skipped.extend(found.skipped)
        for p in inputs.points:
            p.reference = p.reference or p.run_id in ids
        return
    runs = {p.run_id: p for p in inputs.points if p.run_id and p.ok}
    matches = [r for r in runs if r == selector] or [r for r in runs if selector and r.startswith(selector)]
    if len(matches) == 1:
        runs[matches[0]].reference = True
        return
    # Run ids only (the error line is capped): `--format csv` names each run's method, precision and shape.
    listed = sorted(runs)
    more = f" and {len(listed) - 24} more" if len(listed) > 24 else ""
    why = f"starts {len(matches)} run ids" if matches else "is no file or folder, and no run id in these results"
    raise UsageError(
        f"--reference {selector!r} {why}; give a result file, sweep directory or bundle, or one of the run ids "
        f"(llmb report --format csv names their runs): {', '.join(listed[:24])}{more}"
    )


def _files(directory: Path) -> list[Path]:
    found = [*directory.rglob("*.json"), *directory.rglob(SWEEP_LOG_NAME)]
    # Hidden paths hold a sweep's scratch (a trial in flight) and temporary files of atomic writes.
    return sorted(f for f in found if not any(part.startswith(".") for part in f.relative_to(directory).parts))


def point_from_record(record: Result, phase: str | None, source: str) -> Point:
    world_size = record.world_size
    per_device = record.tokens_per_second_per_device or record.tokens_per_second / world_size
    if record.valid:
        validity = "valid"
    else:
        validity = "invalid" if record.invalid_reasons else "debug"
    return Point(
        method=record.plugin.name,
        settings=record.plugin.settings_label(),
        device=record.device.name,
        precision=record.precision.effective,
        mode=record.precision.mode,
        shape=record.shape,
        batch_size=record.batch_size,
        phase=phase,
        world_size=world_size,
        nodes=record.nodes,
        parallel=None if record.parallel == "none" else record.strategy,  # a layout (fsdp tp2 ...) is its own row
        tokens_per_second=record.tokens_per_second,
        tokens_per_second_per_device=per_device,
        tokens_per_joule=record.energy.tokens_per_joule if record.energy else None,
        tflops_per_device=flops.achieved_tflops(per_device, record.model_flops_per_token),
        # The rules' lowest-bit principle: a run below the four precisions (FP8) has no MFU here, whatever peak a
        # plugin declared (as torchtitan: a BF16 datasheet peak is not an FP8 run's ceiling).
        mfu=record.mfu if record.precision.effective in PRECISIONS else None,
        matmul_peak_efficiency=record.matmul_peak_efficiency,
        peak=peaks.peak_note(record) if record.precision.effective in PRECISIONS else "",
        peak_memory_bytes=record.peak_memory_bytes,
        step_seconds=record.timing.window_seconds / record.steps,
        torch=record.software.torch,
        steps=f"{record.steps} + {record.warmup_steps} warmup",
        load_average=record.host.load_average_end[0] if record.host and record.host.load_average_end else None,
        validity=validity,
        detail="; ".join(record.invalid_reasons),
        run_id=record.run_id,
        source=source,
        threads=tuple(record.threads_per_rank or ()),
        global_batch=record.global_batch_size,
    )


def failed_points(header: dict, trials: list, records: dict) -> list[Point]:
    """Points for a sweep's failed trials, named like its successful runs so they land in the same group."""
    made = [records[t.run_id][0] for t in trials if t.run_id in records]
    if made:  # the sweep's own results name the device, settings and shape as the report shows them
        like = point_from_record(made[0], None, "")
        method, settings, device, shape = like.method, like.settings, like.device, like.shape
    else:
        plugin = PluginRef(name=str(header.get("plugin")), version="", distribution="", settings=header.get("settings"))
        method, settings, device = plugin.name, plugin.settings_label(), str(header.get("device"))
        shape = str(header.get("preset"))
    return [
        Point(
            method,
            settings,
            device,
            t.precision,
            str(header.get("mode")),
            shape,
            t.batch_size,
            t.status,
            t.phase,
            detail=t.detail,
        )
        for t in trials
        if not t.ok
    ]


# Aggregation


def by_group(points: list[Point]) -> dict[tuple, list[Point]]:
    groups: dict[tuple, list[Point]] = {}
    for p in points:
        groups.setdefault(p.group, []).append(p)
    order = {name: i for i, name in enumerate(PRECISIONS)}

    def key(item):
        method, settings, device, prec, mode, shape, world_size, nodes, parallel = item[0]
        return (method, settings, device, order.get(prec, 9), prec, mode, shape, world_size, nodes, parallel or "")

    return dict(sorted(groups.items(), key=key))


def median_run(runs: list[Point]) -> Point:
    return runs[median_index([r.tokens_per_second for r in runs])]


def batch_runs(points: list[Point]) -> dict[int, list[Point]]:
    """Per batch size, the runs that count: a sweep's re-runs where the batch has any, else all its runs."""
    ok: dict[int, list[Point]] = {}
    for p in points:
        if p.ok:
            ok.setdefault(p.batch_size, []).append(p)
    return {b: counted_runs(runs, lambda p: p.phase) for b, runs in sorted(ok.items())}


def batch_medians(points: list[Point]) -> dict[int, Point]:
    """Per batch size, the median run over the runs that count."""
    return {b: median_run(runs) for b, runs in batch_runs(points).items()}


# A headline comes from the best standing its group has: a valid run, else a debug one (a non-official shape), and
# only where nothing else finished an invalid one, so a faster invalid run never heads a row over a valid one.
STANDING = {"valid": 0, "debug": 1}


def by_standing(points: list[Point]) -> tuple[list[Point], int]:
    """A group's finished runs of its best standing, and how many finished runs that leaves out (invalid ones)."""
    ok = [p for p in points if p.ok]
    standing = {id(p): STANDING.get(p.validity, len(STANDING)) for p in ok}
    best = min(standing.values(), default=len(STANDING))
    kept = [p for p in ok if standing[id(p)] == best]
    return kept, len(ok) - len(kept)


def headline(points: list[Point]) -> tuple[Point | None, list[Point]]:
    """(the headline run, the runs its median is over) for one group, from its runs of the best standing, by the
    headline rule every reader shares (records.best_batch_runs)."""
    ok, _ = by_standing(points)
    chosen = best_batch_runs(ok, lambda p: p.phase)
    return chosen if chosen is not None else (None, [])


def spread(best: Point, runs: list[Point]) -> tuple[float, float, float]:
    """(lowest, highest, (highest - lowest) / headline) tokens/s of a headline's runs."""
    values = [r.tokens_per_second for r in runs]
    return min(values), max(values), (max(values) - min(values)) / best.tokens_per_second


def noisy_warning(best: Point, runs: list[Point]) -> str | None:
    low, high, ratio = spread(best, runs)
    if ratio <= SPREAD_WARNING:
        return None
    loads = [r.load_average for r in runs if r.load_average is not None]
    load = f"; host load up to {max(loads):.2f}" if loads else ""
    return (
        f"{best.label}, {best.precision} {best.mode}, {best.shape}, batch {best.batch_size}: the {len(runs)} runs "
        f"spread {ratio:.1%} ({low:,.1f}-{high:,.1f} tokens/s, more than {SPREAD_WARNING:.0%}){load}"
    )


# Tables


def _num(fmt: str) -> Callable:
    return lambda v: "" if v is None else format(v, fmt)


def _memory(v) -> str:
    if v is None:
        return "n/a"
    return f"{v / 2**30:.2f} GiB" if v >= 2**30 else f"{v / 2**20:.0f} MiB"


def _seconds(v) -> str:
    return "" if v is None else (f"{v:.3f} s" if v >= 1 else f"{v * 1000:.1f} ms")


def _ratio(v) -> str:
    return "" if v is None else f"{v:.2f}x"


def _percent(v) -> str:
    return "n/a" if v is None else f"{v:.1%}"


def _range(v) -> str:
    return "" if v is None else f"{v[0]:,.1f}-{v[1]:,.1f}"


@dataclass
class Column:
    key: str
    header: str
    fmt: Callable = str
    numeric: bool = False
    missing: str = ""  # shown for None


@dataclass
class Table:
    name: str
    title: str
    columns: list[Column]
    rows: list[dict]
    note: str = ""
    warnings: list[str] = field(default_factory=list)

    def cells(self) -> list[list[str]]:
        """Each row's cells as printable text: the records' own text (names, settings, reasons) capped and with
        control characters shown, in every format."""
        return [
            [c.missing if row.get(c.key) is None else term.clean(c.fmt(row[c.key])) for c in self.columns]
            for row in self.rows
        ]

    def to_json(self) -> dict:
        return {"name": self.name, "title": self.title, "note": self.note, "warnings": self.warnings, "rows": self.rows}


TOKENS = Column("tokens_per_second", "Tokens/s", _num(",.1f"), True)
SPREAD = Column("spread", "Spread (min-max)", _range, True)
TFLOPS = Column("tflops_per_device", "TFLOP/s", _num(".3g"), True)
TOKENS_PER_JOULE = Column("tokens_per_joule", "Tokens/J", _num(",.4g"), True, "n/a")
MFU = Column("mfu", "MFU", _percent, True, "n/a")
MEMORY = Column("peak_memory_bytes", "Peak memory", _memory, True, missing="n/a")
METHOD = Column("method", "Method")
SETTINGS = Column("settings", "Settings")
SHAPE = Column("shape", "Shape")


EFFICIENCY = Column("matmul_peak_efficiency", "vs matmul peak", _percent, True, "n/a")
VERSUS_REFERENCE = Column("vs_reference", "x vs reference", _ratio, True, "n/a")
CLOSED = "/".join(PRECISIONS)


# The reference (--reference): ratios at the same shape and precision only


def reference_bests(points: list[Point]) -> dict[tuple[str, str], Point]:
    """Per (shape, precision), the reference's headline run (its fastest group's where it has several)."""
    bests: dict[tuple[str, str], Point] = {}
    for ps in by_group([p for p in points if p.reference]).values():
        best, _ = headline(ps)
        if best is None:
            continue
        key = (best.shape, best.precision)
        if key not in bests or best.tokens_per_second > bests[key].tokens_per_second:
            bests[key] = best
    return bests


def versus_reference(p: Point, refs: dict[tuple[str, str], Point]) -> float | None:
    """A run's tokens/s over the reference's at its own shape and precision; None where the reference has none
    (never a ratio across shapes or precisions: a smaller model is not a faster device)."""
    ref = refs.get((p.shape, p.precision))
    return p.tokens_per_second / ref.tokens_per_second if ref is not None and p.tokens_per_second else None


def reference_note(refs: dict[tuple[str, str], Point]) -> str:
    if not refs:
        return " x vs reference: n/a everywhere (the reference has no finished run)."
    each = "; ".join(
        f"{shape} {prec}: {ref.label} on {ref.device}, batch {ref.batch_size}, {ref.tokens_per_second:,.1f} tokens/s"
        for (shape, prec), ref in sorted(refs.items())
    )
    return (
        " x vs reference: tokens/s over the reference's headline at the same shape and precision, n/a where the "
        f"reference has no run at that shape and precision (never a ratio across shapes). The reference: {each}."
    )


def best_table(points: list[Point], refs: dict[tuple[str, str], Point] | None = None, outside: bool = False) -> Table:
    """The headline per group: of the closed precisions, or (outside=True) of the runs below them (FP8)."""
    multi = any(p.world_size > 1 for p in points)
    rows, warnings = [], []
    for (method, settings, device, prec, mode, shape, world_size, nodes, parallel), group in by_group(points).items():
        best, runs = headline(group)
        failed = sorted({p.status for p in group if not p.ok})
        row = {
            "method": method,
            "settings": settings,
            "device": device,
            "precision": prec,
            "mode": mode,
            "shape": shape,
        }
        if multi:
            row.update(devices=world_size, nodes=nodes, parallel=parallel or "")
        if best is None:
            row.update(status="no run finished" + (f" ({', '.join(failed)})" if failed else ""))
        else:
            low, high, _ = spread(best, runs)
            warning = noisy_warning(best, runs)
            if warning:
                warnings.append(warning)
            if any(p.unfinished for p in group):
                warnings.append(
                    f"{best.label}, {best.precision} {best.mode}: the sweep was interrupted before its search ended; "
                    f"batch {best.batch_size} is the best so far, not its answer (llmb sweep --resume finishes it)"
                )
            load = "not recorded" if best.load_average is None else f"{best.load_average:.2f}"
            over_peak = over_peak_warning(best.matmul_peak_efficiency, load)
            if over_peak:
                warnings.append(f"{best.label}, {best.precision} {best.mode}, batch {best.batch_size}: {over_peak}")
            row.update(
                best_batch_size=best.batch_size,
                tokens_per_second=best.tokens_per_second,
                spread=[low, high],
                tokens_per_joule=best.tokens_per_joule,
                tflops_per_device=best.tflops_per_device,
                mfu=best.mfu,
                matmul_peak_efficiency=best.matmul_peak_efficiency,
                peak_memory_bytes=best.peak_memory_bytes,
                runs=len(runs),
                status=best.validity
                + ("; sweep not finished: best so far" if any(p.unfinished for p in group) else "")
                + ("; reference" if best.reference else "")
                + ("; MFU " + best.peak if peaks.ORIGIN_DECLARED in best.peak else "")
                + ("; noisy" if warning else "")
                + ("; over the measured matmul peak" if over_peak else "")
                + (f"; larger batches: {', '.join(failed)}" if failed else "")
                + (f"; {dropped} invalid runs left out" if (dropped := by_standing(group)[1]) else ""),
            )
            if refs is not None:
                row["vs_reference"] = versus_reference(best, refs)
        rows.append(row)
    columns = [METHOD, SETTINGS, Column("device", "Device"), Column("precision", "Precision"), Column("mode", "Mode")]
    columns.append(SHAPE)
    if multi:
        columns += [
            Column("devices", "Devices", str, True),
            Column("nodes", "Nodes", str, True),
            Column("parallel", "Strategy"),
        ]
    columns += [Column("best_batch_size", "Best batch", str, True), TOKENS, SPREAD, TOKENS_PER_JOULE, TFLOPS]
    columns += [MEMORY] if outside else [MFU, EFFICIENCY, MEMORY]
    columns += [VERSUS_REFERENCE] if refs is not None else []
    columns += [Column("runs", "Runs", str, True), Column("status", "Result")]
    efficiency = (
        "'vs matmul peak' is the run's model FLOP/s against the dense matmul rate measured in the same run at its "
        "own GEMM shapes (llmb.run.roofline), so every device, the CPU included, has an efficiency."
    )
    if outside:
        note = (
            f"These runs' audited precision is below the benchmark's closed precisions ({CLOSED}), e.g. FP8 from "
            "torchao's float8: by the rules' lowest-bit principle they are outside the benchmark, kept apart from its "
            "rows and never on its leaderboard. No MFU is given (a BF16 datasheet peak is not an FP8 run's ceiling); "
            "'vs matmul peak' is against the float8 GEMM rate (torch._scaled_mm) measured in the same run."
        )
        title = f"Outside the benchmark's precisions ({CLOSED})"
    else:
        note = (
            "Tokens/s is the median run at the best batch size (over a sweep's re-runs where it made them), a run "
            "that happened, of the valid runs where a row has any (else debug-shape, else invalid ones); the spread "
            "is the lowest and highest tokens/s of those runs. TFLOP/s, MFU and peak memory "
            "are the median run's, TFLOP/s and MFU per device, MFU against llmb's peak table "
            "(llmb/spec/peak_table.py) or, "
            "where the result says so, a peak declared by the plugin, and n/a where the device's peak is not known; "
            + efficiency
        )
        title = "Best batch size per precision"
    note += (
        " Tokens/J is the median run's tokens per joule of one device over its measured windows "
        "(llmb.records.energy), n/a where the device has no energy counter (the result says why)."
    )
    if refs is not None:
        note += reference_note(refs)
    return Table("outside" if outside else "best", title, columns, rows, note, warnings)


def comparison_tables(
    points: list[Point], baseline: str | None = None, refs: dict[tuple[str, str], Point] | None = None
) -> list[Table]:
    """lit-gpt style: per device, precision and shape, each method's best time, memory and speed-up over the
    baseline (and, with a reference, its ratio against the reference at the same shape and precision)."""
    sets: dict[tuple, list[tuple[Point, list[Point]]]] = {}
    for (_method, _settings, device, prec, mode, shape, world_size, _nodes, _), group in by_group(points).items():
        best, runs = headline(group)
        if best is not None and world_size == 1:
            sets.setdefault((device, prec, mode, shape), []).append((best, runs))
    tables = []
    for (device, prec, mode, shape), bests in sets.items():
        if len(bests) < 2:
            continue
        methods = {b.label: b for b, _ in bests}
        base = methods.get(baseline) if baseline else next((b for b, _ in bests if b.settings == "defaults"), None)
        rows = []
        for b, runs in sorted(bests, key=lambda item: -item[0].tokens_per_second):
            low, high, _ = spread(b, runs)
            rows.append(
                {
                    "method": b.method,
                    "settings": b.settings,
                    "shape": b.shape,
                    "batch_size": b.batch_size,
                    "step_seconds": b.step_seconds,
                    "tokens_per_second": b.tokens_per_second,
                    "spread": [low, high],
                    "peak_memory_bytes": b.peak_memory_bytes,
                    "speedup": b.tokens_per_second / base.tokens_per_second if base else None,
                    **({"vs_reference": versus_reference(b, refs)} if refs is not None else {}),
                }
            )
        columns = [
            METHOD,
            SETTINGS,
            SHAPE,
            Column("batch_size", "Batch", str, True),
            Column("step_seconds", "Time/step ↓", _seconds, True),
            Column("tokens_per_second", "Tokens/s ↑", TOKENS.fmt, True),
            SPREAD,
            Column("peak_memory_bytes", "Memory ↓", _memory, True, missing="n/a"),
            Column("speedup", "Speed-up ↑", _ratio, True),
            *([VERSUS_REFERENCE] if refs is not None else []),
        ]
        if base:
            note = f"Speed-up in tokens/s over {base.label} (each method at its best batch size)."
        else:
            note = f"No baseline: no run of {baseline!r}" if baseline else "No baseline: no run with default settings"
            note += " (--baseline METHOD names the run to compare against)"
        if refs is not None:
            note += reference_note({k: v for k, v in refs.items() if k == (shape, prec)})
        title = f"Methods on {device}, {prec}" + (f" ({mode})" if mode != "pure" else "") + f", {shape}"
        if prec not in PRECISIONS:
            title += f" (outside the benchmark's precisions, {CLOSED})"
        tables.append(Table("methods", title, columns, rows, note))
    return tables


def scaling_tables(points: list[Point]) -> list[Table]:
    """nanotron style: devices -> tokens/s, per device, efficiency against one device, when there is more than one."""
    if not any(p.world_size > 1 for p in points):
        return []
    sets: dict[tuple, dict[tuple, tuple[Point, list[Point]]]] = {}
    for (method, settings, device, prec, mode, shape, world_size, nodes, parallel), group in by_group(points).items():
        best, runs = headline(group)
        if best is not None:
            sets.setdefault((method, settings, device, prec, mode, shape), {})[(world_size, nodes, parallel or "")] = (
                best,
                runs,
            )
    tables = []
    for (method, settings, device, prec, mode, shape), layouts in sets.items():
        if not any(ws > 1 for ws, _, _ in layouts):
            continue
        singles = [p for (ws, _, _), (p, _) in layouts.items() if ws == 1]
        smallest = min((p for p, _ in layouts.values()), key=lambda p: p.world_size)
        base = singles[0] if singles else smallest
        rows = []
        for (ws, nodes, parallel), (p, runs) in sorted(layouts.items()):
            ideal = base.tokens_per_second_per_device
            low, high, _ = spread(p, runs)
            rows.append(
                {
                    "method": method,
                    "settings": settings,
                    "shape": shape,
                    "devices": ws,
                    "nodes": nodes,
                    "parallel": parallel or "single",
                    "batch_size": p.batch_size,
                    "global_batch_size": p.global_batch or p.batch_size * ws,
                    "threads": ",".join(map(str, p.threads)) or "?",
                    "tflops_per_device": p.tflops_per_device,
                    "tokens_per_second_per_device": p.tokens_per_second_per_device,
                    "tokens_per_second": p.tokens_per_second,
                    "spread": [low, high],
                    "efficiency": p.tokens_per_second_per_device / ideal if ideal else None,
                }
            )
        columns = [
            METHOD,
            SETTINGS,
            SHAPE,
            Column("devices", "Devices", str, True),
            Column("nodes", "Nodes", str, True),
            Column("parallel", "Strategy"),
            Column("batch_size", "Batch/device", str, True),
            Column("global_batch_size", "Global batch", str, True),
            TFLOPS,
            Column("tokens_per_second_per_device", "Tokens/s per device", TOKENS.fmt, True),
            TOKENS,
            SPREAD,
            Column("efficiency", "Efficiency", _percent, True),
            Column("threads", "Threads/rank", str, True),
        ]
        against = "1 device" if singles else f"{base.world_size} devices (no 1-device run in the inputs)"
        note = f"Efficiency: tokens/s per device against {against}; each row at its best batch size per device."
        # A baseline that ran other intra-op threads than the ranks makes the efficiency a thread count's ratio.
        other = [f"{ws} ({parallel or 'single'})" for (ws, _, parallel), (p, _) in sorted(layouts.items())
                 if p.threads and base.threads and set(p.threads) != set(base.threads)]  # fmt: skip
        if other:
            note += (
                f" WARNING: the baseline ran {','.join(map(str, base.threads))} thread(s) per rank, the rows for "
                f"{', '.join(other)} did not: their efficiency compares thread counts, not scaling."
            )
        label = method if settings == "defaults" else f"{method} {settings}"
        title = f"Scaling: {label} on {device}, {prec}" + (f" ({mode})" if mode != "pure" else "") + f", {shape}"
        tables.append(Table("scaling", title, columns, rows, note))
    return tables


def failure_table(points: list[Point]) -> Table | None:
    failed = [p for p in points if not p.ok]
    if not failed:
        return None
    rows = [
        {
            "method": p.method,
            "settings": p.settings,
            "shape": p.shape,
            "precision": p.precision,
            "batch_size": p.batch_size,
            "status": p.status,
            "detail": p.detail,
        }
        for p in sorted(failed, key=lambda p: (p.method, p.settings, p.shape, p.precision, p.batch_size))
    ]
    columns = [
        METHOD,
        SETTINGS,
        SHAPE,
        Column("precision", "Precision"),
        Column("batch_size", "Batch", str, True),
        Column("status", "Failure"),
        Column("detail", "Detail"),
    ]
    return Table("failures", "Failed trials", columns, rows, "From sweep logs: oom, crash, timeout or invalid.")


def build_tables(points: list[Point], baseline: str | None = None, reference: bool = False) -> list[Table]:
    """The tables; reference=True adds the "x vs reference" column (against the points marked as the reference)."""
    refs = reference_bests(points) if reference else None
    closed = [p for p in points if p.closed]
    outside = [p for p in points if not p.closed]
    tables = [best_table(closed, refs)] if closed else []
    tables += [best_table(outside, refs, outside=True)] if outside else []
    tables += [*comparison_tables(points, baseline, refs), *scaling_tables(points)]
    failures = failure_table(points)
    return tables + ([failures] if failures else [])


POINT_FIELDS = [f for f in Point.__dataclass_fields__ if f != "source"] + ["source"]


# Plots (matplotlib's Agg canvas through Figure, so no pyplot state and no display is needed)


def _figure(panels: int = 1, sharex: bool = False):
    """A figure of `panels` axes stacked vertically (each with its own y scale), and the list of them."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise LlmbError(
            "plots need matplotlib (an llmb dependency; this install lacks it): pip install matplotlib"
        ) from None
    fig = Figure(figsize=(7.5, 4.5 if panels == 1 else 0.6 + 3.3 * panels), dpi=110, layout="constrained")
    return fig, list(fig.subplots(panels, 1, squeeze=False, sharex=sharex)[:, 0])


def _png(fig) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()


def _method(group: tuple) -> str:
    method, settings = group[:2]
    return method if settings == "defaults" else f"{method} {settings}"


def _label(group: tuple) -> str:
    prec, mode, shape = group[3], group[4], group[5]
    return f"{prec}{' ' + mode if mode != 'pure' else ''} · {shape} · {_method(group)}"


def _series_label(group: tuple, with_device: bool) -> str:
    """A series inside a panel that names its shape: precision, mode, method (and device where several share it)."""
    prec, mode = group[3], group[4]
    device = f" · {group[2]}" if with_device else ""
    return f"{prec}{' ' + mode if mode != 'pure' else ''} · {_method(group)}{device}"


def _batch_axis(ax, batches: set[int]) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(batches))
    ax.set_xticklabels([str(b) for b in sorted(batches)])
    # Neighbouring sizes (48, 64) sit close on a log axis: many ticks are turned so their labels never overlap.
    ax.tick_params(axis="x", labelrotation=45 if len(batches) > 6 else 0, labelsize=8)
    ax.minorticks_off()
    ax.set_xlabel("batch size per device")
    ax.grid(True, alpha=0.3)


def _legend(ax) -> None:
    """The legend beside the axes, never over the data (seven series cover a plot's corner)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1), borderaxespad=0)


def plot_panels(points: list[Point]) -> dict[str, dict[tuple, list[Point]]]:
    """The single-device groups of the versus-batch plots by panel, each panel with its own y scale: one per shape
    (two shapes' tokens/s are never compared, and a small model's curves would flatten a large one's), and the
    --reference's runs in panels of their own (a reference bundle from a slower or faster device would flatten
    the curves it is plotted beside)."""
    panels: dict[tuple[bool, str], dict[tuple, list[Point]]] = {}
    for is_reference in (False, True):
        chosen = [p for p in points if p.reference == is_reference and p.world_size == 1]
        for group, ps in by_group(chosen).items():
            panels.setdefault((is_reference, group[5]), {})[group] = ps
    return {
        (f"reference: {shape}" if is_reference else shape): groups
        for (is_reference, shape), groups in sorted(panels.items())
    }


def _draw(ax, groups: dict[tuple, list[Point]], value: Callable, colors: dict, mark_best: bool, failures: bool):
    """One panel's series: every run faint, the median per batch joined, the best batch starred, failed trials
    marked × on the x axis. Returns the batch sizes drawn."""
    batches: set[int] = set()
    drawn: dict[int, int] = {}  # failures drawn per batch size
    drawn_label = marked = False
    with_device = len({g[2] for g in groups}) > 1
    for group, ps in groups.items():
        color = colors[group]
        runs = [p for p in ps if p.ok and value(p) is not None]
        medians = batch_medians(runs)
        batches.update(p.batch_size for p in ps if p.ok or failures)
        if runs:
            ax.scatter([p.batch_size for p in runs], [value(p) for p in runs], color=color, alpha=0.35, s=14)
            ax.plot(list(medians), [value(p) for p in medians.values()], "o-", color=color,
                    label=_series_label(group, with_device))  # fmt: skip
            if mark_best and medians:
                batch, best = max(medians.items(), key=lambda item: value(item[1]))
                ax.scatter([batch], [value(best)], marker="*", s=220, color=color, edgecolors="black", zorder=6,
                           label=None if marked else "best batch")  # fmt: skip
                marked = True
        failed = [p for p in ps if not p.ok] if failures else []
        if failed:
            # Failed trials have no measurement: marked on the x axis at their batch size, nudged apart where
            # several precisions failed at the same size.
            xs = []
            for p in failed:
                xs.append(p.batch_size * 2 ** (0.04 * drawn.get(p.batch_size, 0)))
                drawn[p.batch_size] = drawn.get(p.batch_size, 0) + 1
            ax.scatter(
                xs,
                [0] * len(failed),
                marker="x",
                s=70,
                color=color,
                linewidths=2,
                clip_on=False,
                zorder=5,
                label=None if drawn_label else "failed (× at its batch size)",
            )
            drawn_label = True
            for x, p in zip(xs, failed, strict=True):
                ax.annotate(
                    p.status, (x, 0), textcoords="offset points", xytext=(0, 7), ha="center", fontsize=7, color=color
                )
    return batches


def _colors(points: list[Point]) -> dict[tuple, str]:
    """One colour per group, the same in every panel and plot."""
    return {group: f"C{i % 10}" for i, group in enumerate(by_group(points))}


def versus_batch_figure(points: list[Point], value: Callable, ylabel: str, title: str, mark_best: bool = False):
    """The figure of a value against batch size, one panel per plot_panels entry; None when nothing has the value."""
    panels = plot_panels(points)
    if not any(value(p) is not None for groups in panels.values() for ps in groups.values() for p in ps if p.ok):
        return None
    fig, axes = _figure(len(panels))
    colors = _colors(points)
    for ax, (name, groups) in zip(axes, panels.items(), strict=True):
        batches = _draw(ax, groups, value, colors, mark_best, failures=True)
        _batch_axis(ax, batches)
        ax.set_ylim(bottom=0)
        ax.set_ylabel(ylabel)
        ax.set_title(f"{title} · {name}", fontsize=10)
        _legend(ax)
    return fig


def _versus_batch(
    points: list[Point], value: Callable, ylabel: str, title: str, mark_best: bool = False
) -> bytes | None:
    fig = versus_batch_figure(points, value, ylabel, title, mark_best)
    return None if fig is None else _png(fig)


def efficiency_figure(points: list[Point]):
    """Both efficiencies against batch size, one panel each: MFU against the datasheet peak, and model GEMM FLOP/s
    against the matmul peak measured in the run. Ratios share a scale, so every single-device series (the reference
    too) is in the same panel; None when no run has either."""
    single = [p for p in points if p.world_size == 1]
    kinds = [
        (
            "MFU (against the datasheet peak)",
            lambda p: None if p.mfu is None else 100 * p.mfu,
            "no datasheet peak is known for these devices and precisions",
        ),
        (
            "against the matmul peak measured in the run",
            # Over 100% the peak was measured low (records.over_peak_warning): no efficiency, so not drawn as one.
            lambda p: (
                None
                if p.matmul_peak_efficiency is None or p.matmul_peak_efficiency > 1
                else 100 * p.matmul_peak_efficiency
            ),
            "no run measured its matmul peak",
        ),
    ]
    # A panel no run has a figure for (MFU on a CPU: no datasheet peak) is left out, not drawn empty.
    kinds = [kind for kind in kinds if any(kind[1](p) is not None for p in single if p.ok)]
    if not kinds:
        return None
    over = sum(1 for p in single if p.ok and (p.matmul_peak_efficiency or 0) > 1)
    fig, axes = _figure(len(kinds), sharex=True)
    colors = _colors(points)
    groups = by_group(single)
    for ax, (name, value, _why_empty) in zip(axes, kinds, strict=True):
        batches = _draw(ax, groups, value, colors, mark_best=False, failures=False)
        _batch_axis(ax, batches)
        ax.set_ylim(bottom=0)
        ax.set_ylabel("% of peak")
        ax.set_title(f"Efficiency vs batch size: {name}", fontsize=10)
        if over and name.startswith("against the matmul peak"):
            ax.text(0.5, 0.02, f"{over} run(s) over 100% left out: their measured matmul peak was low (a busy host?)",
                    ha="center", va="bottom", transform=ax.transAxes, fontsize=8, color="#a60")  # fmt: skip
        _legend(ax)
    return fig


def methods_plot(points: list[Point]) -> bytes | None:
    bests: dict[str, dict[str, Point]] = {}
    for group, ps in by_group(points).items():
        best, _ = headline(ps)
        if best is not None and group[6] == 1:
            bests.setdefault(" · ".join(_label(group).split(" · ")[:2]), {})[_method(group)] = best
    if not bests:
        return None
    methods = sorted({m for per in bests.values() for m in per})
    fig, (ax,) = _figure()
    width = 0.8 / len(methods)
    for i, method in enumerate(methods):
        offset = (i - (len(methods) - 1) / 2) * width
        shown = [(j, per[method]) for j, per in enumerate(bests.values()) if method in per]
        bars = ax.bar(
            [j + offset for j, _ in shown],
            [b.tokens_per_second for _, b in shown],
            width * 0.95,
            label=method,
            color=f"C{i % 10}",
        )
        ax.bar_label(bars, labels=[f"{b.tokens_per_second:,.0f}\nb{b.batch_size}" for _, b in shown], fontsize=7)
    ax.set_xticks(range(len(bests)))
    ax.set_xticklabels(list(bests))
    ax.set_ylabel("tokens/s (median at the best batch)")
    ax.set_title("Best throughput per method and precision")
    ax.margins(y=0.15)
    _legend(ax)
    return _png(fig)


def scaling_plot(tables: list[Table]) -> bytes | None:
    scaling = [t for t in tables if t.name == "scaling"]
    if not scaling:
        return None
    fig, (ax,) = _figure()
    devices: set[int] = set()
    line = 0
    for table in scaling:
        single = [r for r in table.rows if r["parallel"] == "single"]
        base = (single or sorted(table.rows, key=lambda r: r["devices"]))[0]
        for strategy in sorted({r["parallel"] for r in table.rows} - {"single"}):
            rows = sorted(single + [r for r in table.rows if r["parallel"] == strategy], key=lambda r: r["devices"])
            xs = [r["devices"] for r in rows]
            devices.update(xs)
            color = f"C{line % 10}"
            label = f"{table.title.removeprefix('Scaling: ')} · {strategy}"
            ax.plot(xs, [r["tokens_per_second"] for r in rows], "o-", color=color, label=label)
            ideal = [base["tokens_per_second_per_device"] * x for x in xs]
            ax.plot(xs, ideal, ":", color=color, alpha=0.6)
            line += 1
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(devices))
    ax.set_xticklabels([str(d) for d in sorted(devices)])
    ax.minorticks_off()
    ax.set_ylim(bottom=0)
    ax.set_xlabel("devices")
    ax.set_ylabel(f"tokens/s (dotted: linear from {base['devices']} device{'s' if base['devices'] > 1 else ''})")
    ax.set_title("Scaling")
    ax.grid(True, alpha=0.3)
    _legend(ax)
    return _png(fig)


def make_plots(points: list[Point], tables: list[Table]) -> dict[str, bytes]:
    """PNG bytes by file name; a plot with nothing to show is left out."""
    plots = {
        "throughput_vs_batch.png": _versus_batch(
            points, lambda p: p.tokens_per_second, "tokens/s", "Throughput vs batch size", mark_best=True
        ),
        "tflops_vs_batch.png": _versus_batch(
            points, lambda p: p.tflops_per_device, "TFLOP/s per device", "Achieved TFLOP/s vs batch size", True
        ),
        "efficiency_vs_batch.png": (lambda fig: None if fig is None else _png(fig))(efficiency_figure(points)),
        "memory_vs_batch.png": _versus_batch(
            points,
            lambda p: p.peak_memory_bytes / 2**20 if p.peak_memory_bytes else None,
            "peak memory (MiB)",
            "Peak memory vs batch size",
        ),
        "methods.png": methods_plot(points),
        "scaling.png": scaling_plot(tables),
    }
    return {name: png for name, png in plots.items() if png}


# Renderers


md = term.markdown  # record text in a Markdown report: one helper for every Markdown llmb writes


def to_markdown(tables: list[Table], plots: dict[str, str], missing_plots: str = "") -> str:
    """The tables, then the plots as image links (paths relative to the Markdown file where it was written)."""
    lines = ["# llmb report", ""]
    for table in tables:
        lines += [f"## {md(table.title)}", ""]
        lines.append("| " + " | ".join(md(c.header) for c in table.columns) + " |")
        lines.append("|" + "|".join("--:" if c.numeric else "---" for c in table.columns) + "|")
        for cells in table.cells():
            lines.append("| " + " | ".join(md(cell) for cell in cells) + " |")
        lines += ["", f"_{md(table.note)}_" if table.note else "", ""]
        lines += [f"**Noisy:** {md(w)}" for w in table.warnings]
        lines += [""] if table.warnings else []
    if plots or missing_plots:
        lines += ["## Plots", ""]
    for name, path in plots.items():
        # The link target in angle brackets: a path with spaces or parentheses stays one link.
        lines += [f"![{md(name)}](<{path.replace('<', '%3C').replace('>', '%3E')}>)", ""]
    if missing_plots:
        lines += [f"_{md(missing_plots)}_", ""]
    return "\n".join(lines).rstrip() + "\n"


HTML_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1400px; padding: 0 1em; color: #222; }
div.wide { overflow-x: auto; }
table { border-collapse: collapse; margin: 0.5em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.6em; }
th { background: #f3f3f3; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
p.note { color: #666; font-size: 0.85em; } p.warn { color: #a60; }
img { max-width: 100%; display: block; margin: 1em 0; }
"""


def _about(points: list[Point], e: Callable[[object], str]) -> list[str]:
    """What a reader needs before the figures: shapes (with parameters), torch, steps and the hosts' load."""
    measured = [p for p in points if p.ok]
    if not measured:
        return []
    loads = [p.load_average for p in measured if p.load_average is not None]
    items = [
        ("Shapes", sorted({p.shape for p in measured})),
        ("torch", sorted({p.torch for p in measured if p.torch})),
        ("Steps per run", sorted({p.steps for p in measured if p.steps})),
        ("Host load (1 min, at the end of each run)", [f"{min(loads):.2f}-{max(loads):.2f}"] if loads else []),
    ]
    rows = "".join(f"<li><b>{e(name)}:</b> {e(', '.join(values))}</li>" for name, values in items if values)
    return [f"<h2>About these runs</h2><ul class='about'>{rows}</ul>"]


def to_html(tables: list[Table], plots: dict[str, bytes], inputs: Inputs) -> str:
    def e(value: object) -> str:
        return html.escape(term.clean(value, limit=None))

    created = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8"><title>llmb report</title>',
        f"<style>{HTML_STYLE}</style></head><body>",
        "<h1>llmb report</h1>",
        f"<p class='note'>llmb {e(__version__)}, {e(created)}; inputs: {e(', '.join(inputs.sources))}</p>",
    ]
    parts += _about(inputs.points, e)
    for table in tables:
        # A wide table scrolls inside its own box instead of running off the page (the body keeps its margins).
        parts.append(f"<h2>{e(table.title)}</h2><div class='wide'><table><thead><tr>")
        parts += [f"<th>{e(c.header)}</th>" for c in table.columns]
        parts.append("</tr></thead><tbody>")
        for cells in table.cells():
            row = "".join(
                f"<td class='num'>{e(v)}</td>" if c.numeric else f"<td>{e(v)}</td>"
                for c, v in zip(table.columns, cells, strict=True)
            )
            parts.append(f"<tr>{row}</tr>")
        parts.append("</tbody></table></div>")
        if table.note:
            parts.append(f"<p class='note'>{e(table.note)}</p>")
        parts += [f"<p class='warn'><b>Noisy:</b> {e(w)}</p>" for w in table.warnings]
    if plots:
        parts.append("<h2>Plots</h2>")
    for name, png in plots.items():
        data = base64.b64encode(png).decode("ascii")
        parts.append(f"<img alt='{e(name)}' src='data:image/png;base64,{data}'>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def to_csv(points: list[Point]) -> str:
    """One row per run or failed trial: everything the tables are made of."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=POINT_FIELDS, lineterminator="\n")
    writer.writeheader()
    for p in points:  # text fields printable (the CSV may go to a terminal), never a formula (or a spreadsheet)
        writer.writerow({k: term.csv_cell(v) if isinstance(v, str) else v for k, v in asdict(p).items()})
    return buffer.getvalue()


def to_json(tables: list[Table], inputs: Inputs) -> str:
    return json.dumps(
        {
            **envelope(REPORT_SCHEMA),
            "inputs": inputs.sources,
            "tables": [t.to_json() for t in tables],
            "points": [asdict(p) for p in inputs.points],
            "skipped": inputs.skipped,
        },
        indent=2,
    )


def print_tables(tables: list[Table], console: Console) -> None:
    # Titles and cells quote the records (plugin names, settings, devices): plain text, never rich markup.
    for table in tables:
        rich_table = term.table(table.title, caption=term.text(table.note, limit=None), caption_justify="left")
        for c in table.columns:
            term.column(rich_table, c.header, numeric=c.numeric)
        for cells in table.cells():
            term.row(rich_table, *cells)
        console.print(rich_table)
        for warning in table.warnings:
            console.print(term.text(f"NOISY: {warning}", "bold yellow"), soft_wrap=True)


def plot_folder(fmt: str | None, out: Path | None, plot_dir: Path | None) -> Path | None:
    """Where the PNGs are written: --plot DIR; for a Markdown file (which can only link them) without --plot, the
    folder <report name>_plots beside it; else nowhere (HTML embeds them, the console and CSV/JSON have none)."""
    if plot_dir is not None:
        return plot_dir
    if fmt == "md" and out is not None:
        return out.parent / f"{out.stem}_plots"
    return None


def report(
    paths: list[Path],
    fmt: str | None = None,
    out: Path | None = None,
    plot_dir: Path | None = None,
    baseline: str | None = None,
    console: Console | None = None,
    warn: Callable[[str], None] | None = None,
    reference: str | None = None,
) -> str | None:
    """Load the inputs, render the report; return the text (None when printed to the console as rich tables)."""
    if fmt is None and out is not None:
        fmt = SUFFIX_FORMATS.get(out.suffix.lower())
        if fmt is None:
            raise UsageError(f"cannot tell the format from {out.name!r}: give --format ({', '.join(FORMATS)})")
    if fmt is not None and fmt not in FORMATS:
        raise UsageError(f"unknown report format {fmt!r} (choose from {', '.join(FORMATS)})")
    reference_path = [Path(reference)] if reference and os.path.exists(reference) else []
    paths = [_usable(p) for p in paths]
    # Before anything is read or written: the report and its plots never replace, enter or hold an input.
    outputs.refuse_overlap({"--out": out, "--plot": plot_folder(fmt, out, plot_dir)}, [*paths, *reference_path])
    inputs = load(paths)
    if reference is not None:
        mark_reference(inputs, reference)
    for line in inputs.skipped if warn is not None else []:  # every file left out is named
        warn(line)
    labels = sorted({p.label for p in inputs.points})
    if baseline and baseline not in labels:  # a typo must not read as "no baseline" with exit 0
        raise UsageError(f"--baseline {baseline!r} is no method in these results (methods: {', '.join(labels)})")
    tables = build_tables(inputs.points, baseline, reference=reference is not None)
    if baseline and not any(t.name == "methods" for t in tables):
        raise UsageError(f"--baseline {baseline!r}: no comparison table (it needs two methods on the same device)")
    plot_dir = plot_folder(fmt, out, plot_dir)
    png = make_plots(inputs.points, tables) if (plot_dir is not None or fmt == "html") else {}
    links: dict[str, str] = {}
    if plot_dir is not None and png:
        plot_dir.mkdir(parents=True, exist_ok=True)
        for name, data in png.items():
            write_bytes_atomic(plot_dir / name, data)
            # Relative to the Markdown file, so the report and its plots can be moved (or published) together.
            target = plot_dir / name
            links[name] = Path(os.path.relpath(target, out.parent)).as_posix() if out is not None else str(target)
    if fmt is None:
        print_tables(tables, console or term.out)
        return None
    missing = "" if plot_dir is not None else "Plots: give --plot DIR, or --out FILE.md to write them beside it."
    text = {
        "md": lambda: to_markdown(tables, links, missing),
        "html": lambda: to_html(tables, png, inputs),
        "csv": lambda: to_csv(inputs.points),
        "json": lambda: to_json(tables, inputs),
    }[fmt]()
    if out is not None:
        write_bytes_atomic(out, text.encode())
    return text
