"""The measurements beside the benchmark: `llmb peak` (the roofline), `llmb commbench` (all-reduce bandwidth) and
`llmb project` (a projection from both)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import click

from llmb.api.settings import parse_options
from llmb.cli import click_types as bounds
from llmb.cli.common import (
    EXISTING_FILE,
    console,
    device_spelling,
    given_on_command_line,
    handle_errors,
    json_option,
    json_out_option,
    known_plugin,
    model_options,
    plugin_options,
)
from llmb.spec import vocab as names
from llmb.terminal import console as term
from llmb.terminal.progress import Pace
from llmb.terminal.streams import stdout_to_stderr

if TYPE_CHECKING:
    from pathlib import Path


@click.command(name="peak")
@plugin_options
@click.option(
    "--precision",
    "precisions",
    multiple=True,
    type=bounds.PRECISION,
    help="Precision to measure (repeatable), or all (the default: every one the plugin supports).",
)
@model_options
@click.option(
    "--batch-size", default=1, show_default=True, type=bounds.BATCH, help="The batch whose GEMM shapes are measured."
)
@click.option(
    "--square",
    type=bounds.IntRange(1, 2**16),
    default=None,
    help="Side of the square GEMM (default: doubled from 256 until one matmul lasts 50 ms, at most 8192).",
)
@click.option(
    "--repeats", default=5, show_default=True, type=bounds.REPEATS, help="Timed batches per GEMM; the median counts."
)
@json_option
@json_out_option
@handle_errors
def peak_command(
    plugin: str | None,
    device: str | None,
    options: tuple[str, ...],
    precisions: tuple[str, ...],
    preset: str,
    batch_size: int,
    square: int | None,
    repeats: int,
    as_json: bool,
    out: Path | None,
    **shape: int | None,
) -> None:
    """The roofline: achievable dense matmul FLOP/s per precision at the model's GEMM shapes and a square GEMM."""
    # Lazy, here and in every command below: the modules that do the work import torch; --help must not.
    from llmb.records.result_files import check_out_file, write_json_atomic
    from llmb.run import roofline, roofline_report
    from llmb.spec.presets import build_config

    if out:
        check_out_file(out)  # before anything is measured: a refusal after it would lose the measurement

    with stdout_to_stderr():  # selecting the backend imports the plugin: its module's code runs
        kind = roofline.device_for(plugin, device).type
    if "preset" not in given_on_command_line():  # a shape that suits the device: minutes, not hours, on a CPU
        preset = names.PEAK_DEVICE_PRESETS.get(kind, preset)
        term.say(
            f"llmb peak on {kind}: the {preset} shape's GEMMs (--preset official measures the official ones)",
            stderr=True,
        )
    pace = Pace()  # what is left, from the precisions already measured

    def measured(result: roofline.Roofline, total: int) -> None:
        pace.done(total=total)
        if not as_json:  # --json's output is the JSON alone, for a script
            term.say(f"{result.precision} measured ({pace.finished} of {total}){pace.left()}", stderr=True)

    with stdout_to_stderr():  # the measurement runs in this process, through the plugin's methods
        results = roofline.peak(
            plugin=plugin,
            device=device,
            precisions_wanted=[] if "all" in precisions else list(precisions),  # as run, sweep and check-plugin
            config=build_config(preset, **shape),
            batch_size=batch_size,
            settings=parse_options(options),
            square=square,
            repeats=repeats,
            measured=measured,
        )
    record = roofline_report.peak_record(results, kind, preset, batch_size)
    if out:
        write_json_atomic(out, record)
    if as_json:
        click.echo(json.dumps(record, indent=2))
        return
    roofline_report.print_rooflines(record, results, repeats, console)


@click.command(name="commbench")
@click.option(
    "--plugin", default=None, callback=known_plugin, help="Hardware plugin whose process-group backend is measured."
)
@click.option("--device", default=None, callback=device_spelling, help="Device type (default: the plugin's).")
@click.option(
    "--nproc-per-node", type=bounds.PROCESSES, default=None, help="Processes (default: the host's devices, at least 2)."
)
@click.option("--sizes", default=None, help="Message sizes in bytes, e.g. 1K,1M,64M (default 1K to 64M by x16).")
@click.option("--iters", default=20, show_default=True, type=bounds.COUNT, help="Timed all-reduces per size.")
@click.option(
    "--warmup", default=5, show_default=True, type=bounds.IntRange(0, 10**6), help="Untimed all-reduces per size."
)
@click.option(
    "--dtype",
    default="float32",
    show_default=True,
    type=bounds.COMM_DTYPE,
    help="Element type of the buffers (fp32, fp16 and bf16 are float32, float16 and bfloat16).",
)
@json_out_option
@handle_errors
def commbench_command(
    plugin: str | None,
    device: str | None,
    nproc_per_node: int | None,
    sizes: str | None,
    iters: int,
    warmup: int,
    dtype: str,
    out: Path | None,
) -> None:
    """All-reduce bus bandwidth over message sizes through the plugin's torch.distributed backend."""
    # Lazy, as in every command of this module: the modules that do the work import torch; --help must not.
    from llmb.distributed import job as distributed
    from llmb.records.result_files import check_out_file, write_json_atomic
    from llmb.run import commbench

    options = commbench.CommOptions(plugin=plugin, device=device, iters=iters, warmup=warmup, dtype=dtype)
    if out is not None:
        check_out_file(out)  # before anything is measured
    if sizes is not None:  # an empty --sizes is a usage error, not the default sizes
        options.sizes = commbench.parse_sizes(sizes)
    if distributed.current_world() is not None:  # under torchrun: every rank measures, rank 0 reports
        record = commbench.run(options)
        distributed.shutdown()
    else:
        spec = distributed.LaunchSpec(nproc_per_node or commbench.default_nproc(options))
        record = commbench.launch(spec, options)
    if record is None:
        return
    console.print(commbench.table(record))
    if out is not None:
        write_json_atomic(out, record.to_dict())
        term.say(f"written to {out}")


@click.command(name="project")
@click.option("--layers", type=bounds.PROJECT, default=None, help="L, transformer layers (1T model: 128).")
@click.option("--hidden", type=bounds.PROJECT, default=None, help="d, hidden size (1T model: 25872).")
@click.option(
    "--ffn",
    type=bounds.PROJECT,
    default=None,
    help="Feed-forward size (1T model: 98304); recorded, not in the formula.",
)
@click.option("--heads", type=bounds.PROJECT, default=None, help="Attention heads (checked to divide --hidden).")
@click.option("--seq", type=bounds.PROJECT, default=None, help="s, sequence length.")
@click.option("--global-batch", type=bounds.PROJECT, default=None, help="b, global batch size.")
@click.option("--tp", type=bounds.PROJECT, default=1, show_default=True, help="Tensor-parallel degree.")
@click.option("--pp", type=bounds.PROJECT, default=1, show_default=True, help="Pipeline-parallel degree.")
@click.option("--dp", type=bounds.PROJECT, default=1, show_default=True, help="Data-parallel degree.")
@click.option("--bytes-per-element", type=bounds.PROJECT, default=2, show_default=True, help="Activation element size.")
@click.option(
    "--from",
    "result_path",
    required=True,
    type=EXISTING_FILE,
    help="An llmb run result: its achieved TFLOP/s per device gives alpha.",
)
@click.option(
    "--comm",
    "comm_path",
    required=True,
    type=EXISTING_FILE,
    help="An llmb commbench JSON: its all-reduce bandwidth gives beta.",
)
@click.option(
    "--check",
    "check_path",
    default=None,
    type=EXISTING_FILE,
    help="A measured multi-process llmb run: project its shape and layout, print measured next to projected.",
)
@json_option
@handle_errors
def project_command(
    layers: int | None,
    hidden: int | None,
    ffn: int | None,
    heads: int | None,
    seq: int | None,
    global_batch: int | None,
    tp: int,
    pp: int,
    dp: int,
    bytes_per_element: int,
    result_path: Path,
    comm_path: Path,
    check_path: Path | None,
    as_json: bool,
) -> None:
    """Project the step time and seed FOM of a TP x PP x DP training (the ALCF 1T model) from measured alpha and
    beta; with --check, hold the projection against a measured run."""
    # Lazy: loaded when the command runs, not for --help.
    from llmb.report import time_to_solution as project

    result, comm, measured = project.read_inputs(result_path, comm_path, check_path)
    if measured is not None:
        projection = project.check_against(measured, result, comm)
    else:
        missing = [n for n, v in (("layers", layers), ("hidden", hidden), ("ffn", ffn), ("seq", seq),
                                  ("global-batch", global_batch)) if v is None]  # fmt: skip
        if missing:
            raise click.UsageError(f"missing --{', --'.join(missing)} (or give --check RUN.json)")
        shape = project.Shape(layers, hidden, ffn, seq, global_batch, tp, pp, dp, heads, bytes_per_element)
        projection = project.project(shape, result, comm)
    if as_json:
        click.echo(json.dumps(projection, indent=2))
        return
    console.print(project.table(projection))
    for warning in projection["warnings"]:
        term.warning(warning)
