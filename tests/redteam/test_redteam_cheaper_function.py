"""Red team: a cheaper function on the model instance, where no identity changes. The plugin's `process_model`
replaces each attention module's forward (the instance's, not the class's: the guard sees no torch or llmb object
replaced) with block-local attention, every token attending within its quarter of the sequence only, a quarter of
the attention's work. The dispatch record sees the same SDPA operator in FP32. Stage: run; reason: "replay: step 1:
recorded loss", on every draw: the first steps are always replayed, and in FP32 the loss moves by ~2e-3 against 1e-6.

In pure BF16 the same attention over halves of the sequence moves the first loss by 2.1e-3, inside the 3e-3 row,
and AdamW's moments by 0.047-0.20 of their sums of squares against 0.1 (the digests' error is a norm over the
parameters, which the embedding and the head outweigh), so it passed the whole-window replay at the tiny shape on
some draws; projected onto the judge's random directions its moments part by 0.56-0.88 (2026-11-27): the
whole-window replay catches it, the prefix replay does not (docs/integrity.md, residual risks)."""

from redteam_kit import assert_caught_by_directions, install, reasons, run

BLOCK_LOCAL_INSTANCES = """
import types

import torch
import torch.nn.functional as F

from llmb.model import apply_rotary


def _block_local(self, x, cos, sin):
    batch, length, _ = x.shape
    heads = (batch, length, self.num_heads, self.head_dim)
    q, k, v = (proj(x).view(heads).transpose(1, 2) for proj in (self.q_proj, self.k_proj, self.v_proj))
    q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
    block = max(1, length // 4)
    out = torch.cat(
        [
            F.scaled_dot_product_attention(
                q[..., i : i + block, :], k[..., i : i + block, :], v[..., i : i + block, :], is_causal=True
            )
            for i in range(0, length, block)
        ],
        dim=-2,
    )
    return self.o_proj(out.transpose(1, 2).reshape(batch, length, -1))


def _process_model(model, optimizer, device, precision, settings):
    for layer in model.layers:
        layer.self_attn.forward = types.MethodType(_block_local, layer.self_attn)
    return model
"""


def test_block_local_attention_on_the_instances_fails_the_replay_of_the_first_step(tmp_path):
    site = install(tmp_path / "site", "localattention", BLOCK_LOCAL_INSTANCES)
    args = ["--plugin", "localattention", "--precision", "FP32", "--replay-whole", "0", "--replay-budget", "0"]
    proc, record = run(site, tmp_path, *args)
    assert record is not None, proc.stderr[-2000:]
    assert not reasons(record, "identity"), record["invalid_reasons"]  # no object replaced: the guard is silent
    assert record["precision"]["effective"] == "FP32"
    assert reasons(record, "replay: step 1: recorded loss"), record["invalid_reasons"]


def test_block_local_attention_over_halves_in_pure_bf16_fails_the_moments_directions(tmp_path):
    halves = BLOCK_LOCAL_INSTANCES.replace("length // 4", "length // 2")
    site = install(tmp_path / "site", "halfattention", halves)
    args = ["--plugin", "halfattention", "--precision", "BF16", "--batch-size", "4", "--steps", "5"]
    args += ["--replay-whole", "1"]
    assert_caught_by_directions(*run(site, tmp_path, *args))
