"""`llmb leaderboard`: submission bundles verified and published as a static site a reviewer can browse.

Each bundle (a folder or a .tar.gz) is opened under llmb.bundle.reader's limits and checked by llmb.verify, the same
checks as `llmb verify` (with `--replay`, its replay too); the site is an index.html with one table of systems by
precision, sortable and filterable by a few lines of inline script (no server, nothing fetched), and one page per
submission with the evidence: the system, the plugins, the code diffs, the precision audit, the sweep plots, the
conformance records and the verify verdict. Everything a bundle says is data: each text is HTML-escaped where it is
written, and a bundle that cannot be read or fails a check is listed as failed, with why, while the site builds.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from llmb import report, verify
from llmb.api.errors import UsageError
from llmb.bundle import reader as bundle_io
from llmb.bundle.layout import CODE_DIFF, CODE_STATUS, SUBMISSION_JSON, SYSTEM_JSON, headlines
from llmb.bundle.reader import DEFAULT_LIMITS, MANIFEST_FILE, Limits, Refused
from llmb.records import Conformance, Result, energy, outputs
from llmb.records.result_files import write_bytes_atomic
from llmb.spec.vocab import PRECISIONS
from llmb.terminal import console as term

VALID, DEBUG, FAILED = "valid", "debug", "failed"
WHY_LIMIT = 100  # characters of each failing check's detail in the index


def e(value: object) -> str:
    """A bundle's text for HTML: control characters shown, then escaped (quotes too: it may land in an attribute)."""
    return html.escape(term.clean(value, limit=None), quote=True)


@dataclass
class Headline:
    """One row of the index: a submission's headline run at one precision (the summary's rule)."""

    precision: str
    device: str
    tokens_per_second: float | None
    per_device: float | None
    mfu: float | None
    matmul_peak_efficiency: float | None
    tokens_per_joule: float | None
    energy: str
    runs: int
    over_peak: str | None = None  # Result.matmul_peak_warning: an "efficiency" over 100% is no efficiency


@dataclass
class Entry:
    """One bundle as the site shows it; ``sections`` are its page's parts, already HTML."""

    source: str
    page: str
    verdict: str = FAILED
    why: str = ""
    submitter: str = ""
    system: str = ""
    plugins: str = ""
    rows: list[verify.Row] = field(default_factory=list)
    headlines: list[Headline] = field(default_factory=list)
    sections: list[tuple[str, str]] = field(default_factory=list)
    # sha256 of the bundle's MANIFEST.sha256 (which lists the sha256 of every other file): two copies of one bundle,
    # in two folders or as a folder and its archive, share it. None where there is no manifest to read.
    identity: str | None = None


def judge(rows: list[verify.Row], is_debug: bool) -> tuple[str, str]:
    """The verdict from verify's rows (checked with debug accepted): failed with the failing checks, else debug or
    valid as the bundle (checked by verify's `debug` row) says."""
    # The failing checks by name (one alone with the start of its detail): the page's verify table has the rest.
    failed = [row for row in rows if not row.passed]
    if len(failed) == 1:
        return FAILED, f"{failed[0].check}: {term.clean(failed[0].detail, limit=WHY_LIMIT)}"
    if failed:
        return FAILED, "failed checks: " + ", ".join(row.check for row in failed)
    return (DEBUG, "a debug bundle: not the official shape") if is_debug else (VALID, "")


def load(path: Path, page: str, replay_steps: int = 0, limits: Limits = DEFAULT_LIMITS) -> Entry:
    """One bundle verified and read for its page; a bundle that cannot be opened is an entry that failed."""
    entry = Entry(source=str(path), page=page)
    try:
        with bundle_io.open_bundle(path, limits) as root:
            checked = verify.check_bundle(root, accept_debug=True, limits=limits, replay_steps=replay_steps)
            try:
                entry.identity = hashlib.sha256(checked.text(MANIFEST_FILE).encode("utf-8")).hexdigest()
            except (ValueError, OSError):  # no manifest, or past the limits: verify's rows say so; nothing to compare
                entry.identity = None
            entry.rows = checked.rows
            _read(entry, checked)
    except Refused as exc:  # as `llmb verify` words it
        entry.rows = [verify.Row("bundle" if path.is_dir() else "archive", False, f"refused: {exc}")]
        entry.verdict, entry.why = judge(entry.rows, False)
    return entry


def _read(entry: Entry, b: verify.Bundle) -> None:
    """The page's sections from the bundle's files; a part that cannot be read says so in its place."""
    submission: dict = {}
    try:
        submission = b.json(SUBMISSION_JSON)
    except ValueError as exc:
        entry.sections.append(("Submission", f"<p class='bad'>unreadable: {e(exc)}</p>"))
    entry.submitter = str(submission.get("submitter", ""))
    entry.system = str(submission.get("system_name", ""))
    plugins = [p for p in _list(submission.get("plugins")) if isinstance(p, dict)]
    entry.plugins = ", ".join(f"{p.get('name', '?')} {p.get('version', '?')}" for p in plugins)
    debug = submission.get("debug")
    entry.verdict, entry.why = judge(entry.rows, isinstance(debug, dict) and debug.get("is_debug") is True)
    results = _results(b, submission)
    for title, build in (
        ("System", lambda: _system(b, submission, plugins)),
        ("Code changes", lambda: _code(b)),
        ("Precision audit", lambda: _audit(results)),
        ("Sweep plots", lambda: _plots(results)),
        ("Conformance", lambda: _conformance(b, submission)),
    ):
        try:
            entry.sections.append((title, build()))
        except Exception as exc:  # malformed content where no check foresaw it: said on the page, the site builds
            entry.sections.append((title, f"<p class='bad'>unreadable: {e(f'{type(exc).__name__}: {exc}')}</p>"))
    try:
        entry.headlines = _headlines(results)
    except Exception as exc:
        entry.why = "; ".join(filter(None, [entry.why, f"headlines unreadable: {type(exc).__name__}: {exc}"]))


def _list(value) -> list:
    return value if isinstance(value, list) else []


def _results(b: verify.Bundle, submission: dict) -> dict[str, Result]:
    """The results submission.json lists that read as results (verify names the others): those verify read, as it
    read them; a listed file verify did not read (outside results/) read here."""
    results = {}
    for path in map(str, _list(submission.get("results"))):
        if path in b.results:
            results[path] = b.results[path]
            continue
        try:
            results[path] = Result.from_dict(b.json(path))
        except Exception:
            continue
    return results


def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def _headlines(results: dict[str, Result]) -> list[Headline]:
    rows = []
    for label, h in headlines(list(results.values())).items():
        r = h.run
        rows.append(
            Headline(
                precision=label,
                device=f"{r.world_size} x {r.device.name}" if r.world_size > 1 else r.device.name,
                tokens_per_second=_number(r.tokens_per_second),
                per_device=_number(r.tokens_per_second_per_device or r.tokens_per_second / max(1, r.world_size)),
                mfu=_number(r.mfu) if label in PRECISIONS else None,
                matmul_peak_efficiency=_number(r.matmul_peak_efficiency),
                tokens_per_joule=_number(r.energy.tokens_per_joule) if r.energy else None,
                energy=energy.energy_cell(r.energy),
                runs=len(h.runs),
                over_peak=r.matmul_peak_warning(),
            )
        )
    return rows


def _pairs(rows: list[tuple[object, object]]) -> str:
    body = "".join(f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in rows)
    return f"<table class='facts'>{body}</table>"


def _plain(value: object) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def _system(b: verify.Bundle, submission: dict, plugins: list[dict]) -> str:
    rows = [(k, _plain(submission.get(k))) for k in ("submitter", "system_name", "division", "created", "note")]
    parts = [_pairs([(k, v) for k, v in rows if v not in ("null", "")])]
    parts.append("<h3>Plugins</h3>")
    parts.append(
        _pairs([(p.get("name", "?"), f"{p.get('distribution', '?')} {p.get('version', '?')}") for p in plugins])
    )
    try:
        system = b.json(SYSTEM_JSON)
        parts += ["<h3>system.json</h3>", _pairs([(k, _plain(v)) for k, v in system.items()])]
    except ValueError as exc:
        parts.append(f"<p class='bad'>system.json unreadable: {e(exc)}</p>")
    return "\n".join(parts)


def _diff_html(text: str) -> str:
    """A unified diff with its added, removed and hunk lines marked (each line escaped)."""
    kinds = (("+++", "file"), ("---", "file"), ("@@", "hunk"), ("+", "add"), ("-", "del"), ("diff ", "file"))
    lines = []
    for line in text.splitlines():
        kind = next((k for prefix, k in kinds if line.startswith(prefix)), "")
        lines.append(f"<span class='{kind}'>{e(line)}</span>" if kind else e(line))
    return "<pre class='diff'>" + "\n".join(lines) + "</pre>"


def _code(b: verify.Bundle) -> str:
    parts = []
    try:
        status = b.json(CODE_STATUS)
        files = [f for f in _list(status.get("files")) if isinstance(f, dict) and f.get("status") != "unchanged"]
        summary = f"{len(files)} file(s) of llmb changed, added or removed" if files else "llmb unchanged"
        parts.append(f"<p>{e(summary)}</p>")
        if files:
            parts.append(_pairs([(f.get("path", "?"), f.get("status", "?")) for f in files]))
    except ValueError as exc:
        parts.append(f"<p class='bad'>{e(CODE_STATUS)} unreadable: {e(exc)}</p>")
    try:
        diff = b.text(CODE_DIFF)
        parts.append(_diff_html(diff) if diff.strip() else "<p>No diff: the release's llmb ran.</p>")
    except ValueError as exc:
        parts.append(f"<p class='bad'>{e(CODE_DIFF)} unreadable: {e(exc)}</p>")
    return "\n".join(parts)


def _audit(results: dict[str, Result]) -> str:
    parts = []
    for label, h in headlines(list(results.values())).items():
        r, audit = h.run, h.run.precision.audit
        rows = [
            ("requested / effective", f"{r.precision.requested} / {r.precision.effective} ({r.precision.mode})"),
            ("headline run", r.run_id),
        ]
        if audit is not None:
            rows += [
                ("parameters", _plain(audit.parameter_dtypes)),
                ("gradients", _plain(audit.gradient_dtypes)),
                ("optimizer state", _plain(audit.optimizer_state_dtypes)),
                ("autocast", _plain(audit.autocast_dtype)),
                ("matmul probe", f"{audit.matmul_probe.verdict} (relative error {audit.matmul_probe.relative_error})"),
                *[(f"backend: {f.name}", f"{_plain(f.value)} (implies {f.implies})") for f in audit.backend],
                *[(f"evidence: {k}", v) for k, v in audit.evidence.items()],
            ]
            if audit.dispatch is not None:
                rows.append(("dispatched matmuls", f"{audit.dispatch.effective}: {_plain(audit.dispatch.formats)}"))
        parts += [f"<h3>{e(label)}</h3>", _pairs(rows)]
    return "\n".join(parts) or "<p>No readable result.</p>"


def _plots(results: dict[str, Result]) -> str:
    points = [report.point_from_record(r, None, path) for path, r in results.items()]
    plots = report.make_plots(points, []) if points else {}
    images = [
        f"<img alt='{e(name)}' src='data:image/png;base64,{base64.b64encode(png).decode('ascii')}'>"
        for name, png in plots.items()
    ]
    return "\n".join(images) or "<p>No plot: no readable result.</p>"


def _conformance(b: verify.Bundle, submission: dict) -> str:
    parts = []
    for path in _list(submission.get("conformance")):
        try:
            record = Conformance.from_dict(b.json(str(path)))
        except Exception as exc:
            parts.append(f"<p class='bad'>{e(path)} unreadable: {e(exc)}</p>")
            continue
        verdict = "passed" if record.passed else "FAILED"
        parts.append(
            f"<h3>{e(record.plugin.name)} {e(record.precision.requested)} {e(record.precision.mode)}: {verdict}</h3>"
        )
        body = "".join(
            f"<tr class='{'ok' if c.passed else 'bad'}'><td>{e(c.name)}</td><td>{'pass' if c.passed else 'FAIL'}</td>"
            f"<td>{e(c.detail)}</td></tr>"
            for c in record.checks
        )
        parts.append(f"<table><tr><th>check</th><th>result</th><th>detail</th></tr>{body}</table>")
    return "\n".join(parts) or "<p class='bad'>The submission names no conformance record.</p>"


def _verdict_html(entry: Entry) -> str:
    body = "".join(
        f"<tr class='{'ok' if r.passed else 'bad'}'><td>{e(r.check)}</td><td>{'pass' if r.passed else 'FAIL'}</td>"
        f"<td>{e(r.detail)}</td></tr>"
        for r in entry.rows
    )
    head = f"<p class='verdict {entry.verdict}'>Verdict: <b>{entry.verdict}</b>"
    head += f" ({e(entry.why)})</p>" if entry.why else "</p>"
    return head + f"<table><tr><th>check</th><th>result</th><th>detail</th></tr>{body}</table>"


STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1400px; padding: 0 1em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.6em; vertical-align: top; text-align: left; }
th { background: #f3f3f3; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
#board th { cursor: pointer; user-select: none; } #board td { max-width: 24em; overflow-wrap: anywhere; }
tr.bad td, p.bad, .verdict.failed { color: #b00; } .verdict.valid { color: #070; } .verdict.debug { color: #a60; }
pre.diff { background: #f8f8f8; padding: 0.5em; overflow-x: auto; font-size: 0.85em; }
pre.diff .add { color: #070; } pre.diff .del { color: #b00; } pre.diff .hunk { color: #06c; }
pre.diff .file { font-weight: bold; } img { max-width: 100%; display: block; margin: 1em 0; }
p.note { color: #666; font-size: 0.85em; } .filters { margin: 1em 0; } .filters * { margin-right: 0.6em; }
"""

# Click a header to sort by it (again: the other way); the text box and the two lists hide rows that do not match;
# the page's query string sets both. Numbers sort by their data-v value, empty ones last.
SCRIPT = """
const table = document.getElementById('board');
const body = table.tBodies[0];
let sorted = {column: -1, up: true};
function cellValue(row, column) {
  const cell = row.cells[column];
  return cell.dataset.v !== undefined ? (cell.dataset.v === '' ? null : Number(cell.dataset.v)) : cell.textContent;
}
function sortBy(column) {
  sorted = {column, up: sorted.column === column ? !sorted.up : true};
  const rows = Array.from(body.rows);
  rows.sort((a, b) => {
    const x = cellValue(a, column), y = cellValue(b, column);
    if (x === null || y === null) return (x === null) - (y === null);
    const order = typeof x === 'number' ? x - y : String(x).localeCompare(String(y));
    return sorted.up ? order : -order;
  });
  rows.forEach(row => body.appendChild(row));
}
Array.from(table.tHead.rows[0].cells).forEach((th, column) => th.addEventListener('click', () => sortBy(column)));
function applyFilters() {
  const text = document.getElementById('filter').value.toLowerCase();
  const precision = document.getElementById('precision').value;
  const verdict = document.getElementById('verdict').value;
  for (const row of body.rows) {
    const show = row.textContent.toLowerCase().includes(text)
      && (!precision || row.dataset.precision === precision) && (!verdict || row.dataset.verdict === verdict);
    row.hidden = !show;
  }
}
for (const id of ['filter', 'precision', 'verdict']) {
  document.getElementById(id).addEventListener('input', applyFilters);
}
// A view can be linked: index.html?precision=BF16&verdict=valid&sort=Tokens/J&order=down
const asked = new URLSearchParams(location.search);
for (const id of ['filter', 'precision', 'verdict']) {
  if (asked.has(id)) document.getElementById(id).value = asked.get(id);
}
applyFilters();
const named = Array.from(table.tHead.rows[0].cells).findIndex(th => th.textContent === asked.get('sort'));
if (named >= 0) {
  sortBy(named);
  if (asked.get('order') === 'down') sortBy(named);
}
"""

COLUMNS = (
    "System",
    "Submitter",
    "Plugins",
    "Precision",
    "Device",
    "Tokens/s",
    "Tokens/s per device",
    "MFU",
    "vs matmul peak",
    "Tokens/J",
    "Runs",
    "Verdict",
    "Why",
)


def _num_cell(value: float | None, text: str) -> str:
    if text.startswith("n/a ("):  # the reason in a tooltip: the table stays narrow
        return f"<td class='num' data-v='' title='{e(text)}'>n/a</td>"
    return f"<td class='num' data-v='{'' if value is None else repr(value)}'>{e(text)}</td>"


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def _efficiency_cell(h: Headline) -> str:
    """The matmul-peak efficiency; over 100% the peak was measured low: shown struck through with why, and never
    sorted as an efficiency (as the report does not plot it as one)."""
    if h.over_peak:
        shown = e(_percent(h.matmul_peak_efficiency))
        return f"<td class='num over-peak' data-v='' title='{e(h.over_peak)}'><s>{shown}</s> over peak</td>"
    return _num_cell(h.matmul_peak_efficiency, _percent(h.matmul_peak_efficiency))


def _index_rows(entry: Entry) -> list[str]:
    link = f"<a href='{e(entry.page)}'>{e(entry.system or entry.source)}</a>"
    common = f"<td>{link}</td><td>{e(entry.submitter)}</td><td>{e(entry.plugins)}</td>"
    verdict = f"<td class='verdict {entry.verdict}'>{entry.verdict}</td><td>{e(entry.why)}</td>"
    rows = []
    for h in entry.headlines or [None]:
        precision = h.precision if h else ""
        attrs = f"data-precision='{e(precision)}' data-verdict='{entry.verdict}'"
        if h is None:
            cells = "<td></td><td></td>" + _num_cell(None, "") * 5 + _num_cell(None, "")
        else:
            cells = (
                f"<td>{e(h.precision)}</td><td>{e(h.device)}</td>"
                + _num_cell(h.tokens_per_second, "" if h.tokens_per_second is None else f"{h.tokens_per_second:,.1f}")
                + _num_cell(h.per_device, "" if h.per_device is None else f"{h.per_device:,.1f}")
                + _num_cell(h.mfu, _percent(h.mfu))
                + _efficiency_cell(h)
                + _num_cell(h.tokens_per_joule, h.energy)
                + _num_cell(float(h.runs), str(h.runs))
            )
        rows.append(f"<tr {attrs}>{common}{cells}{verdict}</tr>")
    return rows


def _page(title: str, body: str, script: str = "") -> str:
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>{e(title)}</title><style>{STYLE}</style></head><body>\n{body}\n"
        + (f"<script>{script}</script>" if script else "")
        + "</body></html>\n"
    )


def index_html(entries: list[Entry]) -> str:
    precisions = sorted({h.precision for entry in entries for h in entry.headlines})
    options = "".join(f"<option>{e(p)}</option>" for p in precisions)
    verdicts = "".join(f"<option>{v}</option>" for v in (VALID, DEBUG, FAILED))
    head = "".join(f"<th>{e(c)}</th>" for c in COLUMNS)
    rows = "\n".join(row for entry in entries for row in _index_rows(entry))
    body = (
        "<h1>llmb leaderboard</h1>"
        "<p class='note'>One row per submission and precision: the headline run by the summary's rule (the median "
        "run of the best group). Every bundle is checked as `llmb verify` checks it; a failed one stays listed with "
        "why. Tokens/J is one device's, over the headline run's measured windows. Click a header to sort.</p>"
        "<div class='filters'><input id='filter' type='search' placeholder='filter'>"
        f"<select id='precision'><option value=''>every precision</option>{options}</select>"
        f"<select id='verdict'><option value=''>every verdict</option>{verdicts}</select></div>"
        f"<table id='board'><thead><tr>{head}</tr></thead><tbody>\n{rows}\n</tbody></table>"
    )
    return _page("llmb leaderboard", body, SCRIPT)


def submission_html(entry: Entry) -> str:
    title = entry.system or entry.source
    parts = [
        "<p><a href='index.html'>&larr; leaderboard</a></p>",
        f"<h1>{e(title)}</h1>",
        f"<p class='note'>{e(entry.submitter)}; plugins: {e(entry.plugins)}; from {e(entry.source)}</p>",
        "<h2>Verify verdict</h2>",
        _verdict_html(entry),
    ]
    for heading, section in entry.sections:
        parts += [f"<h2>{e(heading)}</h2>", section]
    return _page(f"llmb: {title}", "\n".join(parts))


def build(
    paths: list[Path],
    out: Path,
    replay_steps: int = 0,
    limits: Limits = DEFAULT_LIMITS,
    skipped: list[str] | None = None,
) -> list[Entry]:
    """Verify each bundle and write the site into ``out``: index.html and submission-N.html for the N-th bundle.
    ``out`` may not be, hold or sit inside a bundle (a page written into one would break its manifest), and a page
    never replaces anything but a file (a symlink named index.html in ``out`` is refused, its target untouched).
    A bundle given twice (the same path, a link to it, or an identical copy elsewhere: a second folder, its archive)
    is listed once; the copy is named in ``skipped``."""
    outputs.refuse_overlap({"--out": out}, paths)
    unique: list[Path] = []
    for path in map(Path, paths):
        first = next((u for u in unique if outputs.overlap(path, u) == "is"), None)
        if first is None:
            unique.append(path)
        elif skipped is not None:
            skipped.append(f"{path}: the bundle {first} again (given twice; listed once)")
    pages = ["index.html", *(f"submission-{n}.html" for n in range(1, len(unique) + 1))]
    for name in pages:  # before any bundle is read: a page in the way that is no file is refused, not written through
        if (out / name).is_symlink() or (os.path.lexists(out / name) and not (out / name).is_file()):
            raise UsageError(f"--out {out}: {name} there is not a regular file; refusing to replace it")
    entries: list[Entry] = []
    for path in unique:
        entry = load(path, f"submission-{len(entries) + 1}.html", replay_steps, limits)
        copy_of = next((e for e in entries if entry.identity and e.identity == entry.identity), None)
        if copy_of is None:
            entries.append(entry)
        elif skipped is not None:  # the same files in another place: one submission, listed once
            skipped.append(f"{path}: the same bundle as {copy_of.source} (identical manifest; listed once)")
    out.mkdir(parents=True, exist_ok=True)
    for entry in entries:
        write_bytes_atomic(out / entry.page, submission_html(entry).encode("utf-8"))
    write_bytes_atomic(out / "index.html", index_html(entries).encode("utf-8"))
    return entries
