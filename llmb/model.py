"""The fixed llmb model: a LLaMA-style decoder with the semantics of HF transformers' LlamaForCausalLM.

This file is the benchmark's model definition, with its shape (llmb/spec/shape.py, torch-free since release 4). Its
sha256 is the model fingerprint: any edit makes every run invalid ("model definition changed"); `llmb verify` checks
the shape's file as released. Hardware plugins post-process the *instance*, never this source.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

# The shape is torch-free, so records read without torch (release 4 moved it out of this file).
from llmb.spec.shape import ModelConfig


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # As HF: normalise in float32, cast back, then scale by the weight in its own dtype.
        input_dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(input_dtype)


class RotaryEmbedding(nn.Module):
    """HF's rotary tables: cos and sin of position x inverse frequency, in FP32, made each forward from the shape.

    HF's tables are cat((angles, angles)): a head's two halves rotate by the same angles, so only one half is made
    and `apply_rotary` broadcasts it over both: HF's values at half the memory. Nothing is kept between steps (less
    memory at the step's peak than a cached table), and a cast of the model has nothing to round: HF's inv_freq
    buffer, once cast to BF16, turns the angles by up to 0.3 rad at the official shape. The tables are rounded once,
    to the activations' dtype, as HF's are.
    """

    def __init__(self, head_dim: int, theta: float) -> None:
        super().__init__()
        self.head_dim, self.theta = head_dim, theta

    def forward(self, x: torch.Tensor, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        exponents = torch.arange(0, self.head_dim, 2, device=x.device, dtype=torch.int64).float() / self.head_dim
        inv_freq = 1.0 / (self.theta**exponents)
        angles = torch.outer(torch.arange(seq_len, device=x.device, dtype=torch.float32), inv_freq)
        return angles.cos().to(x.dtype), angles.sin().to(x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """HF's x * cos + rotate_half(x) * sin, with cos and sin of one half broadcast over both halves of the head."""
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    halves = x.unflatten(-1, (2, -1))
    return (halves * cos + rotate_half(x).unflatten(-1, (2, -1)) * sin).flatten(-2)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        width = self.num_heads * self.head_dim
        self.q_proj = nn.Linear(config.hidden_size, width, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, width, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, width, bias=False)
        self.o_proj = nn.Linear(width, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        batch, seq_len, _ = x.shape
        heads = (batch, seq_len, self.num_heads, self.head_dim)
        q = self.q_proj(x).view(heads).transpose(1, 2)
        k = self.k_proj(x).view(heads).transpose(1, 2)
        v = self.v_proj(x).view(heads).transpose(1, 2)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(batch, seq_len, -1))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    """Decoder-only LLaMA for causal-LM training; parameter names follow HF's LlamaForCausalLM."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        if config.hidden_size % config.num_attention_heads:
            raise ValueError(f"hidden size {config.hidden_size} is not divisible by {config.num_attention_heads} heads")
        if config.head_dim % 2:
            raise ValueError(f"head dim {config.head_dim} must be even for rotary embeddings")
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = RotaryEmbedding(config.head_dim, config.rope_theta)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=self.config.initializer_range)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None):
        """Return (loss, logits); loss is None without labels. Labels are shifted here, as in HF."""
        x = self.embed_tokens(input_ids)
        cos, sin = self.rotary(x, input_ids.shape[1])
        for layer in self.layers:
            x = layer(x, cos, sin)
        logits = self.lm_head(self.norm(x)).float()
        loss = None
        if labels is not None:
            loss = causal_lm_loss(logits, labels)
        return loss, logits


# Label for "no target here"; F.cross_entropy's default, and the value HF pads with.
IGNORE_INDEX = -100


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy: position t predicts labels[t + 1]; the last position has no target.

    As HF 5.x: shift the *labels* left and pad them with the ignore index, so the loss reads the logits in place (a
    view: the head writes them contiguous).
    Slicing the logits instead (logits[:, :-1]) copies them, and its backward writes a zero-filled copy of their
    gradient: at batch 4 of the small preset that is 2 x 125 MiB per step. The mean is over the same batch x
    (seq - 1) targets either way.
    """
    targets = F.pad(labels[:, 1:], (0, 1), value=IGNORE_INDEX)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE_INDEX)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
