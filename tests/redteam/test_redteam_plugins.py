"""The red team: adversarial plugin packages, each caught by a named stage for a named reason.

Every attack below is a real package (tests/redteam/redteam_kit.py builds and pip-installs it alone) and is run the
way a cheating vendor would ship it. Each test asserts the stage that catches it (`llmb run`'s invalid reasons or
its precision label, `llmb check-plugin`'s failed checks) and the reason that stage gives. The fast layer covers
each class of attack once; the rest are marked slow (each is an `llmb run` subprocess of ~10-40 s here).

Classes (issue 19): global monkeypatching at import; late changes; what the audit cannot see; declared peaks;
the attacks caught before this suite (dropped layer, scaled logits, SGD swap, frozen parameters). Bundle forgeries
are in test_redteam_bundles.py.
"""

from __future__ import annotations

import pytest
from redteam_kit import Attack, check_attack, run_attack

pytest.importorskip("hatchling", reason="building a plugin package offline needs hatchling (the test extra)")

slow = pytest.mark.slow

# Global monkeypatching at import: the plugin patches torch or llmb on the class or module, not the instance.
LINEAR_BF16 = Attack(
    "linear_bf16",
    """
    import torch
    import torch.nn.functional as F

    def _forward(self, x):
        bias = self.bias.bfloat16() if self.bias is not None else None
        return F.linear(x.bfloat16(), self.weight.bfloat16(), bias).to(x.dtype)

    torch.nn.Linear.forward = _forward
    """,
)
SKIP_LAYERS = Attack(
    "skip_layers",
    """
    import llmb.model

    _original = llmb.model.LlamaModel.forward

    def _forward(self, input_ids, labels=None):
        kept = self.layers[::2]
        everything, self.layers = self.layers, kept
        try:
            return _original(self, input_ids, labels)
        finally:
            self.layers = everything

    llmb.model.LlamaModel.forward = _forward
    """,
)
SDPA_BLOCK_LOCAL = Attack(
    "sdpa_block_local",
    """
    import torch
    import torch.nn.functional as F

    _sdpa = F.scaled_dot_product_attention

    def _block_local(q, k, v, is_causal=False, **kwargs):
        block = max(1, q.shape[-2] // 4)
        outs = [
            _sdpa(q[..., i : i + block, :], k[..., i : i + block, :], v[..., i : i + block, :], is_causal=is_causal)
            for i in range(0, q.shape[-2], block)
        ]
        return torch.cat(outs, dim=-2)

    F.scaled_dot_product_attention = _block_local
    """,
)
ADAMW_STEP_SGD = Attack(
    "adamw_step_sgd",
    """
    import torch

    @torch.no_grad()
    def _sgd_step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.add_(p.grad, alpha=-group["lr"])

    torch.optim.AdamW.step = _sgd_step
    """,
)
ADAMW_IS_SGD = Attack(
    "adamw_is_sgd",
    """
    import torch

    class AdamW(torch.optim.SGD):
        def __init__(self, params, lr=1e-3, betas=None, eps=None, weight_decay=0.0, **options):
            super().__init__(params, lr=lr, weight_decay=weight_decay)

    AdamW.__module__ = "torch.optim.adamw"
    AdamW.__qualname__ = "AdamW"
    torch.optim.AdamW = AdamW
    """,
)
ADAMW_HALF_STEPS = Attack(
    "adamw_half_steps",
    """
    import torch

    _step = torch.optim.AdamW.step
    _calls = [0]

    def _every_second(self, *args, **kwargs):
        _calls[0] += 1
        if _calls[0] % 2 == 0:
            return None
        return _step(self, *args, **kwargs)

    torch.optim.AdamW.step = _every_second
    """,
)
GLOBAL_PRE_HOOK = Attack(
    "global_pre_hook",
    """
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    def _drop_gradients(optimizer, args, kwargs):
        for group in optimizer.param_groups:
            for p in group["params"][::2]:
                p.grad = None

    register_optimizer_step_pre_hook(_drop_gradients)
    """,
)
HYPERPARAMETER_LR = Attack(
    "hyperparameter_lr",
    """
    import llmb.training.loop

    try:
        llmb.training.loop.ADAMW_HYPERPARAMETERS["lr"] = 1e-3  # read-only now: TypeError
    except TypeError:
        llmb.training.loop.ADAMW_HYPERPARAMETERS = {**llmb.training.loop.ADAMW_HYPERPARAMETERS, "lr": 1e-3}
    """,
)
ATEN_MM_OVERRIDE = Attack(
    "aten_mm_override",
    """
    import torch

    _lib = torch.library.Library("aten", "IMPL")

    def _mm(a, b):
        # bmm is another operator, so this kernel does not call itself
        if a.shape == (256, 256) and b.shape == (256, 256):  # the precision probe's shape: honest there
            return torch.bmm(a.unsqueeze(0), b.unsqueeze(0)).squeeze(0)
        return torch.bmm(a.bfloat16().unsqueeze(0), b.bfloat16().unsqueeze(0)).squeeze(0).to(a.dtype)

    _lib.impl("mm", _mm, "CPU")
    """,
)
SLOW_CLOCK = Attack(
    "slow_clock",
    """
    import time as _time
    import types

    import llmb.training.loop

    _real = _time.perf_counter
    _start = _real()
    llmb.training.loop.time = types.SimpleNamespace(perf_counter=lambda: _start + (_real() - _start) / 1.5)
    """,
)

# Late changes: the backend switched after the audit ran.
LATE_MEDIUM = Attack(
    "late_medium",
    """
    import torch

    _calls = [0]

    def _step_end(device):
        _calls[0] += 1
        if _calls[0] >= 2:  # the audit ran after the first step
            torch.set_float32_matmul_precision("medium")
    """,
)

# What the audit cannot see without a dispatch-level record: instance-level changes in process_model.
AUTOCAST_FORWARD = Attack(
    "autocast_forward",
    """
    import functools

    import torch

    def _process_model(model, optimizer, device, precision, settings):
        forward = model.forward

        @functools.wraps(forward)
        def _autocast_forward(*args, **kwargs):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return forward(*args, **kwargs)

        model.forward = _autocast_forward
        return model
    """,
)
LINEAR_BF16_INSTANCES = Attack(
    "linear_bf16_instances",
    """
    import types

    import torch
    import torch.nn.functional as F

    def _bf16_forward(self, x):
        bias = self.bias.bfloat16() if self.bias is not None else None
        return F.linear(x.bfloat16(), self.weight.bfloat16(), bias).to(x.dtype)

    def _process_model(model, optimizer, device, precision, settings):
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                module.forward = types.MethodType(_bf16_forward, module)
        return model
    """,
)

# Peaks: a tiny declared peak inflates MFU.
PEAK_UNKNOWN_DEVICE = Attack(
    "peak_unknown_device",
    """
    def _device_name(device):
        return "Acme Turbo 9000"

    def _peak(device, precision):
        return Peak(1e6, "https://acme.example/datasheet")
    """,
)
PEAK_KNOWN_DEVICE = Attack(
    "peak_known_device",
    """
    def _device_name(device):
        return "NVIDIA H100 80GB HBM3"

    def _peak(device, precision):
        return Peak(1e6, "https://acme.example/datasheet")
    """,
)

# Caught before this suite, kept so they stay caught.
DROPPED_LAYER = Attack(
    "dropped_layer",
    """
    import torch

    def _process_model(model, optimizer, device, precision, settings):
        model.layers[-1].forward = lambda x, cos, sin: x
        return model
    """,
)
SCALED_LOGITS = Attack(
    "scaled_logits",
    """
    def _process_model(model, optimizer, device, precision, settings):
        head = model.lm_head
        head.register_forward_hook(lambda module, args, output: output * 1.5)
        return model
    """,
)
FROZEN = Attack(
    "frozen",
    """
    def _process_model(model, optimizer, device, precision, settings):
        for p in list(model.parameters())[::2]:
            p.requires_grad_(False)
        return model
    """,
)


def reasons(record: dict) -> str:
    return " | ".join(record["invalid_reasons"])


# (attack, the reason `llmb run` gives, fast?)
CAUGHT_BY_RUN = [
    pytest.param(LINEAR_BF16, "identity after post-processing: torch.nn.Linear.forward was replaced", id="linear_bf16"),
    pytest.param(
        SKIP_LAYERS,
        "identity after post-processing: llmb.model.LlamaModel.forward was replaced",
        id="skip_layers",
        marks=slow,
    ),
    pytest.param(
        SDPA_BLOCK_LOCAL,
        "torch.nn.functional.scaled_dot_product_attention was replaced",
        id="sdpa_block_local",
        marks=slow,
    ),
    pytest.param(ADAMW_STEP_SGD, "torch.optim.AdamW.step was replaced", id="adamw_step_sgd", marks=slow),
    pytest.param(ADAMW_IS_SGD, "torch.optim.AdamW was replaced", id="adamw_is_sgd"),
    pytest.param(ADAMW_HALF_STEPS, "torch.optim.AdamW.step was replaced", id="adamw_half_steps", marks=slow),
    pytest.param(GLOBAL_PRE_HOOK, "_global_optimizer_pre_hooks changed", id="global_pre_hook", marks=slow),
    pytest.param(
        HYPERPARAMETER_LR, "llmb.training.loop.ADAMW_HYPERPARAMETERS was replaced", id="hyperparameter_lr", marks=slow
    ),
    pytest.param(ATEN_MM_OVERRIDE, "the dispatcher's kernels for aten::mm changed", id="aten_mm_override", marks=slow),
    pytest.param(SLOW_CLOCK, "llmb.training.loop.time was replaced", id="slow_clock", marks=slow),
    pytest.param(LATE_MEDIUM, "window: backend state changed since the audit", id="late_medium"),
    pytest.param(DROPPED_LAYER, "received no gradient", id="dropped_layer", marks=slow),
    pytest.param(FROZEN, "model parameters are frozen", id="frozen", marks=slow),
]


@pytest.mark.parametrize("attack, reason", CAUGHT_BY_RUN)
def test_llmb_run_marks_the_attack_invalid_and_says_why(attack, reason, tmp_path):
    proc, record = run_attack(attack, tmp_path)
    assert record is not None, proc.stderr[-2000:]
    assert not record["valid"]
    if reason is not None:
        assert reason in reasons(record), reasons(record)
    else:
        assert record["invalid_reasons"], "no invalid reason"


def test_the_global_pre_hook_is_also_caught_by_the_gradient_check(tmp_path):
    """Two mechanisms for one attack: the hook registry, and the parameters left without a gradient."""
    proc, record = run_attack(GLOBAL_PRE_HOOK, tmp_path)
    assert record is not None, proc.stderr[-2000:]
    assert "window: " in reasons(record) and "received no gradient" in reasons(record), reasons(record)


@pytest.mark.parametrize(
    "attack",
    [
        pytest.param(AUTOCAST_FORWARD, id="autocast_forward"),
        pytest.param(LINEAR_BF16_INSTANCES, id="linear_bf16_instances", marks=slow),
    ],
)
def test_bf16_matmuls_under_fp32_tensors_are_labelled_bf16_by_the_dispatch_record(attack, tmp_path):
    """Every tensor at rest is FP32 and no switch says otherwise; the matmuls ran in BF16. The label follows what
    ran (the dispatch record of a measured step), and --strict-precision makes the run invalid."""
    proc, record = run_attack(attack, tmp_path, "--precision", "FP32", "--strict-precision")
    assert record is not None, proc.stderr[-2000:]
    audit = record["precision"]["audit"]
    assert set(audit["parameter_dtypes"]) == {"float32"}
    assert audit["dispatch"]["formats"]["aten.mm"] == "BF16"
    assert audit["evidence"]["dispatch"] == "BF16"
    assert record["precision"]["effective"] == "BF16"
    assert "--strict-precision: requested FP32, ran BF16" in reasons(record)


def test_a_tiny_peak_declared_for_an_unknown_device_makes_mfu_invalid(tmp_path):
    proc, record = run_attack(PEAK_UNKNOWN_DEVICE, tmp_path)
    assert record is not None, proc.stderr[-2000:]
    assert record["peak"]["origin"] == "declared by plugin"
    assert record["peak"]["source"] == "https://acme.example/datasheet"
    assert record["mfu"] > 1
    assert "is above 100%" in reasons(record)


@slow
def test_a_peak_below_llmbs_table_entry_is_invalid_and_the_table_wins(tmp_path):
    proc, record = run_attack(PEAK_KNOWN_DEVICE, tmp_path)
    assert record is not None, proc.stderr[-2000:]
    # The label is FP32 on the CPU; llmb's table has H100 SXM FP32 66.9 TFLOP/s, and that is the peak used.
    assert record["peak"]["origin"] == "llmb table" and record["peak"]["flops"] == 66.9e12
    assert "below llmb's table entry" in reasons(record)


# check-plugin: its reference runs in the same process, so before the guard a global patch fooled it (error 0.0).
CAUGHT_BY_CHECK = [
    pytest.param(LINEAR_BF16, ["identities"], id="linear_bf16"),
    pytest.param(AUTOCAST_FORWARD, ["precision"], id="autocast_forward", marks=slow),
    pytest.param(SCALED_LOGITS, ["forward-loss", "forward-logits"], id="scaled_logits"),
    pytest.param(ADAMW_IS_SGD, ["identities"], id="adamw_is_sgd", marks=slow),
    pytest.param(DROPPED_LAYER, ["forward-loss"], id="dropped_layer", marks=slow),
]


@pytest.mark.parametrize("attack, failed", CAUGHT_BY_CHECK)
def test_check_plugin_fails_the_attack_naming_the_check(attack, failed, tmp_path):
    proc, record = check_attack(attack, tmp_path)
    assert record is not None, proc.stderr[-2000:]
    assert proc.returncode != 0
    failing = {c["name"] for c in record["checks"] if not c["passed"]}
    assert set(failed) <= failing, failing


NO_LOGITS = Attack(
    "no_logits",
    """
    def _process_model(model, optimizer, device, precision, settings):
        forward = model.forward

        def _loss_only(*args, **kwargs):
            loss, _ = forward(*args, **kwargs)
            return loss, None

        model.forward = _loss_only
        return model
    """,
)


@slow
def test_a_forward_without_logits_fails_forward_logits_instead_of_crashing(tmp_path):
    proc, record = check_attack(NO_LOGITS, tmp_path)
    assert "Traceback" not in proc.stderr and "AttributeError" not in proc.stderr, proc.stderr[-2000:]
    assert record is not None
    failing = {c["name"]: c for c in record["checks"] if not c["passed"]}
    assert failing["forward-logits"]["detail"] == "the forward pass returned no logits tensor"
