"""One `llmb run` request carried out: judged from this process in the clean room (the plugin runs in a worker) or,
for library and test use, in this process; each record saved and shown as soon as it is judged."""

from __future__ import annotations

import json
import os
from pathlib import Path

import click

from llmb.api.errors import LlmbError, UsageError, time_limit
from llmb.api.settings import SECRET_OPTIONS_ENV
from llmb.distributed import job as distributed
from llmb.judge import cleanroom
from llmb.records import Result
from llmb.records.result_files import save_result, write_result
from llmb.registry.plugins import call, select_backend
from llmb.run import jobs as run_jobs
from llmb.run import runner
from llmb.run.result_view import print_record
from llmb.spec import vocab as names
from llmb.terminal import console as term
from llmb.terminal.progress import RichProgress, run_progress


def secret_options() -> dict[str, str]:
    """Secret settings a sweep passes to its trial in the environment, never on the command line."""
    raw = os.environ.pop(SECRET_OPTIONS_ENV, "")
    try:
        given = json.loads(raw) if raw else {}
    except ValueError:
        raise LlmbError(f"{SECRET_OPTIONS_ENV} is not JSON") from None
    if not isinstance(given, dict):
        raise LlmbError(f"{SECRET_OPTIONS_ENV} is not a JSON object")
    return {str(k): str(v) for k, v in given.items()}


def run_and_save(
    base: runner.RunOptions,
    requested: str,
    launch: distributed.LaunchSpec | None,
    replay: tuple[int, float, float],
    out: Path,
    limit_seconds: float | None = None,
) -> tuple[list[Result], list[Path]]:
    """Run each precision asked for (``requested``: one, or ALL) and save its record in ``out`` as it is judged.
    Returns the records and the paths of those saved elsewhere because ``out`` failed (each printed too). Past
    ``limit_seconds`` (--time-limit) TimeLimitReached is raised; what was judged before it is saved already."""
    unsaved: list[Path] = []
    said = (
        f"the run went past its time limit of {limit_seconds or 0:g} s and was stopped (--time-limit); each record "
        f"judged before it is saved in {out}"
    )
    with time_limit(limit_seconds, said):
        if not cleanroom.in_process():
            records = run_clean(base, requested, launch, replay, out, unsaved)
        else:
            records = run_in_process(base, requested, launch, out, unsaved)
    distributed.shutdown()
    return records, unsaved


def run_clean(
    base: runner.RunOptions,
    requested: str,
    launch: distributed.LaunchSpec | None,
    replay: tuple[int, float, float],
    out: Path,
    unsaved: list[Path],
) -> list[Result]:
    """Judged from this process, which imports no plugin: the worker it starts runs the plugin
    (llmb.judge.cleanroom)."""
    # Under --nproc-per-node the parallel strategy is the job's; this process is not in it.
    parallel = None if launch is not None else base.parallel
    runner.check_request(runner.RunOptions(**{**base.__dict__, "precision": requested, "parallel": parallel}), True)
    replay_steps, replay_whole, replay_budget = replay
    if replay_steps < 0:
        raise click.UsageError(f"--replay-steps must be 0 or more, got {replay_steps}")
    runs = [runner.RunOptions(**{**base.__dict__, "precision": requested})]
    if launch is not None:
        runner.check_layout(runs[0], launch.nproc_per_node * launch.nnodes, launch.nnodes)
    world = distributed.current_world()
    with run_progress() as progress:
        shown = RichProgress(progress, "") if world is None or world.rank == 0 else None
        # Each record is saved as soon as it is judged, before the next precision runs: nothing measured is lost
        # to a later failure or a signal.
        saved: list = []
        records, error = cleanroom.run_clean_keeping(
            runs,
            launch,
            progress=shown,
            notes=lambda text: term.say((text, "yellow")),
            replay_steps=replay_steps,
            replay_whole=replay_whole,
            replay_budget=replay_budget,
            on_record=lambda record: saved.append((record, save(record, out, unsaved))),
            on_pending=lambda record: save_quietly(record, out),
        )
    for record, path in saved:
        print_record(record, path)
    if error is not None:
        raise error
    return records


def run_in_process(
    base: runner.RunOptions, requested: str, launch: distributed.LaunchSpec | None, out: Path, unsaved: list[Path]
) -> list[Result]:
    """Library and test use (LLMB_IN_PROCESS=1): the plugin's own process judges, and no record is valid."""
    if requested == names.ALL_PRECISIONS:
        wanted, unsupported = names.expand_precision(
            requested, call(select_backend(base.plugin, base.device).backend.precisions)
        )
        for name in unsupported:
            term.say((f"{name}: unsupported by this plugin", "yellow"))
    else:
        wanted = [requested]
    records = []
    runs = [runner.RunOptions(**{**base.__dict__, "precision": name}) for name in wanted]
    if launch is not None:
        for options_for in runs:  # bad input fails here, before any process starts
            runner.check_launch(options_for, launch.nproc_per_node * launch.nnodes, launch.nnodes)
        for record in run_jobs.launch_runs(launch, runs):
            records.append(record)
            print_record(record, save(record, out, unsaved))
    for options_for in runs if launch is None else []:
        record = run_one(options_for)
        if record is None:
            continue  # another rank of a torchrun job: rank 0 writes the result
        path = save(record, out, unsaved)
        records.append(record)
        print_record(record, path)
    return records


def save(record: Result, out: Path, unsaved: list[Path]) -> Path:
    """Write the result; if --out fails after the measurement, it is printed and saved under the temporary folder."""
    path, problem = save_result(record, out)
    if problem is not None:
        click.echo(json.dumps(record.to_dict(), indent=2))
        term.error(f"the result could not be written to {out} ({problem}); it is printed above and saved as {path}")
        unsaved.append(path)
    return path


def save_quietly(record: Result, out: Path) -> None:
    """Keep a record before its replay; the replayed record replaces it (same file), and reports any failure."""
    try:
        write_result(record, out)
    except (OSError, UsageError):
        pass


def run_one(options: runner.RunOptions) -> Result | None:
    """A run with rich's progress bars (a runner.Result, or None on ranks other than 0)."""
    world = distributed.current_world()
    if world is not None and world.rank != 0:
        return runner.run(options)
    with run_progress() as progress:
        return runner.run(options, RichProgress(progress, options.precision))
