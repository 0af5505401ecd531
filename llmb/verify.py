"""`llmb verify`: check a submission bundle without trusting its submitter.

A bundle is untrusted input: nothing in it is imported or run, an archive is unpacked only into a temporary folder
and only if every member is a plain file or folder of sane size and name, and malformed content gives a failing row,
never a crash. Every figure of every result is recomputed from what the run recorded.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath

from llmb import bundle_evidence, bundle_io, codediff, energy, flops, manifest, peaks
from llmb.bundle_format import (
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
from llmb.bundle_io import DEFAULT_LIMITS, Limits, Refused
from llmb.config import ADAMW_HYPERPARAMETERS, official_reasons
from llmb.fingerprint import RELEASED_MODEL_FINGERPRINT
from llmb.names import PRECISIONS
from llmb.records import (
    CONFORMANCE_SCHEMA,
    PLUGIN_SOURCE_SCHEMA,
    RESULT_SCHEMA,
    SUBMISSION_SCHEMA,
    Conformance,
    RecordError,
    Result,
    loss_band,
    median_index,
)
from llmb.redact import value_for_record
from llmb.spec.formats import DTYPE_NAME_FORMAT, RANK, lowest
from llmb.tolerances import MIN_STEP_SHARE_OF_WINDOW

# Recorded figures are full-precision JSON floats, so a recomputation agrees to far better than this.
REL_TOLERANCE = 1e-6
DTYPE_NAMES = DTYPE_NAME_FORMAT
# Parsed results verify keeps at once, by the size of their files: past it a result is read again from the bundle
# each time a check needs it, so verify's memory is bounded by what it checks, not by the bundle's size (a bundle
# within every limit may hold 60 results of 4 MiB, which parsed all at once passed 1 GiB resident; a typical
# bundle's dozen 15 kB results are read once).
RESULT_CACHE_BYTES = 32 * 2**20


class ResultFiles(Mapping):
    """The bundle's results that read as a Result, by path: parsed on demand, kept parsed up to RESULT_CACHE_BYTES
    of their files (in the order they were first read)."""

    def __init__(self, read: Callable[[str], Result], budget: int | None = None) -> None:
        self._read, self._budget = read, RESULT_CACHE_BYTES if budget is None else budget
        self._sizes: dict[str, int] = {}
        self._kept: dict[str, Result] = {}

    def add(self, path: str, result: Result, size: int) -> None:
        self._sizes[path] = size
        if sum(self._sizes[p] for p in self._kept) + size <= self._budget:
            self._kept[path] = result

    def __getitem__(self, path: str) -> Result:
        if path in self._kept:
            return self._kept[path]
        if path not in self._sizes:
            raise KeyError(path)
        return self._read(path)

    def __iter__(self) -> Iterator[str]:
        return iter(self._sizes)

    def __len__(self) -> int:
        return len(self._sizes)


def headline_view(r: Result) -> Result:
    """A result as the headline rule and summary.md read it, without its bulk (evidence, per-step and per-rank
    figures, facts, host): what verify holds of every result at once to find the headlines."""
    timing = replace(
        r.timing, step_seconds=[], repeat_window_seconds=[], worker_repeat_window_seconds=None, warmup_step_seconds=[]
    )
    return replace(
        r,
        evidence=None,
        judge=None,
        facts={},
        host=None,
        per_rank=None,
        per_rank_busy_seconds=None,
        per_rank_step_seconds=None,
        timing=timing,
        invalid_reasons=r.invalid_reasons[:1],  # the headline rule asks only whether there are any
    )


@dataclass
class Row:
    check: str
    passed: bool
    detail: str


@dataclass
class Bundle:
    root: Path
    accept_debug: bool
    rows: list[Row] = field(default_factory=list)
    submission: dict | None = None
    limits: Limits = field(default_factory=Limits)
    replay_steps: int = 0  # --replay: steps of each headline window replayed here (0: none)
    # path -> record, the ones that read as a Result (check_results_schema), read again past a memory budget
    results: ResultFiles = field(init=False)
    _views: list[Result] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.results = ResultFiles(lambda path: Result.from_dict(self.json(path)))

    def headline_views(self) -> list[Result]:
        """Every result as headline_view shows it, made once (check_runs, check_summary and the leaderboard)."""
        if self._views is None:
            self._views = [headline_view(r) for r in self.results.values()]
        return self._views

    def add(self, check: str, problems: list[str], passed_detail: str) -> None:
        shown = "; ".join(problems[:3]) + (f" (+{len(problems) - 3} more)" if len(problems) > 3 else "")
        self.rows.append(Row(check, not problems, shown if problems else str(passed_detail)))

    def text(self, name: str, max_bytes: int | None = None) -> str:
        """A text file of the bundle itself (never through a link, refused unread over the limit); ValueError with
        a short reason otherwise."""
        data = bundle_io.read_bytes(self.root, name, self.limits.text_bytes if max_bytes is None else max_bytes)
        try:
            return data.decode("utf-8")  # bytes, not read_text: a diff's \r must survive
        except UnicodeDecodeError as exc:
            raise ValueError(f"{name} is unreadable ({exc.__class__.__name__})") from None

    def json(self, name: str) -> dict:
        """A JSON object from the bundle; raises ValueError with a short reason when it is not one."""
        try:
            data = json.loads(self.text(name, self.limits.json_bytes))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{name} is not valid JSON ({exc.__class__.__name__}: {exc})") from None
        if not isinstance(data, dict):
            raise ValueError(f"{name} is not a JSON object")
        return data


def verify(path: Path, accept_debug: bool = False, limits: Limits = DEFAULT_LIMITS, replay_steps: int = 0) -> list[Row]:
    """Every check on a bundle folder or a .tar.gz of one; all rows must pass. The bundle is opened under
    llmb.bundle_io's limits (an archive unpacked in a limited child process into a temporary folder)."""
    path = Path(path)
    kind = "bundle" if path.is_dir() else "archive"
    try:
        with bundle_io.open_bundle(path, limits) as root:
            rows = verify_folder(root, accept_debug, limits, replay_steps)
    except Refused as exc:
        return [Row(kind, False, f"refused: {exc}")]
    return [Row(kind, True, "every member a plain file or folder within the limits, nothing importable"), *rows]


def verify_folder(
    root: Path, accept_debug: bool = False, limits: Limits = DEFAULT_LIMITS, replay_steps: int = 0
) -> list[Row]:
    return check_bundle(root, accept_debug, limits, replay_steps).rows


def check_bundle(
    root: Path, accept_debug: bool = False, limits: Limits = DEFAULT_LIMITS, replay_steps: int = 0
) -> Bundle:
    """Every check on a bundle folder; the Bundle keeps its rows and the results it read (the leaderboard's pages
    show them without reading them again)."""
    bundle = Bundle(Path(root), accept_debug, limits=limits, replay_steps=replay_steps)
    for check in CHECKS + ([check_replay] if replay_steps > 0 else []):
        try:
            check(bundle)
        except Exception as exc:  # malformed content in a place a check did not foresee: a failing row, no crash
            bundle.rows.append(
                Row(check.__name__.removeprefix("check_").replace("_", " "), False, f"malformed: {exc!r}")
            )
    return bundle


# The checks, in the order of the table.


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
    if sub.get("schema") != SUBMISSION_SCHEMA:
        problems.append(f"schema is {sub.get('schema')!r}, expected {SUBMISSION_SCHEMA}")
    for key, kind in (("submitter", str), ("system_name", str), ("plugins", list), ("debug", dict), ("results", list)):
        if not isinstance(sub.get(key), kind):
            problems.append(f"{key} missing or not a {kind.__name__}")
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
    environment = system.get("environment", {})
    if not isinstance(environment, dict):
        problems.append("environment is not an object")
    else:
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


def _close(recorded, expected) -> bool:
    if expected is None or recorded is None:
        return recorded is None and expected is None
    return isinstance(recorded, (int, float)) and math.isclose(recorded, expected, rel_tol=REL_TOLERANCE, abs_tol=1e-12)


def _per_result(b: Bundle, check: str, problems_of: Callable[[Bundle, str, dict], list[str]], passed: str) -> None:
    paths_of: dict[str, list[str]] = {}  # problem -> the results that have it, so a shared one is said once
    for path, record in b.results.items():
        try:
            found = problems_of(b, path, record)
        except Exception as exc:  # a field of the wrong type deep inside a record
            found = [f"malformed ({exc!r})"]
        for problem in found:
            paths_of.setdefault(problem, []).append(path)
    problems = [
        f"{paths[0]}: {problem}" if len(paths) == 1 else f"{len(paths)} results: {problem}"
        for problem, paths in paths_of.items()
    ]
    b.add(check, problems, passed.format(n=len(b.results)))


def throughput_problems(b: Bundle, path: str, r: Result) -> list[str]:
    config, window = r.config, r.timing.window_seconds
    if not window > 0:
        return [f"window {window!r} is not a positive time"]
    # A multi-process job (llmb run --nproc-per-node) records a per-device batch; its throughput is the job's.
    world = r.world_size
    if world < 1:
        return [f"world_size {world!r} is not a positive integer"]
    # Tensor and pipeline groups share one batch: the data-parallel ranks' batches (x accumulation) are the global one.
    dp = r.dp if r.dp is not None else world
    accumulation = r.grad_accum if r.grad_accum is not None else 1
    if not (1 <= dp <= world and accumulation >= 1):
        return [f"layout dp {dp!r} / grad_accum {accumulation!r} is not a layout of {world} processes"]
    global_batch = r.batch_size * accumulation * dp
    tokens_per_second = global_batch * config.sequence_length * r.steps / window
    parameters = flops.parameter_count(config)
    per_token = flops.model_flops_per_token(config, parameters)
    tflops = flops.achieved_tflops(tokens_per_second / world, per_token)
    expected = {
        "sequence_length": config.sequence_length,
        "parameters": parameters,
        "model_flops_per_token": per_token,
        "tokens_per_second": tokens_per_second,
        "samples_per_second": global_batch * r.steps / window,
        "tflops": tflops,
        "mfu": flops.mfu(tflops, r.peak_flops),
        "fom": flops.fom(config, global_batch, window / r.steps),
    }
    if r.global_batch_size is not None:  # recorded by releases that know multi-process jobs
        expected["global_batch_size"] = global_batch
        expected["tokens_per_second_per_device"] = tokens_per_second / world
    return [
        f"{key} recorded {getattr(r, key)!r}, recomputed {value!r}"
        for key, value in expected.items()
        if not _close(getattr(r, key), value)
    ]


def timing_problems(b: Bundle, path: str, r: Result) -> list[str]:
    window, steps, repeats = r.timing.window_seconds, r.timing.step_seconds, r.timing.repeat_window_seconds
    problems = []
    if len(steps) != r.steps or not all(s > 0 for s in steps):
        problems.append(f"{len(steps)} step times for {r.steps} steps, or a time that is not positive")
    elif sum(steps) > window * (1 + REL_TOLERANCE):
        problems.append(f"step times add up to {sum(steps):.6f} s, more than the {window:.6f} s window they lie in")
    elif sum(steps) < MIN_STEP_SHARE_OF_WINDOW * window:
        problems.append(f"step times add up to {sum(steps):.6f} s, under half the {window:.6f} s window")
    if len(repeats) != r.repeats:
        problems.append(f"{len(repeats)} repeat windows for {r.repeats} repeats")
    elif not all(w > 0 for w in repeats):
        problems.append(f"a repeat window that is not a positive time in {repeats!r}")
    elif window != repeats[median_index([1 / w for w in repeats])]:
        problems.append(f"window {window!r} is not the median repeat's (by throughput) of {repeats!r}")
    return problems


def shape_problems(b: Bundle, path: str, r: Result) -> list[str]:
    reasons = official_reasons(r.config)
    if bool(reasons) == r.official:
        return [f"marked official={r.official} but the shape says otherwise"]
    if not reasons:
        return []
    marked = [d.get("result") for d in (b.submission or {}).get("debug", {}).get("results", [])]
    if path not in marked:
        return [f"debug shape not marked as debug in submission.json ({reasons[0]})"]
    return [] if b.accept_debug else [f"not the official shape ({reasons[0]})"]


def validity_problems(b: Bundle, path: str, r: Result) -> list[str]:
    if r.invalid_reasons:
        return [f"invalid: {r.invalid_reasons[0]}"]
    if r.valid != (r.official and not r.invalid_reasons):
        return [f"valid={r.valid} does not follow from official={r.official} and no invalid reasons"]
    return []


def fingerprint_problems(b: Bundle, path: str, r: Result) -> list[str]:
    if r.model_fingerprint != RELEASED_MODEL_FINGERPRINT:
        return [
            f"model fingerprint {r.model_fingerprint[:12]}... is not the released {RELEASED_MODEL_FINGERPRINT[:12]}..."
        ]
    return []


def precision_problems(b: Bundle, path: str, r: Result) -> list[str]:
    prec, audit = r.precision, r.precision.audit
    folder = PurePosixPath(path).parts[1] if len(PurePosixPath(path).parts) == 3 else None
    evidence = dict(audit.evidence)
    for key in ("parameter_dtypes", "gradient_dtypes", "optimizer_state_dtypes", "buffer_dtypes"):
        for dtype in getattr(audit, key) or {}:
            if dtype not in DTYPE_NAMES:
                return [f"unknown dtype {dtype!r} in the audit's {key}"]
            evidence[f"{key}:{dtype}"] = DTYPE_NAMES[dtype]
    evidence["matmul_probe"] = audit.matmul_probe.verdict
    for rank, label in enumerate(audit.rank_effective or []):  # a multi-process job: every rank's verdict
        evidence[f"rank {rank}"] = label
    if any(v not in RANK for v in evidence.values()):
        return [f"unknown format in the audit evidence {sorted(set(evidence.values()) - set(RANK))}"]
    found = lowest(list(evidence.values()))
    problems = []
    if found != audit.effective:
        problems.append(f"the audit's evidence shows {found}, its verdict says {audit.effective}")
    if prec.effective != found:
        problems.append(f"labelled {prec.effective}, the audit's evidence shows {found}")
    if found not in PRECISIONS:
        problems.append(f"{found} is not a benchmark precision")
    if folder != found:
        problems.append(f"filed under results/{folder}/, the audit's evidence shows {found}")
    return problems


def loss_problems(b: Bundle, path: str, r: Result) -> list[str]:
    loss = r.loss
    values = [loss.initial, loss.first, loss.last]
    if not all(math.isfinite(v) for v in values):
        return [f"non-finite loss {values}"]
    low, high = loss_band(r.config.vocab_size)
    if not low <= loss.initial <= high:
        return [f"first loss {loss.initial:.4f} outside [{low:.2f}, {high:.2f}]"]
    if loss.last == loss.initial:
        return ["the loss did not move"]
    return []


def peak_problems(b: Bundle, path: str, r: Result) -> list[str]:
    """The peak behind the MFU is llmb's table figure for the device and label, or one declared by the plugin for a
    device the table lacks (with a source); and no MFU is above 100%."""
    problems = peaks.mfu_problems(r.mfu)
    recorded, label = r.peak_flops, r.precision.effective
    found = peaks.matches(r.device.name)
    entry = found[0] if len(found) == 1 else None
    if len(found) > 1:
        rows = ", ".join(row.label for row in found)
        problems.append(f"device name matches {len(found)} rows of llmb's peak table ({rows}): no peak may be used")
        if recorded is not None:
            problems.append(f"peak {recorded!r} used for an ambiguous device name")
    elif entry is not None:
        known = entry.peaks.get(label)
        if recorded != known:
            problems.append(f"peak {recorded!r} for {entry.label} {label}, llmb's table says {known!r}")
    elif recorded is not None:
        if r.peak is None or r.peak.origin != peaks.ORIGIN_DECLARED or not (r.peak.source or "").strip():
            problems.append(f"peak {recorded!r} for a device llmb's table lacks, not marked declared by plugin")
    return problems


def optimizer_record_problems(b: Bundle, path: str, r: Result) -> list[str]:
    """The recorded optimizer is torch.optim.AdamW with the fixed hyperparameters (re-checked, not trusted)."""
    problems = []
    if r.optimizer.class_name != "torch.optim.adamw.AdamW":
        problems.append(f"optimizer {r.optimizer.class_name!r} is not torch.optim.adamw.AdamW")
    for key, fixed in ADAMW_HYPERPARAMETERS.items():
        got = r.optimizer.defaults.get(key)
        if (tuple(got) if isinstance(got, list) else got) != fixed:
            problems.append(f"optimizer {key} recorded {got!r}, fixed value is {fixed!r}")
    return problems


def check_peaks(b: Bundle) -> None:
    _per_result(b, "peak and MFU", peak_problems, "{n} results: peaks from llmb's table or declared, MFU <= 100%")


def check_optimizer(b: Bundle) -> None:
    _per_result(b, "optimizer", optimizer_record_problems, "{n} results: AdamW with the fixed hyperparameters")


def check_throughput(b: Bundle) -> None:
    _per_result(b, "throughput recomputed", throughput_problems, "tokens/s, samples/s, TFLOP/s, MFU of {n} results")


def check_timing(b: Bundle) -> None:
    _per_result(b, "step times", timing_problems, "step times fit each window; windows are the repeats' medians")


def check_energy(b: Bundle) -> None:
    _per_result(b, "energy", lambda b, path, r: energy.record_problems(r), "{n} results: recomputed where recorded")


def check_official_shape(b: Bundle) -> None:
    _per_result(
        b, "official shape", shape_problems, "{n} results" + (" (debug shapes accepted)" if b.accept_debug else "")
    )


def check_validity(b: Bundle) -> None:
    _per_result(b, "run validity", validity_problems, "no invalid reasons recorded")


def check_fingerprint(b: Bundle) -> None:
    _per_result(b, "model fingerprint", fingerprint_problems, f"{RELEASED_MODEL_FINGERPRINT[:16]}... (released)")


def check_precision(b: Bundle) -> None:
    _per_result(b, "effective precision", precision_problems, "label = audit's lowest format = folder")


def check_losses(b: Bundle) -> None:
    _per_result(b, "losses", loss_problems, "finite, first loss in the band around ln(vocab), moving")


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
    _per_result(b, "run evidence", evidence_problems, "{n} results judged in a clean room, evidence consistent")


def check_clones(b: Bundle) -> None:
    found = bundle_evidence.clone_problems((path, r.to_dict()) for path, r in b.results.items())
    b.add("distinct runs", found, "every window its own challenge and losses")


def check_replay(b: Bundle) -> None:
    """--replay: each result's headline window replayed here, on the CPU in FP32, from the seed and its challenge."""

    def problems(b: Bundle, path: str, r: Result) -> list[str]:
        return bundle_evidence.replay_problems(r.to_dict(), b.replay_steps)

    _per_result(b, "replay", problems, f"{{n}} headline windows replayed here ({b.replay_steps} steps each) agree")


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


CHECKS = [
    check_manifest,
    check_submission,
    check_system,
    check_debug,
    check_results_schema,
    check_throughput,
    check_peaks,
    check_optimizer,
    check_timing,
    check_energy,
    check_official_shape,
    check_validity,
    check_fingerprint,
    check_precision,
    check_losses,
    check_runs,
    check_code,
    check_plugin_source,
    check_conformance,
    check_evidence,
    check_clones,
    check_summary,
]
