"""Submission bundles: `llmb package-submission` gathers results, code, conformance and the system into one folder.

Layout of ``<out>/<ORG>/<NAME>/`` (the verifier, llmb.verify, reads the same names from here):

    submission.json            who, what, which plugins, whether it holds debug results
    system.json                the system, collected automatically and completed with --system-file
    results/<PRECISION>/*.json the runs, filed under the precision the audit found
    conformance/*.json         `llmb check-plugin` for each plugin, precision, mode and settings used
    code/release_manifest.json the release manifest the bundle was made against
    code/llmb.json             every llmb file: unchanged, changed, added or removed, with both hashes
    code/llmb.diff             whole-file unified diffs of every change to llmb
    code/plugins/<dist>/       the complete source of each plugin distribution (the cpu plugin is part of llmb)
    summary.md                 one row per precision
    MANIFEST.sha256            sha256 of every other file
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from llmb.api.errors import LlmbError, UsageError
from llmb.bundle import codediff, manifest
from llmb.bundle import reader as bundle_io

# What the bundle holds (file names, headlines, summary.md), shared with the verifier; importable from here as before.
from llmb.bundle.layout import (  # noqa: F401
    CODE_DIFF,
    CODE_STATUS,
    ENERGY_COLUMN,
    MANIFEST_FILE,
    MIN_RUNS,
    NAME_PATTERN,
    RELEASE_MANIFEST,
    SUBMISSION_JSON,
    SUMMARY_COLUMNS,
    SUMMARY_MD,
    SYSTEM_JSON,
    conformance_key,
    headlines,
    render_summary,
    settings_as_options,
    summary_columns,
)
from llmb.bundle.plugin_source import copy_plugin_source
from llmb.records import (
    CODE_SCHEMA,
    CONFORMANCE_SCHEMA,
    RESULT_SCHEMAS,
    SWEEP_LOG_NAME,
    Conformance,
    DebugInfo,
    DebugResult,
    RecordError,
    Result,
    Submission,
    SubmittedPlugin,
    counted_runs,
    group_runs,
    outputs,
    read_sweep_log,
    system_problems,
)
from llmb.records import files as record_files
from llmb.records.result_files import result_filename, write_json_atomic
from llmb.report.points import interrupted_sweeps
from llmb.run import sysinfo
from llmb.spec.fingerprint import RELEASED_MODEL_FINGERPRINT
from llmb.spec.vocab import PRECISIONS
from llmb.submit.archive import (  # noqa: F401 (write_archive and written_by_llmb: the packager's API)
    check_archive_replaceable,
    check_replaceable,
    write_archive,
    written_by_llmb,
)
from llmb.terminal.progress import Pace


@dataclass
class PackageOptions:
    submitter: str
    system: str
    results: Path
    out: Path = Path("submissions")
    archive: bool = False
    system_file: Path | None = None
    include_debug: bool = False
    allow_debug_shapes: bool = False
    run_conformance: bool = True
    release_sources: list[Path] = field(default_factory=list)
    note: str = ""
    force: bool = False
    package_dir: Path = manifest.PACKAGE_DIR
    # Runs `llmb check-plugin` where the results need a conformance record that is not given; the CLI passes
    # llmb.conformance.check.check_plugin (this module never imports what runs a plugin). None: refuse instead.
    check_plugin: Callable[..., Conformance] | None = None
    # Told a line before each slow step (a conformance check takes tens of seconds), so the console is never silent.
    say: Callable[[str], None] = lambda line: None


# The packager


def check_name(value: str, what: str) -> str:
    if not NAME_PATTERN.match(value or ""):
        raise UsageError(f"{what} {value!r} must be letters, digits, '.', '_' or '-' (a folder name)")
    return value


def read_json_file(path: Path) -> dict:
    """A user's JSON object (--system-file): never waited on (a FIFO), refused where too deep or large in a number, or
    where it holds NaN or Infinity (the bundle's JSON could not carry them: `1e999` was written as `Infinity`)."""
    try:
        data = record_files.read_object(path, 64 * 2**20)
    except record_files.Unreadable as exc:
        raise UsageError(f"{path}: not readable JSON ({exc})") from None
    try:
        json.dumps(data, allow_nan=False)
    except ValueError:
        raise UsageError(f"{path}: holds NaN or Infinity (1e999 reads as Infinity), which JSON cannot carry") from None
    return data


def load_inputs(results_dir: Path) -> tuple[list[Result], list[Conformance], list[str]]:
    """Every result and conformance record under a directory, read strictly; a file that does not read as one is
    left out and named (one line each, with why) in the third list."""
    if not results_dir.is_dir():
        raise UsageError(f"--results {results_dir} is not a directory")
    results, conformance, skipped = [], [], []
    seen: dict[str, Path] = {}
    kinds = {**dict.fromkeys(RESULT_SCHEMAS, Result), CONFORMANCE_SCHEMA: Conformance}
    for path in record_files.under(results_dir, "*.json"):
        try:
            data = record_files.read_object(path, 64 * 2**20)  # never waits on a FIFO
            foreign = record_files.foreign(data, path, kinds)
            if foreign:  # no llmb record, or a version this llmb does not read: named, never dropped unsaid
                raise record_files.Unreadable(foreign)
            kind = kinds.get(data.get("schema"))
            record = record_files.parse(kind, data) if kind else None
        except record_files.Unreadable as exc:
            skipped.append(record_files.skipped_line(path, exc))
            continue
        if isinstance(record, Result):
            if record.run_id in seen:  # one run read twice (a copy): the first read is kept, the copy named
                skipped.append(record_files.duplicate_line(path, record.run_id, seen[record.run_id]))
                continue
            seen[record.run_id] = path
            results.append(record)
        elif isinstance(record, Conformance):
            conformance.append(record)
    return results, conformance, skipped


def sweep_phases(results_dir: Path, skipped: list[str] | None = None) -> dict[str, str]:
    """Run id -> sweep phase ("search" or "repeat") from the sweep logs under a results folder. A log that does not
    read (or a line of one) is named in ``skipped`` and left out: its runs count as runs of no sweep."""
    phases = {}
    for path in record_files.under(results_dir, SWEEP_LOG_NAME):
        try:
            _, trials = read_sweep_log(path, skipped=skipped)
        except RecordError as exc:
            if skipped is None:
                raise UsageError(str(exc)) from None
            skipped.append(str(exc))  # the message starts with the log's path
            continue
        phases.update({t.run_id: t.phase for t in trials if t.run_id})
    return phases


def counted_results(records: list[Result], phases: dict[str, str]) -> tuple[list[Result], list[str]]:
    """The results a headline may count (records.counted_runs, the rule the sweep and the report use): a sweep's
    search trials in a group it re-ran are left out, so summary.md shows the sweep's figure, not a pool of both."""
    kept = set()
    for runs in group_runs(records).values():
        kept.update(id(r) for r in counted_runs(runs, lambda r: phases.get(r.run_id)))
    dropped = [r.run_id for r in records if id(r) not in kept]
    skipped = [
        f"{len(dropped)} sweep search trial(s) of a group the sweep re-ran ({', '.join(dropped[:5])}"
        f"{' and more' if len(dropped) > 5 else ''}): the re-runs are the headline, as in the sweep and the report"
    ]
    return [r for r in records if id(r) in kept], skipped if dropped else []


def debug_reasons(record: Result) -> list[str]:
    """Why a result is not a valid official run (empty when it is)."""
    reasons = [] if record.official else ["debug shape"]
    return reasons + list(record.invalid_reasons)


def select_results(records: list[Result], options: PackageOptions) -> tuple[list[Result], list[str]]:
    """The results the bundle takes, and one line for each it leaves out."""
    kept, skipped, seen = [], [], set()
    left_out: dict[str, list[str]] = {}
    for record in records:
        reasons = debug_reasons(record)
        shape_only = reasons == ["debug shape"]
        if record.run_id in seen:
            skipped.append(f"{record.run_id}: a copy of a run already taken")
        elif not reasons or options.include_debug or (shape_only and options.allow_debug_shapes):
            kept.append(record)
            seen.add(record.run_id)
        else:
            hint = "--allow-debug-shapes" if shape_only else "--include-debug"
            left_out.setdefault(f"{'; '.join(reasons)} (left out; {hint} keeps them)", []).append(record.run_id)
    for reason, ids in left_out.items():  # each reason once, with its count: 25 debug runs are one line
        shown = ", ".join(ids[:5]) + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")
        skipped.append(f"{len(ids)} run(s) ({shown}): {reason}")
    if not kept:
        raise UsageError("no results to submit: " + ("; ".join(skipped) or "no result files found"))
    if not options.include_debug:
        best = headlines(kept)
        short = [f"{label}: {len(h.runs)}" for label, h in best.items() if len(h.runs) < MIN_RUNS]
        if short:
            raise UsageError(
                f"at least {MIN_RUNS} runs per precision at the best batch size are needed ({', '.join(short)})"
            )
    return kept, skipped


def gather_conformance(
    records: list[Result],
    given: list[Conformance],
    check_plugin: Callable[..., Conformance] | None,
    say: Callable[[str], None] = lambda line: None,
) -> list[Conformance]:
    """One conformance record per key the results use: a given one (a passing one first), else a fresh check."""
    chosen = []
    keys = sorted({conformance_key(r) for r in records})
    missing = [key for key in keys if not any(conformance_key(c) == key for c in given)]
    pace = Pace(total=len(missing))  # what is left, from the checks already run
    for key in keys:
        found = sorted((c for c in given if conformance_key(c) == key), key=lambda c: not c.passed)
        if found:
            chosen.append(found[0])
            continue
        name, version, requested, mode, settings = key
        if check_plugin is None:
            raise UsageError(
                f"no conformance record for plugin {name} {requested} {mode} with settings {settings} "
                f"in the results directory: run `llmb check-plugin` or leave out --no-run-conformance"
            )
        if any(isinstance(v, str) and sysinfo.REDACTED in v for v in json.loads(settings).values()):
            raise UsageError(
                f"plugin {name} {requested} {mode} used a secret setting, which records never hold: run "
                "`llmb check-plugin` with it yourself and put its record under --results"
            )
        device = next(r.device.spec or r.device.type for r in records if conformance_key(r) == key)
        say(
            f"running check-plugin {pace.finished + 1} of {len(missing)} for {name} {requested} {mode} on {device} "
            f"(no conformance record given){pace.left()}"
        )
        record = check_plugin(name, device, requested, mode=mode, settings=json.loads(settings))
        pace.done()
        if conformance_key(record) != key:
            raise LlmbError(
                f"check-plugin ran {name} with settings {record.plugin.settings}, the results recorded "
                f"{settings}: the installed plugin is not the one that made the results"
            )
        chosen.append(record)
    return chosen


def plugin_entries(records: list[Result]) -> list[dict]:
    """submission.json's plugins, from what the results recorded; the installed distribution must be the one that
    made them, since its source goes into the bundle."""
    entries: dict[str, dict] = {}
    for record in records:
        p = record.plugin
        if p.name in entries:
            continue
        if p.distribution != "llmb":  # a record's text becomes a folder only as the plain name verify takes
            try:
                bundle_io.check_part(p.distribution, "distribution")
            except ValueError as exc:
                raise LlmbError(f"plugin {p.name}: {exc}") from None
        try:
            installed = metadata.version(p.distribution)
        except metadata.PackageNotFoundError:
            installed = None
        if installed != p.version:
            raise LlmbError(
                f"plugin {p.name}: the results were made by {p.distribution} {p.version}, "
                f"but {p.distribution} {installed or '(not installed)'} is installed; its source would not match"
            )
        precisions = sorted(
            {q for r in records if r.plugin.name == p.name for q in r.plugin.precisions or []},
            key=lambda q: PRECISIONS.index(q) if q in PRECISIONS else len(PRECISIONS),
        )
        source = CODE_DIFF if p.distribution == "llmb" else f"code/plugins/{p.distribution}"
        entries[p.name] = {
            "name": p.name,
            "distribution": p.distribution,
            "version": p.version,
            "precisions": precisions,
            "source": source,
        }
    return list(entries.values())


def write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode("utf-8"))  # bytes: no newline translation, so a diff's \r survives


def bundle_files(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() and p.name != MANIFEST_FILE)


def write_manifest(root: Path) -> None:
    lines = [f"{manifest.sha256_file(root / name)}  {name}\n" for name in bundle_files(root)]
    write_text(root / MANIFEST_FILE, "".join(lines))


def package(options: PackageOptions) -> tuple[Path, list[str]]:
    """Write the bundle; return its folder and one line for each result left out."""
    org, name = check_name(options.submitter, "--submitter"), check_name(options.system, "--system")
    final = Path(options.out) / org / name
    archive = final.parent / f"{name}.tar.gz"
    sources = [Path(options.results), options.system_file, *map(Path, options.release_sources)]
    # Before anything is read or written: the bundle and its archive never replace, enter or hold an input.
    outputs.refuse_overlap({"--out": final, "--archive": archive if options.archive else None}, sources)
    check_replaceable(final, options.force)
    if options.archive:
        check_archive_replaceable(archive, f"{org}/{name}", options.force)
    package_dir = Path(options.package_dir)
    model_hash = manifest.sha256_file(package_dir / "model.py")
    if model_hash != RELEASED_MODEL_FINGERPRINT:
        raise LlmbError(f"llmb/model.py is not the released model (sha256 {model_hash}): the bundle is refused")
    try:
        released = manifest.load(package_dir)
    except (OSError, json.JSONDecodeError) as exc:
        raise LlmbError(f"cannot read the release manifest shipped with llmb: {exc}") from None
    refused = manifest.problems(released)
    if refused:
        raise LlmbError(f"the release manifest shipped with llmb is broken: {refused[0]}")
    given_system = read_json_file(options.system_file) if options.system_file else {}
    retyped = system_problems(given_system)  # before anything runs: a field llmb fills keeps its type
    if retyped:
        raise UsageError(f"--system-file {options.system_file}: {retyped[0]}")

    results, given_conformance, unread = load_inputs(Path(options.results))
    results, pooled = counted_results(results, sweep_phases(Path(options.results), unread))
    for line in interrupted_sweeps(Path(options.results)):
        options.say(f"warning: {line}")
    try:
        try:
            records, skipped = select_results(results, options)
        except UsageError as exc:  # nothing to submit: the files that did not read may be why
            raise UsageError(f"{exc}{'; not read: ' + '; '.join(unread[:3]) if unread else ''}") from None
        skipped = unread + pooled + skipped
        wrong = [r.run_id for r in records if r.model_fingerprint != RELEASED_MODEL_FINGERPRINT]
        if wrong:
            raise LlmbError(f"results made with a changed model definition cannot be submitted: {', '.join(wrong)}")
        status, diff = codediff.code_diff(released, package_dir, list(options.release_sources))
        plugins = plugin_entries(records)
    except (KeyError, TypeError) as exc:
        raise LlmbError(f"a result or conformance record under {options.results} is incomplete ({exc!r})") from None
    check = options.check_plugin if options.run_conformance else None
    conformance = gather_conformance(records, given_conformance, check, options.say)
    failed = [f"{c.plugin.name} {c.precision.requested}" for c in conformance if not c.passed]
    if failed and not options.include_debug:
        raise LlmbError(f"conformance failed for {', '.join(failed)}: the plugin does not preserve the model")

    check_replaceable(final, options.force)  # again: the check-plugin runs took a while
    if options.archive:
        check_archive_replaceable(archive, f"{org}/{name}", options.force)
    final.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{name}.", dir=final.parent) as tmp:
        root = Path(tmp) / name
        _write_bundle(root, org, name, options, records, conformance, plugins, released, status, diff, given_system)
        if final.exists():
            shutil.rmtree(final)
        os.replace(root, final)
    if options.archive:
        write_archive(final, archive, f"{org}/{name}")
    return final, skipped


def _write_bundle(root, org, name, options, records, conformance, plugins, released, status, diff, given_system):
    result_paths = []
    debug = []
    for record in records:
        path = f"results/{outputs.name_part(record.precision.effective)}/{result_filename(record)}"
        write_json_atomic(root / path, record.to_dict())
        result_paths.append(path)
        reasons = debug_reasons(record)
        if reasons:
            debug.append({"result": path, "reasons": reasons})
    conformance_paths = []
    for index, record in enumerate(conformance):
        prec = record.precision
        parts = (record.plugin.name, prec.requested, prec.mode, index)  # a record's text: never a path
        path = f"conformance/{'-'.join(outputs.name_part(p) for p in parts)}.json"
        write_json_atomic(root / path, record.to_dict())
        conformance_paths.append(path)
    for plugin in plugins:
        if plugin["distribution"] != "llmb":
            dest = root / plugin["source"]
            write_json_atomic(
                dest.with_suffix(".json"), copy_plugin_source(plugin["distribution"], plugin["version"], dest)
            )
    write_json_atomic(root / RELEASE_MANIFEST, released)
    write_json_atomic(root / CODE_STATUS, {"schema": CODE_SCHEMA, "package": "llmb", "files": status})
    write_text(root / CODE_DIFF, diff)
    changed = [e["path"] for e in status if e["status"] != "unchanged"]
    reasons = sorted({reason.split(":")[0] for entry in debug for reason in entry["reasons"]})
    submission = Submission(
        submitter=org,
        system_name=name,
        division="open" if changed else "closed",
        llmb_changes=changed,
        debug=DebugInfo(
            is_debug=bool(debug),
            reasons=reasons,
            allow_debug_shapes=options.allow_debug_shapes,
            include_debug=options.include_debug,
            results=[DebugResult(**entry) for entry in debug],
        ),
        note=options.note,
        plugins=[SubmittedPlugin(**plugin) for plugin in plugins],
        results=result_paths,
        conformance=conformance_paths,
    ).to_dict()
    write_json_atomic(root / SUBMISSION_JSON, submission)
    system = sysinfo.complete(sysinfo.collect([r.to_dict() for r in records], plugins), given_system)
    system.update(submitter=org, system_name=name, division=submission["division"])
    write_json_atomic(root / SYSTEM_JSON, system)
    write_text(root / SUMMARY_MD, render_summary(submission, records))
    write_manifest(root)
