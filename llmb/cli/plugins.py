"""The plugin author's commands: `llmb plugins`, `llmb check-plugin` and `llmb new-plugin`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
from rich.table import Table
from rich.text import Text

from llmb.api.settings import parse_options, range_text
from llmb.cli import click_types as bounds
from llmb.cli.common import console, err_console, handle_errors, json_option, plugin_options
from llmb.spec import vocab as names
from llmb.terminal import console as term
from llmb.terminal.progress import Pace
from llmb.terminal.streams import stdout_to_stderr


@click.command(name="plugins")
@json_option
@handle_errors
def plugins_command(as_json: bool) -> None:
    """List installed backends: plugin, devices, precisions, methods overridden, settings, peak sources, vendor
    libraries."""
    from llmb.registry import plugins  # lazy: loading the backends imports torch

    with stdout_to_stderr():  # every plugin is imported and asked: its prints must not mix into the JSON
        described = [plugins.describe(r) for r in plugins.all_registrations().values()]
    for name, error in plugins.load_errors.items():
        term.warning(f"plugin {name!r} failed to load: {error}")
    for b in described:  # a method that failed is the plugin's to fix: said, and its backend still listed
        for error in b["errors"].values():
            term.warning(error)
    if as_json:
        click.echo(json.dumps(described, indent=2))
        return
    # One small table per backend: the method and setting lists are too long for columns of one wide table.
    for b in described:
        console.print(backend_table(b))


def backend_table(b: dict) -> Table:
    """One backend's table; the entry of a method that failed says why instead of a value."""
    hardware = {True: "present", False: "absent"}.get(b["hardware_available"], "unknown")
    title = f"{b['name']}  (plugin {b['plugin']}: {b['distribution']} {b['version']}, hardware {hardware})"
    table = term.table(title, show_header=False)
    term.column(table, "", style="bold")
    term.column(table, "", prose=True)  # folds long values (URLs) instead of cutting them; wraps the help
    failed = b["errors"]
    settings, peaks = b["settings"] or [], b["peak_sources"] or {}
    rows = {
        "devices": ("device_types", ", ".join(b["device_types"] or [])),
        "precisions": ("precisions", ", ".join(b["precisions"] or [])),
        "methods overridden": ("", ", ".join(b["methods_overridden"]) or "none"),
        "settings": ("settings", Text("\n").join(setting_line(s) for s in settings) if settings else "none"),
        "peak sources": ("peak_sources", "\n".join(f"{d}: {source}" for d, source in peaks.items()) or "none (no MFU)"),
        # What the guard accepts process-wide replacements of torch from (a pinned official release of each)
        "vendor libraries": ("vendor_libraries", ", ".join(b["vendor_libraries"] or []) or "none"),
    }
    if "available" in failed:
        rows["hardware"] = ("available", "")
    for label, (method, shown) in rows.items():
        term.row(table, label, term.text(failed[method], "red") if method in failed else shown)
    return table


def setting_line(s: dict) -> Text:
    """One setting: name=default, its type, its allowed values when it has a list or a range, and its help (the
    plugin's text)."""
    choices = f" (one of {', '.join(map(str, s['choices']))})" if s.get("choices") else ""
    bounds = range_text(s.get("minimum"), s.get("maximum"))
    allowed = choices + (f" ({bounds})" if bounds else "")
    return term.text(f"{s['name']}={s['default']} [{s['type']}]{allowed}  {s['help']}")


@click.command(name="check-plugin")
@plugin_options
@click.option(
    "--precision",
    "precision_name",
    default="FP32",
    show_default=True,
    type=bounds.PRECISION,
    help="FP32, TF32, FP16, BF16, or all (every precision the plugin supports; one record each, "
    "named like conformance-bf16.json).",
)
@click.option(
    "--precision-mode", "mode", default="pure", show_default=True, type=bounds.choice(names.MODES, "precision mode")
)
@click.option("--preset", default="tiny", show_default=True, type=bounds.choice(names.CONFORMANCE_PRESETS, "preset"))
@click.option(
    "--steps",
    default=names.CONFORMANCE_STEPS,
    show_default=True,
    type=bounds.STEPS,
    help="Optimizer steps whose results are compared.",
)
@click.option("--batch-size", default=names.CONFORMANCE_BATCH_SIZE, show_default=True, type=bounds.BATCH)
@click.option("--seed", default=0, show_default=True, type=bounds.SEED)
@click.option("--out", default="conformance.json", show_default=True, type=click.Path(dir_okay=False, path_type=Path))
@handle_errors
def check_plugin(
    plugin: str | None,
    device: str | None,
    options: tuple[str, ...],
    precision_name: str,
    mode: str,
    preset: str,
    steps: int,
    batch_size: int,
    seed: int,
    out: Path,
) -> None:
    """Check that a plugin preserves the model's function against the FP32 CPU reference; exit 1 if not."""
    # Lazy: the conformance check and the results import torch; --help must not.
    from llmb.conformance import check as conformance
    from llmb.records.result_files import check_out_file

    check_out_file(out)  # before the check runs, not after
    requested = precision_name.upper()  # ALL, as run and sweep take it: every precision the plugin supports
    # The plugin is imported in a worker process only; this process computes the reference and compares.
    checked = conformance.check_plugins(
        plugin,
        device,
        requested,
        mode,
        settings=parse_options(options),
        preset=preset,
        steps=steps,
        batch_size=batch_size,
        seed=seed,
    )
    passed = True
    pace = Pace()  # what is left, from the precisions already checked
    while True:  # each record written as soon as it is judged: a later failure loses none
        with err_console.status(f"{requested}: running the candidate and the reference{pace.left()}"):
            record = next(checked, None)
        if record is None:
            break
        name = record.precision.requested
        expanded = names.expand_precision(names.ALL_PRECISIONS, record.plugin.precisions or [])[0]
        pace.done(total=len(expanded) if requested == names.ALL_PRECISIONS else 1)
        several = len(expanded) > 1
        all_asked = requested == names.ALL_PRECISIONS
        target = out.with_name(f"{out.stem}-{name.lower()}{out.suffix}") if all_asked and several else out
        path = conformance.write(record, target)
        conformance.print_table(record, console)
        term.say(f"conformance record written to {path}")
        passed = passed and record.passed
    if not passed:
        sys.exit(1)


@click.command(name="new-plugin")
@click.argument("name")
@click.option(
    "--dir",
    "directory",
    default=None,
    type=click.Path(path_type=Path),
    help="Where to write the package (default: ./llmb-NAME); must not exist or be empty.",
)
@handle_errors
def new_plugin(name: str, directory: Path | None) -> None:
    """Write an installable plugin package: a llmb.Backend subclass with every method stubbed, a vendor's start."""
    from llmb.run.scaffold import install_command, write_plugin  # lazy: only `new-plugin` writes files

    target = write_plugin(name, directory)
    term.say(f"wrote plugin {name!r} to {target}; install it with: {install_command(target)}")
