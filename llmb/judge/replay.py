"""A measured window replayed from its seed and challenge, and the replay's checks against what the run answered.

The replay trains the same model from the same seed on the same batch in FP32 with torch's AdamW (no plugin; on
the run's own accelerator where torch drives it alone, else on the CPU: replay_device; its matmuls IEEE, or TF32 on a
CUDA device for a window whose matmuls ran BF16 or lower: reference_matmuls) and compares the first N
losses of a window with the conformance tolerances of the effective precision (llmb/conformance/check.py: the first loss
is a forward at the initial weights, the later ones follow the updates); when N covers the whole window it also
compares the digest's update. N = 2 is one forward, backward and AdamW step plus one forward: at the official shape
about 23 GB of memory (FP32 weights, gradients, two AdamW moments; the host's on the CPU, the device's on a GPU) and
8 x 1.43e9 x tokens FLOPs. N is the judge's draw (draw_replay_steps), and where it falls short of the window the
replay goes on past it while its steps fit in the judge's share of the run's wall time (replay's budget_seconds;
llmb.spec.vocab.DEFAULT_REPLAY_BUDGET), to the whole window where they do. The batch goes through the model in
micro-batches of REPLAY_MICRO_TOKENS
tokens with the gradients accumulated (each micro-batch's mean loss weighted by its share of the rows: every row
has the same number of targets, so the sum is the whole batch's mean), so the replay's activations, and its memory,
do not grow with the batch or the world size; only its time does.
"""

from __future__ import annotations

import contextlib
import gc
import secrets
import time

import torch

from llmb.audit.evidence import MODEL_SCOPE, as_list, digest, digest_scope, global_batch, moment_digest, moment_seal
from llmb.audit.precision import apply_backend_recipe
from llmb.judge.initial import InitialModels, synchronize
from llmb.judge.replay_checks import (  # noqa: F401  (the checks' names, importable from the replay as before)
    CPU_MOMENT_TOLERANCES,
    FP16_LOOP_HINT,
    MOMENT_TOLERANCES,
    ReplayCheck,
    Replayed,
    _flat,
    autocast_checks,
    compare,
    failed,
    moment_tolerance,
    relative_error,
    same_precision_checks,
)
from llmb.model import LlamaModel, ModelConfig
from llmb.spec.formats import DTYPE_NAME_FORMAT, RANK
from llmb.spec.tolerances import row_mode
from llmb.training.loop import build_optimizer

# Pure 16-bit runs: the parameters' dtype of the replay in the run's own format (same_precision_checks), and how many
# of the window's first steps are still replayed in FP32 beside it (the first loss is what says which precision ran).
SIXTEEN_BIT_DTYPES = {"BF16": torch.bfloat16, "FP16": torch.float16}
# Where an AMP window drawn whole is replayed a second time under autocast (autocast_checks): the CPU, whose yardstick
# was measured (llmb.spec.tolerances.AUTOCAST_DIRECTIONS_FACTORS).
AUTOCAST_YARDSTICK_DEVICE_TYPES = ("cpu",)
SIXTEEN_BIT_BY_NAME = {str(dtype).removeprefix("torch."): dtype for dtype in SIXTEEN_BIT_DTYPES.values()}  # the audit's
SAME_PRECISION_FP32_STEPS = 2
# Tokens per micro-batch of the replay (one whole sequence where a sequence is longer: one row at the official
# shape). What the replay holds beyond the model and AdamW is one micro-batch's activations, whatever the batch: at
# the official shape about 0.1 GB of FP32 logits and their gradients; the GEMMs stay 256 rows tall there, which the
# CPU runs at its matmul rate. Small enough that a debug shape's smallest batches fill one micro-batch too.
REPLAY_MICRO_TOKENS = 128
# Device types torch drives with no plugin's library. A run on one of them is replayed on its own accelerator, in
# FP32 with TF32 off, by the judging process, which imported no plugin (the threat model trusts the hardware and
# torch, not the plugin): at the official shape two FP32 steps at batch 64 take 7.6 s on an H100 against minutes on
# its host's CPU (issue 24), and host memory holds no copy of the model. Anywhere else (the CPU, a device only a
# plugin's library drives) and whenever the device refuses (absent, busy, out of memory), the CPU.
NATIVE_REPLAY_DEVICE_TYPES = ("cuda", "xpu", "mps")
# An accelerator's replay micro-batches: 2,048 tokens (8 sequences at the official shape, 0.26 GB of FP32 logits),
# rows enough for its GEMMs to run at rate, the same at any batch.
REPLAY_DEVICE_MICRO_TOKENS = 2048
# The reference's FP32 matmuls: IEEE, except on a CUDA device for a window whose matmuls ran BF16 or lower, where
# its GEMMs run TF32 on the tensor cores. There the reference need only be exact to a small part of the tolerance it
# holds the window to, and TF32's distance from IEEE FP32 is about a thirtieth of BF16's rows (one H100, official
# shape, 3 steps; llmb/spec/tolerances.py): first loss 3.5e-5 against BF16 amp's 1e-3, later losses 9e-5 against
# 1e-2, AdamW's moments 0.003 against 0.1 (RESULTS.md section 15). An FP32, TF32 or FP16 window keeps IEEE: TF32 is
# what an FP32 window's replay must tell apart, and FP16 amp's first-loss row (1e-4) is only three times TF32's
# distance. IEEE FP32 runs on the CUDA cores at about an eighth of TF32's rate, so the two steps of the IEEE prefix
# took 4.5 s of a 20-step AMP run's 57.8 s at batch 64 on an H200, as long as 17 of that run's steps, and grew with
# the batch (issue 24).
TF32_REFERENCE_DEVICE_TYPES = ("cuda",)
TF32_REFERENCE_BELOW = "FP16"  # formats ranked below this one (BF16, FP8) take the TF32 reference
# The lowest format whose compute over FP32 weights the FP32 reference follows over a window (below_weights_format).
FP32_REFERENCE_TRACKS_DOWN_TO = "BF16"


def _peak_rss() -> int | None:
    """This process's peak resident memory (VmHWM: unlike getrusage's ru_maxrss, not inherited from the parent)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def replay_device(spec: str | None) -> torch.device:
    """Where the judge replays a run made on `spec` (a torch device string, e.g. "cuda:0"): that device where its
    type is one torch drives alone (NATIVE_REPLAY_DEVICE_TYPES) and this process sees it, else the CPU."""
    cpu = torch.device("cpu")
    try:
        device = torch.device(spec or "cpu")
    except (RuntimeError, ValueError, TypeError):
        return cpu
    if device.type not in NATIVE_REPLAY_DEVICE_TYPES:
        return cpu
    try:
        module = getattr(torch, device.type, None)
        return device if module is not None and module.is_available() else cpu
    except Exception:  # a driver that fails to answer is no device to replay on
        return cpu


def replay(
    config: ModelConfig,
    seed: int,
    batch_size: int,
    world_size: int,
    challenge: int,
    losses: int,
    window_steps: int,
    device: torch.device | None = None,
    dtype: torch.dtype = torch.float32,
    optimizer_options: dict | None = None,
    initial: InitialModels | None = None,
    keep_initial: bool = False,
    budget_seconds: float | None = None,
    matmuls: str = "FP32",
    seal_key: int | None = None,
    autocast: torch.dtype | None = None,
) -> Replayed:
    """Replay the first `losses` steps of a window in FP32 (on the CPU unless `device` is given: replay_device);
    the whole window (and its digest) when `losses` reaches `window_steps`. No plugin is involved: torch's own
    kernels and torch.optim.AdamW, the implementation `optimizer_options` names (the run's: torch's fused kernel or
    the per-tensor loop; default per-tensor). `dtype` float16 or bfloat16 replays a pure 16-bit run in its own
    precision (same_precision_checks), since a pure 16-bit run keeps only part of AdamW's updates and leaves the FP32
    trajectory within a few steps.
    `budget_seconds`: beyond those `losses` steps, the replay goes on step by step while the whole replay (the
    device's bring-up, the model's copy and every step so far) and two more steps fit in this many seconds
    (affordable, from the steps it has timed), up to the whole window. `initial`: the judge's
    prebuilt initial models (llmb.judge.initial), a copy of which is taken where `keep_initial` (another replay takes
    it after this one). `matmuls`: the FP32 matmuls' format on an accelerator, "FP32" (IEEE) or "TF32"
    (reference_matmuls); the CPU's are IEEE. `seal_key`: the window's, for AdamW's moments projected onto its
    directions after a whole window (moment_seal). `autocast`: FP32 weights trained under torch.autocast of this
    16-bit dtype, as the harness runs AMP (FP16's losses scaled by torch's GradScaler): the yardstick of an AMP
    window's moments (autocast_checks)."""
    device = device or torch.device("cpu")
    start = time.perf_counter()
    with _reference(device, matmuls) as ran:
        initialised = _initialise(device, start)
        floor = min(losses, window_steps)
        # The run's own initial weights, built on the CPU from the seed as the run does: while the worker set itself
        # up where the judge could (llmb.judge.initial), else here.
        model, prebuilt, placement = (initial or InitialModels()).model(config, seed, device, dtype, keep_initial)
        built = _synchronized_seconds(device, start) - initialised
        batch = global_batch(config, batch_size, challenge, world_size).to(device)
        rows = micro_rows(config, REPLAY_MICRO_TOKENS if device.type == "cpu" else REPLAY_DEVICE_MICRO_TOKENS)
        initial_digest = digest(model.parameters())
        # The run's implementation where the judge names it (replay_record); else per-tensor updates, which keep the
        # replay's peak memory low (foreach's lists hold a second copy of the moments' size).
        optimizer = build_optimizer(model, optimizer_options or {"foreach": False})
        scaler = torch.amp.GradScaler(device.type) if autocast == torch.float16 else None  # as the harness's loop
        recorded: list[float] = []
        timed: list[float] = []  # seconds of each whole step (forward, backward, AdamW)
        for step in range(1, window_steps + 1):
            # A step is trained (backward and AdamW) when another follows it, and the window's last is, for the
            # digest; the last replayed step of a shorter replay needs only its loss.
            spent = time.perf_counter() - start
            goes_on = step < floor or (step < window_steps and affordable(budget_seconds, spent, timed))
            trained = goes_on or step == window_steps
            began = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            if trained:
                recorded.append(accumulated_loss(model, batch, backward=True, rows=rows, autocast=autocast,
                                                 scaler=scaler))  # fmt: skip
                if scaler is not None:
                    scaler.step(optimizer)
                    scaler.update()
                else:
                    optimizer.step()
            else:
                with torch.no_grad():
                    recorded.append(accumulated_loss(model, batch, backward=False, rows=rows, autocast=autocast))
            seconds = time.perf_counter() - began  # the loss came to the host as a float: the device has finished
            if trained:
                timed.append(seconds)
            if not goes_on:
                break
        whole = len(recorded) == window_steps
        end = as_list(digest(model.parameters())) if whole else None
        moments = projection = None
        if whole and seal_key is not None:  # as the worker sealed them (moment_seal)
            moments, projection = (as_list(t) for t in moment_seal(list(model.parameters()), optimizer, seal_key))
        elif whole:  # a record made before the judge handed over a key
            moments = as_list(moment_digest(list(model.parameters()), optimizer))
        seconds = time.perf_counter() - start
        return Replayed(recorded, as_list(initial_digest), end, seconds, _peak_rss(), moments, str(device), built,
                        prebuilt, initialised, ran, placement, projection)  # fmt: skip


@contextlib.contextmanager
def _reference(device: torch.device, matmuls: str):
    """The reference's matmul switches on an accelerator for the replay's while, then IEEE again for whatever the
    judge's process replays next; on the CPU, IEEE as the process has them. Yields the format its matmuls run in."""
    if device.type == "cpu":
        yield "FP32"
        return
    apply_backend_recipe(matmuls)
    try:
        yield matmuls
    finally:
        apply_backend_recipe("FP32")


def _initialise(device: torch.device, since: float) -> float:
    """Seconds to bring up an accelerator in this process (its driver context and torch's state on it), apart from
    the model's copy: the replay's record says both. Nothing to bring up on the CPU."""
    if device.type == "cpu":
        return 0.0
    torch.empty(0, device=device)
    return _synchronized_seconds(device, since)


def affordable(budget: float | None, spent: float, timed: list[float]) -> bool:
    """Whether the replay, at a step from its floor on, may train it and go on to the next within `budget` seconds
    for the whole replay (`spent` so far: the device's bring-up, the model's copy, its steps): two more steps at the
    fastest whole step timed (`timed`). Without a budget left or a step timed, never."""
    if budget is None or budget <= 0 or not timed:
        return False
    return spent + 2 * min(timed) <= budget


def _synchronized_seconds(device: torch.device, since: float) -> float:
    """Seconds since `since`, once the device has finished what it was given (the model's copy to it)."""
    synchronize(device)
    return time.perf_counter() - since


def micro_rows(config: ModelConfig, tokens: int = REPLAY_MICRO_TOKENS) -> int:
    """Rows per replay micro-batch: `tokens` tokens, at least one sequence."""
    return max(1, tokens // config.sequence_length)


def accumulated_loss(
    model: LlamaModel,
    batch: torch.Tensor,
    backward: bool,
    rows: int | None = None,
    autocast: torch.dtype | None = None,
    scaler: torch.amp.GradScaler | None = None,
) -> float:
    """The whole batch's mean loss, computed micro-batch by micro-batch (`rows` each, default micro_rows); with
    `backward`, the whole batch's gradients accumulated in the parameters' .grad (equal to one backward of the whole
    batch up to FP32 rounding: losses within 1e-6 relative, tests/test_fidelity.py). `autocast`: each forward under
    torch.autocast of that dtype; `scaler`: the backward of the loss it scales."""
    total = 0.0  # a Python float: the weighted sum in float64
    for micro in batch.split(rows or micro_rows(model.config)):
        # the logits dropped before the backward (llmb.training.loop.Trainer.loss_of)
        amp = torch.autocast(batch.device.type, dtype=autocast) if autocast is not None else contextlib.nullcontext()
        with amp:
            loss = model(micro, labels=micro)[0]
        weighted = loss * (micro.shape[0] / batch.shape[0])
        if backward:
            (scaler.scale(weighted) if scaler is not None else weighted).backward()
        total += float(weighted.detach())
        del loss, weighted  # the micro-batch's graph goes before the next one is built
    return total


def draw_replay_steps(floor: int, window_steps: int, whole_probability: float) -> tuple[int, bool]:
    """How many steps of the window the judge replays, drawn after the worker committed to all of them: the whole
    window (losses, digest and AdamW's moments) with probability `whole_probability`, else the first `floor`."""
    if floor <= 0:
        return 0, False

    whole = floor >= window_steps or secrets.randbelow(1_000_000) < round(whole_probability * 1_000_000)
    return (window_steps if whole else floor), whole


def replay_record(
    record: dict,
    steps: int,
    window: int | None = None,
    device: str | None = None,
    initial: InitialModels | None = None,
    budget_seconds: float | None = None,
) -> dict:
    """Replay one window of a result record (default: the headline's) and return the replay's record. `device`:
    where to try it first (replay_device: the judge passes the run's own device, a reviewer may pass theirs); a
    device that fails it (out of memory beside the worker, say) leaves the replay to the CPU, which is said.
    `initial`: the judge's prebuilt initial models (llmb.judge.initial); kept after the replay where it ran on an
    accelerator (the host holds only that copy, and a sweep's next run takes it), the CPU's replay takes it.
    `budget_seconds`: past the first `steps`, the replay goes on while its further steps fit in this many seconds
    (replay(); the judge's share of the run's wall time, REPLAY_BUDGET), to the whole window where they do. In pure
    FP16/BF16, whose later losses the FP32 replay only brackets, that is the replay in the run's own format, which
    then replays at least SAME_PRECISION_FP32_STEPS steps."""
    evidence = record.get("evidence") or {}
    windows = evidence.get("windows") or []
    index = evidence.get("headline_window", 0) if window is None else window
    if not windows or not 0 <= index < len(windows):
        return {
            "passed": False,
            "checks": [
                {
                    "name": "replay",
                    "passed": False,
                    "detail": "no evidence to replay",
                    "measured": None,
                    "tolerance": None,
                }
            ],
        }
    config = ModelConfig(**record["config"])
    chosen = windows[index]
    # The data-parallel ranks each drew `rows` sequences (tensor and pipeline peers share theirs).
    data_ranks = int((record.get("layout") or {}).get("dp", record.get("world_size", 1)))
    rows = int(record.get("global_batch_size", record["batch_size"] * data_ranks)) // data_ranks
    arguments = dict(
        config=config,
        seed=int(record["seed"]),
        batch_size=rows,
        world_size=data_ranks,
        challenge=int(chosen["challenge"]),
        seal_key=_key(chosen.get("seal_key")),
        losses=steps,
        window_steps=int(record["steps"]),
    )
    precision = record["precision"]
    fp32_master, sixteen = weights_format(precision)
    fused = bool(((record.get("optimizer") or {}).get("defaults") or {}).get("fused"))
    scope = digest_scope(record.get("layout") or {})  # the layout's, not the window's (compare)
    device_type = str((record.get("device") or {}).get("type") or "")
    effective, mode = precision["effective"], precision["mode"]
    same = None  # the replay in a pure 16-bit window's own format, where it has one (twice, below)
    target, fallbacks = replay_device(device), []
    # The FP32 replay's matmuls (reference_matmuls); the replay in a pure window's own format has no FP32 matmuls.
    arguments["matmuls"] = reference_matmuls(effective, target)
    # Both replays step torch's AdamW as the run did, its fused kernel or the per-tensor loop (whose memory the
    # foreach lists would double): an eager run then replays bit for bit (tiny preset, CPU: AdamW's moments 0 apart,
    # where a fused run against the per-tensor replay was 3.5e-8 to 1.3e-7), and the fused kernel's one pass over
    # each tensor made a small-preset replay step about a quarter faster (benchmarks/RESULTS.md section 26).
    arguments["optimizer_options"] = {"fused": True} if fused else {"foreach": False}
    unreplayed = below_weights_format(effective, sixteen)
    # A pure 16-bit window is judged twice: its first losses against FP32 (what precision ran), and the whole window
    # (or as much of it as the budget affords) against a replay in its own precision (that the work was done), which
    # it tracks where FP32 does not. Without a replay in the run's own format (`unreplayed`: FP8, or compute below
    # pure 16-bit weights) the FP32 one parts from its later steps: the first losses against FP32 alone.
    twice = not unreplayed and sixteen is not None and (steps >= arguments["window_steps"] or bool(budget_seconds))
    if unreplayed or twice:
        arguments["losses"] = min(SAME_PRECISION_FP32_STEPS, steps)
    # An AMP window made on the CPU and drawn whole is replayed once more, under autocast (autocast_checks).
    autocast = autocast_yardstick(effective, mode, fp32_master, device_type, target)
    drawn_whole = steps >= arguments["window_steps"] and arguments["seal_key"] is not None and scope == MODEL_SCOPE
    autocast = autocast if drawn_whole else None  # a part of the model (tensor, pipeline) has no whole moments
    # The FP32 replay first; the budget bounds the whole of the judge's replaying, so a replay in the window's own
    # format gets what the FP32 one left of it.
    keep = twice or autocast is not None or target.type != "cpu"
    replayed = _replay_on(target, fallbacks, **arguments, initial=initial, keep_initial=keep,
                          budget_seconds=None if unreplayed or twice else budget_seconds)  # fmt: skip
    if twice:
        depth = max(steps, SAME_PRECISION_FP32_STEPS)
        left = budget_seconds - replayed.seconds if budget_seconds else None
        same = _replay_on(target, fallbacks, **{**arguments, "losses": depth, "matmuls": "FP32"}, dtype=sixteen,
                          initial=initial, keep_initial=target.type != "cpu", budget_seconds=left)  # fmt: skip
    if autocast is not None and replayed.moments_projection is not None:
        same = replay(**arguments, autocast=autocast, initial=initial, keep_initial=False)
    checks = compare(chosen, replayed, effective, mode, fp32_master, fused, scope, device_type)
    if same is not None and autocast is not None:
        checks += autocast_checks(chosen, same, replayed, effective, scope)
    elif same is not None:
        checks += same_precision_checks(chosen, same, effective, mode, scope, fused)
    ran = [r for r in (replayed, same) if r is not None]
    rss = [r.peak_rss_bytes for r in ran if r.peak_rss_bytes is not None]
    same_format = {"autocast": str(autocast).removeprefix("torch.")} if autocast is not None else {}
    same_precision = (
        {"same_precision": {"dtype": str(sixteen or torch.float32).removeprefix("torch."), **same_format,
                            "seconds": same.seconds, "steps": len(same.losses)}}
        if same is not None
        else {}
    )  # fmt: skip
    return {
        "window": index,
        "steps": max(len(r.losses) for r in ran),
        "moments_compared": any(bool(r.moments_end) for r in ran),
        "whole_window": any(r.digest_end is not None for r in ran),
        **same_precision,
        **({"unreplayed": unreplayed} if unreplayed else {}),
        **({"budget_seconds": budget_seconds} if budget_seconds else {}),
        "passed": all(c.passed for c in checks),
        "seconds": sum(r.seconds for r in ran),
        "device_init_seconds": sum(r.device_init_seconds for r in ran),
        "build_seconds": sum(r.build_seconds or 0.0 for r in ran),
        "matmuls": replayed.matmuls,  # what ran: IEEE where the device fell back to the CPU
        **next(({"initial_model": r.prebuilt.to_dict()} for r in ran if r.prebuilt is not None), {}),
        **({"optimizer_warmup": warmed.to_dict()} if initial is not None and (warmed := initial.warmed()) else {}),
        **({"placements": placements} if (placements := [r.placement.to_dict() for r in ran if r.placement]) else {}),
        "peak_rss_bytes": max(rss) if rss else None,
        "device": replayed.device,
        **({"device_fallback": "; ".join(fallbacks)} if fallbacks else {}),
        "checks": [c.to_dict() for c in checks],
    }


def _key(value) -> int | None:
    """A window's seal key as the record holds it (None in records written before the judge handed one over)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def autocast_yardstick(
    effective: str, mode: str, fp32_master: bool, device_type: str, target: torch.device
) -> torch.dtype | None:
    """The autocast dtype of the judge's second replay of an AMP window (16-bit compute over FP32 weights, the amp
    row) made and replayed on the CPU (AUTOCAST_YARDSTICK_DEVICE_TYPES); None for any other window. Other devices'
    AMP windows keep the FP32 replay's checks alone until a GPU has measured the yardstick there."""
    if row_mode(effective, mode, fp32_master) != "amp" or effective not in SIXTEEN_BIT_DTYPES:
        return None
    if device_type not in AUTOCAST_YARDSTICK_DEVICE_TYPES or target.type != device_type:
        return None
    return SIXTEEN_BIT_DTYPES[effective]


def reference_matmuls(effective: str, target: torch.device) -> str:
    """The format of the FP32 replay's matmuls for a window whose matmuls ran `effective`, replayed on `target`:
    "TF32" on a CUDA device where `effective` ranks below FP16 (BF16, FP8), else "FP32", IEEE (TF32_REFERENCE_BELOW)."""
    below = RANK.get(effective, RANK["FP32"]) > RANK[TF32_REFERENCE_BELOW]
    return "TF32" if below and target.type in TF32_REFERENCE_DEVICE_TYPES else "FP32"


def below_weights_format(effective: str, sixteen: torch.dtype | None) -> str | None:
    """Why a pure 16-bit window has no replay in its own format, or None where it has one: its matmuls ran below the
    weights' format (FP8 over BF16 weights), which torch's own kernels do not train, and a replay in the weights' format
    is not that run's (an honest FP8 run leaves a BF16 replay within a few steps: one H200, official shape, batch 8,
    losses 0.3% apart at step 3 and 13% at step 20, AdamW's moments 0.17-0.29 against BF16's 0.1; RESULTS.md section
    25). FP8 is no benchmark precision: its record is never valid, and the judge checks only what it can. A format
    the audit ranks at or above the weights' (llmb.spec.formats.RANK) keeps the replay in the weights' format.
    FP8 matmuls over FP32 weights (`sixteen` None) are not replayed past those first losses either: the FP32
    reference tracks 16-bit compute within the drift its rows allow (llmb.spec.tolerances.REPLAY_TOLERANCES), but an
    honest FP8 run parted from it by 1.7% at step 2 (one H100, official shape, batch 8), as far as BF16 AMP's after
    4 nats of fall, and FP8 has no row measured beyond step 3."""
    if sixteen is None:
        if RANK.get(effective, RANK["FP32"]) <= RANK[FP32_REFERENCE_TRACKS_DOWN_TO]:
            return None
        return (
            f"steps past the first {SAME_PRECISION_FP32_STEPS}: {effective} matmuls over float32 weights have no "
            f"replay in their own format (torch's own kernels), and the FP32 replay parts from them within a few steps"
        )
    weights = str(sixteen).removeprefix("torch.")
    if RANK.get(effective, RANK["FP32"]) <= RANK[DTYPE_NAME_FORMAT[weights]]:  # the weights' format or above
        return None
    return (
        f"steps past the first {SAME_PRECISION_FP32_STEPS}: {effective} matmuls over {weights} weights have no replay "
        f"in their own format (torch's own kernels), and a {weights} replay parts from them within a few steps"
    )


def weights_format(precision: dict) -> tuple[bool, torch.dtype | None]:
    """(whether the weights were FP32, the 16-bit dtype of pure 16-bit weights or None), from the parameters' dtypes
    the precision audit saw, as check-plugin judges them (what ran, not the recipe): an FP32 request whose plugin cast
    the model to BF16 (post-processing the rules allow) trained pure BF16 weights, and is replayed as a pure BF16
    request is, in its own format too; one whose matmuls ran BF16 over FP32 weights is held to the amp row. Mixed
    dtypes, or a record without the audit, keep the recipe's word (the request and its mode). A worker that misstates
    its dtypes gains nothing: either way the window is held to a replay of the format it names, which the other
    format's trajectory does not follow, and skipped work moves AdamW's moments in both."""
    audit = precision.get("audit")
    counts = audit.get("parameter_dtypes") if isinstance(audit, dict) else None
    dtypes = set(counts) if isinstance(counts, dict) else set()
    if dtypes == {"float32"}:
        return True, None
    if len(dtypes) == 1 and (only := next(iter(dtypes))) in SIXTEEN_BIT_BY_NAME:
        return False, SIXTEEN_BIT_BY_NAME[only]
    pure = SIXTEEN_BIT_DTYPES.get(precision["requested"]) if precision["mode"] == "pure" else None
    return precision["mode"] == "amp" or precision["requested"] in ("FP32", "TF32"), pure


def _replay_on(target: torch.device, fallbacks: list[str], **arguments) -> Replayed:
    """replay() on `target`, or on the CPU where the device fails it (said in `fallbacks`)."""
    try:
        return replay(**arguments, device=target)
    except (RuntimeError, MemoryError) as exc:  # torch.OutOfMemoryError is a RuntimeError
        if target.type == "cpu":
            raise
        fallbacks.append(f"{target} failed the replay ({type(exc).__name__}); replayed on the CPU")
        _release(target)
        return replay(**arguments)


def _release(device: torch.device) -> None:
    """Give back what a failed replay held on an accelerator before the CPU tries."""
    gc.collect()
    module = getattr(torch, device.type, None)
    if module is not None and hasattr(module, "empty_cache"):
        module.empty_cache()
