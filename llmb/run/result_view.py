"""The console view of one run's result: its table, then the warnings a reader must not miss (a busy host, noisy
repeats, a precision below the one asked for, a debug or invalid run)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from llmb.records import energy
from llmb.run.host_load import oversubscribed
from llmb.spec import peak_table as peaks
from llmb.terminal import console as term

if TYPE_CHECKING:  # annotations only: the records import the model, and so torch
    from llmb.records import Result


def measured_peak_cell(record: Result) -> str:
    peak, efficiency = record.measured_matmul_peak, record.matmul_peak_efficiency
    if not peak:
        return "n/a (no dense matmul of one precision: FP8)" if record.precision.effective == "FP8" else "n/a"
    return f"{efficiency:.1%} of {peak / 1e12:.4g} TFLOP/s (llmb peak, this run's GEMMs)"


def compile_cell(record: Result) -> str:
    timing = record.timing
    if timing.compile_seconds is None:
        return "n/a"
    warmup = timing.warmup_step_seconds
    return f"{timing.compile_seconds:.2f} s beyond steady steps ({len(warmup)} warmup steps, {sum(warmup):.2f} s)"


def rows(record: Result, path: Path) -> list[tuple[str, str]]:
    """The table's rows: what was measured, how, and where the record is."""
    prec = record.precision
    mfu = record.mfu
    repeats = record.repeat_throughputs()
    shown = [
        ("precision", f"{prec.effective} (requested {prec.requested}, mode {prec.mode})"),
        ("shape", record.shape),
        ("settings", record.plugin.settings_label()),
        ("batch size", str(record.batch_size)),
        ("tokens/s", f"{record.tokens_per_second:,.1f}"),
        ("tokens/J per device", energy.energy_cell(record.energy)),
        ("samples/s", f"{record.samples_per_second:,.2f}"),
        ("TFLOP/s per device", f"{record.tflops:.3f}"),
        ("MFU", f"{mfu:.1%} ({peaks.peak_note(record)})" if mfu is not None else "n/a (peak unknown)"),
        ("of measured matmul peak", measured_peak_cell(record)),
        ("peak memory", f"{record.peak_memory_bytes / 2**30:.2f} GiB" if record.peak_memory_bytes else "n/a"),
        ("loss", f"{record.loss.initial:.4f} -> {record.loss.last:.4f}"),
        ("timing", f"{record.timing.window_seconds:.3f} s window, {record.timing.method}"),
        ("compile (warmup)", compile_cell(record)),
        ("result", str(path)),
    ]
    if len(repeats) > 1:
        shown.insert(5, ("repeats", f"{len(repeats)}, tokens/s {min(repeats):,.1f}-{max(repeats):,.1f} (median shown)"))
    if record.host is not None and record.host.load_average_end:
        cpus = len(record.host.cpu_affinity) if record.host.cpu_affinity else record.host.cpu_count
        shown.insert(-1, ("host load", f"{record.host.load_average_end[0]:.2f} (1 min) on {cpus} CPUs"))
    if record.world_size > 1:
        shown[3:4] = [
            ("devices", f"{record.world_size} on {record.nodes} node(s), {record.parallel}"),
            ("batch size", f"{record.batch_size} per data-parallel rank, {record.global_batch_size} global"),
            ("tokens/s per device", f"{record.tokens_per_second_per_device:,.1f}"),
            ("per-rank window", ", ".join(f"{w:.3f} s" for w in record.per_rank or [])),
        ]
        layout = record.layout
        if layout is not None:
            shown.insert(
                4,
                (
                    "layout",
                    f"tp {layout.tp} x pp {layout.pp} x dp {layout.dp}, "
                    f"{layout.microbatches} microbatch(es), accumulation {layout.grad_accum}",
                ),
            )
        shown.insert(5, ("threads per rank", ", ".join(map(str, record.threads_per_rank or []))))
    return shown


def print_record(record: Result, path: Path) -> None:
    """The run's table on stdout, then its warnings."""
    prec = record.precision
    table = term.table(f"llmb {record.plugin.name} on {record.device.label}", show_header=False)
    term.column(table, "what", style="bold")
    term.column(table, "value")
    for name, value in rows(record, path):
        term.row(table, name, value)  # plugin names and settings are text, never rich markup
    term.out.print(table)
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
