"""`llmb verify`'s checks of the run evidence in a bundle, and `--replay`: the windows replayed on this machine.

What verify can prove offline: each result was judged in a clean room and its headline is its own judged window;
no two results share a challenge or a loss curve (a cloned run); every conformance record's verdicts follow from its
measured figures; and, with --replay, that each result's headline window trained the benchmark's model (its
recorded losses, and for a whole window its parameter digest, agree with a CPU FP32 replay from the seed and the
challenge). No bundle check can prove a recorded time: a consistently rescaled window is `llmb reproduce`'s to catch.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable

from llmb.spec.presets import PRESETS
from llmb.spec.tolerances import seal_allowance


def _windows(record: dict) -> list[dict]:
    windows = (record.get("evidence") or {}).get("windows")
    if not isinstance(windows, list) or not all(isinstance(w, dict) for w in windows):
        raise ValueError("no evidence windows")
    return windows


def evidence_problems(record: dict) -> list[str]:
    """One result's evidence against its own figures."""
    judge = record.get("judge") or {}
    if judge.get("clean_room") is not True:
        return ["not judged in a clean room: its times are the plugin's process's word"]
    try:
        windows = _windows(record)
    except ValueError as exc:
        return [str(exc)]
    problems = []
    if len(windows) != record.get("repeats"):
        problems.append(f"{len(windows)} evidence windows for {record.get('repeats')} repeats")
    for index, window in enumerate(windows):
        if len(window.get("losses") or []) != record.get("steps"):
            problems.append(f"window {index + 1} records {len(window.get('losses') or [])} losses")
        clean, worker = window.get("clean_window_seconds"), window.get("worker_window_seconds")
        if not (_number(clean) and clean > 0):
            problems.append(f"window {index + 1} has no judged time")
        elif _number(worker) and worker > clean * (1 + 1e-9):
            problems.append(f"window {index + 1}: the worker's {worker!r} s exceeds the judge's {clean!r} s")
    timing = record.get("timing") or {}
    judged = [w.get("clean_window_seconds") for w in windows]
    # The judge's seal times, where the record has them (older ones do not): held to the judge's own bound
    # (llmb.judge.verdict.seal_problems), so a record whose reason was dropped does not verify.
    seals = timing.get("seal_seconds") if isinstance(timing.get("seal_seconds"), list) else []
    steps = record.get("steps")
    for index, (seal, clean) in enumerate(zip(seals, judged, strict=False)):  # extra entries: no window
        if _number(seal) and _number(clean) and isinstance(steps, int) and steps > 0:
            allowed = seal_allowance(clean, steps)
            if seal > allowed:
                problems.append(
                    f"window {index + 1}: its seal came {seal:.3f} s after its clock stopped (at most {allowed:.3f} s)"
                )
    if timing.get("repeat_window_seconds") != judged:
        problems.append("the repeat windows are not the judged ones")
    headline = (record.get("evidence") or {}).get("headline_window")
    if not isinstance(headline, int) or not 0 <= headline < len(windows):
        problems.append(f"headline window {headline!r} is not one of the windows")
    elif timing.get("window_seconds") != judged[headline]:
        problems.append("the headline window's time is not its judged time")
    elif windows[headline].get("losses"):
        losses = windows[headline]["losses"]
        loss = record.get("loss") or {}
        if (loss.get("first"), loss.get("last")) != (losses[0], losses[-1]):
            problems.append("the loss's first and last are not the headline window's")
    replayed = (record.get("evidence") or {}).get("replay")
    if not isinstance(replayed, dict) or not replayed.get("passed"):
        problems.append("the run's own replay did not pass (or did not run)")
    return problems


def clone_problems(records: Iterable[tuple[str, dict]]) -> list[str]:
    """Across results, read one at a time: a challenge, or a window's loss curve, seen twice is a copied run. What
    is kept of each is its challenges and a hash of each curve."""
    seen_challenges: dict[int, str] = {}
    seen_losses: dict[str, str] = {}
    problems = []
    for path, record in records:
        try:
            windows = _windows(record)
        except ValueError:
            continue
        for window in windows:
            challenge = window.get("challenge")
            curve = hashlib.sha256(json.dumps(window.get("losses")).encode()).hexdigest()
            if challenge in seen_challenges:
                problems.append(f"{path} repeats the challenge {challenge} of {seen_challenges[challenge]}")
            elif curve in seen_losses and window.get("losses"):
                problems.append(f"{path} repeats a loss curve of {seen_losses[curve]} under another challenge")
            seen_challenges.setdefault(challenge, path)
            seen_losses.setdefault(curve, path)
    return problems


def conformance_arithmetic(record: dict) -> list[str]:
    """A conformance record's verdicts must follow from its own measured figures and tolerances."""
    problems = []
    checks = record.get("checks") or []
    for check in checks:
        measured, tolerance = check.get("measured"), check.get("tolerance")
        if isinstance(measured, str) and measured in ("inf", "nan"):
            measured = math.inf
        if _number(measured) and _number(tolerance) and check.get("name") not in ("optimizer-steps",):
            holds = measured <= tolerance
            if bool(check.get("passed")) != holds:
                problems.append(
                    f"check {check.get('name')!r} says passed={check.get('passed')} but measured {measured!r} against "
                    f"tolerance {tolerance!r}"
                )
    if bool(record.get("passed")) != (bool(checks) and all(c.get("passed") for c in checks)):
        problems.append("passed does not follow from its checks")
    return problems


# A bundle's record decides the size of what the replay builds: only the presets' shapes and a sane batch are
# replayed, so a hostile record cannot make the reviewer's machine allocate without bound.
MAX_REPLAY_SEQUENCES = 1024


def replay_refusal(record: dict) -> str | None:
    config = record.get("config")
    if not any(config == preset.to_dict() for preset in PRESETS.values()):
        return f"replay refused: the shape is not one of the presets ({', '.join(PRESETS)})"
    sizes = [record.get("batch_size"), record.get("world_size", 1), record.get("steps"), record.get("seed")]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in sizes):
        return "replay refused: batch size, world size, steps and seed must be whole numbers"
    if record["batch_size"] * record.get("world_size", 1) > MAX_REPLAY_SEQUENCES:
        return f"replay refused: a global batch over {MAX_REPLAY_SEQUENCES} sequences"
    return None


# The deepest replay a bundle's record can ask of the reviewer's machine by its own word (replay_depth).
MAX_RECORDED_REPLAY_STEPS = 200


def replay_depth(record: dict, steps: int) -> int:
    """How many steps of the headline window verify replays: at least `steps` (--replay-steps), and as deep as the
    judge's replay went (`evidence.replay.steps`, up to MAX_RECORDED_REPLAY_STEPS: the record's word, which can only
    deepen the check), so the reviewer's replay checks every step the run's own did, the whole window where it did."""
    judged = ((record.get("evidence") or {}).get("replay") or {}).get("steps")
    if isinstance(judged, int) and not isinstance(judged, bool) and judged > steps:
        return min(judged, max(steps, MAX_RECORDED_REPLAY_STEPS))
    return steps


def replay_problems(record: dict, steps: int) -> list[str]:
    """Replay the headline window of a result on this machine (replay_depth steps of it) and compare it with what
    the result recorded."""
    refused = replay_refusal(record)
    if refused:
        return [refused]
    from llmb.judge import replay  # here: the replay is the one check of verify's that needs torch (--replay only)

    replayed = replay.replay_record(record, replay_depth(record, steps))
    return [f"replay: {detail}" for detail in replay.failed(replayed)]


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
