"""The report's tables: the best batch size per precision, comparisons, scaling and failures, and the
reference's ratios at the same shape and precision."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from llmb.api.settings import did_you_mean
from llmb.records import (
    over_peak_warning,
)
from llmb.report.points import Point, by_group, by_standing, headline, noisy_warning, spread
from llmb.spec import peak_table as peaks
from llmb.spec.vocab import PRECISIONS
from llmb.terminal import console as term

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
            listed = ", ".join(sorted(methods))
            if baseline:
                note = f"No baseline: no run of {baseline!r} (--baseline takes one of {listed}"
                note += f"{did_you_mean(baseline, methods)})"
            else:
                note = f"No baseline: no run with default settings (--baseline METHOD compares against one of {listed})"
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
    note = "From sweep logs: oom, crash, timeout, invalid or refused."
    return Table("failures", "Failed trials", columns, rows, note)


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
