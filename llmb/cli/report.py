"""The commands that read records into views: `llmb report`, `llmb features` and `llmb leaderboard`."""

from __future__ import annotations

from pathlib import Path

import click
from rich.table import Table

from llmb.cli import click_types as bounds
from llmb.cli.common import console, handle_errors
from llmb.spec import vocab as names
from llmb.terminal import console as term


@click.command(name="report")
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "--format",
    "fmt",
    default=None,
    type=bounds.choice(names.REPORT_FORMATS, "format"),
    help="Output format (default: tables on the console, or the --out file's suffix).",
)
@click.option("--out", default=None, type=click.Path(dir_okay=False, path_type=Path), help="Write to this file.")
@click.option(
    "--plot",
    "plot_dir",
    default=None,
    type=click.Path(file_okay=False, path_type=Path),
    help="Write the PNGs here (a Markdown --out file links them; without --plot they go to <name>_plots beside it).",
)
@click.option("--baseline", default=None, help="Method the speed-up is measured against (default: default settings).")
@click.option(
    "--reference",
    default=None,
    metavar="RUN_ID|PATH",
    help="Add an 'x vs reference' column: tokens/s against this run id (or unique start of one), or the results of "
    "this file, sweep directory or bundle (added to the report if not among PATHS), at the same shape and precision "
    "only; plotted in panels of its own.",
)
@handle_errors
def report_command(
    paths: tuple[Path, ...],
    fmt: str | None,
    out: Path | None,
    plot_dir: Path | None,
    baseline: str | None,
    reference: str | None,
) -> None:
    """Tables and plots from result files, sweep directories and submission bundles."""
    from llmb.records.result_files import check_writable
    from llmb.report import report  # lazy: the report imports the records and matplotlib

    if out is not None:  # before the results are read: a folder that takes no file is a usage error, not a traceback
        check_writable(out.parent, f"--out {out}: its folder")

    def warn(line: str) -> None:
        term.say("skipped: ", line, stderr=True)

    text = report(
        list(paths),
        fmt=fmt,
        out=out,
        plot_dir=plot_dir,
        baseline=baseline,
        console=console,
        warn=warn,
        reference=reference,
    )
    if text is not None and out is None:
        click.echo(text, nl=False)
    elif out is not None:
        term.say(f"report written to {out}", stderr=True)


@click.command(name="features")
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option("--markdown", is_flag=True, help="Print markdown tables instead.")
@handle_errors
def features_command(paths: tuple[Path, ...], markdown: bool) -> None:
    """The feature matrix from result, conformance and attempt records: each feature by single device, DDP and
    FSDP, and each pair of features (yes only where a run exists and conformed)."""
    from llmb.run import feature_matrix as features  # lazy: the records it loads import torch

    records = features.load_records(paths)  # nothing read: an error naming what it left out
    for line in records.skipped:  # every file left out is named, with why
        term.say("skipped: ", line, stderr=True)
    if markdown:
        click.echo(features.markdown(records), nl=False)
        return
    table = Table(title="Feature support (from records)", title_justify="left")
    for column in ("Feature", *features.PARALLEL.values()):
        table.add_column(column)
    for row in features.support_table(records):
        term.row(table, *row)  # failure reasons come from records: text, never markup
    console.print(table)
    for parallel, title in features.PARALLEL.items():
        pairs = Table(title=f"Feature compatibility: {title}", title_justify="left")
        for column in ("", *features.FEATURES.values()):
            pairs.add_column(column)
        for row in features.pair_table(records, parallel):
            term.row(pairs, *row)
        console.print(pairs)


@click.command(name="leaderboard")
@click.argument("bundles", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option("--out", type=click.Path(path_type=Path), required=True, help="The site's folder (index.html and pages).")
@click.option(
    "--replay", is_flag=True, help="Also replay each result's headline window here, as `llmb verify --replay` does."
)
@handle_errors
def leaderboard_command(bundles: tuple[Path, ...], out: Path, replay: bool) -> None:
    """Verify submission bundles (folders or .tar.gz) and write a static site of them: a sortable index of systems by
    precision and one page per submission with its evidence. A bundle that fails is listed as failed, with why."""
    # Lazy: verifying the bundles imports the records (torch); --help must not.
    from llmb.records import outputs
    from llmb.records.result_files import check_writable
    from llmb.submit import leaderboard

    outputs.refuse_overlap({"--out": out}, bundles)  # before anything is made: the site never enters a bundle
    check_writable(out)
    skipped: list[str] = []
    entries = leaderboard.build(list(bundles), out, names.DEFAULT_REPLAY_STEPS if replay else 0, skipped=skipped)
    for line in skipped:  # every bundle left out is named, with why
        term.say("skipped: ", line, stderr=True)
    for entry in entries:
        style = {"valid": "green", "debug": "yellow"}.get(entry.verdict, "bold red")
        term.say((entry.verdict, style), ": ", entry.system or entry.source)  # the bundle's name is text, not markup
    term.say(f"{len(entries)} submission(s): {out / 'index.html'}")
