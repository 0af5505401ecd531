"""The report's plots, drawn on matplotlib's Agg canvas through Figure (no pyplot state, no display needed)."""

from __future__ import annotations

import io
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING

from llmb.api.errors import LlmbError
from llmb.report.points import Point, batch_medians, by_group, headline
from llmb.report.tables import Table

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# Plots (matplotlib's Agg canvas through Figure, so no pyplot state and no display is needed)


def _figure(panels: int = 1, sharex: bool = False):
    """A figure of `panels` axes stacked vertically (each with its own y scale), and the list of them."""
    try:
        # Lazy: matplotlib is the [report] extra's, and slow to import; only a plot needs it.
        import matplotlib
        from matplotlib.figure import Figure
    except ImportError:
        raise LlmbError(
            "plots need matplotlib (an llmb dependency; this install lacks it): pip install matplotlib"
        ) from None
    # The labels are the records' text (plugin names, settings, devices): drawn as written, never as mathtext (a
    # setting "x$^^$" failed the whole report; "$x^2$" was drawn as a formula). Read as each Text is made.
    matplotlib.rcParams["text.parse_math"] = False
    fig = Figure(figsize=(7.5, 4.5 if panels == 1 else 0.6 + 3.3 * panels), dpi=110, layout="constrained")
    return fig, list(fig.subplots(panels, 1, squeeze=False, sharex=sharex)[:, 0])


def _png(fig) -> bytes:
    buffer = io.BytesIO()
    # Silenced: matplotlib's warnings while drawing quote the records' text raw (a device name's ESC and BEL in
    # "Glyph 27 missing from font"), and say nothing the reader of the report can act on.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
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


def versus_batch_figure(
    points: list[Point], value: Callable, ylabel: str, title: str, mark_best: bool = False
) -> Figure | None:
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


def efficiency_figure(points: list[Point]) -> Figure | None:
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
