"""The feature matrix, from real runs: which training features work on one device, with DDP and with FSDP, and
which pairs of them work together (llm-train-bench's two tables), read from result and conformance records.

A cell is "yes" only where a result record of exactly that combination exists with no invalid reason (the FP8
label aside) and a conformance record of the same combination passed; "fails" with the reason where one was tried
and failed (a failed attempt's record, an invalid result, a failed conformance check); "unchecked" where a run exists
but no conformance record; blank where nothing was tried. Conformance runs in one process: a DDP or FSDP cell is
backed by the single-process conformance of the same settings plus its own multi-process result (the parallel
wrapper is torch's own, applied by the harness, not by the plugin).

FP8 is below every benchmark precision by design, so an FP8 run fails conformance's precision check by definition:
there, "conformed" means every other check passed (conformance holds FP8 to the BF16 tolerances).

This module reads records only; it never runs a plugin.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from llmb.api.errors import LlmbError
from llmb.records import ATTEMPT_SCHEMA, CONFORMANCE_SCHEMA, RESULT_SCHEMAS
from llmb.records import files as record_files
from llmb.records.schemas import Result
from llmb.terminal import console as term

# Feature key -> row label, in table order.
FEATURES = {
    "amp": "Mixed precision (BF16 amp)",
    "compile": "torch.compile (Inductor)",
    "thunder": "Thunder",
    "sac": "Selective AC, per operator",
    "fp8": "FP8 (torchao float8)",
}
PARALLEL = {"none": "Single device", "ddp": "DDP", "fsdp": "FSDP"}
# The records the matrix reads; any other llmb record is passed over, anything else named.
READS = (*RESULT_SCHEMAS, CONFORMANCE_SCHEMA, ATTEMPT_SCHEMA)
FP8_LABEL_REASON = "effective precision FP8 is not a benchmark precision"
# Pairs one setting cannot hold at once: not a failure, not a blank.
EXCLUSIVE = {frozenset({"compile", "thunder"}): "one compile setting"}


def features_of(record: dict) -> frozenset[str]:
    """The features a result, conformance or attempt record ran with, from its precision and plugin settings."""
    if record.get("schema") == ATTEMPT_SCHEMA:
        return frozenset(record["features"])
    settings = (record.get("plugin") or {}).get("settings") or {}
    prec = record.get("precision") or {}
    found = set()
    if prec.get("mode") == "amp" and prec.get("requested") in ("FP16", "BF16"):
        found.add("amp")
    compile_mode = settings.get("compile", "none")
    if compile_mode == "thunder":
        found.add("thunder")
    elif compile_mode not in (None, "none"):
        found.add("compile")
    if settings.get("activation_checkpointing") == "selective-ops":
        found.add("sac")
    if settings.get("fp8", "none") not in (None, "none") or prec.get("effective") == "FP8":
        found.add("fp8")
    return frozenset(found)


def parallel_of(record: dict) -> str:
    return record.get("parallel") or "none"


@dataclass
class Records:
    results: list[dict]
    conformance: list[dict]
    attempts: list[dict]
    skipped: list[str] = field(default_factory=list)  # one line per file left out, with why


def _check(record: dict, schema: str) -> None:
    """Raise Unreadable when a record of a kind the matrix reads holds a field it reads in another shape (the
    matrix reads old and partial records too, so only those fields are checked, not the whole record type)."""

    def expect(ok: bool, where: str, what: str) -> None:
        if not ok:
            raise record_files.Unreadable(f"incomplete {schema} record ({where}: expected {what})")

    def names(value: object) -> bool:
        return isinstance(value, list) and all(isinstance(v, str) for v in value)

    plugin, prec = record.get("plugin", {}), record.get("precision", {})
    expect(isinstance(plugin, dict) and isinstance(plugin.get("settings", {}), dict), "plugin", "an object")
    expect(isinstance(prec, dict), "precision", "an object")
    expect(names(record.get("invalid_reasons", [])), "invalid_reasons", "a list of reasons")
    checks = record.get("checks", [])
    expect(isinstance(checks, list) and all(isinstance(c, dict) for c in checks), "checks", "a list of objects")
    expect(isinstance(record.get("parallel", "none"), str), "parallel", "a name")
    if schema == ATTEMPT_SCHEMA:
        expect(names(record.get("features")), "features", "a list of names")
    if schema in RESULT_SCHEMAS:
        # The matrix reads partial results (only the fields above), but a figure no run can give (Result.check's
        # rule: NaN, infinite, negative, a batch of none, a blank run id) makes it no result, here as in every reader.
        for name in Result.FIGURES:
            value = record.get(name)
            expect(value is None or (_number(value) and math.isfinite(value) and value >= 0), name, "a number >= 0")
        for name in Result.COUNTS:
            value = record.get(name, 1)
            expect(isinstance(value, int) and not isinstance(value, bool) and value >= 1, name, "a count >= 1")
        expect(str(record.get("run_id", "-")).strip() != "", "run_id", "a name")
        timing = record.get("timing", {})
        times = [timing.get("window_seconds", 0), *timing.get("step_seconds", [])] if isinstance(timing, dict) else []
        expect(all(_number(t) and math.isfinite(t) and t >= 0 for t in times), "timing", "seconds")


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def load_records(paths: Iterable[Path]) -> Records:
    """Every llmb result, conformance and attempt record under the given files and folders; every other file is
    left out, and each that does not read as a record is named in ``skipped`` with why."""
    paths = list(paths)
    found = Records([], [], [])
    seen: dict[str, Path] = {}
    for path in paths:
        for file in record_files.under(Path(path), "*.json") if Path(path).is_dir() else [Path(path)]:
            try:
                record = record_files.read_object(file)
                foreign = record_files.foreign(record, file, READS)
                if foreign:  # no llmb record, or a version this llmb does not read: named, never dropped unsaid
                    raise record_files.Unreadable(foreign)
                schema = str(record.get("schema", ""))
                if schema in READS:
                    _check(record, schema)
            except record_files.Unreadable as exc:
                found.skipped.append(record_files.skipped_line(file, exc))
                continue
            if schema in RESULT_SCHEMAS:
                run_id = str(record.get("run_id", ""))
                if run_id and run_id in seen:  # a copy of one run must not count twice
                    found.skipped.append(record_files.duplicate_line(file, run_id, seen[run_id]))
                    continue
                seen[run_id] = file
                found.results.append(record)
            elif schema == CONFORMANCE_SCHEMA:
                found.conformance.append(record)
            elif schema == ATTEMPT_SCHEMA:
                found.attempts.append(record)
    if not (found.results or found.conformance or found.attempts):
        # An empty matrix with exit 0 would read as "nothing supported"; it is "nothing read".
        raise LlmbError(record_files.none_read_line("records", paths, found.skipped))
    return found


def _conformed(record: dict, combo: frozenset[str]) -> bool:
    failed = {c["name"] for c in record.get("checks", []) if not c.get("passed")}
    return not failed or ("fp8" in combo and failed == {"precision"})


def cell(records: Records, combo: frozenset[str], parallel: str) -> str:
    """ "yes", "fails: <reason>", "unchecked", "exclusive: <why>" or "" for one combination and parallel mode."""
    for pair, why in EXCLUSIVE.items():
        if pair <= combo:
            return f"exclusive: {why}"
    attempts = [a for a in records.attempts if features_of(a) == combo and a.get("parallel", "none") == parallel]
    runs = [r for r in records.results if features_of(r) == combo and parallel_of(r) == parallel]
    checks = [c for c in records.conformance if features_of(c) == combo]
    allowed = {FP8_LABEL_REASON} if "fp8" in combo else set()
    good = [r for r in runs if not set(r.get("invalid_reasons", [])) - allowed]
    passed = [c for c in checks if _conformed(c, combo)]
    if good and passed:
        return "yes"
    if attempts:
        return f"fails: {attempts[-1].get('error', 'unknown error')}"
    bad = [r for r in runs if set(r.get("invalid_reasons", [])) - allowed]
    if bad and not good:
        return f"fails: {sorted(set(bad[-1]['invalid_reasons']) - allowed)[0]}"
    if checks and not passed:
        failed = [c["name"] for c in checks[-1].get("checks", []) if not c.get("passed")]
        return f"fails: conformance ({', '.join(failed)})"
    if runs:
        return "unchecked"
    return ""


def support_table(records: Records) -> list[list[str]]:
    """Rows of (feature, single, DDP, FSDP): each feature alone."""
    return [
        [label, *(cell(records, frozenset({key}), parallel) for parallel in PARALLEL)]
        for key, label in FEATURES.items()
    ]


def pair_table(records: Records, parallel: str) -> list[list[str]]:
    """A square of feature pairs for one parallel mode; the diagonal is blank."""
    keys = list(FEATURES)
    return [[FEATURES[a], *("" if a == b else cell(records, frozenset({a, b}), parallel) for b in keys)] for a in keys]


def markdown(records: Records) -> str:
    """Both tables as markdown, llm-train-bench's layout (one pair table per parallel mode)."""

    def row(cells: list[str], escape: bool = True) -> str:  # reasons come from records: shown, never markup
        return "| " + " | ".join(term.markdown(c) if escape else c for c in cells) + " |"

    lines = ["### Feature support", "", row(["Feature", *PARALLEL.values()])]
    lines += [row([":-", *[":-:"] * len(PARALLEL)], escape=False)]
    lines += [row(r) for r in support_table(records)]
    for parallel, title in PARALLEL.items():
        lines += ["", f"### Feature compatibility: {title}", "", row(["", *FEATURES.values()])]
        lines += [row(["-:", *[":-:"] * len(FEATURES)], escape=False)]
        lines += [row(r) for r in pair_table(records, parallel)]
    return "\n".join(lines) + "\n"
