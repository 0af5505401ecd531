"""`llmb run`: its options, parsed into the runner's RunOptions, then handed to llmb.run.request."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from llmb.api.settings import parse_options
from llmb.cli import click_types as bounds
from llmb.cli.common import (
    LAUNCH_PARAMETERS,
    handle_errors,
    launch_options,
    launch_spec,
    loop_options,
    plugin_options,
    pop_shape,
    precision_options,
)
from llmb.spec import vocab as names


@click.command()
@plugin_options
@precision_options("FP32")
@click.option("--strict-precision", is_flag=True, help="Fail when the audited precision is below the requested one.")
@click.option("--batch-size", default=1, show_default=True, type=bounds.BATCH)
@click.option(
    "--repeats",
    default=1,
    show_default=True,
    type=bounds.REPEATS,
    help="Measurements on the same model; the median is reported.",
)
@loop_options("Measured steps per repeat.")
@click.option(
    "--out",
    default="results",
    show_default=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory for the result JSON files.",
)
@launch_options
@click.option(
    "--parallel",
    type=bounds.choice(names.PARALLEL, "parallelism"),
    default=None,
    help="Several processes: DDP, FSDP2 (each decoder layer a unit) or HSDP (replicate x shard); default ddp. "
    "Batch size is per data-parallel rank.",
)
@click.option(
    "--tp", type=bounds.PROCESSES, default=1, show_default=True, help="Tensor-parallel size (torch's TP plans)."
)
@click.option(
    "--pp", type=bounds.PROCESSES, default=1, show_default=True, help="Pipeline stages (torch.distributed.pipelining)."
)
@click.option("--microbatches", type=bounds.COUNT, default=None, help="Pipeline microbatches per step (default: --pp).")
@click.option(
    "--pp-schedule", type=bounds.choice(names.SCHEDULES, "pipeline schedule"), default="gpipe", show_default=True
)
@click.option("--grad-accum", type=bounds.COUNT, default=1, show_default=True, help="Micro-steps per optimizer step.")
@click.option("--sequence-parallel", is_flag=True, help="With --tp: shard norms and the residual along the sequence.")
@click.option(
    "--dist-timeout",
    "timeout_seconds",
    type=bounds.SECONDS,
    default=names.DEFAULT_TIMEOUT_SECONDS,
    show_default=True,
    help="Seconds a collective waits for a peer before the run fails.",
)
@click.option(
    "--replay-steps",
    type=bounds.REPLAY_STEPS,
    default=names.DEFAULT_REPLAY_STEPS,
    show_default=True,
    help="Steps of the headline window replayed on the CPU in FP32 before the record is written (0: none, "
    "and the result is not valid).",
)
@click.option(
    "--replay-whole",
    type=bounds.SHARE,
    default=names.DEFAULT_REPLAY_WHOLE,
    show_default=True,
    help="Probability that the judge replays the whole headline window instead (drawn after the window answered "
    "for every step; 1: always).",
)
@click.option(
    "--replay-budget",
    type=bounds.SHARE,
    default=names.DEFAULT_REPLAY_BUDGET,
    show_default=True,
    help="Share of the run's wall time the judge's replay may take when the whole window is not drawn: past "
    "--replay-steps, which it always replays, it goes on while the whole replay fits, to the whole window where it "
    "does (0: none).",
)
@click.option(
    "--time-limit",
    type=bounds.SECONDS,
    default=None,
    help="Seconds the whole command may take (every precision, the judge's replay included; default: none). Past "
    "it the worker is stopped, each record judged before stays saved, and llmb exits 124.",
)
@handle_errors
def run(
    precision_name: str,
    options: tuple[str, ...],
    out: Path,
    replay_steps: int,
    replay_whole: float,
    replay_budget: float,
    time_limit: float | None,
    **fields: Any,
) -> None:
    """Run the training benchmark and write one result JSON per precision."""
    # Lazy: the model's config, the results and the runner import torch; --help must not.
    from llmb.records.result_files import check_writable
    from llmb.run import request as run_request
    from llmb.run import runner
    from llmb.spec.presets import build_config

    # What is left in ``fields`` once the launch and the shape are taken out is runner.RunOptions's fields, each
    # under its own name (--precision-mode: mode, --dist-timeout: timeout_seconds): click fills them.
    launch = launch_spec(*(fields.pop(name) for name in LAUNCH_PARAMETERS), fields["timeout_seconds"])
    config = build_config(fields["preset"], **pop_shape(fields))
    check_writable(out)  # before anything is measured, not after
    settings = {**parse_options(options), **run_request.secret_options()}
    base = runner.RunOptions(config=config, settings=settings, **fields)
    requested = precision_name.upper()
    records, unsaved = run_request.run_and_save(
        base, requested, launch, (replay_steps, replay_whole, replay_budget), out, time_limit
    )
    if unsaved:
        sys.exit(1)
    if any(r.invalid_reasons for r in records) and base.strict_precision:
        sys.exit(1)
