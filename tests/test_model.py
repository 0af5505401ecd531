import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from llmb.model import LlamaModel, apply_rotary, causal_lm_loss, count_parameters, rotate_half
from llmb.spec.flops import parameter_count
from llmb.spec.presets import PRESETS
from llmb.spec.shape import OFFICIAL_CONFIG


def test_official_shape_has_exactly_1_433_680_000_parameters():
    with torch.device("meta"):
        model = LlamaModel(OFFICIAL_CONFIG)
    assert count_parameters(model) == 1_433_680_000


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_analytic_parameter_count_matches_the_model(preset):
    with torch.device("meta"):
        model = LlamaModel(PRESETS[preset])
    assert parameter_count(PRESETS[preset]) == count_parameters(model)


def test_parameter_names_follow_hf():
    names = {n for n, _ in LlamaModel(PRESETS["tiny"]).named_parameters()}
    assert "embed_tokens.weight" in names and "lm_head.weight" in names and "norm.weight" in names
    assert "layers.1.self_attn.q_proj.weight" in names and "layers.0.mlp.gate_proj.weight" in names


def test_fresh_model_loss_is_near_ln_vocab_and_logits_are_float32():
    torch.manual_seed(0)
    config = PRESETS["tiny"]
    model = LlamaModel(config).to(torch.bfloat16)
    ids = torch.randint(0, config.vocab_size, (2, config.sequence_length))
    loss, logits = model(ids, labels=ids)
    assert logits.dtype == torch.float32
    assert abs(loss.item() - math.log(config.vocab_size)) < 0.2


def test_causal_attention_does_not_see_the_future():
    torch.manual_seed(0)
    config = PRESETS["tiny"]
    model = LlamaModel(config)
    ids = torch.randint(0, config.vocab_size, (1, config.sequence_length))
    changed = ids.clone()
    changed[0, -1] = (ids[0, -1] + 1) % config.vocab_size
    _, a = model(ids)
    _, b = model(changed)
    assert torch.equal(a[0, :-1], b[0, :-1])
    assert not torch.equal(a[0, -1], b[0, -1])


def test_installed_model_matches_the_released_fingerprint():
    from llmb.spec.fingerprint import RELEASED_MODEL_FINGERPRINT, model_fingerprint

    assert model_fingerprint() == RELEASED_MODEL_FINGERPRINT


def test_the_release_table_names_every_release_and_the_pinned_one_as_current():
    import re
    from pathlib import Path

    from llmb.spec.fingerprint import MODEL_RELEASES, RELEASED_MODEL_FINGERPRINT

    rules = (Path(__file__).resolve().parents[1] / "docs" / "rules.md").read_text()
    rows = {
        int(m[1]): (m[2], m[3]) for m in re.finditer(r"^\| (\d+) (\(current, )?[^|]*\| `([0-9a-f]{64})`", rules, re.M)
    }
    assert {number: fingerprint for number, (_, fingerprint) in rows.items()} == dict(MODEL_RELEASES)
    assert [fingerprint for current, fingerprint in rows.values() if current] == [RELEASED_MODEL_FINGERPRINT]


def _sliced_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The released-before loss: slice the logits, then the mean cross-entropy (the semantics to keep)."""
    return F.cross_entropy(logits[:, :-1, :].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1))


@pytest.mark.parametrize("batch", [1, 3])
def test_loss_and_gradients_equal_the_sliced_logits_loss(batch):
    torch.manual_seed(0)
    config = PRESETS["tiny"]
    ids = torch.randint(0, config.vocab_size, (batch, config.sequence_length))
    model = LlamaModel(config)
    loss, _ = model(ids, labels=ids)
    loss.backward()
    ours = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    _, logits = model(ids)
    reference = _sliced_loss(logits, ids)
    reference.backward()
    # The same batch x (seq - 1) terms averaged; only the order of the FP32 sum may differ (a few ulps).
    assert loss.item() == pytest.approx(reference.item(), rel=1e-6)
    for name, p in model.named_parameters():
        torch.testing.assert_close(ours[name], p.grad, rtol=1e-5, atol=1e-8, msg=name)


def test_loss_ignores_padded_labels_as_hf_does():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 11)
    labels = torch.randint(0, 11, (2, 5))
    labels[1, 3] = -100  # a padded target: left out of the sum and of the count
    kept = [(b, t) for b in range(2) for t in range(4) if labels[b, t + 1] != -100]
    expected = torch.stack([F.cross_entropy(logits[b, t], labels[b, t + 1]) for b, t in kept]).mean()
    assert causal_lm_loss(logits, labels).item() == pytest.approx(expected.item(), rel=1e-6)


class _LargeOutputs(TorchDispatchMode):
    """Records the operators whose output has at least `numel` elements (logits-sized tensors)."""

    def __init__(self, numel: int) -> None:
        super().__init__()
        self.numel, self.ops = numel, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        outs = out if isinstance(out, (tuple, list)) else [out]
        if any(isinstance(o, torch.Tensor) and o.numel() >= self.numel for o in outs):
            self.ops.append(func.__name__)
        return out


@pytest.mark.parametrize("loss_of", [causal_lm_loss, _sliced_loss], ids=["model", "sliced"])
def test_the_loss_reads_the_logits_without_copying_them(loss_of):
    batch, seq, vocab = 3, 16, 50
    logits = torch.randn(batch, seq, vocab, requires_grad=True)
    labels = torch.randint(0, vocab, (batch, seq))
    with _LargeOutputs(batch * (seq - 1) * vocab) as seen:
        loss_of(logits, labels).backward()
    names = [op.split(".")[0] for op in seen.ops]
    copies = [op for op in names if op in ("clone", "copy_", "slice_backward", "_to_copy")]
    # The sliced loss (the check's own control) copies the logits forward and their gradient backward.
    assert copies == [] if loss_of is causal_lm_loss else copies == ["clone", "slice_backward"]


def _hf_inv_freq(head_dim: int, theta: float = 10000.0) -> torch.Tensor:
    """HF's inverse frequencies (LlamaRotaryEmbedding's inv_freq buffer), FP32."""
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))


def _hf_tables(head_dim: int, positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """HF's rotary tables as LlamaRotaryEmbedding.forward builds them each step: cat((angles, angles)), FP32."""
    angles = torch.outer(torch.arange(positions, dtype=torch.float32), _hf_inv_freq(head_dim))
    both = torch.cat((angles, angles), dim=-1)
    return both.cos(), both.sin()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_rotary_embedding_equals_hfs_full_tables(dtype):
    config = PRESETS["tiny"]
    model = LlamaModel(config).to(dtype)
    x = torch.randn(2, config.sequence_length, config.num_attention_heads, config.head_dim).transpose(1, 2).to(dtype)
    cos, sin = _hf_tables(config.head_dim, config.sequence_length)
    expected = x * cos.to(dtype) + rotate_half(x) * sin.to(dtype)
    # The half-tables, broadcast over both halves of the head, give HF's result bit for bit.
    assert torch.equal(apply_rotary(x, *model.rotary(x, config.sequence_length)), expected)


def test_casting_the_model_rounds_the_rotary_tables_not_their_frequencies():
    config = PRESETS["tiny"]
    model = LlamaModel(config).to(torch.bfloat16)
    assert list(model.buffers()) == []  # nothing kept between steps, so nothing a cast can round
    x = torch.zeros(1, config.sequence_length, config.hidden_size, dtype=torch.bfloat16)
    cos, _ = model.rotary(x, config.sequence_length)
    expected, _ = _hf_tables(config.head_dim, config.sequence_length)
    assert torch.equal(cos, expected[:, : config.head_dim // 2].to(torch.bfloat16))
    # HF after .to(bfloat16) (and llmb's release 2) rounds the inverse frequencies first: angles off by far more.
    rounded_freq = _hf_inv_freq(config.head_dim).bfloat16().float()
    rounded = torch.outer(torch.arange(config.sequence_length).float(), rounded_freq).cos()
    assert not torch.equal(cos, rounded.to(torch.bfloat16))
