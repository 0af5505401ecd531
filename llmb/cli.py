"""The llmb command line: parses, then delegates to the modules that do the work."""

from __future__ import annotations

import functools
import json
import os
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.table import Table
from rich.text import Text

# Only what --help needs is imported here: torch (about 6 s to import on a loaded machine) and the modules that
# import it are imported inside the commands that train, so `llmb --help` and `llmb CMD --help` answer at once.
from llmb import bounds, names, peaks
from llmb import console as term
from llmb.errors import LlmbError, UsageError
from llmb.settings import parse_options

if TYPE_CHECKING:  # annotations only: records and the runner import the model, and so torch
    from rich.progress import Progress

    from llmb import runner
    from llmb.records import Result

console = term.out
err_console = term.err


def handle_errors(func):
    """Turn llmb's errors into one line on stderr and an exit code."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except LlmbError as exc:
            if os.environ.get("LLMB_DEBUG") and exc.__cause__ is not None:
                # A plugin's own exception (PluginError wraps it): its traceback is what the plugin's author needs.
                traceback.print_exception(exc.__cause__)
            term.error(str(exc))
            sys.exit(exc.exit_code)
        except KeyboardInterrupt:
            term.say(("interrupted", "bold red"), stderr=True)
            sys.exit(130)
        except (click.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise  # click's own usage errors keep click's messages and exit codes
        except Exception as exc:
            # An unexpected failure (a plugin's kernel, a backend's dtype error): still one line, exit 1.
            if os.environ.get("LLMB_DEBUG"):
                raise
            first_line = (str(exc).strip().splitlines() or [""])[0]
            term.error(f"{type(exc).__name__}: {first_line}", (" (LLMB_DEBUG=1 shows the traceback)", ""))
            sys.exit(1)

    return wrapper


@click.group()
@click.version_option(package_name="llmb", prog_name="llmb")  # read from the metadata only when asked
def cli() -> None:
    """llmb: a vendor-neutral benchmark of LLM training throughput."""
    from llmb.cluster import quiet_native_logs

    quiet_native_logs(os.environ)  # before any command imports torch


def shape_options(func):
    for name in reversed(names.SHAPE_FIELDS):
        func = click.option(
            f"--{name.replace('_', '-')}",
            name,
            type=bounds.SHAPE,
            default=None,
            help="Debug shape override (the run is not official).",
        )(func)
    return func


def _known_plugin(ctx, param, value: str | None) -> str | None:
    """--plugin checked as it is parsed, from installed metadata (no torch import): a typo is answered at once."""
    from llmb import plugins

    if value is not None:
        try:
            plugins.check_name(value)
        except LlmbError as exc:
            raise click.BadParameter(str(exc)) from None
    return value


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
        "--plugin",
        default=None,
        callback=_known_plugin,
        help="Hardware plugin (default: first with hardware present, else cpu).",
    )(func)
    return func


def launch_options(func):
    """torchrun's launch options; with --nproc-per-node, llmb starts the processes through torch's launcher."""
    options = [
        click.option(
            "--nproc-per-node",
            type=bounds.PROCESSES,
            default=None,
            help="Processes (devices) per node, launched as torchrun would.",
        ),
        click.option("--nnodes", type=bounds.NODES, default=1, show_default=True, help="Nodes in the job."),
        click.option("--node-rank", type=bounds.NODE_RANK, default=0, show_default=True, help="This node's rank."),
        click.option("--master-addr", default=None, help="Node rank 0's address (several nodes)."),
        click.option("--master-port", type=bounds.PORT, default=None, help="Node rank 0's port (default 29500)."),
    ]
    return _apply(func, options)


def _apply(func, options):
    """Apply option decorators in the order they are listed (the order `--help` shows them)."""
    for option in reversed(options):
        func = option(func)
    return func


def precision_options(default: str):
    """The precision asked for and its mode, for the commands that train (run: FP32, sweep: all)."""
    return lambda func: _apply(
        func,
        [
            click.option(
                "--precision",
                "precision_name",
                default=default,
                show_default=True,
                type=bounds.PRECISION,
                help="FP32, TF32, FP16, BF16, or all (every precision the plugin supports).",
            ),
            click.option(
                "--precision-mode",
                "mode",
                default="pure",
                show_default=True,
                type=bounds.choice(names.MODES),
                help="pure: 16-bit everything; amp: FP32 master weights + autocast.",
            ),
        ],
    )


def model_options(func):
    """The preset and its debug shape overrides."""
    func = shape_options(func)
    return click.option("--preset", default="official", show_default=True, type=bounds.choice(names.PRESET_NAMES))(func)


def device_scaled(name: str) -> str:
    """--help's default of a sweep option that scales to the device: the general value, then each device's."""
    scaled = "; ".join(f"{d[name]:g} on {kind}" for kind, d in names.SWEEP_DEVICE_DEFAULTS.items())
    return f"{names.SWEEP_DEFAULTS[name]:g}; {scaled}"


def loop_options(steps_help: str, scaled: bool = False):
    """The measured loop's length and seed, then the model's shape: one set for run and sweep. Scaled (a sweep's):
    a step count not given is the device's (None here: llmb.sweep.scaled_to_device), and --help says which."""

    def default(name: str, value: int):
        return (
            {"default": None, "show_default": device_scaled(name)}
            if scaled
            else {"default": value, "show_default": True}
        )

    return lambda func: _apply(
        func,
        [
            click.option("--steps", type=bounds.STEPS, help=steps_help, **default("steps", 50)),
            click.option("--warmup-steps", type=bounds.WARMUP, **default("warmup_steps", 5)),
            click.option("--seed", default=0, show_default=True, type=bounds.SEED),
            model_options,
        ],
    )


# Options that several commands take in the same words.
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON.")
json_out_option = click.option(
    "--out", default=None, type=click.Path(dir_okay=False, path_type=Path), help="Write the JSON here."
)
EXISTING_FILE = click.Path(exists=True, dir_okay=False, path_type=Path)


def launch_spec(nproc_per_node, nnodes, node_rank, master_addr, master_port, timeout=names.DEFAULT_TIMEOUT_SECONDS):
    """The torchrun launch the options ask for (a distributed.LaunchSpec), or None for a single process."""
    if nproc_per_node is None:
        if nnodes != 1 or node_rank or master_addr or master_port:
            raise click.UsageError("--nnodes, --node-rank, --master-addr and --master-port need --nproc-per-node")
        return None
    from llmb import distributed

    spec = distributed.LaunchSpec(nproc_per_node, nnodes, node_rank, master_addr, master_port, timeout)
    spec.check()  # a usage error (an unresolvable --master-addr) before anything touches the disk
    return spec


def run_progress() -> Progress:
    """The progress display of a command that times steps. Drawn when a step or phase ends, never by rich's timer
    (10 renders a second from a thread of the judging process, which on a CPU host shares the cores the timed
    steps run on: nothing llmb does may change the speed of what it times)."""
    from rich.progress import Progress

    return Progress(*progress_columns(), console=err_console, transient=True, auto_refresh=False)


def progress_columns() -> tuple:
    """rich's progress columns for a long command: what it does, how far, the time taken and rich's estimate of the
    time left (from the rate of the steps so far)."""
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    return (
        TextColumn("{task.description}", markup=False),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("left"),
        TimeRemainingColumn(),
    )


class RichProgress:
    """runner.Progress drawn with rich's progress bars."""

    def __init__(self, progress, label: str) -> None:
        self.progress, self.label, self.task = progress, label, None

    def phase(self, name: str, total: int) -> None:
        if self.task is not None:
            self.progress.remove_task(self.task)
        self.task = self.progress.add_task(f"{self.label} {name}", total=total)
        self.progress.refresh()

    def advance(self) -> None:
        self.progress.advance(self.task)
        self.progress.refresh()

    def note(self, text: str) -> None:
        self.progress.console.print(term.text(text, "bold yellow"), soft_wrap=True)


@cli.command()
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
    type=bounds.choice(names.PARALLEL),
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
@click.option("--pp-schedule", type=bounds.choice(names.SCHEDULES), default="gpipe", show_default=True)
@click.option("--grad-accum", type=bounds.COUNT, default=1, show_default=True, help="Micro-steps per optimizer step.")
@click.option("--sequence-parallel", is_flag=True, help="With --tp: shard norms and the residual along the sequence.")
@click.option(
    "--dist-timeout",
    type=bounds.SECONDS,
    default=names.DEFAULT_TIMEOUT_SECONDS,
    show_default=True,
    help="Seconds a collective waits for a peer before the run fails.",
)
@click.option(
    "--replay-steps",
    type=int,
    default=names.DEFAULT_REPLAY_STEPS,
    show_default=True,
    help="Steps of the headline window replayed on the CPU in FP32 before the record is written (0: none, "
    "and the result is not valid).",
)
@click.option(
    "--replay-whole",
    type=click.FloatRange(0, 1),
    default=names.DEFAULT_REPLAY_WHOLE,
    show_default=True,
    help="Probability that the judge replays the whole headline window instead (drawn after the window answered "
    "for every step; 1: always).",
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
    nproc_per_node,
    nnodes,
    node_rank,
    master_addr,
    master_port,
    parallel,
    tp,
    pp,
    microbatches,
    pp_schedule,
    grad_accum,
    sequence_parallel,
    dist_timeout,
    replay_steps,
    replay_whole,
    **shape,
) -> None:
    """Run the training benchmark and write one result JSON per precision."""
    from llmb import cleanroom, distributed, runner
    from llmb.config import build_config

    launch = launch_spec(nproc_per_node, nnodes, node_rank, master_addr, master_port, dist_timeout)
    config = build_config(preset, **shape)
    from llmb.results import check_writable  # results imports the records, and so torch

    check_writable(out)  # before anything is measured, not after
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
        settings={**parse_options(options), **_secret_options()},
        strict_precision=strict_precision,
        parallel=parallel,
        timeout_seconds=dist_timeout,
        tp=tp,
        pp=pp,
        microbatches=microbatches,
        pp_schedule=pp_schedule,
        grad_accum=grad_accum,
        sequence_parallel=sequence_parallel,
    )
    requested = precision_name.upper()
    unsaved: list[Path] = []
    if not cleanroom.in_process():
        records = _run_clean(base, requested, launch, (replay_steps, replay_whole), out, unsaved)
    else:
        records = _run_in_process(base, requested, launch, out, unsaved)
    distributed.shutdown()
    if unsaved:
        sys.exit(1)
    if any(r.invalid_reasons for r in records) and strict_precision:
        sys.exit(1)


def _run_clean(
    base: runner.RunOptions, requested: str, launch, replay: tuple[int, float], out: Path, unsaved: list[Path]
) -> list[dict]:
    """Judged from this process, which imports no plugin: the worker it starts runs the plugin (llmb.cleanroom)."""
    from llmb import cleanroom, distributed, runner

    # Under --nproc-per-node the parallel strategy is the job's; this process is not in it.
    parallel = None if launch is not None else base.parallel
    runner.check_request(runner.RunOptions(**{**base.__dict__, "precision": requested, "parallel": parallel}), True)
    replay_steps, replay_whole = replay
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
            on_record=lambda record: saved.append((record, _save(record, out, unsaved))),
            on_pending=lambda record: _save_quietly(record, out),
        )
    for record, path in saved:
        _print_record(record, path)
    if error is not None:
        raise error
    return records


def _run_in_process(base: runner.RunOptions, requested: str, launch, out: Path, unsaved: list[Path]) -> list[dict]:
    """Library and test use (LLMB_IN_PROCESS=1): the plugin's own process judges, and no record is valid."""
    from llmb import runner
    from llmb.plugins import call, select_backend

    if requested == names.ALL_PRECISIONS:
        wanted, unsupported = names.expand_precision(requested, call(select_backend(base.plugin).backend.precisions))
        for name in unsupported:
            term.say((f"{name}: unsupported by this plugin", "yellow"))
    else:
        wanted = [requested]
    records = []
    runs = [runner.RunOptions(**{**base.__dict__, "precision": name}) for name in wanted]
    if launch is not None:
        for options_for in runs:  # bad input fails here, before any process starts
            runner.check_launch(options_for, launch.nproc_per_node * launch.nnodes, launch.nnodes)
        for record in runner.launch_runs(launch, runs):
            records.append(record)
            _print_record(record, _save(record, out, unsaved))
    for options_for in runs if launch is None else []:
        record = _run_one(options_for)
        if record is None:
            continue  # another rank of a torchrun job: rank 0 writes the result
        path = _save(record, out, unsaved)
        records.append(record)
        _print_record(record, path)
    return records


def _secret_options() -> dict[str, str]:
    """Secret settings a sweep passes to its trial in the environment, never on the command line."""
    from llmb.settings import SECRET_OPTIONS_ENV

    raw = os.environ.pop(SECRET_OPTIONS_ENV, "")
    try:
        given = json.loads(raw) if raw else {}
    except ValueError:
        raise LlmbError(f"{SECRET_OPTIONS_ENV} is not JSON") from None
    if not isinstance(given, dict):
        raise LlmbError(f"{SECRET_OPTIONS_ENV} is not a JSON object")
    return {str(k): str(v) for k, v in given.items()}


def _save(record: Result, out: Path, unsaved: list[Path]) -> Path:
    """Write the result; if --out fails after the measurement, it is printed and saved under the temporary folder."""
    from llmb.results import save_result  # results imports the records, and so torch

    path, problem = save_result(record, out)
    if problem is not None:
        click.echo(json.dumps(record.to_dict(), indent=2))
        term.error(f"the result could not be written to {out} ({problem}); it is printed above and saved as {path}")
        unsaved.append(path)
    return path


def _save_quietly(record: Result, out: Path) -> None:
    """Keep a record before its replay; the replayed record replaces it (same file), and reports any failure."""
    from llmb.errors import UsageError
    from llmb.results import write_result

    try:
        write_result(record, out)
    except (OSError, UsageError):
        pass


def _run_one(options):
    """A run with rich's progress bars (a runner.Result, or None on ranks other than 0)."""
    from llmb import distributed, runner

    world = distributed.current_world()
    if world is not None and world.rank != 0:
        return runner.run(options)
    with run_progress() as progress:
        return runner.run(options, RichProgress(progress, options.precision))


def oversubscribed(record: Result) -> str | None:
    """Why the host looks oversubscribed (its 1-minute load average above the threads torch was given), or None.

    The load counts the run's own threads, so a load above them means other work competed for the cores: a quick
    start on a busy machine measured 23 tokens/s where an idle one gives 524.
    """
    host = record.host
    if host is None or not host.load_average_end:
        return None
    threads = (record.threads_per_rank or [0])[0] or torch_threads()
    cpus = len(host.cpu_affinity) if host.cpu_affinity else host.cpu_count
    load = max(host.load_average_start[:1] + host.load_average_end[:1])
    if threads and load > max(threads, 1) + 0.5 and load > (cpus or 0) * 0.9:
        from llmb import sysinfo

        return (
            f"load average {load:.1f} with torch on {threads} thread(s) and {cpus} CPUs: other processes competed "
            f"for the cores, so this figure is low; {sysinfo.threads_advice(record.plugin.settings, threads)}"
        )
    return None


def torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def _measured_peak_cell(record: Result) -> str:
    peak, efficiency = record.measured_matmul_peak, record.matmul_peak_efficiency
    if not peak:
        return "n/a (no dense matmul of one precision: FP8)" if record.precision.effective == "FP8" else "n/a"
    return f"{efficiency:.1%} of {peak / 1e12:.4g} TFLOP/s (llmb peak, this run's GEMMs)"


def _compile_cell(record: Result) -> str:
    timing = record.timing
    if timing.compile_seconds is None:
        return "n/a"
    warmup = timing.warmup_step_seconds
    return f"{timing.compile_seconds:.2f} s beyond steady steps ({len(warmup)} warmup steps, {sum(warmup):.2f} s)"


def _print_record(record: Result, path: Path) -> None:
    from llmb import energy

    prec = record.precision
    table = term.table(f"llmb {record.plugin.name} on {record.device.label}", show_header=False)
    term.column(table, "what", style="bold")
    term.column(table, "value")
    mfu = record.mfu
    repeats = record.repeat_throughputs()
    rows = [
        ("precision", f"{prec.effective} (requested {prec.requested}, mode {prec.mode})"),
        ("shape", record.shape),
        ("settings", record.plugin.settings_label()),
        ("batch size", str(record.batch_size)),
        ("tokens/s", f"{record.tokens_per_second:,.1f}"),
        ("tokens/J per device", energy.energy_cell(record.energy)),
        ("samples/s", f"{record.samples_per_second:,.2f}"),
        ("TFLOP/s per device", f"{record.tflops:.3f}"),
        ("MFU", f"{mfu:.1%} ({peaks.peak_note(record)})" if mfu is not None else "n/a (peak unknown)"),
        ("of measured matmul peak", _measured_peak_cell(record)),
        ("peak memory", f"{record.peak_memory_bytes / 2**30:.2f} GiB" if record.peak_memory_bytes else "n/a"),
        ("loss", f"{record.loss.initial:.4f} -> {record.loss.last:.4f}"),
        ("timing", f"{record.timing.window_seconds:.3f} s window, {record.timing.method}"),
        ("compile (warmup)", _compile_cell(record)),
        ("result", str(path)),
    ]
    if len(repeats) > 1:
        rows.insert(5, ("repeats", f"{len(repeats)}, tokens/s {min(repeats):,.1f}-{max(repeats):,.1f} (median shown)"))
    if record.host is not None and record.host.load_average_end:
        cpus = len(record.host.cpu_affinity) if record.host.cpu_affinity else record.host.cpu_count
        rows.insert(-1, ("host load", f"{record.host.load_average_end[0]:.2f} (1 min) on {cpus} CPUs"))
    if record.world_size > 1:
        rows[3:4] = [
            ("devices", f"{record.world_size} on {record.nodes} node(s), {record.parallel}"),
            ("batch size", f"{record.batch_size} per data-parallel rank, {record.global_batch_size} global"),
            ("tokens/s per device", f"{record.tokens_per_second_per_device:,.1f}"),
            ("per-rank window", ", ".join(f"{w:.3f} s" for w in record.per_rank or [])),
        ]
        layout = record.layout
        if layout is not None:
            rows.insert(
                4,
                (
                    "layout",
                    f"tp {layout.tp} x pp {layout.pp} x dp {layout.dp}, "
                    f"{layout.microbatches} microbatch(es), accumulation {layout.grad_accum}",
                ),
            )
        rows.insert(5, ("threads per rank", ", ".join(map(str, record.threads_per_rank or []))))
    for name, value in rows:
        term.row(table, name, value)  # plugin names and settings are text, never rich markup
    console.print(table)
    busy = oversubscribed(record)
    if busy:
        term.say((f"BUSY HOST: {busy}", "bold yellow"))
    warning = record.repeat_spread_warning()
    if warning:
        term.say((f"NOISY: {warning}", "bold yellow"))
    over_peak = record.matmul_peak_warning()
    if over_peak:
        term.say((f"MATMUL PEAK: {over_peak}", "bold yellow"))
    if prec.effective != prec.requested:
        term.say(
            (
                f"PRECISION: requested {prec.requested} but the audit found {prec.effective} running; "
                f"the result is labelled {prec.effective}.",
                "bold red",
            )
        )
    if not record.official:
        term.say(("DEBUG RUN, NOT A VALID RESULT: " + "; ".join(record.debug_reasons), "bold yellow"))
    for reason in record.invalid_reasons:
        term.say((f"INVALID: {reason}", "bold red"))
    for note in record.stragglers or []:
        term.say((f"STRAGGLER: {note}", "bold yellow"))


@cli.command(name="plugins")
@json_option
@handle_errors
def plugins_command(as_json: bool) -> None:
    """List installed backends: plugin, devices, precisions, methods overridden, settings, peak sources."""
    from rich.text import Text

    from llmb import plugins

    described = [plugins.describe(r) for r in plugins.all_registrations().values()]
    for name, error in plugins.load_errors.items():
        term.warning(f"plugin {name!r} failed to load: {error}")
    if as_json:
        click.echo(json.dumps(described, indent=2))
        return
    # One small table per backend: the method and setting lists are too long for columns of one wide table.
    for b in described:
        hardware = "present" if b["hardware_available"] else "absent"
        title = f"{b['name']}  (plugin {b['plugin']}: {b['distribution']} {b['version']}, hardware {hardware})"
        table = term.table(title, show_header=False)
        term.column(table, "", style="bold")
        term.column(table, "")  # folds long values (URLs) instead of cutting them
        term.row(table, "devices", ", ".join(b["device_types"]))
        term.row(table, "precisions", ", ".join(b["precisions"]))
        term.row(table, "methods overridden", ", ".join(b["methods_overridden"]) or "none")
        settings = Text("\n").join(_setting_line(s) for s in b["settings"])
        term.row(table, "settings", settings if b["settings"] else "none")
        peaks = "\n".join(f"{device}: {source}" for device, source in b["peak_sources"].items())
        term.row(table, "peak sources", peaks or "none (no MFU)")
        console.print(table)


def _given_on_command_line() -> set[str]:
    """The parameters of the running command that were typed (not defaults)."""
    ctx = click.get_current_context()
    return {
        name for name in ctx.params if ctx.get_parameter_source(name) not in (click.core.ParameterSource.DEFAULT, None)
    }


def _setting_line(s: dict) -> Text:
    """One setting: name=default, its type, its allowed values when it has a list, and its help (the plugin's text)."""
    choices = f" (one of {', '.join(map(str, s['choices']))})" if s.get("choices") else ""
    return term.text(f"{s['name']}={s['default']} [{s['type']}]{choices}  {s['help']}")


@cli.command(name="package-submission")
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
    submitter,
    system_name,
    results_dir,
    out,
    archive,
    system_file,
    include_debug,
    allow_debug_shapes,
    no_run_conformance,
    release_sources,
    note,
    force,
) -> None:
    """Write a submission bundle: results, system, code diff, plugin source, conformance, summary, manifest."""
    from llmb import conformance, submission, verify

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


@cli.command(name="verify")
@click.argument("path", type=click.Path(exists=True, path_type=Path))
@click.option("--accept-debug", is_flag=True, help="Accept a debug bundle (non-official shapes), checking the rest.")
@click.option(
    "--replay",
    is_flag=True,
    help="Also replay each result's headline window here on the CPU in FP32 (from its seed and challenge).",
)
@click.option(
    "--replay-steps",
    type=click.IntRange(min=1),
    default=names.DEFAULT_REPLAY_STEPS,
    show_default=True,
    help="Steps of each headline window that --replay replays (the whole window, digest included, when it covers it).",
)
@handle_errors
def verify_command(path: Path, accept_debug: bool, replay: bool, replay_steps: int) -> None:
    """Check a submission bundle (a folder or a .tar.gz) without running any of its code; exit 1 if any check fails."""
    from llmb import verify

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


@cli.command(name="reproduce")
@click.argument("path", type=click.Path(exists=True, path_type=Path))
@click.option(
    "--tolerance",
    type=float,
    default=0.05,
    show_default=True,
    help="How far a headline may exceed the reproduced median (0.05: 5%) before it is refuted.",
)
@click.option(
    "--runs", type=click.IntRange(min=1), default=3, show_default=True, help="Reproduction runs per headline."
)
@handle_errors
def reproduce_command(path: Path, tolerance: float, runs: int) -> None:
    """Re-run each headline of a bundle here (its shipped plugin source and settings) and compare; exit 1 if any
    headline exceeds its reproduction by more than the tolerance."""
    from llmb import reproduce

    rows = reproduce.reproduce(path, tolerance=tolerance, runs=runs)
    table = term.table(f"llmb reproduce {path}")
    for column in ("headline", "result", "detail"):
        term.column(table, column)
    for row in rows:
        verdict = Text("reproduced", style="green") if row.passed else Text("REFUTED", style="bold red")
        term.row(table, row.label, verdict, row.detail)  # the bundle's text: never markup
    console.print(table)
    if not all(row.passed for row in rows):
        sys.exit(1)


@cli.command(name="new-plugin")
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
    from llmb.scaffold import install_command, write_plugin

    target = write_plugin(name, directory)
    term.say(f"wrote plugin {name!r} to {target}; install it with: {install_command(target)}")


@cli.command(name="commbench")
@click.option("--plugin", default=None, help="Hardware plugin whose process-group backend is measured.")
@click.option("--device", default=None, help="Device type (default: the plugin's).")
@click.option(
    "--nproc-per-node", type=bounds.PROCESSES, default=None, help="Processes (default: the host's devices, at least 2)."
)
@click.option("--sizes", default=None, help="Message sizes in bytes, e.g. 1K,1M,64M (default 1K to 64M by x16).")
@click.option("--iters", default=20, show_default=True, type=bounds.COUNT, help="Timed all-reduces per size.")
@click.option(
    "--warmup", default=5, show_default=True, type=click.IntRange(0, 10**6), help="Untimed all-reduces per size."
)
@click.option("--dtype", default="float32", show_default=True, help="Element type of the buffers.")
@json_out_option
@handle_errors
def commbench_command(plugin, device, nproc_per_node, sizes, iters, warmup, dtype, out) -> None:
    """All-reduce bus bandwidth over message sizes through the plugin's torch.distributed backend."""
    from llmb import commbench, distributed
    from llmb.results import check_writable, write_json_atomic

    options = commbench.CommOptions(plugin=plugin, device=device, iters=iters, warmup=warmup, dtype=dtype)
    if out is not None:
        check_writable(out.parent)  # before anything is measured
    if sizes:
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


@cli.command(name="project")
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
    layers,
    hidden,
    ffn,
    heads,
    seq,
    global_batch,
    tp,
    pp,
    dp,
    bytes_per_element,
    result_path,
    comm_path,
    check_path,
    as_json,
) -> None:
    """Project the step time and seed FOM of a TP x PP x DP training (the ALCF 1T model) from measured alpha and
    beta; with --check, hold the projection against a measured run."""
    from llmb import project
    from llmb.records import Commbench, RecordError, Result
    from llmb.results import load_result

    try:
        result, comm = load_result(result_path), load_result(comm_path)
        measured = load_result(check_path) if check_path else None
    except (OSError, ValueError) as exc:
        raise LlmbError(f"cannot read JSON: {exc}") from None
    checked = [(result_path, result, Result), (comm_path, comm, Commbench)]
    checked += [(check_path, measured, Result)] if measured is not None else []
    for path, data, kind in checked:
        try:
            kind.from_dict(data)  # strict: a file that is not the record it should be is named with its bad field
        except RecordError as exc:
            raise LlmbError(f"{path} is not an llmb {kind.__name__.lower()} record: {exc}") from None
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


@cli.command()
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
    plugin,
    device,
    options,
    precision_name,
    mode,
    batch_sizes,
    max_batch_size,
    repeats,
    steps,
    warmup_steps,
    seed,
    preset,
    trial_timeout,
    out,
    resume,
    search_items,
    **shape,
) -> None:
    """Find the best batch size per precision (and, with --search, the best plugin settings): each trial its own
    `llmb run` process, resumable."""
    from llmb import grid, runner
    from llmb import sweep as sweeps
    from llmb.config import build_config

    if resume and not (out / sweeps.LOG_NAME).is_file():
        # Nothing to continue: starting a sweep here would run whatever the defaults are (the official shape, every
        # precision) where the user meant to resume one.
        raise UsageError(
            f"--resume: {out} holds no sweep to continue (no {sweeps.LOG_NAME}); leave out --resume to start one there"
        )
    if resume:  # the options not given again are the log's: a resumed sweep needs no retyping
        logged = sweeps.logged_options(out, given=_given_on_command_line())
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
    searched = grid.parse_search(search_items, run_options.settings)
    if searched:
        with sweeps.LiveDisplay(err_console) as display:
            found = grid.search(sweep_options, searched, display)
        grid.print_search(found, console)
        term.say(f"search written to {out} ({grid.SEARCH_SUMMARY_NAME}; llmb report {out})")
        return
    with sweeps.LiveDisplay(err_console) as display:
        summary = sweeps.sweep(sweep_options, display)
    sweeps.print_summary(summary, console)
    term.say(f"sweep written to {out} (llmb report {out})")


@cli.command(name="report")
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "--format",
    "fmt",
    default=None,
    type=bounds.choice(["md", "html", "csv", "json"]),
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
def report_command(paths, fmt, out, plot_dir, baseline, reference) -> None:
    """Tables and plots from result files, sweep directories and submission bundles."""
    from llmb.report import report

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


@cli.command(name="check-plugin")
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
@click.option("--precision-mode", "mode", default="pure", show_default=True, type=bounds.choice(names.MODES))
@click.option("--preset", default="tiny", show_default=True, type=bounds.choice(names.CONFORMANCE_PRESETS))
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
def check_plugin(plugin, device, options, precision_name, mode, preset, steps, batch_size, seed, out) -> None:
    """Check that a plugin preserves the model's function against the FP32 CPU reference; exit 1 if not."""
    from llmb import conformance
    from llmb.results import check_writable

    check_writable(out.parent)  # before the check runs, not after
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
    while True:  # each record written as soon as it is judged: a later failure loses none
        with err_console.status(f"{requested}: running the candidate and the reference"):
            record = next(checked, None)
        if record is None:
            break
        name = record.precision.requested
        several = len(names.expand_precision(names.ALL_PRECISIONS, record.plugin.precisions or [])[0]) > 1
        all_asked = requested == names.ALL_PRECISIONS
        target = out.with_name(f"{out.stem}-{name.lower()}{out.suffix}") if all_asked and several else out
        path = conformance.write(record, target)
        conformance.print_table(record, console)
        term.say(f"conformance record written to {path}")
        passed = passed and record.passed
    if not passed:
        sys.exit(1)


@cli.command(name="peak")
@plugin_options
@click.option(
    "--precision",
    "precisions",
    multiple=True,
    type=bounds.choice(names.PRECISIONS),
    help="Precision to measure (repeatable; default: every one the plugin supports).",
)
@model_options
@click.option(
    "--batch-size", default=1, show_default=True, type=bounds.BATCH, help="The batch whose GEMM shapes are measured."
)
@click.option(
    "--square",
    type=click.IntRange(1, 2**16),
    default=None,
    help="Side of the square GEMM (default: doubled from 256 until one matmul lasts 50 ms, at most 8192).",
)
@click.option(
    "--repeats", default=5, show_default=True, type=bounds.REPEATS, help="Timed batches per GEMM; the median counts."
)
@json_option
@json_out_option
@handle_errors
def peak_command(plugin, device, options, precisions, preset, batch_size, square, repeats, as_json, out, **shape):
    """The roofline: achievable dense matmul FLOP/s per precision at the model's GEMM shapes and a square GEMM."""
    from llmb import roofline, sysinfo
    from llmb.config import build_config
    from llmb.records import device_label
    from llmb.results import write_json_atomic

    kind = roofline.device_for(plugin, device).type
    if "preset" not in _given_on_command_line():  # a shape that suits the device: minutes, not hours, on a CPU
        preset = names.PEAK_DEVICE_PRESETS.get(kind, preset)
        term.say(
            f"llmb peak on {kind}: the {preset} shape's GEMMs (--preset official measures the official ones)",
            stderr=True,
        )
    emulated = sysinfo.cpu_emulated_precisions() if kind == "cpu" else []
    results = roofline.peak(
        plugin=plugin,
        device=device,
        precisions_wanted=list(precisions),
        config=build_config(preset, **shape),
        batch_size=batch_size,
        settings=parse_options(options),
        square=square,
        repeats=repeats,
    )
    from llmb.records import ROOFLINE_SCHEMA, envelope

    data = {
        **envelope(ROOFLINE_SCHEMA),
        "preset": preset,
        "batch_size": batch_size,
        "emulated": [r.precision for r in results if r.precision in emulated],
        "rooflines": [r.to_dict() for r in results],
    }
    if out:
        write_json_atomic(out, data)
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    for result in results:
        # The device name comes from the plugin: text, never markup.
        title = f"{result.precision} matmul on {device_label(result.device, result.device_name)}, median of {repeats}"
        if result.precision in emulated:
            title += " (emulated: this CPU has no native matmul for it, so it is slow)"
        table = term.table(title)
        for column in ("GEMM", "m x n x k", "iters", "TFLOP/s"):
            term.column(table, column, numeric=column != "GEMM")
        for rate in result.rates:
            g = rate.gemm
            table.add_row(g.name, f"{g.m} x {g.n} x {g.k}", str(rate.iters), f"{rate.flops_per_second / 1e12:.4g}")
        console.print(table)
        line = f"measured matmul peak {result.peak_flops / 1e12:.4g} TFLOP/s"
        if result.model_gemm_flops:
            line += f"; the model's GEMMs together {result.model_gemm_flops / 1e12:.4g} TFLOP/s"
        term.say(line)


@cli.command(name="features")
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option("--markdown", is_flag=True, help="Print markdown tables instead.")
@handle_errors
def features_command(paths, markdown) -> None:
    """The feature matrix from result, conformance and attempt records: each feature by single device, DDP and
    FSDP, and each pair of features (yes only where a run exists and conformed)."""
    from llmb import features

    records = features.load_records(paths)
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


@cli.command(name="leaderboard")
@click.argument("bundles", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option("--out", type=click.Path(path_type=Path), required=True, help="The site's folder (index.html and pages).")
@click.option(
    "--replay", is_flag=True, help="Also replay each result's headline window here, as `llmb verify --replay` does."
)
@handle_errors
def leaderboard_command(bundles: tuple[Path, ...], out: Path, replay: bool) -> None:
    """Verify submission bundles (folders or .tar.gz) and write a static site of them: a sortable index of systems by
    precision and one page per submission with its evidence. A bundle that fails is listed as failed, with why."""
    from llmb import leaderboard, outputs
    from llmb.results import check_writable

    outputs.refuse_overlap({"--out": out}, bundles)  # before anything is made: the site never enters a bundle
    check_writable(out)
    entries = leaderboard.build(list(bundles), out, names.DEFAULT_REPLAY_STEPS if replay else 0)
    for entry in entries:
        style = {"valid": "green", "debug": "yellow"}.get(entry.verdict, "bold red")
        term.say((entry.verdict, style), ": ", entry.system or entry.source)  # the bundle's name is text, not markup
    term.say(f"{len(entries)} submission(s): {out / 'index.html'}")
