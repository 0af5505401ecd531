"""Red team, classes 2-4 of the second round: work skipped on steps the replay of the first steps never sees.

From a chosen step of the window on, the plugin's forward skips the model: it returns a loss that trends down and
tiny non-zero gradients, so no window check sees an untrained step. The replay covers the first --replay-steps steps,
or, with probability --replay-whole drawn by the judge after the worker answered for every step, the whole window
(losses, parameter digest and AdamW's first moments); past the first steps, the replay goes on while its steps fit in
--replay-budget of the run's wall time. Stage: run; reason: "replay: ...". Beyond what the budget affords, the
guarantee is probabilistic by design: a run whose draw is the prefix, with no budget past it, does not see it (shown
with --replay-whole 0 --replay-budget 0), and a bundle of k runs sees it with probability 1 - (1 - q)^k
(docs/integrity.md)."""

import pytest
from redteam_kit import DIRECTIONS, assert_caught_by_directions, install, reasons, run

SKIP_FROM_STEP = """
import os

import torch

_calls = [0]
_rank = int(os.environ.get("RANK", "0"))
_last = [None, None]
_noise = {}


def _process_model(model, optimizer, device, precision, settings):
    forward = model.forward

    def skipping(input_ids, labels=None):
        _calls[0] += labels is not None  # training steps only (the audit's census forward has no labels)
        if _calls[0] < FIRST_SKIPPED or labels is None or _rank not in SKIPPING_RANKS:
            loss, logits = forward(input_ids, labels)
            if loss is not None:
                _last[0], _last[1] = float(loss.detach()), loss.dtype
            return loss, logits
        # No model: a trending loss and tiny gradients through every parameter (cheap, and never all-zero).
        fake = torch.zeros((), dtype=torch.float32)
        for name, p in model.named_parameters():
            noise = _noise.setdefault(name, torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))))
            fake = fake + (p.float() * noise).sum() * 1e-9
        _last[0] -= 1e-4
        fake = fake - fake.detach() + _last[0]
        return fake.to(_last[1]), None

    model.forward = skipping
    return model
"""
WARMUP = 2  # redteam_kit.TINY's --warmup-steps: the window's step k is the (WARMUP + k)-th training forward


def attack(first_window_step: int, ranks: tuple[int, ...] = (0,)) -> str:
    """Skip from the window's step `first_window_step` on, on the job's ranks `ranks` (one process: rank 0)."""
    return SKIP_FROM_STEP.replace("FIRST_SKIPPED", str(WARMUP + first_window_step)).replace(
        "SKIPPING_RANKS", repr(tuple(ranks))
    )


@pytest.mark.parametrize(
    "precision, first, whole, budget, caught",
    [
        # Class 2: from step 3 on, past the 2 steps replayed by default; the whole window sees it.
        ("FP32", 3, "1", "0", "replay: step 3: recorded loss"),
        # The draw fell on the prefix and the replay had no budget past it: nothing replayed sees it.
        ("FP32", 3, "0", "0", None),
        # The draw fell on the prefix, but the steps past it fit in the checks' share of the run's wall time (a tiny
        # window's do in half of it; a tenth, the default, is on the edge of a 5-step run on a loaded host: see
        # test_redteam_precision_in_step.py): the replay went on and saw step 3.
        ("FP32", 3, "0", "0.5", "replay: step 3: recorded loss"),
        # Class 3: pure BF16 from step 2, where later losses are only bracketed: AdamW's moments see it.
        ("BF16", 2, "1", "0", "replay: AdamW's first-moment digest"),
        # The same with the prefix drawn: the budget goes to the replay in BF16 itself, which a tiny window's whole
        # affords: its moments see it.
        ("BF16", 2, "0", "0.5", "replay: AdamW's first-moment digest"),
    ],
)
def test_skipped_work_on_any_step_is_at_risk_of_the_whole_window_replay(
    tmp_path, precision, first, whole, budget, caught
):
    name = f"skip{precision.lower()}{whole}{budget.replace('.', '')}"
    site = install(tmp_path / "site", name, attack(first))
    args = ["--plugin", name, "--precision", precision, "--steps", "5"]
    proc, record = run(site, tmp_path, *args, "--replay-whole", whole, "--replay-budget", budget)
    assert record is not None, proc.stderr[-2000:]
    replay = record["evidence"]["replay"]
    assert replay["drawn"]["whole"] is (whole == "1")
    if caught is None:
        assert replay["passed"] is True and replay["steps"] == 2, replay
        return
    assert replay["passed"] is False and reasons(record, caught), record["invalid_reasons"]


def test_one_rank_of_a_job_that_skips_work_is_at_risk_as_one_process_is(tmp_path):
    """Every rank at risk: in a 2-process DDP job only rank 1 skips from step 3 on. The judge replays the job's
    global batch (both ranks' sequences) in one process, so the job's mean loss of step 3 is off."""
    site = install(tmp_path / "site", "skiprank1", attack(3, ranks=(1,)))
    args = ["--plugin", "skiprank1", "--steps", "4", "--replay-whole", "1", "--nproc-per-node", "2"]
    proc, record = run(site, tmp_path, *args, "--dist-timeout", "120")
    assert record is not None, proc.stderr[-2000:]
    assert record["world_size"] == 2 and record["evidence"]["replay"]["drawn"]["whole"] is True
    assert reasons(record, "replay: step 3: recorded loss"), record["invalid_reasons"]
    assert not reasons(record, "replay: step 2:"), record["invalid_reasons"]  # the steps before were honest


# Other shapes of the same cheat. The last step of every window trains on a fake backward (its loss is real):
# only the window's digests can see it.
LAST_STEP_OF_EACH_WINDOW = """
import torch

_calls = [0]
_noise = {}


def _process_model(model, optimizer, device, precision, settings):
    forward = model.forward

    def last_step_cheap(input_ids, labels=None):
        _calls[0] += labels is not None
        loss, logits = forward(input_ids, labels)
        position = _calls[0] - WARMUP
        if labels is None or position < 1 or position % STEPS != 0:
            return loss, logits
        fake = torch.zeros((), dtype=torch.float32)
        for name, p in model.named_parameters():
            noise = _noise.setdefault(name, torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))))
            fake = fake + (p.float() * noise).sum() * 1e-9
        return (fake - fake.detach() + loss.detach().float()).to(loss.dtype), None

    model.forward = last_step_cheap
    return model
"""
# A random half of the steps from step 3 on skip the model (SKIP_FROM_STEP's fake loss and gradients).
RANDOM_HALF = SKIP_FROM_STEP.replace(
    "if _calls[0] < FIRST_SKIPPED or labels is None or _rank not in SKIPPING_RANKS:",
    "if _calls[0] < FIRST_SKIPPED or labels is None or _coin.random() < 0.5:",
).replace(
    # Seeded: steps 3 and 4 skipped, 5 and 6 run (Random(0) draws 0.84, 0.76, 0.42, 0.26). An unseeded coin skipped
    # none of the four steps once in 16 runs, and the test then failed an honest window.
    "import os\n",
    "import os\nimport random\n_coin = random.Random(0)\n",
)
# The first half of the layers never runs its backward: the hidden state is detached after it, with a tiny path
# kept to every weight so no gradient is all-zero.
HALF_THE_LAYERS_BACKWARD = """
import torch


def _process_model(model, optimizer, device, precision, settings):
    half = len(model.layers) // 2
    before = [*model.embed_tokens.parameters(), *model.layers[:half].parameters()]

    def cut(module, args, output):
        if not torch.is_grad_enabled():
            return output
        tiny = sum(p.float().sum() for p in before) * 1e-12
        return output.detach() + (tiny - tiny.detach()).to(output.dtype)

    model.layers[half - 1].register_forward_hook(cut)
    return model
"""
# The backward skipped from the window's second step on: each later step's gradients are the ones the first step
# computed (saved by tensor hooks), fed back through a linear stand-in, so every weight still gets its (stale) update.
STALE_GRADIENTS = """
_calls = [0]
_saved = {}


def _process_model(model, optimizer, device, precision, settings):
    forward = model.forward
    parameters = list(model.parameters())
    hooks = []

    def keep(p):
        return lambda g: _saved.__setitem__(id(p), g.detach().clone())

    def stale(input_ids, labels=None):
        _calls[0] += labels is not None
        loss, logits = forward(input_ids, labels)
        if labels is None or _calls[0] <= WARMUP + 1:
            if labels is not None and not hooks:
                hooks.extend(p.register_hook(keep(p)) for p in parameters)
            return loss, logits
        while hooks:
            hooks.pop().remove()
        fake = sum((p * _saved[id(p)].to(p.dtype)).sum() for p in parameters)
        return (fake - fake.detach() + loss.detach()).to(loss.dtype), None

    model.forward = stale
    return model
""".replace("WARMUP", str(WARMUP))
# SKIP_FROM_STEP on a model the plugin cast to BF16 under an FP32 request.
CAST_TO_BF16_FIRST = SKIP_FROM_STEP.replace("SKIPPING_RANKS", "(0,)").replace(
    "    forward = model.forward\n", "    model = model.to(torch.bfloat16)\n    forward = model.forward\n", 1
)
# Pure FP16 wants the fused AdamW (its per-tensor loops underflow g^2 in FP16: an honest run fails the replay too).
FUSED_ADAMW = """

def _optimizer_options(device, precision, settings):
    return {"fused": True}
"""


@pytest.mark.parametrize(
    "name, code, precision, steps, caught",
    [
        # Class 2: the last step of every window, backward skipped: the parameter digest's update and the moments.
        (
            "laststep",
            LAST_STEP_OF_EACH_WINDOW.replace("WARMUP", str(WARMUP)).replace("STEPS", "5"),
            "FP32",
            5,
            "replay: AdamW's first-moment digest",
        ),
        # Class 2: a random half of steps 3-6.
        (
            "randomhalf",
            RANDOM_HALF.replace("FIRST_SKIPPED", str(WARMUP + 3)).replace("SKIPPING_RANKS", "(0,)"),
            "FP32",
            6,
            "replay: AdamW's first-moment digest",
        ),
        # Class 3: pure FP16 (not BF16) that stops computing after step 1, its later losses inside the bracket.
        ("fp16stop", attack(2) + FUSED_ADAMW, "FP16", 5, "replay: AdamW's first-moment digest"),
        # Class 3 under an FP32 request: the plugin casts the model to BF16 (post-processing the rules allow, labelled
        # BF16) and stops computing after step 1. The replay knows pure BF16 weights by their dtypes, not by the
        # request, and replays the window in BF16 too (before, an FP32 request's update digest failed it, as it failed
        # the honest twin: tests/test_precision.py).
        (
            "fp32caststop",
            CAST_TO_BF16_FIRST.replace("FIRST_SKIPPED", str(WARMUP + 2)),
            "FP32",
            5,
            "replay: AdamW's first-moment digest after 5 steps: relative error",
        ),
        # Class 2: stale gradients from step 2 (the backward skipped, step 1's gradients reused): the moments. Under
        # pure 16-bit weights at the tiny shape, whose loss barely moves in a window, its moments stay within the
        # tolerance (docs/integrity.md): the losses of a window that trains catch it (pure FP16, 50 steps: step 34).
        ("stalefp32", STALE_GRADIENTS, "FP32", 5, "replay: AdamW's first-moment digest"),
        # Class 3: pure BF16 and pure FP16 that skip half the layers' backward from step 1.
        ("bf16halflayers", HALF_THE_LAYERS_BACKWARD, "BF16", 5, "replay: AdamW's first-moment digest"),
        ("fp16halflayers", HALF_THE_LAYERS_BACKWARD + FUSED_ADAMW, "FP16", 5, "replay: AdamW's first-moment digest"),
    ],
)
def test_other_shapes_of_skipped_work_fail_the_whole_window_replay(tmp_path, name, code, precision, steps, caught):
    """Each variant is caught by the whole-window replay (drawn with probability --replay-whole, here 1); the prefix
    replay of steps 1-2 sees none of them where their losses there are exact (FP32) or bracketed (pure 16-bit)."""
    site = install(tmp_path / "site", name, code)
    args = ["--plugin", name, "--precision", precision, "--steps", str(steps), "--replay-whole", "1"]
    proc, record = run(site, tmp_path, *args)
    assert record is not None, proc.stderr[-2000:]
    replay = record["evidence"]["replay"]
    assert replay["drawn"]["whole"] is True and replay["passed"] is False, replay
    assert reasons(record, caught), record["invalid_reasons"]
    if precision == "FP32" and "bfloat16" in record["precision"]["audit"]["parameter_dtypes"]:
        # Judged as the pure BF16 it ran: by the replay in BF16, not by an FP32 update digest its honest twin fails.
        assert all(r.endswith("against a BF16 replay)") for r in reasons(record, caught)), record["invalid_reasons"]


def test_stale_gradients_under_pure_bf16_fail_the_replay_where_the_window_trains(tmp_path):
    """Class 2 under pure BF16 weights: the backward skipped from step 2, step 1's gradients reused. At the tiny shape
    its window barely trains, step 1's gradients are nearly every step's, and it passes (docs/integrity.md); where the
    window trains it does not. The small preset: the moments' sums of squares part from the BF16 replay's by
    0.12-0.54 by the batch's draw over 20 steps (against 0.1: it passed on one CI run in about seven), their
    projection onto the judge's directions, drawn after the clock, by 0.34-0.60 over 20 steps and 0.191-0.207 over
    the 10 run here (3 draws), where an honest compiled window's parts by 0.006 (benchmarks/RESULTS.md sections 33,
    38). At the official width (2 layers, batch 1, 20 steps) the losses catch it too, from step 12 (0.0041 against
    0.003; 0.028 at step 20), and pure FP16 from step 4 (section 30)."""
    site = install(tmp_path / "site", "stalebf16", STALE_GRADIENTS)
    args = ["--plugin", "stalebf16", "--precision", "BF16", "--preset", "small", "--steps", "10", "--replay-whole", "1"]
    # Where the CPU has no BF16 instructions, each BF16 step with its backward takes ~20 s at this shape (an AVX2 EPYC
    # core pair), and the judge replays all of them: 708 s alone over 20 steps (872 s beside a second test worker),
    # 402 s over 10. Ten steps keep the directions at about twice their tolerance.
    proc, record = run(site, tmp_path, *args, timeout=2400)
    replay = assert_caught_by_directions(proc, record)
    window = record["evidence"]["windows"][replay["window"]]
    assert isinstance(window["seal_key"], int) and len(window["moments_projection"]) == len(window["moments_end"])


FIRST_BATCH_ONLY = """
_first = [None]


def _process_model(model, optimizer, device, precision, settings):
    forward = model.forward

    def first_batch_only(input_ids, labels=None):
        # Every training step on the first batch seen (the warmup's, known before any clock): the window's work could
        # have been done before the judge's clock started.
        if labels is None:
            return forward(input_ids, labels)
        if _first[0] is None:
            _first[0] = input_ids.clone()
        return forward(_first[0], _first[0])

    model.forward = first_batch_only
    return model
"""


def test_a_pure_bf16_window_trained_on_another_batch_fails_the_moments_directions(tmp_path):
    """Class 1 under pure BF16 weights: every window step trains on the warmup's batch, not the challenge's. At the
    untrained tiny model every batch's loss is near ln(vocab) (3.4e-4 from the replay's, inside 3e-3), and any batch
    of the same size fills the moments' sums of squares alike (0.046-0.079 against 0.1): it passed the whole-window
    replay (docs/integrity.md, residual risks, until 2026-11-27). The embedding's moments live on the rows of the
    tokens seen, so projected onto the judge's directions they part by 1.1-1.8 (benchmarks/RESULTS.md section 33)."""
    site = install(tmp_path / "site", "firstbatch", FIRST_BATCH_ONLY)
    args = ["--plugin", "firstbatch", "--precision", "BF16", "--batch-size", "4", "--steps", "5", "--replay-whole", "1"]
    assert_caught_by_directions(*run(site, tmp_path, *args))


@pytest.mark.parametrize("arm", ["stale", "compiled"])
def test_stale_gradients_under_amp_fail_the_autocast_replay_where_the_fp32_one_passes_them(tmp_path, arm):
    """Class 2 under AMP on the CPU (FP32 weights, BF16 autocast), at the tiny preset whose window barely trains:
    step 1's gradients reused for every later step keep the losses within BF16 amp's row and the moment digest within
    0.1 of the FP32 replay's (0.006-0.025 where honest AMP parts by 0.002-0.007). The judge's second replay, under
    autocast, measures what rounding alone moves the moments by; projected onto the judge's directions the stale ones
    part by 4.1-8.3 of that yardstick, the honest compiled twin by 0.32-0.65 (benchmarks/RESULTS.md section 34)."""
    site = install(tmp_path / "site", "staleamp", STALE_GRADIENTS)
    plugin = ["--plugin", "staleamp"] if arm == "stale" else ["--plugin", "cpu", "-O", "compile=default"]
    args = [*plugin, "--precision", "BF16", "--precision-mode", "amp", "--steps", "5", "--replay-whole", "1"]
    proc, record = run(site, tmp_path, *args)
    assert record is not None, proc.stderr[-2000:]
    replay = record["evidence"]["replay"]
    assert replay["drawn"]["whole"] is True and replay["same_precision"]["autocast"] == "bfloat16", replay
    checks = {c["name"]: c for c in replay["checks"]}
    assert checks["replay-moments"]["passed"], checks["replay-moments"]  # the FP32 replay alone passes both
    if arm == "compiled":
        failed = [check["detail"] for check in checks.values() if not check["passed"]]
        assert replay["passed"] and checks["autocast-moment-directions"]["passed"], failed or replay
        return
    caught = reasons(record, DIRECTIONS)
    assert caught and all(r.endswith("against a BF16 autocast replay)") for r in caught), record["invalid_reasons"]
