"""The llmb command line: the `llmb` click group, one module per command group, each parsing its options and
delegating to the modules that do the work (pyproject's `llmb` script and `python -m llmb` both start `cli`)."""

from __future__ import annotations

import os

import click

from llmb.cli import measure, plugins, report, run, submission, sweep
from llmb.cli.common import Commands
from llmb.distributed.cluster import quiet_native_logs


@click.group(cls=Commands)
@click.version_option(package_name="llmb", prog_name="llmb")  # read from the metadata only when asked
def cli() -> None:
    """llmb: a vendor-neutral benchmark of LLM training throughput."""
    quiet_native_logs(os.environ)  # before any command imports torch


# In the order the commands were written (cli.commands keeps it; --help sorts them).
for command in (
    run.run,
    plugins.plugins_command,
    submission.package_submission,
    submission.verify_command,
    submission.reproduce_command,
    plugins.new_plugin,
    measure.commbench_command,
    measure.project_command,
    sweep.sweep,
    report.report_command,
    plugins.check_plugin,
    measure.peak_command,
    report.features_command,
    report.leaderboard_command,
):
    cli.add_command(command)
del command

__all__ = ["cli"]
