"""The points a report is made of: runs loaded from result files, sweep folders and bundles, grouped by
what they ran, with each group's headline by the rule the sweep and summary.md share (records.best_batch_runs)."""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from llmb.api.errors import LlmbError, UsageError
from llmb.bundle import reader as bundle_io
from llmb.bundle.reader import Refused
from llmb.records import (
    RECORD_LIMIT,
    RESULT_SCHEMAS,
    SPREAD_WARNING,
    SWEEP_LOG_NAME,
    SWEEP_SUMMARY_NAME,
    SWEEP_SUMMARY_SCHEMA,
    PluginRef,
    RecordError,
    Result,
    best_batch_runs,
    counted_runs,
    median_index,
    outputs,
    read_sweep_log,
)
from llmb.records import files as record_files
from llmb.spec import flops
from llmb.spec import peak_table as peaks
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
    """Result JSON files, directories of them, sweep directories and submission bundles (searched recursively), a
    bundle's .tar.gz too: unpacked under the limits `llmb verify` keeps, its files named as inside the archive."""
    if not paths:
        raise UsageError("give at least one result file or directory")
    unpacked: dict[str, str] = {}  # where an archive was unpacked -> the archive's path as given

    def named(text: str) -> str:
        for root, archive in unpacked.items():
            text = text.replace(root, archive)
        return text

    with contextlib.ExitStack() as stack:
        given = []
        for path in map(_usable, paths):
            if path.is_file() and path.name.endswith(ARCHIVE_SUFFIXES):
                try:
                    root = stack.enter_context(bundle_io.open_bundle(path))
                except Refused as exc:
                    raise LlmbError(f"{path}: bundle refused: {exc}") from None
                unpacked[str(root)] = str(path)
                path = root
            given.append(path)
        try:
            inputs = _load(given)
        except LlmbError as exc:  # a usage error stays one; the message names the archive, not where it was unpacked
            if not unpacked:
                raise
            raise (UsageError if isinstance(exc, UsageError) else LlmbError)(named(str(exc))) from None
    inputs.sources = [named(s) for s in inputs.sources]
    inputs.skipped = [named(s) for s in inputs.skipped]
    for point in inputs.points:
        point.source = named(point.source)
    return inputs


# A bundle's archive, as `llmb package-submission --archive` writes it.
ARCHIVE_SUFFIXES = (".tar.gz", ".tgz")


def _load(paths: list[Path]) -> Inputs:
    records: dict[str, tuple[Result, Path]] = {}
    logs, log_files = [], []
    inputs = Inputs()
    for path in paths:
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
                foreign = None if explicit else record_files.foreign(data, file, RESULT_SCHEMAS)
                if foreign:  # no llmb record, or a version this llmb does not read: named, never dropped unsaid
                    raise record_files.Unreadable(foreign)
                record = record_files.parse(Result, data) if schema in RESULT_SCHEMAS else None
            except ValueError as exc:  # Unreadable says why; RecordError (a log that is no sweep log) names its file
                inputs.skipped.append(
                    str(exc) if isinstance(exc, RecordError) else record_files.skipped_line(file, exc)
                )
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
        if t.precision not in finished_precisions(file.parent)
    }  # fmt: skip
    for record, file in records.values():
        inputs.points.append(point_from_record(record, phases.get(record.run_id), str(file)))
        inputs.points[-1].unfinished = record.run_id in unfinished
    for (header, trials), file in zip(logs, log_files, strict=True):
        try:
            inputs.points.extend(failed_points(header, trials, records))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:  # the header is not typed
            inputs.skipped.append(f"{file}: incomplete sweep log ({exc.__class__.__name__}: {exc})")
        inputs.skipped.extend(missing_results(trials, records, file))
    if not inputs.points:
        raise LlmbError(record_files.none_read_line("results", paths, inputs.skipped))
    return inputs


def missing_results(trials: list, records: dict, log: Path) -> list[str]:
    """One line per trial that a sweep log says finished ok and whose result file is gone from beside it: its point is
    left out of the report, and said (a file present but not read, or unreadable, is another line's business)."""
    lines = []
    for trial in trials:
        name = Path(str(trial.result or "")).name  # the log's word: a file name beside it, never a path elsewhere
        if trial.ok and trial.run_id not in records and name and not (log.parent / name).exists():
            lines.append(
                f"{log.parent / name}: the result of {trial.precision} at batch {trial.batch_size} ({trial.phase}), "
                f"ok in {log.name}, is gone: its point is left out"
            )
    return lines


def finished_precisions(folder: Path) -> set[str]:
    """The precisions whose search a sweep folder's summary says ended; none where it has no readable summary (a
    sweep interrupted before its first precision ended)."""
    try:
        summary = json.loads(record_files.read_regular(folder / SWEEP_SUMMARY_NAME, RECORD_LIMIT))
        entries = summary["precisions"].items()
        return {name for name, entry in entries if entry.get("status") != "not run yet"}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return set()


def interrupted_sweeps(results_dir: Path) -> list[str]:
    """One line per sweep under a results folder that was interrupted before the search of a precision it ran ended:
    its figure there is the best so far, as `llmb report` says, not the sweep's answer."""
    lines = []
    for path in record_files.under(results_dir, SWEEP_LOG_NAME):
        try:
            _, trials = read_sweep_log(path, skipped=[])
        except RecordError:
            continue  # sweep_phases names a log that does not read
        finished = finished_precisions(path.parent)
        left = sorted({t.precision for t in trials} - finished, key=lambda p: (p not in PRECISIONS, p))
        if left:
            lines.append(
                f"the sweep in {path.parent} was interrupted before its search of {', '.join(left)} ended: its runs "
                f"there are the best so far, not its answer (llmb sweep --resume --out {path.parent} finishes it)"
            )
    return lines


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
    return record_files.under(directory, "*.json", SWEEP_LOG_NAME)


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
