"""Red team, classes 2-4 of the second round: work skipped on steps the replay of the first steps never sees.

From a chosen step of the window on, the plugin's forward skips the model: it returns a loss that trends down and
tiny non-zero gradients, so no window check sees an untrained step. The replay covers the first --replay-steps steps,
or, with probability --replay-whole drawn by the judge after the worker answered for every step, the whole window
(losses, parameter digest and AdamW's first moments). Stage: run; reason: "replay: ...". The guarantee is
probabilistic by design: a run whose draw is the prefix does not see it (shown with --replay-whole 0), and a bundle
of k runs sees it with probability 1 - (1 - q)^k (docs/integrity.md)."""

import pytest
from redteam_kit import install, reasons, run

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
    "precision, first, whole, caught",
    [
        # Class 2: from step 3 on, past the 2 steps replayed by default; the whole window sees it.
        ("FP32", 3, "1", "replay: step 3: recorded loss"),
        # The draw fell on the prefix: nothing replayed sees it (probability 1 - q per run).
        ("FP32", 3, "0", None),
        # Class 3: pure BF16 from step 2, where later losses are only bracketed: AdamW's moments see it.
        ("BF16", 2, "1", "replay: AdamW's first-moment digest"),
    ],
)
def test_skipped_work_on_any_step_is_at_risk_of_the_whole_window_replay(tmp_path, precision, first, whole, caught):
    site = install(tmp_path / "site", f"skip{precision.lower()}{whole}", attack(first))
    args = ["--plugin", f"skip{precision.lower()}{whole}", "--precision", precision, "--steps", "5"]
    proc, record = run(site, tmp_path, *args, "--replay-whole", whole)
    assert record is not None, proc.stderr[-2000:]
    replay = record["evidence"]["replay"]
    assert replay["drawn"]["whole"] is (whole == "1")
    if caught is None:
        assert replay["passed"] is True, replay
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
