"""Model FLOPs per token (torchtitan's count), achieved TFLOP/s, MFU, and the ALCF 1T benchmark's FOM."""

from __future__ import annotations

from llmb.spec.shape import ModelConfig, embedding_parameters


def parameter_count(config: ModelConfig) -> int:
    """Parameters of the model for a shape, without building it (tested against the model itself)."""
    d, f, layers, vocab = config.hidden_size, config.intermediate_size, config.num_hidden_layers, config.vocab_size
    width = config.num_attention_heads * config.head_dim
    attention = 3 * d * width + width * d
    mlp = 3 * d * f
    norms = 2 * d
    return vocab * d + layers * (attention + mlp + norms) + d + d * vocab


def model_flops_per_token(config: ModelConfig, parameters: int | None = None) -> int:
    """6 x non-embedding parameters + 12 x layers x heads x head_dim x seq (attention, causal mask not halved)."""
    n = parameter_count(config) if parameters is None else parameters
    attention = 12 * config.num_hidden_layers * config.num_attention_heads * config.head_dim * config.sequence_length
    return 6 * (n - embedding_parameters(config)) + attention


def achieved_tflops(tokens_per_second_per_device: float, flops_per_token: int) -> float:
    """Achieved model TFLOP/s per device."""
    return tokens_per_second_per_device * flops_per_token / 1e12


def mfu(tflops: float, peak_flops: float | None) -> float | None:
    """Model FLOPs utilisation against the device's dense peak for the effective precision; None if unknown."""
    if not peak_flops:
        return None
    return tflops * 1e12 / peak_flops


def fom(config: ModelConfig, batch_size: int, step_seconds: float) -> float:
    """ALCF 1T benchmark figure of merit: (6 s d^2 + s^2 d) b L / T, in FLOP/s."""
    s, d = config.sequence_length, config.hidden_size
    return (6 * s * d * d + s * s * d) * batch_size * config.num_hidden_layers / step_seconds
