"""Batch-size sweeps: every trial a `llmb run` subprocess, every finished point logged at once, resumable.

The automatic search doubles the batch from 1 until a trial fails (out of memory, crash, timeout, invalid, refused) or
the throughput stops growing, then bisects between the last two sizes. Its next step is a pure function of the points
found so far, so a sweep resumed from its log takes the same decisions and reruns nothing finished.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from llmb.api.errors import LlmbError, Terminated, UsageError, interrupts_remembered, shown, time_limit
from llmb.api.settings import recorded
from llmb.audit import precision
from llmb.records import (
    SPREAD_WARNING,
    SWEEP_LOG_SCHEMA,
    SWEEP_SUMMARY_SCHEMA,
    envelope,
)
from llmb.records import SWEEP_LOG_NAME as LOG_NAME
from llmb.records import SweepTrial as Trial
from llmb.records.result_files import check_writable, read_result, write_json_atomic
from llmb.registry.plugins import call
from llmb.run import runner, sysinfo

# The sweep's parts, each in its own module (callers import them from there).
from llmb.run.sweep_display import Display
from llmb.run.sweep_log import SweepLog
from llmb.run.sweep_options import (
    CONFIRM_TRIALS,
    MAX_BATCH_SIZE,
    PLATEAU_GAIN,
    REFINE_POINTS,
    SUMMARY_NAME,
    FirstTrialRefused,
    Interrupted,
    SweepOptions,
)
from llmb.run.sweep_search import (
    Points,
    best_batch,
    headline_of,
    next_batch,
    next_listed_batch,
    next_point,
)
from llmb.run.sweep_trials import run_trial
from llmb.spec import vocab as names
from llmb.terminal import console as term

if TYPE_CHECKING:
    import torch

    from llmb.registry.plugins import Registration


# The sweep.


def precisions_to_sweep(plugin: Registration, requested: str) -> tuple[list[str], list[str]]:
    """(precisions to sweep, precisions the plugin does not support) for a --precision value."""
    return names.expand_precision(requested, call(plugin.backend.precisions))


def emulated_note(device: torch.device, names: list[str]) -> str | None:
    """The warning a sweep on the host CPU gives before its first trial for the 16-bit precisions this CPU only
    emulates (from its flags): their trials take several times FP32's (issue 27). None elsewhere."""
    slow = sysinfo.cpu_emulated_precisions() if device.type == "cpu" else []  # reads /proc/cpuinfo: once
    emulated = [p for p in names if p in slow]
    if not emulated:
        return None
    them = "them" if len(emulated) > 1 else "it"
    return (
        f"warning: {', '.join(emulated)} emulated on this CPU (no native matmul for {them}): their trials run several "
        "times slower than FP32's"
    )


def sweep(options: SweepOptions, display: Display | None = None) -> dict:
    """Run (or resume) a sweep; return its summary, which is also written to SUMMARY_NAME in the out directory.
    The sweep holds an exclusive lock on its folder for its whole life: a second sweep there is refused."""
    out = Path(options.out)
    # The folders this sweep makes (--out and any parent missing, as for `--search`'s sub-folders), deepest first.
    made = [p for p in [out, *out.parents] if not os.path.lexists(p)]
    try:
        check_writable(out)
        out.mkdir(parents=True, exist_ok=True)  # the lock is taken on the folder; removed below if nothing ran
        with _folder_lock(out):
            return _sweep(options, display)
    except BaseException:
        for folder in made:  # a sweep refused before its first trial leaves no empty folder behind, parents neither
            if not folder.is_dir() or folder.is_symlink() or any(folder.iterdir()):
                break
            folder.rmdir()
        raise


@contextlib.contextmanager
def _folder_lock(out: Path):
    fd = os.open(out, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)  # close-on-exec: trials never hold it
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise LlmbError(
                f"{out} is in use by another sweep (it holds the folder's lock): wait, or use another --out"
            ) from None
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def trial_bound(options: SweepOptions, precisions: int) -> int:
    """The most trials a sweep of this many precisions can take: each size of the search (a list's, or the doublings
    up to the ceiling and the refinement's) measured at most CONFIRM_TRIALS times, then the re-runs."""
    sizes = len(options.batch_sizes) if options.batch_sizes else options.max_batch_size.bit_length() + REFINE_POINTS
    return precisions * (sizes * CONFIRM_TRIALS + options.repeats)


def scaled_to_device(options: SweepOptions) -> tuple[SweepOptions, str]:
    """The sweep's options with those not given (None) set for the device it runs on, and a line saying which."""
    run = options.run
    given = {
        "steps": run.steps,
        "warmup_steps": run.warmup_steps,
        "max_batch_size": options.max_batch_size,
        "trial_timeout": options.trial_timeout,
    }
    if all(value is not None for value in given.values()):
        return options, ""
    _, device, _ = runner.resolve(replace(run, steps=run.steps or 1, warmup_steps=run.warmup_steps or 1))
    defaults = names.SWEEP_DEVICE_DEFAULTS.get(device.type, names.SWEEP_DEFAULTS)
    chosen = {k: defaults[k] if v is None else v for k, v in given.items()}
    taken = [k for k, v in given.items() if v is None]
    line = (
        f"sweep on {device.type}: {chosen['steps']} + {chosen['warmup_steps']} warmup steps a trial, batch sizes up "
        f"to {chosen['max_batch_size']}, {chosen['trial_timeout']:g} s a trial at most (the {device.type} defaults "
        f"of {', '.join('--' + k.replace('_', '-') for k in taken)})"
    )
    run = replace(run, steps=chosen["steps"], warmup_steps=chosen["warmup_steps"])
    scaled = replace(options, run=run, max_batch_size=chosen["max_batch_size"], trial_timeout=chosen["trial_timeout"])
    return scaled, line


def _sweep(options: SweepOptions, display: Display | None = None) -> dict:
    display = display or Display()
    # The sweep's own calls into the plugin (its import, precisions, devices, settings), before any trial, are
    # bounded as a trial is: a plugin that hangs there would otherwise hang the sweep, which no trial's limit covers.
    # Before the device is known, by the longest default.
    longest = max(d["trial_timeout"] for d in (names.SWEEP_DEFAULTS, *names.SWEEP_DEVICE_DEFAULTS.values()))
    bound = options.trial_timeout if options.trial_timeout is not None else longest
    said = f"the plugin did not answer the sweep's own checks within {bound:g} s (--trial-timeout); no trial was run"
    with time_limit(bound, said):
        options, line = scaled_to_device(options)
        if line:
            display.note(line)
        for name, value, low in (("repeats", options.repeats, 0), ("max-batch-size", options.max_batch_size, 1)):
            if value < low:
                raise UsageError(f"--{name} must be at least {low}, got {value}")
        if options.trial_timeout <= 0:
            raise UsageError(f"--trial-timeout must be positive, got {options.trial_timeout}")
        plugin, device, settings = runner.resolve(options.run)
        precisions, unsupported = precisions_to_sweep(plugin, options.precision)
        for name in precisions:  # every precision is checked before the first trial starts
            runner.resolve(replace(options.run, precision=name))
    line = emulated_note(device, precisions)
    if line:  # said once the folder's lock is held: a refused sweep says one line, the refusal
        display.note(line)
    display.plan(trial_bound(options, len(precisions)))
    run_options = replace(options.run, plugin=plugin.name, device=str(device))
    header = {
        "schema": SWEEP_LOG_SCHEMA,
        "plugin": plugin.name,
        "device": str(device),
        "settings": recorded(settings),
        "mode": run_options.mode,
        "preset": run_options.preset,
        "config": run_options.config.to_dict(),
        "steps": run_options.steps,
        "warmup_steps": run_options.warmup_steps,
        "seed": run_options.seed,
        "batch_sizes": options.batch_sizes or "auto",
        "max_batch_size": options.max_batch_size,
        # Not identity (a resumed sweep may change them), but --resume takes them from here when not given again.
        "precision": options.precision,
        "repeats": options.repeats,
        "trial_timeout": options.trial_timeout,
        "plateau_gain": PLATEAU_GAIN,
        "refine_points": REFINE_POINTS,
        "confirm_trials": CONFIRM_TRIALS,
    }
    secret = frozenset(getattr(settings, "secret", frozenset()))
    options = replace(options, run=run_options, out=Path(options.out), secret=secret)
    log = SweepLog.open(options.out, header, options.resume)
    for stale in options.out.glob(".trial-*"):  # scratch left by a killed sweep
        shutil.rmtree(stale, ignore_errors=True)
    summary = {
        **envelope(SWEEP_SUMMARY_SCHEMA),
        "log": LOG_NAME,
        **{k: header[k] for k in ("plugin", "device", "settings", "mode", "preset", "steps", "warmup_steps")},
        "repeats": options.repeats,
        "precisions": {
            name: {"status": "unsupported by the plugin" if name in unsupported else "not run yet"}
            for name in precision.PRECISIONS
            if name in precisions or name in unsupported
        },
    }
    current = ["", 0]

    def point(precision_name: str, batch: int, phase: str, index: int) -> Trial:
        found = log.find(precision_name, phase, batch, index)
        if found is None:
            # An interrupt CPython dropped (raised inside a finalizer) stops the sweep before a trial and after one
            # (the last trial's: no next one would look), the finished point logged first.
            stop_if_interrupted()
            current[:] = [precision_name, batch]
            display.trial(precision_name, batch, phase, index + 1)
            found = run_trial(options, precision_name, batch, phase, index)
            if found.status == "refused" and not log.trials:
                # The sweep's first trial refused, nothing measured yet: the request itself is the likelier cause
                # (a device the sweep cannot check without taking it, e.g. --device cuda:7 on one GPU), so the
                # sweep stops with the run's reason and loses nothing. A later refusal is that point's.
                raise FirstTrialRefused(
                    f"{precision_name} batch {batch}: llmb run refused the sweep's first trial: {found.detail}"
                )
            log.add(found)
            display.finished(found, reused=False)
            stop_if_interrupted()
        else:
            display.finished(found, reused=True)
        return found

    try:
        # SIGTERM stops the sweep as Ctrl-C does: the running trial is killed, the log kept.
        with interrupts_remembered() as stop_if_interrupted:
            for name in precisions:
                summary["precisions"][name] = _sweep_precision(options, name, point, display)
                write_json_atomic(options.out / SUMMARY_NAME, summary)
    except KeyboardInterrupt as exc:
        code = 143 if isinstance(exc, Terminated) else 130
        where = f" at {current[0]} batch {current[1]}" if current[0] else ""
        raise Interrupted(
            f"sweep interrupted{where}; {len(log.trials)} finished points kept in {log.path} (continue with --resume)",
            code,
        ) from None
    write_json_atomic(options.out / SUMMARY_NAME, summary)
    return summary


def _sweep_precision(options: SweepOptions, name: str, point, display: Display) -> dict:
    points: Points = {}
    search = (
        (lambda p: next_listed_batch(p, options.batch_sizes))
        if options.batch_sizes
        else (lambda p: next_batch(p, options.max_batch_size))
    )
    while True:
        batch, reason = next_point(points, search)
        if batch is None:
            break
        trials = points.setdefault(batch, [])
        trials.append(point(name, batch, "search", len(trials)))
        display.best(name, headline_of(points, []))
    best = best_batch(points)
    entry = {
        "stop": reason,
        "search": [_brief(t) for b in sorted(points) for t in points[b]],
    }
    if best is None:
        return {"status": "no batch size ran", **entry}
    repeats = []
    for i in range(options.repeats):
        repeats.append(point(name, best, "repeat", i))
        display.best(name, headline_of(points, repeats))
    entry.update(best_batch_size=best, repeats=[_brief(t) for t in repeats])
    if options.repeats and not any(t.ok for t in repeats):
        return {"status": f"every re-run of batch {best} failed", **entry}
    headline, measured = headline_of(points, repeats)
    record = read_result(options.out / headline.result)
    values = [t.tokens_per_second for t in measured]
    return {
        "status": "ok",
        "best_batch_size": best,
        "tokens_per_second": headline.tokens_per_second,  # the median run's (the slower middle for even counts)
        "spread": [min(values), max(values)],
        "runs": len(measured),
        "headline_result": headline.result,
        "effective_precision": record.precision.effective,
        "device_label": record.device.label,  # as the run and check-plugin name it: "AMD EPYC (cpu)"
        "tflops": record.tflops,
        "mfu": record.mfu,
        "peak_memory_bytes": record.peak_memory_bytes,
        **entry,
    }


def _brief(trial: Trial) -> dict:
    return {k: v for k, v in trial.to_dict().items() if k not in ("precision", "phase") and v not in (None, "")}


def parse_batch_sizes(text: str) -> list[int] | None:
    """ "auto" (None) or a comma-separated list of positive sizes, sorted."""
    if text.strip().lower() == "auto":
        return None
    try:
        # An empty item (1,,4) is a typo, not a size to leave out: it fails like any other.
        sizes = sorted({int(part) for part in text.split(",")})
    except ValueError:
        raise UsageError(f"--batch-sizes expects auto or a list like 1,2,4, got {shown(text)}") from None
    if not sizes or sizes[0] < 1 or sizes[-1] > MAX_BATCH_SIZE:
        raise UsageError(f"--batch-sizes must be integers from 1 to {MAX_BATCH_SIZE}, got {shown(text)}")
    return sizes


def print_summary(summary: dict, console: Console) -> None:
    labels = [e["device_label"] for e in summary["precisions"].values() if isinstance(e.get("device_label"), str)]
    table = term.table(f"llmb sweep: {summary['plugin']} on {labels[0] if labels else summary['device']}")
    columns = ("precision", "best batch", "tokens/s (median)", "spread (min-max)", "runs", "TFLOP/s", "stopped because")
    for column in columns:
        term.column(table, column, numeric=column in ("best batch", "tokens/s (median)", "runs", "TFLOP/s"))
    warnings = []
    for name, entry in summary["precisions"].items():
        if entry.get("status") != "ok":
            term.row(table, name, "", entry["status"], "", "", "", entry.get("stop", ""))
            continue
        low, high = entry["spread"]
        term.row(
            table,
            name,
            str(entry["best_batch_size"]),
            f"{entry['tokens_per_second']:,.1f}",
            f"{low:,.1f}-{high:,.1f}",
            str(entry["runs"]),
            f"{entry['tflops']:.3g}",
            entry["stop"],
        )
        spread = (high - low) / entry["tokens_per_second"]
        if spread > SPREAD_WARNING:
            warnings.append(
                f"NOISY: {name} batch {entry['best_batch_size']}: the {entry['runs']} runs spread {spread:.1%} "
                f"({low:,.1f}-{high:,.1f} tokens/s, more than {SPREAD_WARNING:.0%}); re-run on a quieter host"
            )
    console.print(table)
    for warning in warnings:
        console.print(term.text(warning, "bold yellow"), soft_wrap=True)
