"""Red team: the window's work done after the judge's clock stopped, before the seal.

The digests of what a window trained reach the judge in a second message, the seal, after its clock stopped
(docs/integrity.md, section 2). This plugin runs only the forwards inside the window (their losses are the ones
it answers with, computed without a graph), and every backward and AdamW update of the window in the moments
between the close and the seal: it hooks the optimizer instance's `state`, which the moment digest reads after the
clock (a route llmb.audit.guard.optimizer_problems now names too; the seal's time catches the class whatever the
route: a thread, a tensor subclass the digests read). Its digests are then exactly the honest window's, and in pure
BF16 (weights that barely move under lr 1e-5) its losses of unchanged weights stay inside the replay's tolerances:
the whole-window replay passes. Stage: run; reason: "judge: window 1's seal came ... after its clock stopped"
(llmb.judge.verdict.seal_problems)."""

from redteam_kit import install, reasons, run

# Enough work moved for the seal to pass its bound whatever the host's speed: the bound is 4 of the window's (forward
# only) steps plus 0.5 s of slack, and the work moved after the clock is every step's backward and update. At 8 steps
# of batch 1 an idle host did that work in 0.25 s, inside the slack; 16 steps of batch 8 took 1.27 s against a bound
# of 0.64 s (the 2-core host, idle).
STEPS = 16
BATCH = 8
WARMUP = 2  # redteam_kit.TINY's --warmup-steps
DEFERRED = f"""
import collections

import torch

_calls = [0]
_pending = []


def _process_model(model, optimizer, device, precision, settings):
    forward = model.forward

    def flush():
        # The window's backward passes and AdamW updates, in order: after the clock, before the digests.
        batches, _pending[:] = list(_pending), []
        hooks = optimizer._optimizer_step_post_hooks
        saved = dict(hooks)
        hooks.clear()  # the harness counts AdamW's steps: these are not its
        try:
            with torch.enable_grad():
                for batch in batches:
                    optimizer.zero_grad(set_to_none=True)
                    forward(batch, batch)[0].backward()
                    optimizer.step()
        finally:
            hooks.update(saved)

    class State(collections.defaultdict):
        def get(self, key, default=None):  # llmb.audit.evidence.moment_digest, after the clock
            if _pending:
                flush()
            return super().get(key, default)

    state = State(dict)
    state.update(optimizer.state)
    optimizer.state = state

    def forward_only(input_ids, labels=None):
        _calls[0] += labels is not None
        if labels is None or not {WARMUP} < _calls[0] <= {WARMUP + STEPS}:
            return forward(input_ids, labels)
        with torch.no_grad():
            loss, logits = forward(input_ids, labels)
        _pending.append(input_ids)
        return loss.detach().clone().requires_grad_(), logits

    model.forward = forward_only
    return model
"""


def test_backward_and_updates_moved_after_the_clock_make_the_seal_late(tmp_path):
    site = install(tmp_path / "site", "afterclock", DEFERRED)
    args = ["--plugin", "afterclock", "--precision", "BF16", "--steps", str(STEPS), "--batch-size", str(BATCH)]
    args += ["--replay-whole", "1"]
    proc, record = run(site, tmp_path, *args)
    assert record is not None, proc.stderr[-2000:]
    # The replay of the whole window does not see it: the digests are the honest window's.
    assert record["evidence"]["replay"]["passed"] is True, record["invalid_reasons"]
    assert reasons(record, "judge: window 1's seal came"), record["invalid_reasons"]
    seal = record["timing"]["seal_seconds"][0]
    assert seal > 2 * record["timing"]["window_seconds"] / STEPS, record["timing"]


def test_a_bundle_whose_late_seal_lost_its_reason_does_not_verify():
    """A forger who drops the judge's reason keeps a record whose own seal time breaks the bound: verify says so."""
    from llmb.verify.evidence_checks import evidence_problems

    losses = [10.33] * STEPS
    record = {
        "judge": {"clean_room": True},
        "repeats": 1,
        "steps": STEPS,
        "loss": {"first": losses[0], "last": losses[-1]},
        "timing": {"window_seconds": 0.6, "repeat_window_seconds": [0.6], "seal_seconds": [4.4]},
        "evidence": {
            "windows": [{"losses": losses, "clean_window_seconds": 0.6, "worker_window_seconds": 0.59}],
            "headline_window": 0,
            "replay": {"passed": True},
        },
    }
    allowed = 4 * 0.6 / STEPS + 0.5
    said = f"window 1: its seal came 4.400 s after its clock stopped (at most {allowed:.3f} s)"
    assert evidence_problems(record) == [said]
    record["timing"]["seal_seconds"] = [0.1]
    assert evidence_problems(record) == []
