"""llmb.audit.guard: the identities captured before any plugin import, and what a comparison names after a change.

Each test changes one watched object in this process and puts it back (monkeypatch), so the comparison sees the
change while it lasts and nothing afterwards.
"""

import sys
from pathlib import Path

import pytest
import torch

import llmb.model
import llmb.training.loop
from llmb.audit import guard


@pytest.fixture(scope="module")
def baseline():
    return guard.capture()


def test_nothing_changed_compares_clean(baseline):
    assert guard.compare(baseline) == []


@pytest.mark.parametrize(
    "holder, name, reported",
    [
        (torch.nn.Linear, "forward", "torch.nn.Linear.forward was replaced"),
        (torch.nn.functional, "scaled_dot_product_attention", "scaled_dot_product_attention was replaced"),
        (torch.optim, "AdamW", "torch.optim.AdamW was replaced"),
        (torch.optim.AdamW, "step", "torch.optim.AdamW.step was replaced"),
        (llmb.model.LlamaModel, "forward", "llmb.model.LlamaModel.forward was replaced"),
        (llmb.training.loop.Trainer, "measure", "llmb.training.loop.Trainer.measure was replaced"),
        (llmb.training.loop, "time", "llmb.training.loop.time was replaced"),
        (llmb.training.loop, "ADAMW_HYPERPARAMETERS", "llmb.training.loop.ADAMW_HYPERPARAMETERS was replaced"),
    ],
)
def test_a_replaced_object_is_named(baseline, monkeypatch, holder, name, reported):
    monkeypatch.setattr(holder, name, lambda *args, **kwargs: None)
    assert any(reported in change for change in guard.compare(baseline)), guard.compare(baseline)


def test_every_module_of_the_package_is_watched_without_a_list(baseline, monkeypatch):
    """The modules found on disk, not a hand-kept list: those that judge and time windows (the replay, mesh,
    distributed, cleanroom) included, and any module added later."""
    package = Path(llmb.__file__).parent
    on_disk = {
        "llmb." + ".".join(path.relative_to(package).with_suffix("").parts).removesuffix(".__init__")
        for path in package.rglob("*.py")
        if "__pycache__" not in path.parts
    } - {"llmb.__init__", "llmb"}
    entry_points = {name for name in on_disk if name.endswith(".__main__")}
    assert {"llmb.__main__", "llmb.records.__main__"} <= entry_points
    assert set(guard.llmb_module_names()) == on_disk - entry_points
    from llmb.distributed import job_judge, mesh
    from llmb.judge import cleanroom, replay

    judging = [(replay, "compare"), (mesh, "stage_layers"), (job_judge, "JobJudge"), (cleanroom, "finish")]
    for module, name in judging:
        monkeypatch.setattr(module, name, lambda *args, **kwargs: None)
        assert f"{module.__name__}.{name} was replaced" in "\n".join(guard.compare(baseline))
        monkeypatch.undo()


def test_state_a_run_sets_on_an_llmb_class_is_not_a_change_but_its_code_is(baseline, monkeypatch):
    from llmb.distributed import job as distributed

    monkeypatch.setattr(distributed.Heartbeat, "_current", object())  # a job's one heartbeat, set while it runs
    assert guard.compare(baseline) == []
    monkeypatch.setattr(distributed.Heartbeat, "stop", lambda *args: None)
    assert "llmb.distributed.job.Heartbeat.stop was replaced" in "\n".join(guard.compare(baseline))


def test_a_method_added_to_tensor_shadowing_a_c_method_is_named(baseline, monkeypatch):
    monkeypatch.setattr(torch.Tensor, "mm", lambda self, other: other, raising=False)
    assert "torch.Tensor.mm was added" in guard.compare(baseline)


def test_a_global_optimizer_hook_is_named(baseline):
    handle = sys.modules["torch.optim.optimizer"].register_optimizer_step_pre_hook(lambda *args: None)
    try:
        changes = guard.compare(baseline)
    finally:
        handle.remove()
    assert any("_global_optimizer_pre_hooks changed" in c for c in changes), changes
    assert guard.compare(baseline) == []


def test_constants_are_read_only_and_compared_by_value():
    with pytest.raises(TypeError):
        llmb.training.loop.ADAMW_HYPERPARAMETERS["lr"] = 1e-3


def test_an_aten_kernel_overridden_through_torch_library_is_named(baseline):
    """Run in a child: an override cannot be taken back in this process."""
    import subprocess

    code = (
        "import torch, warnings; from llmb.audit import guard; b = guard.capture(); warnings.simplefilter('ignore');"
        "lib = torch.library.Library('aten', 'IMPL'); lib.impl('mm', lambda a, b: a, 'CPU');"
        "print(guard.compare(b))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert "the dispatcher's kernels for aten::mm changed" in proc.stdout, proc.stderr[-2000:]


def test_torch_compile_in_an_honest_run_changes_nothing(baseline):
    """torch's own lazy patches (dynamo's optimizer wrappers, Module generation tagging) are applied before the
    baseline, so compiling a model shows no change."""
    model = torch.compile(torch.nn.Linear(4, 4))
    model(torch.randn(2, 4)).sum().backward()
    assert guard.compare(baseline) == []


def test_problems_name_the_stage():
    guard.ensure_baseline()
    assert guard.problems("after the window") == []


def test_vendor_changes_reuse_the_last_comparison_with_the_process_baseline(monkeypatch):
    """The window's close compares everything once; the record's vendor counts read what it accepted."""
    guard.ensure_baseline()
    assert guard.problems("after the window") == []
    walks = []
    real = guard.changes
    monkeypatch.setattr(guard, "changes", lambda baseline: walks.append(baseline) or real(baseline))
    monkeypatch.setattr(guard, "_last_accepted", {"vendor-x": ["torch.mm was replaced"]})
    assert guard.vendor_changes() == {"vendor-x": 1} and walks == []
    monkeypatch.setattr(guard, "_last_accepted", None)  # no comparison yet: one walk
    assert guard.vendor_changes() == {} and len(walks) == 1
