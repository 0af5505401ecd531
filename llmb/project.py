"""The ALCF 1T benchmark's time-to-solution model, fed with measured figures.

The seed (ALCF 1T LLM training benchmark) models one training step as

    t = alpha * b L (36 s d^2 + 6 s^2 d) / (PP * TP)  +  beta * 4 b L s d / PP

alpha is the time per FLOP of one device (1 / its FLOP/s) and beta the time per byte of the intranode all-reduce
(1 / its bandwidth); the second term reduces an [s, d] activation four times per layer in the TP group. The DP
all-reduce is left out: it overlaps with the next layer's compute. Here:

- alpha = 1 / the achieved model FLOP/s per device of an `llmb run` result (its `tflops`): the projection assumes
  the big model runs the device as efficiently as the measured one did.
- beta = 1 / the all-reduce algorithm bandwidth of an `llmb commbench` record: the time of an all-reduce of S bytes
  is S / algbw by definition (busbw is the link-comparable figure, not a time). The bandwidth is the one measured at
  the size nearest (log scale) to one [s, d] activation (s x d x bytes per element); beyond the largest measured
  size, the largest's (bandwidth saturates with size).
- The terms count elements; bytes per element (default 2, BF16 activations) turns the second into bytes.
- b: the seed's formula is one model replica (TP x PP devices) working through its batch. With DP replicas each
  works through global batch / DP at the same time, so b = global batch / DP (DP = 1 is the seed's formula as
  written). The FOM, (6 s d^2 + s^2 d) b L / T (llmb.flops.fom), takes the global batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from llmb import flops
from llmb.errors import UsageError
from llmb.model import OFFICIAL_CONFIG


@dataclass(frozen=True)
class Shape:
    layers: int
    hidden: int
    ffn: int
    seq: int
    global_batch: int
    tp: int = 1
    pp: int = 1
    dp: int = 1
    heads: int | None = None
    bytes_per_element: int = 2


def check(shape: Shape) -> None:
    for name in ("layers", "hidden", "ffn", "seq", "global_batch", "tp", "pp", "dp", "bytes_per_element"):
        if getattr(shape, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(shape, name)}")
    if shape.global_batch % shape.dp:
        raise UsageError(f"--global-batch {shape.global_batch} does not divide into --dp {shape.dp} replicas")
    if shape.heads is not None and (shape.heads < 1 or shape.hidden % shape.heads):
        raise UsageError(f"--hidden {shape.hidden} is not divisible by --heads {shape.heads}")


def achieved_flops(result: dict) -> float:
    """Achieved model FLOP/s per device of a run result."""
    tflops = result.get("tflops")
    if not tflops or tflops <= 0:
        raise UsageError("the --from result has no achieved TFLOP/s (is it an llmb run result?)")
    return float(tflops) * 1e12


def pick_bandwidth(comm: dict, message_bytes: float) -> dict:
    """The commbench row measured nearest (log scale) to the message size; the largest for bigger messages."""
    rows = comm.get("results") or []
    if comm.get("operation") != "all_reduce" or not rows:
        raise UsageError("the --comm file has no all-reduce results (is it an llmb commbench record?)")
    largest = max(rows, key=lambda r: r["bytes"])
    if message_bytes >= largest["bytes"]:
        return largest
    return min(rows, key=lambda r: abs(math.log(r["bytes"] / message_bytes)))


def project(shape: Shape, result: dict, comm: dict) -> dict:
    """Every term of the time-to-solution model, the projected step time and the FOM."""
    check(shape)
    s, d, layers = shape.seq, shape.hidden, shape.layers
    b = shape.global_batch // shape.dp
    flop_rate = achieved_flops(result)
    compute_flops = b * layers * (36 * s * d**2 + 6 * s**2 * d)
    alpha_term = compute_flops / (shape.pp * shape.tp) / flop_rate
    message_bytes = s * d * shape.bytes_per_element
    row = pick_bandwidth(comm, message_bytes)
    bandwidth = row["algbw_bytes_per_second"]
    comm_bytes = 4 * b * layers * s * d * shape.bytes_per_element / shape.pp
    beta_term = comm_bytes / bandwidth
    step_seconds = alpha_term + beta_term
    config = replace(
        OFFICIAL_CONFIG,
        hidden_size=d,
        intermediate_size=shape.ffn,
        num_hidden_layers=layers,
        num_attention_heads=shape.heads or 1,
        sequence_length=s,
    )
    return {
        "shape": shape.__dict__,
        "batch_per_replica": b,
        "achieved_flops_per_device": flop_rate,
        "compute_flops": compute_flops,
        "alpha_term_seconds": alpha_term,
        "message_bytes": message_bytes,
        "bandwidth_message_bytes": row["bytes"],
        "allreduce_algbw_bytes_per_second": bandwidth,
        "allreduce_ranks": comm.get("world_size"),
        "comm_bytes": comm_bytes,
        "beta_term_seconds": beta_term,
        "step_seconds": step_seconds,
        "fom": flops.fom(config, shape.global_batch, step_seconds),
        "devices": shape.tp * shape.pp * shape.dp,
    }


def table(p: dict):
    """Each term with its formula and numbers, then the step time and the FOM."""
    from rich.table import Table

    shape = p["shape"]
    s, d, layers, b = shape["seq"], shape["hidden"], shape["layers"], p["batch_per_replica"]
    tp, pp, nbytes = shape["tp"], shape["pp"], shape["bytes_per_element"]
    out = Table(
        title=f"ALCF time-to-solution model: L={layers} d={d} s={s} B={shape['global_batch']} "
        f"TP={tp} PP={pp} DP={shape['dp']} ({p['devices']} devices)",
        show_header=False,
    )
    out.add_column("what", style="bold")
    out.add_column("value")
    rows = [
        ("b (batch per replica)", f"global batch {shape['global_batch']} / DP {shape['dp']} = {b}"),
        ("alpha (achieved, per device)", f"1 / {p['achieved_flops_per_device'] / 1e12:.4g} TFLOP/s (from --from)"),
        ("compute b L (36 s d^2 + 6 s^2 d)", f"{p['compute_flops']:.6g} FLOP"),
        (
            "alpha-term",
            f"{p['compute_flops']:.6g} / ({pp} x {tp}) / {p['achieved_flops_per_device']:.6g} "
            f"= {p['alpha_term_seconds']:.6g} s",
        ),
        (
            "beta (all-reduce algbw)",
            f"1 / {p['allreduce_algbw_bytes_per_second'] / 1e9:.4g} GB/s at "
            f"{p['bandwidth_message_bytes']:,} B on {p['allreduce_ranks']} ranks "
            f"(message s d x {nbytes} B = {p['message_bytes']:,} B)",
        ),
        ("communication 4 b L s d / PP", f"{p['comm_bytes']:.6g} B ({nbytes} B per element)"),
        (
            "beta-term",
            f"{p['comm_bytes']:.6g} / {p['allreduce_algbw_bytes_per_second']:.6g} = {p['beta_term_seconds']:.6g} s",
        ),
        ("projected step time T", f"{p['step_seconds']:.6g} s"),
        ("FOM (6 s d^2 + s^2 d) B L / T", f"{p['fom']:.6g} FLOP/s ({p['fom'] / 1e15:.4g} PFLOP/s)"),
    ]
    for row in rows:
        out.add_row(*row)
    return out
