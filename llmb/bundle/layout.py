"""What a submission bundle holds, shared by the packager and the verifier so they agree by construction: its file
names, the rules for names and run counts, the headline per precision, its summary.md, and the key that ties a
result to its conformance record. Torch-free and run-side free: `llmb verify` and the leaderboard import it, never
the packager (llmb.submit.package)."""

from __future__ import annotations

import json
import re

from llmb.records import MIN_RUNS, Conformance, Headline, Result, energy, group_runs, headline, spread_warning
from llmb.spec import peak_table as peaks
from llmb.spec.vocab import PRECISIONS
from llmb.terminal import console as term

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
# File names in a bundle, shared with the verifier.
SUBMISSION_JSON, SYSTEM_JSON, SUMMARY_MD, MANIFEST_FILE = (
    "submission.json",
    "system.json",
    "summary.md",
    "MANIFEST.sha256",
)
RELEASE_MANIFEST, CODE_STATUS, CODE_DIFF = "code/release_manifest.json", "code/llmb.json", "code/llmb.diff"


# Headlines and the summary (used by both the packager and the verifier, so they agree by construction)


def headlines(records: list[Result]) -> dict[str, Headline]:
    """Per effective precision, the headline of the group with the best median tokens/s over its valid runs, among
    the groups whose headline has at least MIN_RUNS runs where there are any. Each group's headline (its batch, its
    median run) is the rule every reader shares (records.headline); runs differing in plugin, settings, mode, shape,
    device or job layout are separate groups, never pooled."""
    best: dict[str, Headline] = {}
    for group, runs in group_runs([r for r in records if not r.invalid_reasons]).items():
        h = headline(runs)
        # A group with enough runs at its headline's batch for a median beats a faster one without.
        rank = (len(h.runs) >= MIN_RUNS, h.run.tokens_per_second)
        held = best.get(group.precision)
        if held is None or rank > (len(held.runs) >= MIN_RUNS, held.run.tokens_per_second):
            best[group.precision] = h
    return best


SUMMARY_COLUMNS = (
    "Precision",
    "Plugin",
    "Settings",
    "Mode",
    "Shape",
    "Best batch",
    "Tokens/s (median)",
    "Spread (min-max)",
    "TFLOP/s",
    "MFU",
    "Peak memory",
    "Runs",
)


# Beside tokens/s where the bundle's results recorded energy: a bundle made before llmb measured it keeps the summary
# it was sealed with, so it still verifies.
ENERGY_COLUMN = "Tokens/J"


def summary_columns(records: list[Result]) -> tuple[str, ...]:
    """summary.md's columns for these results: SUMMARY_COLUMNS, and Tokens/J where any result has an energy section."""
    if not any(r.energy is not None for r in records):
        return SUMMARY_COLUMNS
    at = SUMMARY_COLUMNS.index("Spread (min-max)") + 1
    return (*SUMMARY_COLUMNS[:at], ENERGY_COLUMN, *SUMMARY_COLUMNS[at:])


def _cell(text: str) -> str:
    return term.markdown(text)  # a record's text in summary.md: shown as written, never markup nor a row break


def render_summary(submission: dict, records: list[Result]) -> str:
    """summary.md: one row per benchmark precision, from the bundle's results and its plugins' capabilities."""
    best = headlines(records)
    supported = {p for plugin in submission["plugins"] for p in plugin.get("precisions") or []}
    plugin_names = _cell(", ".join(str(p["name"]) for p in submission["plugins"]))
    lines = [f"# llmb submission: {_cell(submission['submitter'])} / {_cell(submission['system_name'])}", ""]
    if submission["debug"]["is_debug"]:
        lines += [
            "**DEBUG BUNDLE: not a valid submission.** It holds results that are not valid official runs "
            f"({_cell(', '.join(map(str, submission['debug']['reasons'])))}); `llmb verify` fails it unless given "
            "--accept-debug.",
            "",
        ]
    if submission.get("note"):
        lines += [_cell(submission["note"]), ""]
    columns = summary_columns(records)
    lines += ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    blank = " |" * (len(columns) - 2)
    warnings = []
    declared_notes: list[str] = []
    for label in PRECISIONS:
        h = best.get(label)
        if h is None:
            why = "not supported by " + plugin_names if supported and label not in supported else "not submitted"
            lines.append(f"| {label} | {why} |{blank}")
            continue
        r = h.run
        mfu = f"{r.mfu:.2%}" if r.mfu is not None else "n/a"
        if r.mfu is not None and peaks.declared(r):
            mfu += " (peak declared by plugin)"
            declared_notes.append(f"- {label}: {_cell(peaks.peak_note(r))}")
        memory = f"{r.peak_memory_bytes / 2**30:.2f} GiB" if r.peak_memory_bytes else "n/a"
        cells = [
            label,
            r.plugin.name,
            r.plugin.settings_label(),
            r.precision.mode,
            r.shape,
            str(r.batch_size),
            f"{r.tokens_per_second:,.1f}",
            f"{h.low:,.1f}-{h.high:,.1f}",
            *([energy.energy_cell(r.energy)] if ENERGY_COLUMN in columns else []),
            f"{r.tflops:.4f}",
            mfu,
            memory,
            str(len(h.runs)),
        ]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
        warning = spread_warning(h)
        if warning:
            warnings.append(f"- **Noisy:** {_cell(warning)}")
    lines += [
        "",
        "Each row is one group of runs (same plugin, settings, mode, shape, batch, device and job layout; groups are "
        "never pooled). Tokens/s, TFLOP/s, MFU and peak memory are the median run's (a run that happened: the slower "
        "middle one for an even count); the spread is the lowest and highest tokens/s of the group's runs. MFU is "
        "against llmb's dense peak table for the device and effective precision "
        "(llmb/spec/peak_table.py), or a peak declared "
        "by the plugin where marked.",
    ]
    if declared_notes:
        lines += ["", "Peaks declared by plugin:", *declared_notes]
    if warnings:
        lines += ["", *warnings]
    return "\n".join(lines) + "\n"


def settings_as_options(settings: dict) -> dict[str, str]:
    """Resolved plugin settings back to the -O strings a run parses."""
    return {k: (str(v).lower() if isinstance(v, bool) else str(v)) for k, v in settings.items()}


def conformance_key(record: Result | Conformance) -> tuple:
    """What a conformance record must match: plugin, version, requested precision, mode, settings."""
    plugin, prec = record.plugin, record.precision
    settings = json.dumps(settings_as_options(plugin.settings), sort_keys=True)
    return plugin.name, plugin.version, prec.requested, prec.mode, settings
