"""The roofline: the dense matmul FLOP/s a device really achieves, measured at the model's own GEMM shapes.

A datasheet peak exists for few devices (no CPU has one), and even where it exists it is a ceiling no GEMM reaches.
This module measures the achievable rate through the plugin's device services, synchronised on the device at both
ends of every timed batch of matmuls, median of repeats. A run's efficiency against this measured peak sits next to
its datasheet MFU, so every device, the CPU included, gets an efficiency figure.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch

from llmb.api.backend import Backend, overridden
from llmb.api.errors import UsageError, describe
from llmb.audit import precision as precisions
from llmb.records import ROOFLINE_SCHEMA
from llmb.registry import plugins
from llmb.registry.plugins import call, resolve_settings, select_backend
from llmb.registry.state import with_state
from llmb.run.device import check_device_present, plugin_device
from llmb.run.plugin_returns import PluginReturns
from llmb.spec.shape import ModelConfig

SCHEMA = ROOFLINE_SCHEMA  # each roofline entry names its kind
# The dtype each benchmark precision multiplies in (TF32 is FP32 tensors with the TF32 switches on).
MATMUL_DTYPE = {"FP32": torch.float32, "TF32": torch.float32, "FP16": torch.float16, "BF16": torch.bfloat16}
# FP8 runs' GEMMs (torchao's float8 training): e4m3 operands through torch._scaled_mm, the rate an FP8 run's
# efficiency is measured against (a run's record only; `llmb peak` measures the four benchmark precisions).
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
RUN_MATMUL_DTYPE = {**MATMUL_DTYPE, "FP8": torch.float8_e4m3fn}
# The large square GEMM grows from MIN_SQUARE, doubling, until one matmul lasts SQUARE_SECONDS or it reaches
# MAX_SQUARE: 1024-2048 on a CPU core pair, 8192 on a datacenter GPU (1.1 TFLOP, ~1 ms), without asking what the
# device is.
MIN_SQUARE, MAX_SQUARE, SQUARE_SECONDS = 256, 8192, 0.05
# Each timed batch of matmuls lasts at least this long, so the host timer's resolution and the sync cost vanish.
MIN_BATCH_SECONDS = 0.02
MAX_ITERS = 1024


@dataclass(frozen=True)
class Gemm:
    """One GEMM: (m x k) @ (k x n), named by where the model runs it."""

    name: str
    m: int
    n: int
    k: int

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k


@dataclass
class GemmRate:
    gemm: Gemm
    iters: int
    seconds: list[float]  # per repeat, for `iters` matmuls
    flops_per_second: float  # from the median repeat

    def to_dict(self) -> dict:
        return {
            **asdict(self.gemm),
            "iters": self.iters,
            "seconds": self.seconds,
            "flops_per_second": self.flops_per_second,
        }


@dataclass
class Roofline:
    precision: str
    device: str
    device_name: str
    repeats: int
    rates: list[GemmRate] = field(default_factory=list)

    @property
    def peak_flops(self) -> float:
        """The best rate any measured GEMM reached: the achievable dense matmul peak."""
        return max(rate.flops_per_second for rate in self.rates)

    @property
    def model_gemm_flops(self) -> float | None:
        """The rate of the model's own GEMMs together (FLOP-weighted: their total FLOPs over their total time)."""
        own = [r for r in self.rates if r.gemm.name != "square"]
        if not own:
            return None
        return sum(r.gemm.flops for r in own) / sum(r.gemm.flops / r.flops_per_second for r in own)

    def to_dict(self) -> dict:
        return {
            "schema": SCHEMA,
            "precision": self.precision,
            "device": self.device,
            "device_name": self.device_name,
            "repeats": self.repeats,
            "method": "host-synchronised",
            "peak_flops": self.peak_flops,
            "model_gemm_flops": self.model_gemm_flops,
            "gemms": [rate.to_dict() for rate in self.rates],
        }


def model_gemms(config: ModelConfig, batch_size: int) -> list[Gemm]:
    """The forward GEMMs of one decoder layer and the LM head at this batch (the backward's are their transposes,
    with the same sizes), deduplicated by shape; attention's batched matmuls are SDPA's business, not listed."""
    tokens = batch_size * config.sequence_length
    d, f, vocab = config.hidden_size, config.intermediate_size, config.vocab_size
    width = config.num_attention_heads * config.head_dim
    candidates = [
        Gemm("q/k/v_proj", tokens, width, d),
        Gemm("o_proj", tokens, d, width),
        Gemm("gate/up_proj", tokens, f, d),
        Gemm("down_proj", tokens, d, f),
        Gemm("lm_head", tokens, vocab, d),
    ]
    seen, unique = set(), []
    for gemm in candidates:
        if (gemm.m, gemm.n, gemm.k) not in seen:
            seen.add((gemm.m, gemm.n, gemm.k))
            unique.append(gemm)
    return unique


def square_rate(
    backend: Backend, device: torch.device, dtype: torch.dtype, repeats: int, side: int | None = None
) -> GemmRate:
    """The large square GEMM's rate: of the given side, or of the side where one matmul lasts SQUARE_SECONDS on this
    device. There the search has already warmed the kernel and timed three single matmuls, each longer than
    MIN_BATCH_SECONDS (the batch `measure_gemm` would size), so they are the first of the repeats: the side found
    costs no second warmup and sizing: 1.0-1.4 s less per CPU run on 2 cores (benchmarks/roofline_cost.py)."""
    if not side:
        side = MIN_SQUARE
        while side < MAX_SQUARE:
            gemm = Gemm("square", side, side, side)
            a, b = _operands(gemm, dtype, device)  # random, as measured: some devices multiply ones faster
            _timed(backend, device, a, b, 1)  # compile / select the kernel first
            seconds = [_timed(backend, device, a, b, 1) for _ in range(3)]
            # The fastest of three: a size is chosen by what the device can do, not by a moment of contention.
            if min(seconds) >= SQUARE_SECONDS:
                seconds += [_timed(backend, device, a, b, 1) for _ in range(repeats - len(seconds))]
                return _rate(gemm, 1, seconds[:repeats])
            side *= 2
    return measure_gemm(backend, device, Gemm("square", side, side, side), dtype, repeats)


def _timed(backend: Backend, device: torch.device, a: torch.Tensor, b: torch.Tensor, iters: int) -> float:
    """Seconds for `iters` matmuls, the device synchronised before the clock starts and before it stops."""
    # A lazy device (XLA) runs each matmul at its step_end; elsewhere the call would be timed too, for nothing.
    step_end = with_state(backend.step_end) if "step_end" in overridden(backend) else None
    product = _product(a, b)
    backend.synchronize(device)
    start = time.perf_counter()
    for _ in range(iters):
        out = product()
        if step_end:
            step_end(device)
    del out
    backend.synchronize(device)
    return time.perf_counter() - start


def _product(a: torch.Tensor, b: torch.Tensor):
    """The GEMM as the run computes it: `a @ b`, or for float8 operands torch._scaled_mm (what torchao's float8
    Linear calls: per-tensor scales, a BF16 result)."""
    if a.dtype not in FP8_DTYPES:
        return lambda: a @ b
    scale = torch.ones((), device=a.device)
    return lambda: torch._scaled_mm(a, b, scale_a=scale, scale_b=scale, out_dtype=torch.bfloat16)


def float8_gemm_unavailable(device: torch.device) -> str | None:
    """Why torch._scaled_mm cannot run on this device with this torch (one line), or None when it runs."""
    try:
        a = torch.ones(16, 16, device=device).to(torch.float8_e4m3fn)
        _product(a, a.t())()
    except (RuntimeError, NotImplementedError) as exc:
        return describe(exc)
    return None


def _operands(gemm: Gemm, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(gemm.m, gemm.k, generator=generator).to(device, dtype)
    if dtype in FP8_DTYPES:
        # torch._scaled_mm takes its second operand column-major: the transpose of a row-major (n, k) matrix.
        return a, torch.randn(gemm.n, gemm.k, generator=generator).to(device, dtype).t()
    return a, torch.randn(gemm.k, gemm.n, generator=generator).to(device, dtype)


def measure_gemm(backend: Backend, device: torch.device, gemm: Gemm, dtype: torch.dtype, repeats: int) -> GemmRate:
    """Warm up, size the batch of matmuls to last MIN_BATCH_SECONDS, then time `repeats` batches; median rate."""
    a, b = _operands(gemm, dtype, device)
    _timed(backend, device, a, b, 2)  # first calls: kernel selection, lazy compilation, page faults
    iters = 1
    # timeit's autorange: grow the batch until it lasts MIN_BATCH_SECONDS (one slow sample only ends it sooner).
    while iters < MAX_ITERS and _timed(backend, device, a, b, iters) < MIN_BATCH_SECONDS:
        iters = min(MAX_ITERS, iters * 2)
    return _rate(gemm, iters, [_timed(backend, device, a, b, iters) for _ in range(repeats)])


def _rate(gemm: Gemm, iters: int, seconds: list[float]) -> GemmRate:
    """The rate of the median repeat (the lower of the middle two for an even count)."""
    return GemmRate(gemm, iters, seconds, gemm.flops * iters / statistics.median_low(seconds))


def measure(backend: Backend, device: torch.device, precision: str, gemms: list[Gemm], repeats: int = 5) -> Roofline:
    """The roofline for one precision in the backend state the caller set (a run's own, or `prepare_backend`)."""
    if precision not in RUN_MATMUL_DTYPE:
        raise ValueError(f"no matmul dtype for precision {precision!r}")
    name = PluginReturns(getattr(backend, "name", "?")).name("device_name", call(backend.device_name, device))
    result = Roofline(precision, str(device), name, repeats)
    for gemm in gemms:
        result.rates.append(measure_gemm(backend, device, gemm, RUN_MATMUL_DTYPE[precision], repeats))
    return result


def at_model_shapes(
    backend: Backend,
    device: torch.device,
    precision: str,
    config: ModelConfig,
    batch_size: int,
    repeats: int,
    square: int | None = None,
) -> Roofline:
    """The roofline at the model's GEMMs at this batch, then the large square GEMM (of side `square`, else searched)."""
    result = measure(backend, device, precision, model_gemms(config, batch_size), repeats)
    result.rates.append(square_rate(backend, device, RUN_MATMUL_DTYPE[precision], repeats, square))
    return result


def prepare_backend(backend: Backend, device: torch.device, precision: str, settings: dict) -> None:
    """The backend state a run at this precision gets: the harness's switches, then the backend's setup."""
    precisions.apply_backend_recipe(precision)
    plugins.setup(backend, device, precision, settings)


def efficiency(tflops: float, measured_peak_flops: float | None) -> float | None:
    """Achieved model FLOP/s as a fraction of the measured matmul peak; None when there is none."""
    if not measured_peak_flops:
        return None
    return tflops * 1e12 / measured_peak_flops


def peak(
    *,
    plugin: str | None,
    device: str | None,
    precisions_wanted: list[str],
    config: ModelConfig,
    batch_size: int,
    settings: dict[str, str],
    square: int | None = None,
    repeats: int = 5,
    measured: Callable[[Roofline, int], None] | None = None,
) -> list[Roofline]:
    """`llmb peak`: the roofline of each precision on the plugin's device, at the model's GEMMs and a square one.
    `measured(roofline, total)` is called as each precision's ends (a long command says what is left)."""
    selected = select_backend(plugin, device)
    backend = selected.backend
    resolved = resolve_settings(backend, settings)
    supported = list(call(backend.precisions))
    wanted = precisions_wanted or supported
    for name in wanted:
        if name not in MATMUL_DTYPE:
            raise UsageError(f"unknown precision {name!r} (choose from {', '.join(MATMUL_DTYPE)})")
        if name not in supported:
            raise UsageError(f"plugin {selected.name!r} does not support {name} (supports {', '.join(supported)})")
    if batch_size < 1 or repeats < 1 or (square is not None and square < 1):
        raise UsageError("--batch-size, --repeats and --square must be at least 1")
    torch_device = plugin_device(selected, device, plugin)
    results = []
    for name in wanted:
        prepare_backend(backend, torch_device, name, resolved)
        check_device_present(torch_device)
        results.append(at_model_shapes(backend, torch_device, name, config, batch_size, repeats, square))
        if measured is not None:
            measured(results[-1], len(wanted))
    return results


def device_for(plugin: str | None, device: str | None) -> torch.device:
    """The device `llmb peak` measures: the one given, else the plugin's first device type."""
    return plugin_device(select_backend(plugin, device), device, plugin)


def compile_seconds(warmup_step_seconds: list[float], steady_step_seconds: float) -> float:
    """What the warmup steps cost beyond steady-state steps: tracing, compilation, autotuning, first-touch."""
    return max(0.0, sum(warmup_step_seconds) - len(warmup_step_seconds) * steady_step_seconds)


def for_run(
    backend: Backend, device: torch.device, precision: str, config: ModelConfig, batch_size: int, repeats: int = 3
) -> Roofline | None:
    """The roofline of a finished run, in its own backend state, at its own GEMM shapes. An FP8 run's is float8
    GEMMs through torch._scaled_mm; None where the device has none (the reason is not a run's failure)."""
    if precision not in RUN_MATMUL_DTYPE:
        return None
    try:
        return at_model_shapes(backend, device, precision, config, batch_size, repeats)
    except (RuntimeError, NotImplementedError):
        if precision != "FP8":
            raise
        return None  # a device without float8 GEMM kernels (an older GPU): no FP8 peak to measure against
