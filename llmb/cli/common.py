"""What the command groups share: the error handler that makes llmb's errors one line, and the options several
commands take in the same words.

Only what --help needs is imported here: torch (about 6 s to import on a loaded machine) and the modules that import
it are imported inside the commands that train, so `llmb --help` and `llmb CMD --help` answer at once.
"""

from __future__ import annotations

import functools
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from llmb.api.errors import (
    LlmbError,
    Terminated,
    TimeLimitReached,
    describe,
    first_line,
    message,
    sigterm_raises,
)
from llmb.api.settings import env_flag
from llmb.cli import click_types as bounds
from llmb.spec import vocab as names
from llmb.spec.presets import PRESETS  # torch-free: the shapes themselves, so --help names them from their one source
from llmb.spec.printable import one_line
from llmb.terminal import console as term

if TYPE_CHECKING:  # annotations only: distributed imports torch
    from llmb.distributed.job import LaunchSpec

console = term.out
err_console = term.err


class Commands(click.Group):
    """The `llmb` group: click's own usage errors (an unknown option or command, an extra argument, a missing path)
    repeat what was typed, whole and raw; here each is said as every llmb line is, on one line, capped, its control
    characters shown (llmb.spec.printable), before click prints it with the usage."""

    def make_context(self, *args: Any, **kwargs: Any) -> click.Context:
        try:
            return super().make_context(*args, **kwargs)
        except click.ClickException as exc:
            raise _printable(exc) from None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.ClickException as exc:
            raise _printable(exc) from None


# A bare `llmb` raises this to print the group's help, which is llmb's own text on many lines (click 8.2 and later).
_HELP = getattr(click.exceptions, "NoArgsIsHelpError", ())


def _printable(exc: click.ClickException) -> click.ClickException:
    if not isinstance(exc, _HELP):
        exc.message = one_line(exc.message)
    return exc


def handle_errors(func: Callable) -> Callable:
    """Turn llmb's errors into one line on stderr and an exit code."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            with sigterm_raises():
                returned = func(*args, **kwargs)
            sys.stdout.flush()  # here, not at exit: a reader that stopped (`| head`) is caught below, not printed
            return returned
        except BrokenPipeError:
            # The reader of stdout stopped (`llmb report --format csv | head -1`): nothing is left to tell it and
            # nothing failed. Silent, exit 1, as rich's console does for the same (Console.on_broken_pipe); stdout
            # goes to /dev/null so the interpreter's last flush has nowhere to fail.
            _stdout_to_devnull()
            sys.exit(1)
        except LlmbError as exc:
            if env_flag("LLMB_DEBUG") and exc.__cause__ is not None:
                # A plugin's own exception (PluginError wraps it): its traceback is what the plugin's author needs.
                traceback.print_exception(exc.__cause__)
            term.error(message(exc))
            sys.exit(exc.exit_code)
        except TimeLimitReached as exc:
            term.error(message(exc))
            sys.exit(exc.exit_code)
        except Terminated:
            term.say(("stopped by SIGTERM", "bold red"), stderr=True)
            sys.exit(143)  # 128 + SIGTERM, as a shell reports a process the signal ended
        except KeyboardInterrupt:
            term.say(("interrupted", "bold red"), stderr=True)
            sys.exit(130)
        except (click.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise  # click's own usage errors keep click's messages and exit codes
        except OSError as exc:
            # The system refused a file (a full disk, a folder that cannot be made, a name too long): said as the
            # system says it, with the path, one line.
            if env_flag("LLMB_DEBUG"):
                raise
            where = f": {exc.filename}" if exc.filename is not None else ""
            said = exc.strerror or first_line(exc) or type(exc).__name__
            term.error(f"{said}{where}")
            sys.exit(1)
        except Exception as exc:
            # An unexpected failure (a plugin's kernel, a backend's dtype error): still one line, exit 1.
            if env_flag("LLMB_DEBUG"):
                raise
            term.error(describe(exc), (" (LLMB_DEBUG=1 shows the traceback)", ""))
            sys.exit(1)

    return wrapper


def _stdout_to_devnull() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # no file descriptor behind stdout (a test's capture): nothing to do
        pass


def given_on_command_line() -> set[str]:
    """The parameters of the running command that were typed (not defaults)."""
    ctx = click.get_current_context()
    return {
        name for name in ctx.params if ctx.get_parameter_source(name) not in (click.core.ParameterSource.DEFAULT, None)
    }


def apply(func: Callable, options: list[Callable]) -> Callable:
    """Apply option decorators in the order they are listed (the order `--help` shows them)."""
    for option in reversed(options):
        func = option(func)
    return func


def shape_options(func: Callable) -> Callable:
    for name in reversed(names.SHAPE_FIELDS):
        func = click.option(
            f"--{name.replace('_', '-')}",
            name,
            type=bounds.SHAPE,
            default=None,
            help="Debug shape override (the run is not official).",
        )(func)
    return func


def pop_shape(params: dict[str, Any]) -> dict[str, int | None]:
    """The debug shape overrides taken out of a command's parameters (for build_config)."""
    return {name: params.pop(name) for name in names.SHAPE_FIELDS}


def known_plugin(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """--plugin checked as it is parsed, from installed metadata (no torch import): a typo is answered at once."""
    from llmb.registry import plugins  # lazy: the entry points are read only when --plugin is given

    if value is not None:
        try:
            return plugins.check_name(value)
        except LlmbError as exc:
            raise click.BadParameter(str(exc)) from None
    return value


def device_spelling(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """--device in any case (`CPU`, `Cuda:1`): torch's device types are lower case, and so is what a record, a
    sweep's log and its --resume compare."""
    if value is None:
        return None
    if not value.strip():  # an unset variable in a script (--device "$DEVICE"): said, never read as the default
        raise click.BadParameter("is empty: give a device torch accepts (cpu, cuda:0), or leave it out (the plugin's)")
    kind, sep, index = value.strip().partition(":")
    return f"{kind.lower()}{sep}{index}"


def plugin_options(func: Callable) -> Callable:
    func = click.option(
        "-O",
        "--option",
        "options",
        multiple=True,
        metavar="KEY=VALUE",
        help="A plugin setting (repeatable); see `llmb plugins`.",
    )(func)
    func = click.option(
        "--device",
        default=None,
        callback=device_spelling,
        help="Any device string torch accepts, in any case (default: the plugin's).",
    )(func)
    func = click.option(
        "--plugin",
        default=None,
        callback=known_plugin,
        help="Hardware plugin (default: first with hardware present serving --device, else cpu).",
    )(func)
    return func


# The parameters launch_options adds, in launch_spec's order.
LAUNCH_PARAMETERS = ("nproc_per_node", "nnodes", "node_rank", "master_addr", "master_port")


def launch_options(func: Callable) -> Callable:
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
    return apply(func, options)


def launch_spec(
    nproc_per_node: int | None,
    nnodes: int,
    node_rank: int,
    master_addr: str | None,
    master_port: int | None,
    timeout: float = names.DEFAULT_TIMEOUT_SECONDS,
) -> LaunchSpec | None:
    """The torchrun launch the options ask for (a distributed.LaunchSpec), or None for a single process."""
    if nproc_per_node is None:
        if nnodes != 1 or node_rank or master_addr or master_port:
            raise click.UsageError("--nnodes, --node-rank, --master-addr and --master-port need --nproc-per-node")
        return None
    from llmb.distributed import job as distributed  # lazy: torch

    spec = distributed.LaunchSpec(nproc_per_node, nnodes, node_rank, master_addr, master_port, timeout)
    spec.check()  # a usage error (an unresolvable --master-addr) before anything touches the disk
    return spec


def precision_options(default: str) -> Callable[[Callable], Callable]:
    """The precision asked for and its mode, for the commands that train (run: FP32, sweep: all)."""
    return lambda func: apply(
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
                type=bounds.choice(names.MODES, "precision mode"),
                help="pure: 16-bit everything; amp: FP32 master weights + autocast.",
            ),
        ],
    )


def model_options(func: Callable) -> Callable:
    """The preset and its debug shape overrides."""
    func = shape_options(func)
    preset = bounds.choice(tuple(PRESETS), "preset")
    return click.option("--preset", default="official", show_default=True, type=preset)(func)


def device_scaled(name: str) -> str:
    """--help's default of a sweep option that scales to the device: the general value, then each device's."""
    scaled = "; ".join(f"{d[name]:g} on {kind}" for kind, d in names.SWEEP_DEVICE_DEFAULTS.items())
    return f"{names.SWEEP_DEFAULTS[name]:g}; {scaled}"


def loop_options(steps_help: str, scaled: bool = False) -> Callable[[Callable], Callable]:
    """The measured loop's length and seed, then the model's shape: one set for run and sweep. Scaled (a sweep's):
    a step count not given is the device's (None here: llmb.run.sweep.scaled_to_device), and --help says which."""

    def default(name: str, value: int) -> dict:
        return (
            {"default": None, "show_default": device_scaled(name)}
            if scaled
            else {"default": value, "show_default": True}
        )

    return lambda func: apply(
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
