"""The whole-window audit's parts: the dispatch recorder, the backend state, gradients and parameter changes, peaks."""

import pytest
import torch
import torch.nn.functional as F

from llmb.audit import precision
from llmb.audit.dispatch import DtypeRecorder
from llmb.audit.evidence import synthetic_batch
from llmb.audit.window import (
    WindowAudit,
    equal_to,
    gradient_problems,
    parameter_digests,
    unchanged_parameters,
    vector_copies,
)
from llmb.model import LlamaModel
from llmb.spec import peak_table as peaks
from llmb.spec.presets import PRESETS
from llmb.training.loop import build_optimizer


def _step(model, optimizer, batch):
    optimizer.zero_grad(set_to_none=True)
    loss, _ = model(batch, labels=batch)
    loss.backward()
    optimizer.step()


@pytest.fixture
def tiny():
    torch.manual_seed(0)
    model = LlamaModel(PRESETS["tiny"])
    optimizer = build_optimizer(model, None)
    return model, optimizer, synthetic_batch(PRESETS["tiny"], 1, 0, torch.device("cpu"))


def test_the_recorder_sees_fp32_matmuls_and_attention_in_an_honest_step(tiny):
    with DtypeRecorder() as recorder:
        _step(*tiny)
    record = recorder.record.to_dict()
    assert record["formats"]["aten.mm"] == "FP32"
    assert any("scaled_dot_product" in op for op in record["calls"])
    assert record["effective"] == "FP32" and not record["opaque"] and record["unknown_operators"] == {}


def test_the_recorder_sees_a_linear_that_computes_in_bf16_with_fp32_tensors(tiny, monkeypatch):
    def bf16_forward(self, x):
        return F.linear(x.bfloat16(), self.weight.bfloat16()).float()

    monkeypatch.setattr(torch.nn.Linear, "forward", bf16_forward)
    with DtypeRecorder() as recorder:
        _step(*tiny)
    assert recorder.record.effective() == "BF16"
    assert all(p.dtype == torch.float32 for p in tiny[0].parameters())


def test_the_recorder_sees_autocast_around_forward(tiny):
    model, optimizer, batch = tiny
    with DtypeRecorder() as recorder, torch.autocast("cpu", dtype=torch.bfloat16):
        model(batch, labels=batch)[0].backward()
    assert recorder.record.formats()["aten.mm"] == "BF16"


def test_the_recorder_flags_operators_of_unknown_namespaces():
    torch.library.define("llmb_test::fast_mm", "(Tensor a, Tensor b) -> Tensor")

    @torch.library.impl("llmb_test::fast_mm", "CPU")
    def fast_mm(a, b):
        return a @ b

    with DtypeRecorder() as recorder:
        torch.ops.llmb_test.fast_mm(torch.ones(2, 2), torch.ones(2, 2))
    assert recorder.record.to_dict()["unknown_operators"] == {"llmb_test::fast_mm": 1}


def test_with_dispatch_lowers_the_label_to_what_ran():
    audit = {"effective": "FP32", "evidence": {"parameters": "FP32", "matmul_probe": "FP32"}}
    merged = precision.with_dispatch(audit, {"effective": "BF16"})
    assert merged["effective"] == "BF16" and merged["evidence"]["dispatch"] == "BF16"


def test_backend_state_names_a_late_switch():
    before = precision.backend_state("cpu")
    torch.set_float32_matmul_precision("medium")
    try:
        changes = precision.state_changes(before, precision.backend_state("cpu"))
    finally:
        precision.apply_backend_recipe("FP32")
    assert any(c.startswith("torch.float32_matmul_precision: 'highest' -> 'medium'") for c in changes), changes


def test_a_window_with_a_late_switch_is_invalid(tiny):
    model, optimizer, batch = tiny
    _step(model, optimizer, batch)
    window = WindowAudit(model, optimizer, "cpu", precision.backend_state("cpu"), steps=2)
    window.open()
    _step(model, optimizer, batch)
    window.after_step()
    torch.set_float32_matmul_precision("medium")
    try:
        _step(model, optimizer, batch)
        window.after_step()
    finally:
        precision.apply_backend_recipe("FP32")
    window.close()
    assert any("backend state changed since the audit (after step 2 of the window)" in p for p in window.problems)


def test_parameters_without_gradients_or_without_change_are_named(tiny):
    model, optimizer, batch = tiny
    _step(model, optimizer, batch)
    before = parameter_digests(model, optimizer)
    _step(model, optimizer, batch)
    after = parameter_digests(model, optimizer)
    dtypes = {n: p.dtype for n, p in model.named_parameters()}
    assert unchanged_parameters(before, after, dtypes) == []
    model.lm_head.weight.grad = None
    with torch.no_grad():
        model.norm.weight.grad.zero_()
    problems = gradient_problems(model)
    assert "1 parameters received no gradient (first: lm_head.weight)" in problems[0]
    assert "1 parameters received an all-zero gradient (first: norm.weight)" in problems[1]
    assert unchanged_parameters(after, after, dtypes) == list(dtypes)


def test_a_norm_update_that_cancels_in_the_digest_still_counts_as_a_change(tiny):
    """A vector two of whose elements trade places is the same in both digest columns in any precision (its sum and
    sum of squares are the same numbers), yet it changed: small parameters are compared whole. (Ones moved up and
    down by 2^-13 served here while the digest squared in float32, which lost the 2^-26; its float64 squares see
    them now.)"""
    model, optimizer, _ = tiny
    weight = model.norm.weight
    with torch.no_grad():
        weight[0], weight[1] = 2.0, 0.5
    before, copies = parameter_digests(model, optimizer), vector_copies(model)
    with torch.no_grad():
        weight[0], weight[1] = 0.5, 2.0
    after = parameter_digests(model, optimizer)
    dtypes = {n: p.dtype for n, p in model.named_parameters()}
    assert after["norm.weight"] == before["norm.weight"]  # the digest alone would call it stuck
    stuck = unchanged_parameters(before, after, dtypes, equal_to(model, copies))
    assert "norm.weight" not in stuck and "lm_head.weight" in stuck


def test_peaks_come_from_llmbs_table_first():
    choice = peaks.choose("NVIDIA H100 80GB HBM3", "BF16")
    assert choice.flops == 989.4e12 and choice.origin == peaks.ORIGIN_TABLE and "whitepaper" in choice.source
    low = peaks.choose("NVIDIA H100 80GB HBM3", "BF16", declared=1e6, declared_source="x")
    assert low.flops == 989.4e12 and "below llmb's table entry" in low.problems[0]
    assert peaks.choose("AMD Instinct MI250X", "TF32").flops is None  # no TF32 rate, on purpose
    assert peaks.choose("NVIDIA H100 NVL", "BF16").flops is None  # excluded: other figures


def test_a_declared_peak_only_for_a_device_the_table_lacks():
    declared = peaks.choose("Acme Turbo 9000", "BF16", declared=5e14, declared_source="https://acme.example/sheet")
    assert (declared.flops, declared.origin, declared.source) == (
        5e14,
        "declared by plugin",
        "https://acme.example/sheet",
    )
    assert peaks.choose("Acme Turbo 9000", "BF16", declared=5e14).flops is None  # no source, no MFU
    assert peaks.mfu_problems(1.2) and not peaks.mfu_problems(0.4) and not peaks.mfu_problems(None)


def test_reports_say_declared_by_plugin_with_the_source():
    from dataclasses import replace

    from records_factory import make_result

    from llmb import records, report

    declared = records.PeakInfo(flops=1e12, source="https://acme.example/sheet", origin=peaks.ORIGIN_DECLARED)
    record = replace(make_result(), peak=declared)
    point = report.point_from_record(record, None, "x.json")
    assert point.peak == "peak 1 TFLOP/s, declared by plugin: https://acme.example/sheet"
    assert peaks.declared(record) and peaks.declared(record.to_dict())
