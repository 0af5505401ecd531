"""The model's shape: the fields a LLaMA-style decoder is built from, and the official benchmark shape.

Torch-free, so what reads records (report, verify, leaderboard) never imports torch. Part of the model definition
since release 4 (it was in llmb/model.py before): `llmb verify` checks this file is the released one, as it does for
the model and the loop, and a run's shape is checked against OFFICIAL_CONFIG field by field.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 32000
    hidden_size: int = 3200
    intermediate_size: int = 6400
    num_hidden_layers: int = 12
    num_attention_heads: int = 32
    sequence_length: int = 256
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    initializer_range: float = 0.02

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def to_dict(self) -> dict:
        return asdict(self)


# The official benchmark shape, the only one a valid result may use (1,433,680,000 parameters).
OFFICIAL_CONFIG = ModelConfig()


def embedding_parameters(config: ModelConfig) -> int:
    """Parameters of the input embedding table (excluded from FLOPs, as torchtitan does)."""
    return config.vocab_size * config.hidden_size
