"""The llmb command line: parses, then delegates to the modules that do the work."""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from llmb import __version__, precision, runner
from llmb.config import PRESETS, SHAPE_FIELDS, build_config
from llmb.errors import LlmbError
from llmb.plugins import Plugin, plugin_names
from llmb.settings import parse_options

console = Console()
err_console = Console(stderr=True)


def handle_errors(func):
    """Turn llmb's errors into one line on stderr and an exit code."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except LlmbError as exc:
            err_console.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
            sys.exit(exc.exit_code)
        except KeyboardInterrupt:
            err_console.print("[bold red]interrupted[/]")
            sys.exit(130)

    return wrapper


@click.group()
@click.version_option(__version__, prog_name="llmb")
def cli() -> None:
    """llmb: a vendor-neutral benchmark of LLM training throughput."""


def shape_options(func):
    for name in reversed(SHAPE_FIELDS):
        func = click.option(
            f"--{name.replace('_', '-')}",
            name,
            type=int,
            default=None,
            help="Debug shape override (the run is not official).",
        )(func)
    return func


def plugin_options(func):
    func = click.option(
        "-O",
        "--option",
        "options",
        multiple=True,
        metavar="KEY=VALUE",
        help="A plugin setting (repeatable); see `llmb plugins`.",
    )(func)
    func = click.option("--device", default=None, help="Any device string torch accepts (default: the plugin's).")(func)
    func = click.option(
        "--plugin", default=None, help="Hardware plugin (default: first with hardware present, else cpu)."
    )(func)
    return func


class RichProgress(runner.Progress):
    def __init__(self, progress: Progress, label: str) -> None:
        self.progress, self.label, self.task = progress, label, None

    def phase(self, name: str, total: int) -> None:
        if self.task is not None:
            self.progress.remove_task(self.task)
        self.task = self.progress.add_task(f"{self.label} {name}", total=total)

    def advance(self) -> None:
        self.progress.advance(self.task)


@cli.command()
@plugin_options
@click.option(
    "--precision",
    "precision_name",
    default="FP32",
    show_default=True,
    help="FP32, TF32, FP16, BF16, or all (every precision the plugin supports).",
)
@click.option(
    "--precision-mode",
    "mode",
    default="pure",
    show_default=True,
    type=click.Choice(precision.MODES),
    help="pure: 16-bit everything; amp: FP32 master weights + autocast.",
)
@click.option("--strict-precision", is_flag=True, help="Fail when the audited precision is below the requested one.")
@click.option("--batch-size", default=1, show_default=True, type=int)
@click.option("--steps", default=50, show_default=True, type=int, help="Measured steps per repeat.")
@click.option("--warmup-steps", default=5, show_default=True, type=int)
@click.option(
    "--repeats", default=1, show_default=True, type=int, help="Measurements on the same model; the median is reported."
)
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--preset", default="official", show_default=True, type=click.Choice(list(PRESETS)))
@shape_options
@click.option(
    "--out",
    default="results",
    show_default=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory for the result JSON files.",
)
@handle_errors
def run(
    plugin,
    device,
    options,
    precision_name,
    mode,
    strict_precision,
    batch_size,
    steps,
    warmup_steps,
    repeats,
    seed,
    preset,
    out,
    **shape,
) -> None:
    """Run the training benchmark and write one result JSON per precision."""
    config = build_config(preset, **shape)
    base = runner.RunOptions(
        config=config,
        preset=preset,
        plugin=plugin,
        device=device,
        mode=mode,
        batch_size=batch_size,
        steps=steps,
        warmup_steps=warmup_steps,
        repeats=repeats,
        seed=seed,
        settings=parse_options(options),
        strict_precision=strict_precision,
    )
    requested = precision_name.upper()
    if requested == "ALL":
        supported = runner.select_plugin(plugin).precisions()
        names = [p for p in precision.PRECISIONS if p in supported]
        for p in precision.PRECISIONS:
            if p not in supported:
                console.print(f"[yellow]{p}: unsupported by this plugin[/]")
    else:
        names = [requested]
    records = []
    for name in names:
        options_for = runner.RunOptions(**{**base.__dict__, "precision": name})
        record = _run_one(options_for)
        path = runner.write(record, out)
        records.append(record)
        _print_record(record, path)
    if any(r["invalid_reasons"] for r in records) and strict_precision:
        sys.exit(1)


def _run_one(options: runner.RunOptions) -> dict:
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=err_console, transient=True) as progress:
        return runner.run(options, RichProgress(progress, options.precision))


def _print_record(record: dict, path: Path) -> None:
    prec = record["precision"]
    table = Table(title=f"llmb {record['plugin']['name']} on {record['device']['name']}", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value")
    mfu = record["mfu"]
    rows = [
        ("precision", f"{prec['effective']} (requested {prec['requested']}, mode {prec['mode']})"),
        ("shape", f"{record['preset']}, {record['parameters']:,} parameters"),
        ("batch size", str(record["batch_size"])),
        ("tokens/s", f"{record['tokens_per_second']:,.1f}"),
        ("samples/s", f"{record['samples_per_second']:,.2f}"),
        ("TFLOP/s per device", f"{record['tflops']:.3f}"),
        ("MFU", f"{mfu:.1%}" if mfu is not None else "n/a (peak unknown)"),
        ("peak memory", f"{record['peak_memory_bytes'] / 2**30:.2f} GiB" if record["peak_memory_bytes"] else "n/a"),
        ("loss", f"{record['loss']['initial']:.4f} -> {record['loss']['last']:.4f}"),
        ("timing", f"{record['timing']['window_seconds']:.3f} s window, {record['timing']['method']}"),
        ("result", str(path)),
    ]
    for row in rows:
        table.add_row(*row)
    console.print(table)
    if prec["effective"] != prec["requested"]:
        console.print(
            f"[bold red]PRECISION: requested {prec['requested']} but the audit found {prec['effective']} running; "
            f"the result is labelled {prec['effective']}.[/]"
        )
    if not record["official"]:
        console.print("[bold yellow]DEBUG RUN, NOT A VALID RESULT: " + "; ".join(record["debug_reasons"]) + "[/]")
    for reason in record["invalid_reasons"]:
        console.print(f"[bold red]INVALID: {reason}[/]")


@cli.command(name="plugins")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@handle_errors
def plugins_command(as_json: bool) -> None:
    """List installed plugins: name, distribution, devices, precisions, hooks, settings."""
    described = [Plugin(name).describe() for name in plugin_names()]
    if as_json:
        click.echo(json.dumps(described, indent=2))
        return
    table = Table(title="llmb plugins")
    for column in ("name", "distribution", "devices", "precisions", "hardware", "hooks", "settings"):
        table.add_column(column)
    for p in described:
        table.add_row(
            p["name"],
            f"{p['distribution']} {p['version']}",
            ", ".join(p["device_types"]),
            ", ".join(p["precisions"]),
            "present" if p["hardware_available"] else "absent",
            ", ".join(p["hooks"]),
            ", ".join(f"{s['name']}={s['default']}" for s in p["settings"]),
        )
    console.print(table)
