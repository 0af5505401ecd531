"""`llmb sweep`: its options, parsed into a sweep's options (and a search's), then handed to llmb.run.sweep and
llmb.run.grid."""

from __future__ import annotations

from pathlib import Path

import click

from llmb.api.settings import parse_options
from llmb.cli import click_types as bounds
from llmb.cli.common import (
    console,
    device_scaled,
    err_console,
    given_on_command_line,
    handle_errors,
    loop_options,
    plugin_options,
    precision_options,
)
from llmb.terminal import console as term


@click.command()
@plugin_options
@precision_options("all")
@click.option(
    "--batch-sizes",
    default="auto",
    show_default=True,
    help="auto (double until out of memory or a plateau, then bisect) or a list like 1,2,4,8.",
)
@click.option(
    "--max-batch-size",
    default=None,
    show_default=device_scaled("max_batch_size"),
    type=bounds.BATCH,
    help="Upper bound for auto.",
)
@click.option(
    "--repeats",
    default=3,
    show_default=True,
    type=bounds.SWEEP_REPEATS,
    help="Re-runs of the best batch; median = headline.",
)
@loop_options("Measured steps per trial.", scaled=True)
@click.option(
    "--trial-timeout",
    default=None,
    show_default=device_scaled("trial_timeout"),
    type=bounds.SECONDS,
    help="Seconds before a trial is killed.",
)
@click.option(
    "--out",
    default="sweep",
    show_default=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory for the log, the summary and the result JSON files.",
)
@click.option("--resume", is_flag=True, help="Continue the sweep in --out from its log; finished points are kept.")
@click.option(
    "--search",
    "search_items",
    multiple=True,
    metavar="KEY=V1,V2",
    help="Also search this plugin setting (repeatable): one sweep per combination, in a sub-folder of --out each, "
    "and the combination with the best headline named per precision.",
)
@handle_errors
def sweep(
    plugin: str | None,
    device: str | None,
    options: tuple[str, ...],
    precision_name: str,
    mode: str,
    batch_sizes: str,
    max_batch_size: int | None,
    repeats: int,
    steps: int | None,
    warmup_steps: int | None,
    seed: int,
    preset: str,
    trial_timeout: float | None,
    out: Path,
    resume: bool,
    search_items: tuple[str, ...],
    **shape: int | None,
) -> None:
    """Find the best batch size per precision (and, with --search, the best plugin settings): each trial its own
    `llmb run` process, resumable."""
    # Lazy: the sweep and the runner import torch; --help must not.
    from llmb.run import grid, runner, sweep_display, sweep_log
    from llmb.run import sweep as sweeps
    from llmb.spec.presets import build_config

    # A search keeps one sweep per combination in a sub-folder: it resumes from the first combination's log.
    searched = grid.parse_search(search_items, parse_options(options))
    logged_in = (grid.logged_folder(out, searched) if searched else out) or out
    if resume:  # the options not given again are the log's: a resumed sweep needs no retyping
        logged = sweep_log.resume_options(out, logged_in, given_on_command_line(), searched)
        plugin, device = logged.get("plugin", plugin), logged.get("device", device)
        mode, preset = logged.get("mode", mode), logged.get("preset", preset)
        steps, warmup_steps = logged.get("steps", steps), logged.get("warmup_steps", warmup_steps)
        seed, options = logged.get("seed", seed), logged.get("options", options)
        batch_sizes = logged.get("batch_sizes", batch_sizes)
        max_batch_size = logged.get("max_batch_size", max_batch_size)
        precision_name, repeats = logged.get("precision_name", precision_name), logged.get("repeats", repeats)
        trial_timeout = logged.get("trial_timeout", trial_timeout)
        shape = {k: logged.get(k, v) for k, v in shape.items()}
    run_options = runner.RunOptions(
        config=build_config(preset, **shape),
        preset=preset,
        plugin=plugin,
        device=device,
        mode=mode,
        steps=steps,
        warmup_steps=warmup_steps,
        seed=seed,
        settings=parse_options(options),
    )
    sweep_options = sweeps.SweepOptions(
        run=run_options,
        out=out,
        precision=precision_name,
        batch_sizes=sweeps.parse_batch_sizes(batch_sizes),
        repeats=repeats,
        max_batch_size=max_batch_size,
        trial_timeout=trial_timeout,
        resume=resume,
    )
    searched = grid.parse_search(search_items, run_options.settings)  # again: the log's -O settings may clash
    if searched:
        with sweep_display.LiveDisplay(err_console) as display:
            found = grid.search(sweep_options, searched, display)
        grid.print_search(found, console)
        term.say(f"search written to {out} ({grid.SEARCH_SUMMARY_NAME}; llmb report {out})")
        return
    with sweep_display.LiveDisplay(err_console) as display:
        summary = sweeps.sweep(sweep_options, display)
    sweeps.print_summary(summary, console)
    term.say(f"sweep written to {out} (llmb report {out})")
