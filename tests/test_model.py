import math

import pytest
import torch

from llmb.config import PRESETS
from llmb.flops import parameter_count
from llmb.model import OFFICIAL_CONFIG, LlamaModel, count_parameters


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
    from llmb.fingerprint import RELEASED_MODEL_FINGERPRINT, model_fingerprint

    assert model_fingerprint() == RELEASED_MODEL_FINGERPRINT
