"""Plugin conformance: does a plugin's backend setup and post-processing preserve the model's function?

The candidate is prepared exactly as `llmb run` prepares it (`runner.prepare`: precision recipe, the plugin's
backend setup, the model built from the seed, AdamW, the plugin's post-processing) and trained for K steps by the
harness's own loop (`Trainer.step`), in a worker process that alone imports the plugin (llmb.judge.cleanroom.serve); its
trace comes back as tensors and plain data. The reference is the same model from the same seed on the same batch,
prepared through the built-in cpu plugin with no settings, in FP32, with no post-processing, in the judging process,
which imports no plugin: a patch the plugin makes to torch at import cannot reach it. The two are compared there:

- parameter-names: the parameter count, names and shapes are unchanged (after normalising wrapper names, below);
- fingerprint: the installed model definition is the released one;
- identities: torch's entry points, AdamW, the global hook registries, the aten kernels and llmb's own code and
  constants are the objects they were before any plugin was imported (llmb.audit.guard);
- optimizer: exactly torch.optim.AdamW with the fixed hyperparameters over every parameter, none frozen, its
  `step` not replaced on the instance (checked after post-processing and again after the K steps);
- optimizer-steps: AdamW's own step post-hook counted as many steps as the harness's loop made;
- precision: the audited effective precision is not below the requested one;
- forward-loss, forward-logits: one forward pass at the initial weights (relative error, relative norm error);
- gradients: every parameter's gradient after the first step's backward, by name (worst relative norm error);
- loss-curve: the loss of each of the K harness steps (worst relative error);
- trained-parameters: the parameters after K steps, by name (worst relative norm error). Where the parameters are
  kept in FP32 (FP32, TF32 and amp) the *update* p_K - p_0 is compared, since the update (about K x lr = K x 1e-5
  per element) is far smaller than the weights and would vanish in their error. Pure FP16/BF16 weights cannot hold
  a 1e-5 update (BF16's spacing at 0.02 is 1.2e-4), so there the weights themselves are compared.

Names are normalised by dropping the segments that known wrappers add, wherever they appear: torch.compile's
``_orig_mod``, activation checkpointing's ``_checkpoint_wrapped_module``, FSDP's ``_fsdp_wrapped_module``, CPU
offload's ``_offload_wrapped_module`` and DDP/DataParallel's ``module`` (the fixed model has no segment of these
names, so nothing real is dropped).

Tolerances are per effective precision and mode (16-bit compute over weights kept in FP32 takes the amp row, whatever
mode was asked for: an FP32 request whose matmuls ran BF16 fails precision, and its function is held to BF16 amp's):
ten times the worst error measured, rounded up to 1, 2 or 5 (2 contended CPU cores, torch 2.13.0+cpu; tiny preset
seeds 0 and 1, small preset seed 0, batch 2, K = 5; `python scripts/conformance_errors.py` re-measures). FP32 is
measured against a float64 copy of the reference (a second FP32 implementation, a GPU's or a compiled graph's, differs
from the FP32 reference by about that much); the 16-bit rows are the CPU's own FP16/BF16 kernels through the harness's
recipes against the FP32 reference.

    worst measured relative error -> tolerance
    effective, mode | forward-loss     | forward-logits | gradients      | loss-curve       | trained-parameters
    FP32            | 9.3e-8 -> 1e-6 ^ | 7.2e-7 -> 1e-5 | 1.6e-6 -> 2e-5 | 9.3e-8 -> 1e-6   | 1.8e-3 -> 2e-2
    TF32            | (FP16 amp's)     |                |                |                  |
    FP16 amp        | 1.8e-6 -> 2e-5   | 1.1e-3 -> 2e-2 | 2.1e-3 -> 5e-2 | 1.9e-6 -> 2e-5   | 8.1e-3 -> 1e-1
    FP16 pure       | 3.8e-6 -> 5e-5   | 1.2e-3 -> 2e-2 | 4.3e-2 -> 5e-1 | 3.0e-1 -> 2e-1 * | 2.4    -> 5e-2 *
    BF16 amp        | 2.4e-5 -> 5e-4   | 8.0e-3 -> 1e-1 | 1.8e-2 -> 2e-1 | 2.9e-5 -> 5e-4   | 4.6e-2 -> 5e-1
    BF16 pure       | 1.7e-5 -> 2e-4   | 9.5e-3 -> 1e-1 | 2.2e-2 -> 5e-1 | 1.9e-2 -> 2e-1   | 2.9e-3 -> 5e-2

^ One FP32 ulp of the loss: both sides reduce FP32 logits (the model casts them). No CPU runs TF32: its matmul
inputs keep FP16's 10-bit mantissa while activations stay FP32, so it takes the FP16 amp row. A check of the FP32
row, two other FP32 implementations against the FP32 reference on the tiny preset: XLA:CPU (the xla plugin on the
CPU PJRT device, K = 3) loss 9.2e-8, logits 2.2e-7, gradients 6.3e-7, loss curve 9.2e-8, updates 7.4e-5; and
torch.compile's CPU graph (the cpu plugin's -O compile=default, K = 5) 9.2e-8, 1.7e-7, 3.9e-7, 9.2e-8, 3.9e-6.

* Pure FP16 does not preserve training: AdamW's second moment g^2, kept in FP16, underflows for |g| < 2.4e-4, the
step becomes lr * g / eps, up to ~100 x lr, and the weights run away (loss 10.39 -> 9.86 in three steps where the
reference goes to 10.383). Its loss-curve and trained-parameters tolerances are therefore not taken from that
divergence but from the BF16 pure row (weights that cannot follow 1e-5 updates, correctly stepped), so the check
reports it. The loss-curve and trained-parameters errors grow with K; the table holds for K up to the default.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from rich.text import Text

from llmb.api.errors import LlmbError, UsageError
from llmb.api.settings import recorded
from llmb.audit import precision
from llmb.conformance.checks import compare, relative_error  # noqa: F401  (relative_error: importable as before)
from llmb.conformance.trace import (  # noqa: F401  (normalise_name: importable as before)
    Trace,
    normalise_name,
    pack,
    trace,
    unpack,
)
from llmb.judge import cleanroom
from llmb.records import Conformance, DeviceRef, PluginRef, Precision
from llmb.records.result_files import write_json_atomic
from llmb.registry.plugins import call, get_backend, resolve_settings
from llmb.run import clean_worker
from llmb.run.plugin_returns import PluginReturns
from llmb.run.runner import RunOptions, Session, check_request, is_out_of_memory, prepare, resolve
from llmb.spec.fingerprint import model_fingerprint
from llmb.spec.presets import PRESETS
from llmb.spec.tolerances import TOLERANCES, Tolerance, tolerance_for  # noqa: F401  (the measurements: above)
from llmb.spec.vocab import CONFORMANCE_BATCH_SIZE as DEFAULT_BATCH_SIZE
from llmb.spec.vocab import CONFORMANCE_PRESETS
from llmb.spec.vocab import CONFORMANCE_STEPS as DEFAULT_STEPS
from llmb.terminal import console as term

if TYPE_CHECKING:
    from rich.console import Console

    from llmb.distributed.job import World

REFERENCE_PLUGIN = "cpu"


@contextlib.contextmanager
def _restored_global_state() -> Iterator[None]:
    """Put back the global torch state a plugin's setup may change, so the reference after it starts clean.

    The reference's own preparation resets the matmul switches (`precision.apply_backend_recipe`); this covers
    the rest that changes what the reference computes or how fast.
    """
    dtype, threads, matmul = torch.get_default_dtype(), torch.get_num_threads(), precision.matmul_precision_setting()
    try:
        yield
    finally:
        torch.set_default_dtype(dtype)
        torch.set_num_threads(threads)
        if not matmul.startswith("unreadable"):  # per-backend switches that disagree: the reference resets them
            torch.set_float32_matmul_precision(matmul)


def reference_options(options: RunOptions) -> RunOptions:
    """The reference's request: the same shape, batch, seed and steps, FP32 on the CPU through the cpu plugin."""
    return replace(options, plugin=REFERENCE_PLUGIN, device="cpu", precision="FP32", mode="pure", settings={})


# The reference is the model as defined with torch's default AdamW implementation: the cpu plugin's faster fused
# kernel is a choice a plugin makes, so it is checked as a candidate, not assumed by the reference.
REFERENCE_SETTINGS = {"fused_adamw": "false"}


def reference_session(options: RunOptions) -> Session:
    reference = get_backend(REFERENCE_PLUGIN)
    settings = resolve_settings(reference.backend, REFERENCE_SETTINGS)
    return prepare(reference_options(options), reference, torch.device("cpu"), settings)


_reference_traces: dict[tuple, Trace] = {}


def reference_trace(options: RunOptions) -> Trace:
    """The reference's trace, computed once per shape, batch, steps and seed in a process (the CPU's FP32 result
    is deterministic, so checking several plugins or precisions in one process reuses it)."""
    key = (options.config, options.batch_size, options.steps, options.seed)
    if key not in _reference_traces:
        _reference_traces.clear()  # keep one: a small-preset trace holds about 0.5 GB
        _reference_traces[key] = trace(reference_session(options), options.steps)
    return _reference_traces[key]


def request(
    plugin: str | None,
    device: str | None,
    precision: str,
    mode: str = "pure",
    settings: dict[str, str] | None = None,
    preset: str = "tiny",
    steps: int = DEFAULT_STEPS,
    batch_size: int = DEFAULT_BATCH_SIZE,
    seed: int = 0,
) -> RunOptions:
    """The check's request, checked before any process starts (precision may be ALL)."""
    if preset not in CONFORMANCE_PRESETS:
        raise UsageError(f"conformance runs on a small shape: preset {preset!r} is not one of tiny, small")
    options = RunOptions(
        config=PRESETS[preset],
        preset=preset,
        plugin=plugin,
        device=device,
        precision=precision.upper(),
        mode=mode,
        batch_size=batch_size,
        steps=steps,
        warmup_steps=1,
        seed=seed,
        settings=dict(settings or {}),
    )
    check_request(options, allow_all=True)
    return options


def candidate(options: RunOptions) -> dict:
    """The candidate's side, in the process that imported the plugin: prepared exactly as `llmb run` prepares it,
    traced, and described (precision, mode, device, plugin) for the judge."""
    chosen, torch_device, resolved = resolve(options)
    try:
        with _restored_global_state():  # in process (LLMB_IN_PROCESS=1), the reference comes after it
            session = prepare(options, chosen, torch_device, resolved)
            mode = session.recipe.mode
            name = PluginReturns(chosen.name).name("device_name", call(session.backend.device_name, torch_device))
            found = trace(session, options.steps)
            del session
            gc.collect()  # the trainer and its optimizer hold each other (the step hook): free the model now
    except LlmbError:
        raise
    except Exception as exc:
        if is_out_of_memory(exc):
            raise LlmbError(f"out of memory at batch size {options.batch_size} on {torch_device}") from exc
        raise
    plugin = PluginRef(
        name=chosen.name,
        version=chosen.version,
        distribution=chosen.distribution,
        settings=recorded(resolved),  # a secret setting's value is never recorded, nor sent
        defaults=recorded(resolve_settings(chosen.backend, {})),
        precisions=list(call(chosen.backend.precisions)),
    )
    device = DeviceRef(type=torch_device.type, spec=str(torch_device), name=name)
    return {
        "precision": options.precision,
        "mode": mode,
        "device": device,
        "plugin": plugin,
        "trace": found,
    }


def candidate_task(jobs: list[RunOptions], link: clean_worker.Link | None, world: World | None) -> Iterator[bytes]:
    """check-plugin's work in the worker (llmb.run.clean_worker.worker_main): each requested precision (ALL: every one
    the plugin supports) prepared and traced there, sent to the judge as tensors and plain data (`pack`)."""
    for options in clean_worker.expand_all(jobs, link):
        yield pack(candidate(options))


def judge(found: dict, options: RunOptions) -> Conformance:
    """The judge's side: the reference, computed in this process, and every check of the candidate against it."""
    options = replace(options, precision=found["precision"])
    try:
        reference = reference_trace(options)
    except Exception as exc:
        if is_out_of_memory(exc):
            raise LlmbError(f"out of memory at batch size {options.batch_size} on the cpu (the reference)") from exc
        raise
    candidate_trace, mode = found["trace"], found["mode"]
    checks = compare(candidate_trace, reference, options.precision, mode)
    return Conformance(
        passed=all(c.passed for c in checks),
        plugin=found["plugin"],
        device=found["device"],
        precision=Precision(requested=options.precision, effective=candidate_trace.audit["effective"], mode=mode),
        preset=options.preset,
        config=options.config,
        seed=options.seed,
        steps=options.steps,
        batch_size=options.batch_size,
        model_fingerprint=model_fingerprint(),
        checks=checks,
    )


def check_plugins(
    plugin: str | None,
    device: str | None,
    precision: str,
    mode: str = "pure",
    settings: dict[str, str] | None = None,
    preset: str = "tiny",
    steps: int = DEFAULT_STEPS,
    batch_size: int = DEFAULT_BATCH_SIZE,
    seed: int = 0,
) -> Iterator[Conformance]:
    """Run the candidate in a worker process (the only one that imports the plugin) and the reference here, compare
    them here, and yield one conformance record per precision (ALL: every precision the plugin supports), each as
    soon as it is judged.

    Judged from a process that imported no plugin, a patch the plugin makes at import (torch's Linear computing in
    BF16, AdamW replaced) reaches the candidate only, never the reference or the comparison. LLMB_IN_PROCESS=1
    (in-memory test backends) runs the candidate in this process instead."""
    options = request(plugin, device, precision, mode, settings, preset, steps, batch_size, seed)
    if cleanroom.in_process():
        for options_for in clean_worker.expand_all([options], None):
            yield judge(candidate(options_for), options)
        return
    sent, error = cleanroom.serve(candidate_task, [options])
    while sent:  # one candidate's tensors at a time beside the reference's
        data = sent.pop(0)[0]
        yield judge(unpack(data, options.precision), options)
    if error is not None:
        raise error  # after the records of the precisions that finished


def check_plugin(
    plugin: str | None,
    device: str | None,
    precision: str,
    mode: str = "pure",
    settings: dict[str, str] | None = None,
    preset: str = "tiny",
    steps: int = DEFAULT_STEPS,
    batch_size: int = DEFAULT_BATCH_SIZE,
    seed: int = 0,
) -> Conformance:
    """`check_plugins` for one precision: its conformance record."""
    if precision.upper() == "ALL":
        raise UsageError("check_plugin checks one precision; check_plugins checks all")
    (record,) = list(check_plugins(plugin, device, precision, mode, settings, preset, steps, batch_size, seed))
    return record


def failed_checks(record: Conformance) -> list[str]:
    return record.failed()


def write(record: Conformance, path: Path) -> Path:
    return write_json_atomic(Path(path), record.to_dict())


def _figure(value) -> str:
    if value is None:
        return ""
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def print_table(record: Conformance, console: Console) -> None:
    """One row per check, then the verdict (the CLI's view of the record)."""
    prec = record.precision
    title = (
        f"llmb check-plugin {record.plugin.name} on {record.device.label}: requested {prec.requested} "
        f"{prec.mode}, audited {prec.effective}, {record.preset} preset, {record.steps} steps"
    )
    table = term.table(title)
    for column in ("check", "result", "measured", "tolerance", "detail"):
        term.column(table, column, numeric=column in ("measured", "tolerance"))
    for check in record.checks:
        verdict = Text("PASS", style="green") if check.passed else Text("FAIL", style="bold red")
        # The detail quotes parameter names and plugin text: plain text, never rich markup.
        term.row(table, check.name, verdict, _figure(check.measured), _figure(check.tolerance), check.detail)
    console.print(table)
    if record.passed:
        console.print(Text("CONFORMS: every check passed", style="bold green"))
    else:
        console.print(term.text(f"DOES NOT CONFORM: failed {', '.join(failed_checks(record))}", "bold red"))
