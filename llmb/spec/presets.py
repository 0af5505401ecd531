"""Presets: the official shape (from the model file, its one source of truth) and small debug shapes."""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType

from llmb.api.errors import UsageError
from llmb.spec.shape import OFFICIAL_CONFIG, ModelConfig
from llmb.spec.vocab import SHAPE_FIELDS

# The benchmark's optimizer, fixed: torch.optim.AdamW with these hyperparameters (no decay on 1-D parameters).
# Read-only; llmb.audit.guard compares it before and after a plugin ran, and verify re-checks every recorded run against
# it.
ADAMW_HYPERPARAMETERS = MappingProxyType({"lr": 1e-5, "betas": (0.9, 0.999), "eps": 1e-6, "weight_decay": 0.01})

PRESETS: dict[str, ModelConfig] = {
    "official": OFFICIAL_CONFIG,
    # Debug shapes: same vocabulary (so the loss band around ln(vocab) holds), fewer and narrower layers.
    "small": replace(
        OFFICIAL_CONFIG, hidden_size=512, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=8
    ),
    "tiny": replace(
        OFFICIAL_CONFIG,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        sequence_length=32,
    ),
}


def build_config(preset: str, **overrides: int | None) -> ModelConfig:
    """The preset's shape with any debug overrides applied; checks that the shape can be built."""
    if preset not in PRESETS:
        raise UsageError(f"unknown preset {preset!r} (choose from {', '.join(PRESETS)})")
    changes = {k: v for k, v in overrides.items() if v is not None}
    for key, value in changes.items():
        if key not in SHAPE_FIELDS:
            raise UsageError(f"unknown shape option {key!r}")
        if value < 1:
            raise UsageError(f"--{key.replace('_', '-')} must be at least 1, got {value}")
    config = replace(PRESETS[preset], **changes)
    if config.hidden_size % config.num_attention_heads:
        raise UsageError(
            f"hidden size {config.hidden_size} is not divisible by {config.num_attention_heads} attention heads"
        )
    if config.head_dim % 2:
        raise UsageError(f"head dim {config.head_dim} must be even for rotary embeddings")
    if config.sequence_length < 2:
        raise UsageError("sequence length must be at least 2 (the loss predicts the next token)")
    return config


def official_reasons(config: ModelConfig) -> list[str]:
    """Why a shape is not the official one (empty when it is)."""
    return [
        f"{field} is {getattr(config, field)}, official is {getattr(OFFICIAL_CONFIG, field)}"
        for field in ModelConfig.__dataclass_fields__
        if getattr(config, field) != getattr(OFFICIAL_CONFIG, field)
    ]
