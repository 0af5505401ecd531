"""HF transformers' counterpart of llmb's model, for parity tests and side-by-side benchmarks (not part of llmb).

transformers is not a dependency of llmb: import this module only where it is installed.
"""

from __future__ import annotations

import transformers

from llmb.model import ModelConfig


def llama_config(config: ModelConfig) -> transformers.LlamaConfig:
    """HF's LlamaConfig for llmb's shape: SDPA attention, untied head, no biases, no KV cache (training)."""
    hf_config = transformers.LlamaConfig(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_attention_heads,
        max_position_embeddings=config.sequence_length,
        rms_norm_eps=config.rms_norm_eps,
        rope_theta=config.rope_theta,
        initializer_range=config.initializer_range,
        hidden_act="silu",
        tie_word_embeddings=False,
        attention_bias=False,
        mlp_bias=False,
        use_cache=False,
    )
    hf_config._attn_implementation = "sdpa"
    return hf_config
