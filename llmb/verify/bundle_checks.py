"""The checks of a bundle as a whole: its manifest, submission and system files, the results' schema, the runs per
precision, the code diff against the release, the plugin source, conformance, the clean room's evidence, the
replay (--replay) and summary.md."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path, PurePosixPath

from llmb.bundle import codediff, manifest
from llmb.bundle import reader as bundle_io
from llmb.bundle.layout import (
    CODE_DIFF,
    CODE_STATUS,
    MANIFEST_FILE,
    MIN_RUNS,
    NAME_PATTERN,
    RELEASE_MANIFEST,
    SUBMISSION_JSON,
    SUMMARY_MD,
    SYSTEM_JSON,
    conformance_key,
    headlines,
    render_summary,
)
from llmb.records import (
    CONFORMANCE_SCHEMA,
    PLUGIN_SOURCE_SCHEMA,
    RESULT_SCHEMA,
    Conformance,
    RecordError,
    Result,
    Submission,
    system_problems,
)
from llmb.spec.fingerprint import RELEASED_MODEL_FINGERPRINT
from llmb.spec.redact import value_for_record
from llmb.verify import evidence_checks as bundle_evidence
from llmb.verify.bundle import Bundle, per_result


def check_manifest(b: Bundle) -> None:
    problems, listed = [], {}
    try:
        text = b.text(MANIFEST_FILE)
    except ValueError as exc:
        b.add("manifest", [str(exc)], "")
        return
    for number, line in enumerate(text.splitlines(), 1):
        digest, _, name = line.partition("  ")
        parts = PurePosixPath(name).parts
        if len(digest) != 64 or not name or name.startswith("/") or ".." in parts:
            problems.append(f"line {number} malformed")
        else:
            listed[name] = digest
    present = {}
    for directory, dirs, files in os.walk(b.root):
        for entry in dirs + files:
            full = Path(directory) / entry
            if full.is_symlink():
                problems.append(f"symlink {full.relative_to(b.root).as_posix()}")
            elif entry in files and not full.is_file():
                problems.append(f"special file {full.relative_to(b.root).as_posix()}")
        dirs[:] = [d for d in dirs if not (Path(directory) / d).is_symlink()]
        for entry in files:
            full = Path(directory) / entry
            if full.is_file() and not full.is_symlink():
                present[full.relative_to(b.root).as_posix()] = full
    present.pop(MANIFEST_FILE, None)
    problems += [f"file not listed: {name}" for name in sorted(set(present) - set(listed))]
    problems += [f"listed file missing: {name}" for name in sorted(set(listed) - set(present))]
    problems += [
        f"hash wrong: {name}"
        for name in sorted(set(listed) & set(present))
        if bundle_io.sha256_file(present[name], b.limits.member_bytes) != listed[name]
    ]
    b.add("manifest", problems, f"{len(listed)} files listed, every hash right, no extra files")


def check_submission(b: Bundle) -> None:
    problems = []
    try:
        sub = b.json(SUBMISSION_JSON)
    except ValueError as exc:
        b.add("submission.json", [str(exc)], "")
        return
    try:  # strictly, as a result is read: every field of the type the packager writes, none unknown
        Submission.from_dict(sub)
    except RecordError as exc:
        problems.append(str(exc))
    for key in ("submitter", "system_name"):  # folder names, as the packager wrote them: no markup, no escapes
        if isinstance(sub.get(key), str) and not NAME_PATTERN.match(sub[key]):
            problems.append(f"{key} {sub[key][:100]!r} does not match {NAME_PATTERN.pattern}")
    if not problems:
        b.submission = sub
    b.add("submission.json", problems, f"{sub.get('submitter')} / {sub.get('system_name')}")


def check_system(b: Bundle) -> None:
    try:
        system = b.json(SYSTEM_JSON)
    except ValueError as exc:
        b.add("system.json", [str(exc)], "")
        return
    problems = []
    sub = b.submission or {}
    for key in ("submitter", "system_name"):
        if system.get(key) != sub.get(key):
            problems.append(f"{key} {system.get(key)!r} differs from submission.json's {sub.get(key)!r}")
    problems += system_problems(system)  # the fields llmb fills keep their types; a user's own are free
    environment = system.get("environment", {})
    if isinstance(environment, dict):
        problems += [
            f"variable {k} holds a credential-like value" for k, v in environment.items() if value_for_record(k, v) != v
        ]
    b.add("system.json", problems, system.get("host_processor_model_name", "described"))


def check_debug(b: Bundle) -> None:
    debug = (b.submission or {}).get("debug") or {}
    if not debug.get("is_debug"):
        b.add("official bundle", [], "no debug results")
    elif b.accept_debug:
        b.add("official bundle", [], f"DEBUG bundle ({', '.join(debug.get('reasons', []))}) accepted by --accept-debug")
    else:
        reasons = ", ".join(debug.get("reasons", []))
        refused = f"DEBUG bundle ({reasons}): not a valid submission (--accept-debug checks the rest)"
        b.add("official bundle", [refused], "")


def _result_paths(b: Bundle) -> list[str]:
    folder = b.root / "results"
    if not folder.is_dir() or folder.is_symlink():
        return []
    return sorted(p.relative_to(b.root).as_posix() for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def check_results_schema(b: Bundle) -> None:
    problems = []
    paths = _result_paths(b)
    for path in paths:
        try:
            record = b.json(path)
        except ValueError as exc:
            problems.append(str(exc))
            continue
        try:
            b.results.add(path, Result.from_dict(record), (b.root / path).stat().st_size)
        except RecordError as exc:
            problems.append(f"{path}: {exc}")
    listed = set((b.submission or {}).get("results") or [])
    if b.submission is not None and listed != set(paths):
        problems.append("the results on disk are not the ones submission.json lists")
    if not paths:
        problems.append("no results")
    b.add("result schema", problems, f"{len(paths)} results, schema {RESULT_SCHEMA}")


def check_runs(b: Bundle) -> None:
    problems = []
    best = headlines(b.headline_views())
    for label, h in best.items():
        if len(h.runs) < MIN_RUNS:
            problems.append(f"{label}: {len(h.runs)} runs at batch {h.run.batch_size}, at least {MIN_RUNS} needed")
    seen_ids, seen_times = {}, {}
    for path, record in b.results.items():
        times = hashlib.sha256(json.dumps(record.timing.step_seconds).encode()).hexdigest()
        for seen, key, what in ((seen_ids, record.run_id, "run id"), (seen_times, times, "step times")):
            if key in seen:
                problems.append(f"{path} repeats the {what} of {seen[key]}")
            seen[key] = path
    counts = {label: len(h.runs) for label, h in best.items()}
    b.add("runs per precision", problems, ", ".join(f"{k}: {v} distinct" for k, v in counts.items()) or "none")


def check_code(b: Bundle) -> None:
    """The recorded release manifest, every file's status, and the diffs rebuilt to both sides' hashes."""
    problems = []
    try:
        released, status = b.json(RELEASE_MANIFEST), b.json(CODE_STATUS)
        diff_text = b.text(CODE_DIFF)
        diffs = codediff.parse_diffs(diff_text)
    except ValueError as exc:
        b.add("code diff", [str(exc)], "")
        b.add("model and loop unchanged", ["no readable code record"], "")
        return
    problems += manifest.problems(released)
    entries = {e["path"]: e for e in status.get("files", [])}
    expected = codediff.file_status(released["files"], {p: e["sha256"] for p, e in entries.items() if e["sha256"]})
    if [entries[e["path"]] for e in expected if e["path"] in entries] != expected or len(entries) != len(expected):
        problems.append("code/llmb.json does not follow from the release manifest and the shipped hashes")
    changed = {p for p, e in entries.items() if e["status"] != "unchanged"}
    if set(diffs) != changed:
        problems.append(f"diffs shown for {sorted(set(diffs))}, changed files are {sorted(changed)}")
    for path in sorted(changed & set(diffs)):
        old, new = diffs[path]
        entry = entries[path]
        for side, text, want in (("released", old, entry["released_sha256"]), ("shipped", new, entry["sha256"])):
            got = None if text is None else manifest.sha256_bytes(text.encode("utf-8"))
            if got != want:
                problems.append(f"{path}: the diff's {side} side does not hash to {want}")
    known_changes = _known_release_problems(released, entries)
    problems += known_changes
    sub = b.submission or {}
    division = "open" if changed else "closed"
    if sub and (sub.get("division") != division or set(sub.get("llmb_changes", [])) != changed):
        problems.append("submission.json's division and llmb_changes do not follow from the changed files")
    b.add(
        "code diff",
        problems,
        f"{len(changed)} of {len(entries)} llmb files changed, each shown in full; {_release_note(released)}",
    )
    untouched = []
    for path in (manifest.MODEL_PATH, manifest.SHAPE_PATH, manifest.LOOP_PATH):
        entry = entries.get(path)
        if entry is None or entry["status"] != "unchanged":
            untouched.append(f"{path} is {entry['status'] if entry else 'missing'}")
        elif any(p.startswith(f"{path} differs from") for p in known_changes):
            untouched.append(f"{path} differs from the nearest known release")
    b.add(
        "model and loop unchanged",
        untouched,
        f"{manifest.MODEL_PATH}, {manifest.SHAPE_PATH}, {manifest.LOOP_PATH} as released",
    )


def _known_release_problems(released: dict, entries: dict) -> list[str]:
    """A bundle made against a manifest that this installation does not list as a release is compared with the
    nearest known release: each file whose shipped hash differs from that release is named (never "the release")."""
    if manifest.known_release(released) is not None:
        return []
    shipped = {path: e["sha256"] for path, e in entries.items() if e.get("sha256")}
    nearest, changed = manifest.nearest_release(shipped)
    if nearest is None:
        return ["the bundle's release manifest is not a known llmb release, and this installation lists none"]
    found = [
        f"the bundle's release manifest is not a known llmb release; against the nearest known release "
        f"({nearest.get('llmb_version')}, {nearest['digest'][:12]}...) {len(changed)} files differ"
    ]
    return found + [f"{path} differs from the nearest known release" for path in changed]


def _release_note(released: dict) -> str:
    """Whether the bundle was made against this installation's release manifest (said, never failed: a bundle
    stays checkable after the manifest moves on; the model file is pinned on its own)."""
    try:
        same = manifest.load()["files"] == released["files"]
    except (OSError, ValueError, KeyError):
        return "this installation has no release manifest to compare"
    return f"made against {'this' if same else 'another'} llmb release manifest ({released.get('llmb_version')})"


def check_plugin_source(b: Bundle) -> None:
    problems, shown = [], []
    for plugin in (b.submission or {}).get("plugins", []):
        used = any(r.plugin.name == plugin.get("name") for r in b.results.values())
        if plugin.get("distribution") == "llmb" or not used:
            shown.append(f"{plugin.get('name')} (part of llmb)")
            continue
        try:  # every path below is built from bundle data: a strict name, and it must stay inside the bundle
            folder = f"code/plugins/{bundle_io.check_part(str(plugin.get('distribution')), 'distribution')}"
            record = b.json(f"{folder}.json")
            files = record.get("files") or {}
            for name in files:
                bundle_io.inside(b.root, f"{folder}/{name}")
        except ValueError as exc:
            problems.append(str(exc))
            continue
        if record.get("schema") != PLUGIN_SOURCE_SCHEMA or record.get("version") != plugin.get("version"):
            problems.append(
                f"{folder}.json is not the source record of {plugin['distribution']} {plugin.get('version')}"
            )
        missing = [f for f in files if not bundle_io.inside(b.root, f"{folder}/{f}").is_file()]
        if missing or not any(str(f).endswith(".py") for f in files):
            problems.append(f"{folder}: source incomplete ({missing[:2] or 'no Python files'})")
        shown.append(f"{plugin['distribution']} {plugin.get('version')}: {len(files)} files")
    names = {r.plugin.name for r in b.results.values()}
    listed = {p.get("name") for p in (b.submission or {}).get("plugins", [])}
    if names - listed:
        problems.append(f"plugins {sorted(names - listed)} made results but are not in submission.json")
    b.add("plugin source", problems, "; ".join(shown))


def check_conformance(b: Bundle) -> None:
    problems, records = [], []
    folder = b.root / "conformance"
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        name = path.relative_to(b.root).as_posix()
        try:
            data = b.json(name)
            if data.get("schema") == CONFORMANCE_SCHEMA:
                records.append(Conformance.from_dict(data))
        except ValueError as exc:  # RecordError is one: it names the bad field
            problems.append(f"{name}: {exc}")
    ran: dict[tuple, tuple[set, set]] = {}  # per key, the device types and audited precisions its results ran at
    for r in b.results.values():  # one pass, one result at a time (ResultFiles)
        device_types, effective = ran.setdefault(conformance_key(r), (set(), set()))
        device_types.add(r.device.type)
        effective.add(r.precision.effective)
    keys = sorted(ran)
    for key in keys:
        name, version, requested, mode, _ = key
        matching = [c for c in records if conformance_key(c) == key]
        if not matching:
            problems.append(f"no conformance record for {name} {version} {requested} {mode} with its settings")
            continue
        c = matching[0]
        failed = c.failed()
        if not c.passed or failed or not c.checks:
            problems.append(f"{name} {requested} {mode}: conformance failed ({', '.join(failed) or 'passed=false'})")
        if c.model_fingerprint != RELEASED_MODEL_FINGERPRINT:
            problems.append(f"{name} {requested} {mode}: conformance ran on a changed model")
        # The check must have run where and as the results did: same device type, same audited precision.
        device_types, effective = ran[key]
        if {c.device.type} != device_types:
            problems.append(f"{name} {requested} {mode}: checked on {c.device.type}, ran on {device_types}")
        if {c.precision.effective} != effective:
            problems.append(f"{name} {requested} {mode}: checked as {c.precision.effective}, ran as {effective}")
        problems += [f"{name} {requested} {mode}: {p}" for p in bundle_evidence.conformance_arithmetic(c.to_dict())]
    b.add("conformance", problems, f"{len(keys)} plugin/precision/mode combinations passed")


def evidence_problems(b: Bundle, path: str, r: Result) -> list[str]:
    return bundle_evidence.evidence_problems(r.to_dict())


def check_evidence(b: Bundle) -> None:
    per_result(b, "run evidence", evidence_problems, "{n} results judged in a clean room, evidence consistent")


def check_clones(b: Bundle) -> None:
    found = bundle_evidence.clone_problems((path, r.to_dict()) for path, r in b.results.items())
    b.add("distinct runs", found, "every window its own challenge and losses")


def check_replay(b: Bundle) -> None:
    """--replay: each result's headline window replayed here, on the CPU in FP32, from the seed and its challenge."""

    def problems(b: Bundle, path: str, r: Result) -> list[str]:
        return bundle_evidence.replay_problems(r.to_dict(), b.replay_steps)

    what = f"at least {b.replay_steps} steps each, as deep as the run's own replay"
    per_result(b, "replay", problems, f"{{n}} headline windows replayed here ({what}) agree")


def check_summary(b: Bundle) -> None:
    if b.submission is None:
        b.add("summary.md", ["no readable submission.json to render it from"], "")
        return
    try:
        text = b.text(SUMMARY_MD)
    except ValueError as exc:
        b.add("summary.md", [str(exc)], "")
        return
    expected = render_summary(b.submission, b.headline_views())
    if text == expected:
        b.add("summary.md", [], "agrees with the results")
        return
    got, want = text.splitlines(), expected.splitlines()
    index = next((i for i, (x, y) in enumerate(zip(got, want, strict=False)) if x != y), min(len(got), len(want)))
    line = got[index] if index < len(got) else "(end of file)"
    b.add(
        "summary.md",
        [f"line {index + 1} is {line!r}, the results give {want[index] if index < len(want) else '(end)'!r}"],
        "",
    )
