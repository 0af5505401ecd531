"""Thunder as a compiler: real runs where lightning-thunder imports (tox -e thunder: torch 2.9.0 + lightning-thunder
0.2.6), and one clear line where it does not (torch 2.13: lightning-thunder 0.2.6 fails to import)."""

from __future__ import annotations

import pytest
import torch

from llmb import Backend
from llmb.api.errors import UsageError
from llmb.conformance import check as conformance
from llmb.toolkit import compilers

REASON = compilers.thunder_unavailable()
needs_thunder = pytest.mark.skipif(REASON is not None, reason=f"Thunder cannot run here: {REASON}")


class ThunderPlugin(Backend):
    """A minimal backend whose only post-processing is thunder.jit (what the cpu plugin's compile=thunder does)."""

    name = "thunder_on_cpu"

    def precisions(self):
        return ["FP32", "BF16"]

    def process_model(self, model, optimizer, device, precision, settings):
        return compilers.compile_model(model, "thunder")


@pytest.mark.skipif(REASON is None, reason="Thunder imports here")
def test_where_thunder_cannot_run_the_reason_is_one_line():
    assert "\n" not in REASON and "lightning-thunder" in REASON
    with pytest.raises(UsageError, match="compile=thunder: lightning-thunder") as info:
        compilers.check_compiler("thunder")
    assert "\n" not in str(info.value)


@needs_thunder
def test_thunder_keeps_the_parameters_and_trains_like_eager():
    from llmb.model import LlamaModel
    from llmb.spec.presets import PRESETS

    torch.manual_seed(0)
    eager = LlamaModel(PRESETS["tiny"])
    torch.manual_seed(0)
    plain = LlamaModel(PRESETS["tiny"])
    jitted = compilers.compile_model(plain, "thunder")
    assert [p is q for p, q in zip(jitted.parameters(), plain.parameters(), strict=True)] == [True] * len(
        list(plain.parameters())
    )
    batch = torch.randint(0, 32000, (2, 32), generator=torch.Generator().manual_seed(1))
    for model in (eager, jitted):
        loss, _ = model(batch, labels=batch)
        loss.backward()
        model.loss = float(loss)
    assert jitted.loss == pytest.approx(eager.loss, rel=1e-5)
    grads = dict(eager.named_parameters())
    for name, p in plain.named_parameters():
        torch.testing.assert_close(p.grad, grads[name].grad, rtol=1e-4, atol=1e-6)


@needs_thunder
def test_thunder_conforms(register_backend):
    register_backend(ThunderPlugin())
    record = conformance.check_plugin("thunder_on_cpu", "cpu", "FP32", steps=3)
    assert record.passed, conformance.failed_checks(record)
    assert record.precision.effective == "FP32"


@needs_thunder
def test_the_cpu_plugins_compile_thunder_conforms():
    record = conformance.check_plugin("cpu", "cpu", "FP32", settings={"compile": "thunder"}, steps=3)
    assert record.passed, conformance.failed_checks(record)
