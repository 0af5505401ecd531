"""The ALCF 1T benchmark's time-to-solution model, fed with measured figures.

The seed (ALCF 1T LLM training benchmark) models one training step as

    t = alpha * b L (36 s d^2 + 6 s^2 d) / (PP * TP)  +  beta * 4 b L s d / PP

alpha is the time per multiply-add of one device and beta the time per byte of the intranode all-reduce (1 / its
bandwidth); the second term reduces an [s, d] activation four times per layer in the TP group. The DP all-reduce is
left out: it overlaps with the next layer's compute. Here:

- alpha = 2 / the achieved model FLOP/s per device of an `llmb run` result (its `tflops`). The seed's
  `36 s d^2 + 6 s^2 d` counts multiply-adds (its modelling report counts an [m,n]x[n,k] matmul as m n k), while
  llmb's FLOP/s count two FLOPs per multiply-add. The projection assumes the big model runs the device as
  efficiently as the measured one did.
- beta = 1 / the all-reduce algorithm bandwidth in the TP group: the time of an all-reduce of S bytes is S / algbw.
  An `llmb commbench` record measured algbw on its own rank count n; a ring's bus bandwidth busbw = algbw 2 (n-1)/n
  is the same whatever the count (nccl-tests' point), so the TP group of t ranks gets algbw_t = busbw t / (2 (t-1)).
  A commbench on another rank count than TP is a warning: links within t ranks may differ from those within n.
  TP 1 has no TP all-reduce: the beta-term is zero. The bandwidth is the one measured at the size nearest (log
  scale) to one [s, d] activation (s x d x bytes per element); beyond the largest measured size, the largest's.
- The terms count elements; bytes per element (default 2, BF16 activations) turns the second into bytes.
- b: the seed's formula is one model replica (TP x PP devices) working through its batch. With DP replicas each
  works through global batch / DP at the same time, so b = global batch / DP (DP = 1 is the seed's formula as
  written). The FOM, (6 s d^2 + s^2 d) b L / T (llmb.spec.flops.fom), takes the global batch; it is the seed's own
  figure of merit (a count of its own), not a FLOP/s to compare with a device's peak.

`check` holds the model against reality: the shape, layout and bytes of a measured multi-process run, projected from
a one-process result and a commbench record, next to the run's measured step time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from llmb.api.errors import LlmbError, UsageError
from llmb.records import Commbench, RecordError, Result
from llmb.records.result_files import load_result
from llmb.spec import flops
from llmb.spec.shape import OFFICIAL_CONFIG
from llmb.terminal import console as term

if TYPE_CHECKING:
    from pathlib import Path

    from rich.table import Table


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
    if not positive(tflops):
        raise UsageError("the --from result has no achieved TFLOP/s (is it an llmb run result?)")
    return float(tflops) * 1e12


def positive(value: object) -> bool:
    """Whether a record's figure is a finite number above zero (a file's 0, -5, NaN or 10**400 projects nothing)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(float(value)) and value > 0
    except OverflowError:
        return False


def pick_bandwidth(comm: dict, message_bytes: float) -> dict:
    """The commbench row measured nearest (log scale) to the message size; the largest for bigger messages. A row
    whose size or bandwidth is not a positive, finite number refuses the whole record."""
    rows = comm.get("results") or []
    if comm.get("operation") != "all_reduce" or not rows:
        raise UsageError("the --comm file has no all-reduce results (is it an llmb commbench record?)")
    for index, row in enumerate(rows):
        for key in ("bytes", "algbw_bytes_per_second"):
            if not positive(row.get(key)):
                raise UsageError(f"the --comm file's results[{index}].{key} is not a positive, finite number")
    largest = max(rows, key=lambda r: r["bytes"])
    if message_bytes >= largest["bytes"]:
        return largest
    return min(rows, key=lambda r: abs(math.log(r["bytes"] / message_bytes)))


def _measured_shape(result: dict) -> str:
    """The shape alpha was measured at, as the projection states it."""
    c = result.get("config") or {}
    layers, hidden, seq = (c.get(k, "?") for k in ("num_hidden_layers", "hidden_size", "sequence_length"))
    return (
        f"{result.get('preset', '?')} preset, {layers} layers, hidden {hidden}, seq {seq}, "
        f"batch {result.get('batch_size', '?')}, {result.get('parameters', 0):,} parameters"
    )


def project(shape: Shape, result: dict, comm: dict) -> dict:
    """Every term of the time-to-solution model, the projected step time and the FOM."""
    check(shape)
    s, d, layers = shape.seq, shape.hidden, shape.layers
    b = shape.global_batch // shape.dp
    flop_rate = achieved_flops(result)
    multiply_adds = b * layers * (36 * s * d**2 + 6 * s**2 * d)
    alpha = 2 / flop_rate  # seconds per multiply-add: two FLOPs each
    alpha_term = multiply_adds / (shape.pp * shape.tp) * alpha
    message_bytes = s * d * shape.bytes_per_element
    row = pick_bandwidth(comm, message_bytes)
    ranks = int(comm.get("world_size") or 2)
    if shape.tp > 1 and ranks < 2:
        raise UsageError(
            "the --comm record was measured on one rank, where an all-reduce moves nothing: measure it with "
            "`llmb commbench --nproc-per-node 2` or more"
        )
    busbw = row["algbw_bytes_per_second"] * 2 * (ranks - 1) / ranks
    bandwidth = busbw * shape.tp / (2 * (shape.tp - 1)) if shape.tp > 1 else math.inf
    comm_bytes = 4 * b * layers * s * d * shape.bytes_per_element / shape.pp if shape.tp > 1 else 0
    beta_term = comm_bytes / bandwidth if shape.tp > 1 else 0.0
    warnings = []
    if shape.tp > 1 and ranks != shape.tp:
        warnings.append(
            f"the commbench ran on {ranks} ranks, the TP group has {shape.tp}: its bus bandwidth is carried over "
            f"as a ring's (algbw = busbw t / (2 (t - 1))), which holds only if the links are alike"
        )
    alpha_shape = _measured_shape(result)
    if result.get("official") is False:  # a record says; the hand-made dicts of tests do not
        warnings.append(
            f"alpha comes from a debug run ({'; '.join(result.get('debug_reasons') or ['not official'])}) measured at "
            f"{alpha_shape}: a small model's TFLOP/s rarely carries over to this one; use an official-shape run"
        )
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
        "alpha_measured_at": alpha_shape,
        "compute_multiply_adds": multiply_adds,
        "alpha_seconds_per_multiply_add": alpha,
        "alpha_term_seconds": alpha_term,
        "message_bytes": message_bytes,
        "bandwidth_message_bytes": row["bytes"],
        "commbench_algbw_bytes_per_second": row["algbw_bytes_per_second"],
        "commbench_busbw_bytes_per_second": busbw,
        "allreduce_algbw_bytes_per_second": bandwidth if shape.tp > 1 else None,
        "allreduce_ranks": ranks,
        "tp_group": shape.tp,
        "warnings": warnings,
        "comm_bytes": comm_bytes,
        "beta_term_seconds": beta_term,
        "step_seconds": step_seconds,
        "seed_fom": flops.fom(config, shape.global_batch, step_seconds),
        "devices": shape.tp * shape.pp * shape.dp,
    }


def shape_of(record: dict) -> Shape:
    """The shape, layout and activation bytes of a measured `llmb run` record."""
    config = record.get("config") or {}
    try:
        layout = record.get("layout") or {"tp": 1, "pp": 1, "dp": record.get("world_size", 1)}
        bytes_per_element = {"FP32": 4, "TF32": 4}.get(record["precision"]["effective"], 2)
        return Shape(
            layers=config["num_hidden_layers"],
            hidden=config["hidden_size"],
            ffn=config["intermediate_size"],
            seq=config["sequence_length"],
            global_batch=record["global_batch_size"],
            tp=layout["tp"],
            pp=layout["pp"],
            dp=layout["dp"],
            heads=config.get("num_attention_heads"),
            bytes_per_element=bytes_per_element,
        )
    except (KeyError, TypeError) as exc:
        raise UsageError(f"the --check file is not an llmb run result (missing {exc})") from None


def read_inputs(result_path: Path, comm_path: Path, check_path: Path | None) -> tuple[dict, dict, dict | None]:
    """The records a projection reads: a result, a commbench record and (--check) a measured run, each checked
    strictly against its schema, so a file that is not the record it should be is named with its bad field."""
    try:
        result, comm = load_result(result_path), load_result(comm_path)
        measured = load_result(check_path) if check_path else None
    except (OSError, ValueError) as exc:
        raise LlmbError(f"cannot read JSON: {exc}") from None
    checked = [(result_path, result, Result), (comm_path, comm, Commbench)]
    checked += [(check_path, measured, Result)] if measured is not None else []
    for path, data, kind in checked:
        try:
            kind.from_dict(data)
        except RecordError as exc:
            raise LlmbError(f"{path} is not an llmb {kind.__name__.lower()} record: {exc}") from None
    return result, comm, measured


def check_against(measured: dict, result: dict, comm: dict) -> dict:
    """A measured run next to the model's projection of it from a (one-process) result and a commbench record."""
    window_seconds, steps = measured["timing"]["window_seconds"], measured["steps"]
    if not positive(window_seconds) or not positive(steps):
        raise UsageError("the --check run has no measured step time (its window's seconds and steps must be > 0)")
    projection = project(shape_of(measured), result, comm)
    seconds = window_seconds / steps
    projection["measured_step_seconds"] = seconds
    projection["projection_error"] = (projection["step_seconds"] - seconds) / seconds
    return projection


def table(p: dict) -> Table:
    """Each term with its formula and numbers, then the step time and the FOM."""
    shape = p["shape"]
    s, d, layers, b = shape["seq"], shape["hidden"], shape["layers"], p["batch_per_replica"]
    tp, pp, nbytes = shape["tp"], shape["pp"], shape["bytes_per_element"]
    out = term.table(
        f"ALCF time-to-solution model: L={layers} d={d} s={s} B={shape['global_batch']} "
        f"TP={tp} PP={pp} DP={shape['dp']} ({p['devices']} devices)",
        show_header=False,
    )
    term.column(out, "what", style="bold")
    term.column(out, "value")
    if tp > 1:
        beta = (
            f"1 / {p['allreduce_algbw_bytes_per_second'] / 1e9:.4g} GB/s: algbw in the TP group of {tp} = busbw "
            f"{p['commbench_busbw_bytes_per_second'] / 1e9:.4g} GB/s x {tp} / (2 ({tp} - 1)); commbench at "
            f"{p['bandwidth_message_bytes']:,} B on {p['allreduce_ranks']} ranks (message s d x {nbytes} B = "
            f"{p['message_bytes']:,} B)"
        )
        beta_term = (
            f"{p['comm_bytes']:.6g} / {p['allreduce_algbw_bytes_per_second']:.6g} = {p['beta_term_seconds']:.6g} s"
        )
    else:
        beta, beta_term = "none: TP 1 has no TP all-reduce", "0 s"
    rows = [
        ("b (batch per replica)", f"global batch {shape['global_batch']} / DP {shape['dp']} = {b}"),
        (
            "alpha (per multiply-add, per device)",
            f"2 / {p['achieved_flops_per_device'] / 1e12:.4g} TFLOP/s (from --from, measured at "
            f"{p['alpha_measured_at']}): the formula counts multiply-adds, TFLOP/s count 2 FLOPs per multiply-add",
        ),
        ("compute b L (36 s d^2 + 6 s^2 d)", f"{p['compute_multiply_adds']:.6g} multiply-adds"),
        (
            "alpha-term",
            f"{p['compute_multiply_adds']:.6g} / ({pp} x {tp}) x {p['alpha_seconds_per_multiply_add']:.6g} s "
            f"= {p['alpha_term_seconds']:.6g} s",
        ),
        ("beta (TP all-reduce)", beta),
        ("communication 4 b L s d / PP", f"{p['comm_bytes']:.6g} B ({nbytes} B per element)"),
        ("beta-term", beta_term),
        ("projected step time T", f"{p['step_seconds']:.6g} s"),
        ("seed FOM (6 s d^2 + s^2 d) B L / T", f"{p['seed_fom']:.6g} (the seed's figure of merit, not a FLOP/s)"),
    ]
    if "measured_step_seconds" in p:
        rows.append(
            (
                "measured step time",
                f"{p['measured_step_seconds']:.6g} s; projection error {p['projection_error']:+.1%}",
            )
        )
    for row in rows:
        term.row(out, *row)
    return out
