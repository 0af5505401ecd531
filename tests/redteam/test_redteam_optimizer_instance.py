"""Red team: the harness's AdamW changed on the instance, where the guard's watch of torch's classes cannot see it.

The plugin's `process_model` receives the optimizer the harness built and sets a `step` of its own on the instance,
which the loop then calls: it keeps AdamW's first moments (exp_avg, what the sealed moment digest holds) and skips
the second moments and the weights' update, then runs the instance's post-hooks so the harness counts a real step.
In pure BF16, whose weights barely move under lr 1e-5, nothing else saw it before: the parameters "changed" check
passes a 16-bit parameter whose AdamW state moved, and the whole-window replay passed (moments 7.8e-4 against 0.1,
parameters 6.5e-8 against 1e-3). Stage: run; reason: "optimizer: the optimizer instance replaces its class's step"
(llmb.audit.guard.optimizer_problems, after post-processing and again at the window's close). The same holds for a
`state` mapping replaced to run code when the digests read it, and for a step pre-hook of the instance."""

import pytest
from redteam_kit import install, reasons, run

MOMENTS_ONLY = """
import torch


def _process_model(model, optimizer, device, precision, settings):
    @torch.no_grad()
    def moments_only(*args, **kwargs):
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = optimizer.state[p]
                if "exp_avg" not in state:
                    state.update(step=torch.tensor(0.0), exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
                state["step"] += 1
                state["exp_avg"].lerp_(p.grad, 1 - group["betas"][0])
        for hook in list(optimizer._optimizer_step_post_hooks.values()):
            hook(optimizer, args, kwargs)

    optimizer.step = moments_only
    return model
"""
STATE_MAPPING = """
import collections


class _State(collections.defaultdict):
    def get(self, key, default=None):  # the moment digest reads AdamW's state through get(), after the clock
        return super().get(key, default)


def _process_model(model, optimizer, device, precision, settings):
    state = _State(dict)
    state.update(optimizer.state)
    optimizer.state = state
    return model
"""
PRE_HOOK_LATE = """
_calls = [0]


def _step_end(device):
    # After post-processing was judged: from the window on, AdamW sees half of each gradient.
    _calls[0] += 1
    if _calls[0] == 2:
        _OPTIMIZER[0].register_step_pre_hook(_halve)


def _halve(optimizer, args, kwargs):
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.grad is not None:
                p.grad.mul_(0.5)


_OPTIMIZER = [None]


def _process_model(model, optimizer, device, precision, settings):
    _OPTIMIZER[0] = optimizer
    return model
"""


@pytest.mark.parametrize(
    "name, code, precision, caught",
    [
        ("momentsonly", MOMENTS_ONLY, "BF16", "optimizer: the optimizer instance replaces its class's step"),
        ("statemapping", STATE_MAPPING, "FP32", "optimizer: the optimizer's state is a "),
        ("prehooklate", PRE_HOOK_LATE, "FP32", "window: the optimizer instance has step pre-hooks"),
    ],
)
def test_the_optimizer_changed_on_its_instance_is_invalid(tmp_path, name, code, precision, caught):
    site = install(tmp_path / "site", name, code)
    proc, record = run(site, tmp_path, "--plugin", name, "--precision", precision, "--replay-whole", "1")
    assert record is not None, proc.stderr[-2000:]
    assert reasons(record, caught), record["invalid_reasons"]
