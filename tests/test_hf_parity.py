"""Parity with HF transformers' LlamaForCausalLM (transformers is a test-only dependency)."""

import sys
from pathlib import Path

import pytest
import torch

from llmb.model import LlamaModel
from llmb.spec.presets import build_config

transformers = pytest.importorskip("transformers", reason="transformers is not installed (pip install -e .[test])")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # benchmarks/hf.py, not part of llmb
from hf import llama_config  # noqa: E402 - needs transformers


def _twins():
    """llmb's model and HF's LlamaForCausalLM with llmb's weights copied in by name."""
    config = build_config("tiny", num_hidden_layers=3)
    hf_config = llama_config(config)
    torch.manual_seed(0)
    ours = LlamaModel(config).eval()
    hf = transformers.LlamaForCausalLM(hf_config).eval()
    hf_state = {name.removeprefix("model."): tensor for name, tensor in hf.state_dict().items()}
    # Copy our weights into HF by name: HF nests the decoder under "model.", the head sits beside it.
    theirs = {}
    for name, tensor in ours.state_dict().items():
        assert name in hf_state, f"{name} has no HF counterpart"
        theirs[name if name == "lm_head.weight" else f"model.{name}"] = tensor
    missing, unexpected = hf.load_state_dict(theirs, strict=False)
    assert not unexpected and all("rotary" in m for m in missing)
    return config, ours, hf


def test_logits_and_loss_match_hf_llama_in_fp32():
    config, ours, hf = _twins()
    ids = torch.randint(0, config.vocab_size, (2, config.sequence_length), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        loss, logits = ours(ids, labels=ids)
        out = hf(input_ids=ids, labels=ids)
    torch.testing.assert_close(logits, out.logits.float(), rtol=1e-5, atol=1e-5)
    assert abs(loss.item() - out.loss.item()) < 1e-5


def test_gradients_match_hf_llama_in_fp32():
    config, ours, hf = _twins()
    ids = torch.randint(0, config.vocab_size, (3, config.sequence_length), generator=torch.Generator().manual_seed(2))
    loss, _ = ours(ids, labels=ids)
    loss.backward()
    out = hf(input_ids=ids, labels=ids)
    out.loss.backward()
    # HF 5.x shifts the labels and pads them with the ignore index, as llmb does: the same loss to one FP32 ulp.
    assert loss.item() == pytest.approx(out.loss.item(), rel=2e-7)
    theirs = {name.removeprefix("model."): p.grad for name, p in hf.named_parameters()}
    for name, p in ours.named_parameters():
        torch.testing.assert_close(p.grad, theirs[name], rtol=1e-4, atol=1e-7, msg=name)
