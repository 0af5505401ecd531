"""torchtitan's Llama 3 model at llmb's shape, as a benchmark peer (torchtitan and triton are `bench` extras).

torchtitan's trainer has no CPU mode, so only its model is used: `Llama3Model` built from its own config helpers
at llmb's shape (untied head, no GQA, theta as llmb, no RoPE scaling), its attention configured to SDPA (its
language-model configs offer only flex and varlen, which take document masks), its `cross_entropy_loss` (sum,
FP32) divided by the token count, as its trainer does. Everything else is torchtitan's default: the fused QKV
projection, complex RoPE, `nn.RMSNorm`, its initialisation. Importing torchtitan needs `triton` installed.
"""

from __future__ import annotations

import torch

from llmb.model import ModelConfig


def titan_model(config: ModelConfig) -> torch.nn.Module:
    """torchtitan's Llama3Model with llmb's shape; parameters initialised by torchtitan's own init."""
    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.common.config_utils import make_ffn_config, make_gqa_config
    from torchtitan.models.llama3 import _LINEAR_INIT, _NORM_INIT, Llama3Model, Llama3TransformerBlock

    dim, heads = config.hidden_size, config.num_attention_heads
    linear_init = _LINEAR_INIT
    rope = ComplexRoPE.Config(dim=dim // heads, max_seq_len=config.sequence_length, theta=config.rope_theta)
    layers = [
        Llama3TransformerBlock.Config(
            attention_norm=RMSNorm.Config(normalized_shape=dim, eps=config.rms_norm_eps, param_init=_NORM_INIT),
            ffn_norm=RMSNorm.Config(normalized_shape=dim, eps=config.rms_norm_eps, param_init=_NORM_INIT),
            attention=make_gqa_config(
                dim=dim,
                n_heads=heads,
                wqkv_param_init=linear_init,
                wo_param_init=linear_init,
                inner_attention=ScaledDotProductAttention.Config(),
                fuse_qkv=True,
                rope=rope,
            ),
            feed_forward=make_ffn_config(
                dim=dim, hidden_dim=config.intermediate_size, w1_param_init=linear_init, w2w3_param_init=linear_init
            ),
        )
        for _ in range(config.num_hidden_layers)
    ]
    titan_config = Llama3Model.Config(
        dim=dim,
        vocab_size=config.vocab_size,
        tok_embeddings=Embedding.Config(
            num_embeddings=config.vocab_size, embedding_dim=dim, param_init={"weight": torch.nn.init.normal_}
        ),
        norm=RMSNorm.Config(normalized_shape=dim, eps=config.rms_norm_eps, param_init=_NORM_INIT),
        lm_head=Linear.Config(in_features=dim, out_features=config.vocab_size, param_init=linear_init),
        layers=layers,
    )
    model = titan_config.build()
    model.init_states()
    return model


def titan_loss(model: torch.nn.Module, batch: torch.Tensor) -> torch.Tensor:
    """Next-token loss as torchtitan's trainer computes it: labels shifted (the last position padded with the
    ignore index, so every arm predicts the same batch x (seq - 1) targets), summed in FP32, over the count."""
    from torchtitan.components.loss import IGNORE_INDEX, cross_entropy_loss

    labels = torch.nn.functional.pad(batch[:, 1:], (0, 1), value=IGNORE_INDEX)
    return cross_entropy_loss(model(batch), labels) / (labels.numel() - labels.shape[0])
