"""The judge's verdict on a worker's record: what it asked for (AskedRuns, judge_figures), the headline from its own
clock, the windows' evidence and the replay (finish), and every check of the worker's figures against its own."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from llmb.api.errors import LlmbError
from llmb.audit import evidence, precision
from llmb.judge import hardware, replay
from llmb.records import RecordError, Result, energy, median_index
from llmb.spec import flops
from llmb.spec import peak_table as peaks
from llmb.spec.presets import official_reasons
from llmb.spec.shape import ModelConfig
from llmb.spec.tolerances import MIN_STEP_SHARE_OF_WINDOW, SEAL_SLACK_SECONDS, SEAL_STEPS, seal_allowance

if TYPE_CHECKING:  # annotations only: the job launcher loads only when a job runs
    from llmb.distributed.job import LaunchSpec, World
    from llmb.judge.initial import InitialModels

# perf_counter is CLOCK_MONOTONIC, one clock for every process of the host: the worker's window must lie inside the
# judge's. Slack for the two clock reads' own granularity.
NESTING_SLACK_SECONDS = 1e-4


def installed_plugins() -> list[dict]:
    """Every installed llmb plugin with its distribution and version, read from metadata (nothing is imported):
    llmb.registry.plugins.installed, the one list of installed plugins."""
    # Lazy: importing the judge loads none of the plugin machinery (tests/test_clean_boundaries.py); this reads
    # package metadata only, when a record is written.
    from llmb.registry.plugins import installed_records

    return installed_records()


@dataclass
class JudgedWindow:
    challenge: int
    opened: float
    closed: float | None = None
    answer: dict = field(default_factory=dict)
    # When its seal (the digests) arrived: work done between the close and the seal is work no clock timed.
    sealed: float | None = None
    # The key the judge handed over at the close (llmb.audit.evidence.moment_seal): the judge's, never the seal's.
    seal_key: int | None = None

    @property
    def seconds(self) -> float:
        return (self.closed or math.nan) - self.opened

    @property
    def seal_seconds(self) -> float:
        return (self.sealed or math.nan) - (self.closed or math.nan)


class AskedRuns:
    """What the judge asked the worker for, run by run: the figures a headline is made of are the judge's own (the
    options it sent, the job it launched), never fields of the worker's record. `--precision all` is one request
    that the worker answers with one record per precision the plugin supports, in llmb's order."""

    def __init__(self, runs: list, launch: LaunchSpec | None = None, world: World | None = None) -> None:
        self.runs = list(runs)
        if launch is not None:
            self.world_size, self.nodes, self.job = launch.nproc_per_node * launch.nnodes, launch.nnodes, True
        elif world is not None:
            self.world_size, self.nodes, self.job = world.world_size, world.nodes, True
        else:
            self.world_size, self.nodes, self.job = 1, 1, False
        self.index = 0
        self.last_precision: str | None = None

    def upcoming(self) -> Any:
        """The options of the run the worker answers next (an ALL request's precisions share their shape and seed)."""
        return self.runs[min(self.index, len(self.runs) - 1)]

    def figures_for(self, record: dict) -> dict:
        """The judge's figures for the next record the worker sent."""
        options = self.upcoming()
        got = str((record.get("precision") or {}).get("requested"))
        if options.precision == "ALL":
            order = list(precision.PRECISIONS)
            earlier = self.last_precision is not None and (
                got not in order or order.index(got) <= order.index(self.last_precision)
            )
            if earlier and self.index + 1 < len(self.runs):  # this ALL request is answered; the next one starts
                self.index += 1
                self.last_precision = None
                return self.figures_for(record)
            self.last_precision = got
            requested = got if got in order else None  # None: any benchmark precision, the worker's choice
        else:
            requested = options.precision
            self.index += 1
        return judge_figures(options, requested, self.world_size, self.nodes, self.job)


def judge_figures(options: Any, requested: str | None, world_size: int, nodes: int, job: bool) -> dict:
    """The figures of one asked run, from the options and the job's size alone (`requested` None: `--precision
    all` asked for whichever benchmark precision the worker ran)."""
    dp = world_size // max(1, options.tp * options.pp)
    microbatches = options.microbatches or math.gcd(options.pp, options.batch_size)
    return {
        "steps": options.steps,
        "repeats": options.repeats,
        "warmup_steps": options.warmup_steps,
        "batch_size": options.batch_size,
        "seed": options.seed,
        "preset": options.preset,
        "config": options.config.to_dict(),
        "official": not official_reasons(options.config),
        "world_size": world_size,
        "nodes": nodes,
        # Each data-parallel rank trains batch_size x grad_accum sequences a step; tensor and pipeline peers add none.
        "global_batch_size": options.batch_size * options.grad_accum * dp,
        "tp": options.tp,
        "pp": options.pp,
        "dp": dp,
        "grad_accum": options.grad_accum,
        "microbatches": microbatches,
        "parallel": (options.parallel if options.parallel not in (None, "none") else "ddp") if job else "none",
        "precision": requested,
        "mode": options.mode,
        # The device type asked for (--device), None where the plugin chose it (the worker resolves its default).
        "device_type": hardware.device_type(options.device),
        # The FLOPs a token costs, from the shape the judge asked for (flops.parameter_count, tested against the
        # model itself): the record's TFLOP/s, MFU and matmul-peak efficiency never rest on the worker's count.
        "model_flops_per_token": flops.model_flops_per_token(options.config),
        # The parameters the shape has (the shape's label in every table says it: "tiny (1433.7M)" would pass a
        # debug shape off as the official one to a reader).
        "parameters": flops.parameter_count(options.config),
    }


# The record's fields that the judge's own figures replace once compared (figure_problems): the headline, its FLOPs
# and the replay are made of these; the layout's degrees are replaced inside the record's layout.
JUDGED_LAYOUT = ("tp", "pp", "dp", "grad_accum", "microbatches")
JUDGED_FIELDS = (
    *("steps", "repeats", "batch_size", "seed", "global_batch_size", "parallel", "model_flops_per_token"),
    *("world_size", "nodes", "parameters"),
)


def figure_problems(record: dict, asked: dict) -> list[str]:
    """Every field of the worker's record that disagrees with what the judge asked for, named."""
    layout = record.get("layout") if isinstance(record.get("layout"), dict) else {}
    said = {
        **{key: record.get(key) for key in ("steps", "repeats", "warmup_steps", "batch_size", "seed", "preset")},
        "config": record.get("config"),
        "official": record.get("official"),
        **{key: record.get(key) for key in JUDGED_FIELDS},
        "precision": (record.get("precision") or {}).get("requested"),
        "mode": (record.get("precision") or {}).get("mode"),
        **{f"layout.{key}": layout.get(key) for key in JUDGED_LAYOUT},
    }
    # The device's type, as the record states it and as its device string parses: both are the worker's word, and
    # the replay's tolerances and device are chosen by them.
    device = record.get("device") if isinstance(record.get("device"), dict) else {}
    said["device type"] = device.get("type")
    said["device spec's type"] = hardware.device_type(device.get("spec"))
    asked = {**asked, **{f"layout.{key}": asked[key] for key in JUDGED_LAYOUT}}
    asked["device type"] = asked["device spec's type"] = asked.get("device_type")
    problems = []
    for key, value in said.items():
        expected = asked[key]
        if key == "precision" and expected is None:
            continue  # --precision all: the precision is the worker's choice among the benchmark's
        if key.startswith("device") and expected is None:
            continue  # no --device: the plugin's default device, which the worker resolved
        if value != expected:
            problems.append(f"judge: the worker's record says {key} {value!r}; the judge asked for {expected!r}")
    return problems


def result_of(record: object) -> Result:
    """The worker's record as a typed Result, checked field by field: it comes from the plugin's process."""
    try:
        return Result.from_dict(record)
    except (RecordError, TypeError, ValueError) as exc:
        raise LlmbError(f"the worker process sent a malformed result: {exc}") from None


# The reason a record saved before its replay carries until the replay's verdict replaces it.
REPLAY_PENDING = (
    "replay: not finished (the run stopped while the judge replayed its window): the run's function is unchecked"
)


def finish(
    record: dict,
    windows: list[JudgedWindow],
    replay_steps: int,
    on_pending: Callable[[Result | dict], None] | None = None,
    asked: dict | None = None,
    replay_whole: float = evidence.DEFAULT_REPLAY_WHOLE,
    initial: InitialModels | None = None,
    run_seconds: float | None = None,
    replay_budget: float = evidence.DEFAULT_REPLAY_BUDGET,
) -> dict:
    """The judge's part of the record: the headline from its own clock, the evidence of every window, the checks of
    the worker's figures against its own, and the replay. ``asked`` (judge_figures) is what the judge asked for:
    the steps, batch, job and shape the headline is computed from, and a record that says otherwise is invalid,
    naming the field. Without it (a record finished again from its own fields) the record's figures are used.
    The replay covers the first `replay_steps` steps of the headline window, or with probability `replay_whole`
    (drawn after every window was answered) the whole of it; past the first steps, it goes on while its further
    steps fit in `replay_budget` of `run_seconds` (the run's wall time on the judge's clock), to the whole window
    where they do.
    ``on_pending`` gets the record as it stands before the replay (marked REPLAY_PENDING), to keep while the replay
    runs. ``initial``: the replay's initial models the judge built while the worker set up (llmb.judge.initial)."""
    result = record
    record = record.to_dict() if hasattr(record, "to_dict") else dict(record)  # a typed Result, or its dict
    invalid = list(record.get("invalid_reasons", []))
    if asked is not None:
        invalid += figure_problems(record, asked)
        # From here on the record carries the judge's figures: what the headline and the replay are made of.
        record.update({key: asked[key] for key in JUDGED_FIELDS})
        if isinstance(record.get("layout"), dict):
            record["layout"] = {**record["layout"], **{k: asked[k] for k in JUDGED_LAYOUT}}
        record["config"] = asked["config"]
        record["sequence_length"] = asked["config"]["sequence_length"]
        if not asked["official"]:
            record["official"] = False
    repeats = int(record["repeats"])
    closed = [w for w in windows if w.closed is not None]
    if len(closed) != repeats or len(windows) != repeats:
        invalid.append(
            f"judge: {len(closed)} of {repeats} measured windows were opened and closed through the clean clock"
        )
    for index, window in enumerate(closed):
        invalid += nesting_problems(index, window)
        invalid += seal_problems(index, window, int(record["steps"]))
    invalid += record_problems(record, closed)
    # What the sealed digests cover is the job's layout's to say (the judge's tp and pp), not the seal's: a seal that
    # called a one-process run's digests "rank 0's part" would have its whole-window replay skip them.
    scope = evidence.digest_scope(record.get("layout") or {})
    for index, window in enumerate(closed):
        sealed = window.answer.get("digest_scope", scope)
        if sealed != scope:
            invalid.append(
                f"judge: window {index + 1}'s seal says its digests cover {sealed!r}; the job's layout gives {scope!r}"
            )
    evidence_windows = [
        evidence.Window(
            challenge=w.challenge,
            clean_seconds=w.seconds,
            losses=list(w.answer.get("losses") or []),
            digest_start=list(w.answer.get("digest_start") or []),
            digest_end=list(w.answer.get("digest_end") or []),
            worker_seconds=_number(w.answer.get("worker_window_seconds")),
            moments_end=list(w.answer.get("moments_end") or []),
            seal_key=w.seal_key,
            moments_projection=list(w.answer.get("moments_projection") or []),
        ).to_dict()
        | {"digest_scope": scope}
        for w in closed
    ]
    steps = int(record["steps"])
    for index, window in enumerate(evidence_windows):
        if len(window["losses"]) != steps:
            invalid.append(f"judge: window {index + 1} answered {len(window['losses'])} losses for {steps} steps")
    record = dict(record)
    # The device's name as the judge reads it where it can, then the peak behind the MFU, chosen here again: the
    # worker's choice (and its reasons) crossed the link as its word.
    record["device"], known, problems = judged_device(record)
    invalid += problems + hardware.unseen_device_problems(record["device"].get("spec"))
    record["peak"], problems = judged_peak(record, known)
    invalid += [problem for problem in problems if problem not in invalid]
    if closed:
        seconds = [w.seconds for w in closed]
        headline = median_index([1 / s for s in seconds])  # by throughput: the headline rule
        timing = dict(record["timing"])
        timing["worker_window_seconds"] = timing.get("window_seconds")
        timing["worker_repeat_window_seconds"] = timing.get("repeat_window_seconds")
        timing.update(
            window_seconds=seconds[headline],
            repeat_window_seconds=seconds,
            clock="judge",
            seal_seconds=[w.seal_seconds for w in closed] if all(w.sealed is not None for w in closed) else None,
        )
        record["timing"] = timing
        record.update(headline_figures(record, seconds[headline]))
        invalid += [problem for problem in peaks.mfu_problems(record["mfu"]) if problem not in invalid]
        chosen = evidence_windows[headline]["losses"]
        if chosen:
            record["loss"] = {**record["loss"], "first": chosen[0], "last": chosen[-1]}
    else:
        headline = 0
    # The energy over the judge's own windows, from the counter readings the worker answered at each close.
    tokens = int(record.get("global_batch_size") or record["batch_size"]) * int(record["config"]["sequence_length"])
    record["energy"], problems = energy.summarise(
        record.get("energy"),
        [w.answer.get("energy_joules") for w in closed],
        [w.seconds for w in closed],
        tokens * steps / int(record.get("world_size") or 1),
    )
    invalid += problems
    record["evidence"] = {
        "schema": evidence.SCHEMA,
        "digest": "per parameter, in the model's order: [sum, sum of squares] of its elements in float64",
        "windows": evidence_windows,
        "headline_window": headline,
    }
    record["judge"] = {
        "clean_room": True,
        "clock": "time.perf_counter of a process that imported no plugin",
        "pid": os.getpid(),
        "installed_plugins": installed_plugins(),
    }
    if evidence_windows and replay_steps > 0 and len(closed) == repeats:
        if on_pending is not None:
            pending = {**record, "evidence": {**record["evidence"], "replay": None}}
            on_pending(_sealed(result, pending, [*invalid, REPLAY_PENDING]))
        # Drawn now, after the worker answered for every step of every window: any step may be checked.
        depth, whole = replay.draw_replay_steps(replay_steps, steps, replay_whole)
        # Past the steps drawn, as far as the checks' share of the run's wall time affords (none where it is not
        # known: a record finished again from its own fields).
        budget = replay_budget * run_seconds if run_seconds and not whole else None
        # On the run's own accelerator where torch drives it without a plugin (replay.replay_device), else the CPU.
        device = (record.get("device") or {}).get("spec")
        replayed = replay.replay_record(record, depth, device=device, initial=initial, budget_seconds=budget)
        replayed["drawn"] = {
            "floor_steps": replay_steps,
            "whole_window_probability": replay_whole,
            "whole": whole,
            "budget_share": replay_budget,
            "run_seconds": run_seconds,
        }
        record["evidence"]["replay"] = replayed
        invalid += [f"replay: {detail}" for detail in replay.failed(replayed)]
    elif replay_steps <= 0:
        record["evidence"]["replay"] = None
        invalid.append("replay: not run (--replay-steps 0): the run's function is unchecked")
    return _sealed(result, record, invalid)


def _sealed(result, record: dict, invalid: list[str]):
    """The judged record with its invalid reasons and verdict, typed as the worker's record came (Result or dict)."""
    record = {**record, "invalid_reasons": invalid, "valid": bool(record.get("official")) and not invalid}
    return type(result).from_dict(record) if hasattr(result, "to_dict") else record


def judged_device(record: dict) -> tuple[dict, bool, list[str]]:
    """The record's device with the name the judge reads for it where it can read this host's devices through torch
    (llmb.judge.hardware), whether the name is known (False: the judge read this host's devices and could not tell
    which of them ran; the plugin's name stays and no peak is used), and what is wrong with the plugin's name.
    Elsewhere the name stays the plugin's word."""
    device = dict(record.get("device") or {})
    name, problems = hardware.judged_device_name(device.get("spec"), str(device.get("name") or ""))
    if name is not None:
        device["name"] = name
    return device, name is not None, problems


def judged_peak(record: dict, known: bool = True) -> tuple[dict, list[str]]:
    """The record's peak as llmb's table gives it for the record's device name and label, with the plugin's
    declaration only where the table lacks the device (llmb.spec.peak_table.choose, as the worker's record.choose_peak
    calls it), and every problem with it: a peak the worker's record carries that is not this one is named. The
    device name is the judge's (judged_device, before this) and the declaration stays the plugin's word
    (docs/integrity.md, section 6)."""
    said = record.get("peak") if isinstance(record.get("peak"), dict) else {}
    name = str((record.get("device") or {}).get("name") or "")
    effective = str((record.get("precision") or {}).get("effective") or "")
    declared = _number(said.get("declared_flops"))
    declared = declared if effective in precision.PRECISIONS and math.isfinite(declared) and declared > 0 else None
    source = said.get("source") if said.get("origin") == peaks.ORIGIN_DECLARED else None
    if not known:  # the judge read this host's devices and could not tell which one ran: no peak
        return peaks.PeakChoice(None, None, None, (), declared).to_dict(), []
    # A declaration below the matmul rate the run measured is no ceiling. The worker's figure; one lowered to pass
    # this meets the model GEMM rate above it (a warning).
    measured = measured_matmul_peak(record)
    choice = peaks.choose(name, effective, declared, source if isinstance(source, str) else None, measured)
    peak = choice.to_dict()
    problems = list(choice.problems)
    if (said.get("flops"), said.get("origin")) != (peak["flops"], peak["origin"]):
        problems.append(
            f"judge: the worker's record says peak {said.get('flops')!r} ({said.get('origin')}); llmb's table and the "
            f"plugin's declaration give {peak['flops']!r} ({peak['origin']}) for {name!r} {effective}"
        )
    return peak, problems


def nesting_problems(index: int, window: JudgedWindow) -> list[str]:
    """The worker's window, read on the same host clock, must lie inside the judge's."""
    start, end = _number(window.answer.get("worker_start")), _number(window.answer.get("worker_end"))
    if not (math.isfinite(start) and math.isfinite(end)):
        return [f"judge: window {index + 1}'s answer carries no worker clock readings"]
    slack = NESTING_SLACK_SECONDS
    if start < window.opened - slack or end > window.closed + slack or end < start:
        return [
            f"clock: the plugin's process timed window {index + 1} from {start:.6f} to {end:.6f}, outside the clean "
            f"clock's {window.opened:.6f} to {window.closed:.6f} (its clock is not the host's)"
        ]
    return []


def seal_problems(index: int, window: JudgedWindow, steps: int) -> list[str]:
    """The seal must follow the close by no more than its digests and the last step's backward and update take
    (SEAL_STEPS of the window's mean steps): the digests come after the judge's clock stopped, so a plugin that ran
    the forwards in the window and the backwards and AdamW's updates before the seal would otherwise answer for work
    no clock timed, its digests exact (tests/redteam/test_redteam_after_the_clock.py)."""
    if window.sealed is None or window.closed is None or steps <= 0:
        return []  # no seal: no digests, which the replay refuses on its own
    allowed = seal_allowance(window.seconds, steps)
    if window.seal_seconds <= allowed:
        return []
    return [
        f"judge: window {index + 1}'s seal came {window.seal_seconds:.3f} s after its clock stopped, more than the "
        f"{allowed:.3f} s its digests and last step may take ({SEAL_STEPS} of its {steps} steps' mean "
        f"{window.seconds / steps:.3f} s, plus {SEAL_SLACK_SECONDS} s): work done after the clock is not the window's"
    ]


def record_problems(record: dict, closed: list[JudgedWindow]) -> list[str]:
    """The worker's own figures against what it answered at each close and the judge's clock: its record's
    windows must be the ones it timed, and its step times must fill the judged window."""
    timing = record.get("timing") or {}
    claimed = timing.get("repeat_window_seconds") or []
    problems = []
    for index, window in enumerate(closed[: len(claimed)]):
        own, said = _number(window.answer.get("worker_window_seconds")), _number(claimed[index])
        if not (math.isfinite(said) and own * (1 - 1e-9) <= said <= window.seconds + NESTING_SLACK_SECONDS):
            problems.append(
                f"timing: the plugin's process recorded window {index + 1} as {said:.6f} s; it timed {own:.6f} s "
                f"and the clean clock {window.seconds:.6f} s"
            )
    if closed:
        headline = median_index([1 / w.seconds for w in closed])
        steps = [_number(s) for s in timing.get("step_seconds") or []]
        window = closed[headline].seconds
        # The headline repeat's step times, from the plugin's process (device events or host clock): information,
        # but a set that leaves most of the judged window unexplained says the plugin's timer is not the device's.
        worker_headline = median_index([1 / _number(w) for w in claimed]) if len(claimed) == len(closed) else headline
        if worker_headline == headline and steps and sum(steps) < MIN_STEP_SHARE_OF_WINDOW * window:
            problems.append(
                f"timing: the plugin's step times add up to {sum(steps):.6f} s, under "
                f"{MIN_STEP_SHARE_OF_WINDOW:.0%} of the {window:.6f} s the clean clock measured"
            )
    return problems


def measured_matmul_peak(record: dict) -> float | None:
    """The dense matmul rate the run measured on its device after its window (llmb.run.roofline), as the record
    says it; None where it holds no positive, finite figure."""
    value = _number(record.get("measured_matmul_peak"))
    return value if math.isfinite(value) and value > 0 else None


def _number(value) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan


def headline_figures(record: dict, window_seconds: float) -> dict:
    """Every figure derived from the window, from the record's own shape, batch and job."""
    config = ModelConfig(**record["config"])
    world_size = int(record.get("world_size") or 1)
    # What the data-parallel ranks ran, as the run recorded it (tensor and pipeline peers add no samples).
    global_batch = int(record.get("global_batch_size") or int(record["batch_size"]) * world_size)
    steps = int(record["steps"])
    tokens_per_second = global_batch * config.sequence_length * steps / window_seconds
    tflops = flops.achieved_tflops(tokens_per_second / world_size, record["model_flops_per_token"])
    # The matmul rate the run measured after its window: the efficiency from the judge's figure.
    matmul_peak = measured_matmul_peak(record)
    return {
        "tokens_per_second": tokens_per_second,
        "tokens_per_second_per_device": tokens_per_second / world_size,
        "samples_per_second": global_batch * steps / window_seconds,
        "tflops": tflops,
        "mfu": flops.mfu(tflops, (record.get("peak") or {}).get("flops")),
        "fom": flops.fom(config, global_batch, window_seconds / steps),
        "matmul_peak_efficiency": tflops * 1e12 / matmul_peak if matmul_peak else None,
    }
