"""The report rendered: to the console, Markdown, HTML, CSV and JSON, and `report`, which loads, tabulates, plots
and writes one."""

from __future__ import annotations

import base64
import csv
import datetime as dt
import html
import io
import json
import os
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from rich.console import Console

from llmb.api.errors import UsageError
from llmb.records import (
    REPORT_SCHEMA,
    envelope,
    outputs,
)
from llmb.records.result_files import write_bytes_atomic
from llmb.report.plots import make_plots
from llmb.report.points import FORMATS, SUFFIX_FORMATS, Inputs, Point, _usable, load, mark_reference
from llmb.report.tables import POINT_FIELDS, Table, build_tables
from llmb.spec.version import __version__
from llmb.terminal import console as term

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
    if baseline is not None and baseline not in labels:  # a typo must not read as "no baseline" with exit 0
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
