"""The reviewer's commands: `llmb package-submission`, `llmb verify` and `llmb reproduce`."""

from __future__ import annotations

import sys
from pathlib import Path

import click
from rich.text import Text

from llmb.cli import click_types as bounds
from llmb.cli.common import console, err_console, handle_errors
from llmb.spec import vocab as names
from llmb.terminal import console as term


@click.command(name="package-submission")
@click.option("--submitter", required=True, help="Your organisation (a folder name).")
@click.option("--system", "system_name", required=True, help="The system's name (a folder name).")
@click.option(
    "--results",
    "results_dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder of result JSON files (and any conformance.json files).",
)
@click.option("--out", default="submissions", show_default=True, type=click.Path(file_okay=False, path_type=Path))
@click.option("--archive", is_flag=True, help="Also write <out>/<ORG>/<NAME>.tar.gz.")
@click.option(
    "--system-file", type=click.Path(dir_okay=False, path_type=Path), help="JSON merged over the collected system."
)
@click.option("--include-debug", is_flag=True, help="Keep every result, invalid ones too (marked: a debug bundle).")
@click.option(
    "--allow-debug-shapes", is_flag=True, help="Keep valid runs at non-official shapes (marked: a debug bundle)."
)
@click.option(
    "--no-run-conformance", is_flag=True, help="Refuse instead of running check-plugin where no record is given."
)
@click.option(
    "--release-source",
    "release_sources",
    multiple=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder of released llmb sources, for the diffs of changed files (default: the git history).",
)
@click.option("--note", default="", help="A line for summary.md.")
@click.option("--force", is_flag=True, help="Replace an existing bundle of the same name.")
@handle_errors
def package_submission(
    submitter: str,
    system_name: str,
    results_dir: Path,
    out: Path,
    archive: bool,
    system_file: Path | None,
    include_debug: bool,
    allow_debug_shapes: bool,
    no_run_conformance: bool,
    release_sources: tuple[Path, ...],
    note: str,
    force: bool,
) -> None:
    """Write a submission bundle: results, system, code diff, plugin source, conformance, summary, manifest."""
    # Lazy: packaging may run check-plugin, and the records import torch; --help must not.
    from llmb import verify
    from llmb.conformance import check as conformance
    from llmb.submit import package as submission

    options = submission.PackageOptions(
        submitter=submitter,
        system=system_name,
        results=results_dir,
        out=out,
        archive=archive,
        system_file=system_file,
        include_debug=include_debug,
        allow_debug_shapes=allow_debug_shapes,
        run_conformance=not no_run_conformance,
        release_sources=list(release_sources),
        note=note,
        force=force,
        check_plugin=conformance.check_plugin,
        say=lambda line: term.say(line, stderr=True),
    )
    with err_console.status("packaging (runs check-plugin where no conformance record is given)"):
        root, skipped = submission.package(options)
    for line in skipped:
        term.say(("left out", "yellow"), " ", line, stderr=True)
    console.print(term.text((root / submission.SUMMARY_MD).read_text(), limit=None))
    rows = verify.verify(root, accept_debug=True)
    failed = [row for row in rows if not row.passed]
    term.say(f"bundle written to {root}" + (f" and {root}.tar.gz" if archive else ""))
    if failed:
        term.say((f"{len(failed)} checks fail even with --accept-debug; run `llmb verify {root}`", "bold red"))


@click.command(name="verify")
@click.argument("path", type=click.Path(exists=True, path_type=Path))
@click.option("--accept-debug", is_flag=True, help="Accept a debug bundle (non-official shapes), checking the rest.")
@click.option(
    "--replay",
    is_flag=True,
    help="Also replay each result's headline window here on the CPU in FP32 (from its seed and challenge).",
)
@click.option(
    "--replay-steps",
    type=bounds.IntRange(1, 10**6),
    default=names.DEFAULT_REPLAY_STEPS,
    show_default=True,
    help="Steps of each headline window that --replay replays at least; deeper where the run's own replay went "
    "deeper (the whole window, digest included, when it covers it).",
)
@handle_errors
def verify_command(path: Path, accept_debug: bool, replay: bool, replay_steps: int) -> None:
    """Check a submission bundle (a folder or a .tar.gz) without running any of its code; exit 1 if any check fails."""
    from llmb import verify  # lazy: the records import torch

    rows = verify.verify(path, accept_debug=accept_debug, replay_steps=replay_steps if replay else 0)
    table = term.table(f"llmb verify {path}")
    for column in ("check", "result", "detail"):
        term.column(table, column)
    for row in rows:
        # The detail quotes the bundle's own text: plain text, capped, never rich markup.
        verdict = Text("pass", style="green") if row.passed else Text("FAIL", style="bold red")
        term.row(table, row.check, verdict, row.detail)
    console.print(table)
    failed = sum(not row.passed for row in rows)
    if failed:
        term.say((f"{failed} of {len(rows)} checks failed", "bold red"))
        sys.exit(1)
    term.say((f"all {len(rows)} checks passed", "green"))


@click.command(name="reproduce")
@click.argument("path", type=click.Path(exists=True, path_type=Path))
@click.option(
    "--tolerance",
    type=bounds.FiniteFloatRange(0, 10),
    default=0.05,
    show_default=True,
    help="How far a headline may exceed the reproduced median (0.05: 5%) before it is refuted.",
)
@click.option(
    "--runs", type=bounds.IntRange(1, 1000), default=3, show_default=True, help="Reproduction runs per headline."
)
@handle_errors
def reproduce_command(path: Path, tolerance: float, runs: int) -> None:
    """Re-run each headline of a bundle here (its shipped plugin source and settings) and compare; exit 1 if any
    headline exceeds its reproduction by more than the tolerance."""
    from llmb.submit import reproduce  # lazy: reproducing runs the plugin

    rows = reproduce.reproduce(
        path,
        tolerance=tolerance,
        runs=runs,
        warn=lambda line: term.say("skipped: ", line, stderr=True),
        say=lambda line: term.say(line, stderr=True),
    )
    table = term.table(f"llmb reproduce {path}")
    for column in ("headline", "result", "detail"):
        term.column(table, column)
    for row in rows:
        verdict = Text("reproduced", style="green") if row.passed else Text("REFUTED", style="bold red")
        term.row(table, row.label, verdict, row.detail)  # the bundle's text: never markup
    console.print(table)
    if not all(row.passed for row in rows):
        sys.exit(1)
