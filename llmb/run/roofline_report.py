"""What `llmb peak` writes and shows: the rooflines of its precisions as one JSON record, and a table each."""

from __future__ import annotations

from rich.console import Console

from llmb.records import ROOFLINE_SCHEMA, device_label, envelope
from llmb.run import sysinfo
from llmb.run.roofline import Roofline
from llmb.terminal import console as term


def peak_record(results: list[Roofline], device_type: str, preset: str, batch_size: int) -> dict:
    """The JSON record of one `llmb peak`: its shape and batch, and each precision's roofline; ``emulated`` names the
    precisions this CPU has no native matmul for (measured all the same, slow)."""
    emulated = sysinfo.cpu_emulated_precisions() if device_type == "cpu" else []
    return {
        **envelope(ROOFLINE_SCHEMA),
        "preset": preset,
        "batch_size": batch_size,
        "emulated": [r.precision for r in results if r.precision in emulated],
        "rooflines": [r.to_dict() for r in results],
    }


def print_rooflines(record: dict, results: list[Roofline], repeats: int, console: Console) -> None:
    """A table per precision (each GEMM's rate), then its measured peak and the model's GEMMs together."""
    for result in results:
        # The device name comes from the plugin: text, never markup.
        title = f"{result.precision} matmul on {device_label(result.device, result.device_name)}, median of {repeats}"
        if result.precision in record["emulated"]:
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
