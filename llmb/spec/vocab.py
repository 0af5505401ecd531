"""The fixed vocabularies and defaults the command line offers, kept free of torch so `llmb --help` stays instant.

Each is defined here once; the modules that use them (precision, config, distributed, conformance) import them.
"""

from __future__ import annotations

from collections.abc import Container

PRECISIONS = ("FP32", "TF32", "FP16", "BF16")
# The value of --precision that asks for every precision the plugin supports (run, sweep and check-plugin).
ALL_PRECISIONS = "ALL"
# The formats `llmb report` writes (--format; llmb.report renders each).
REPORT_FORMATS = ("md", "html", "csv", "json")
MODES = ("pure", "amp")
SHAPE_FIELDS = (
    "sequence_length",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "vocab_size",
)
# The first-party hardware plugins, each its own distribution in the llmb checkout's plugins/<name> folder
# (tests/test_first_hour.py checks this against the folders): llmb names their install command for an unknown name.
FIRST_PARTY_PLUGINS = ("cuda", "rocm", "xla", "xpu")
PARALLEL = ("ddp", "fsdp", "hsdp")
SCHEDULES = ("gpipe", "1f1b")  # the pipeline schedules llmb.distributed.mesh builds
# `llmb commbench --dtype`: the torch dtypes (by their torch attribute names) that every collective backend reduces.
COMM_DTYPES = ("float32", "float16", "bfloat16", "float64", "int8", "uint8", "int32", "int64")
# How long a collective may wait for a peer before the group fails it: long enough for a slow first step (compile),
# short enough that a rank lost without its process dying (a hung device, a lost node) fails the run, not hangs it.
DEFAULT_TIMEOUT_SECONDS = 600
# The most processes one node starts (--nproc-per-node's bound): a plugin's device count, taken as commbench's default,
# is held to it too, so a plugin that claims a million devices cannot have llmb start a process for each.
MAX_PROCESSES_PER_NODE = 4096
# The largest seed a run takes: torch.manual_seed takes a 64-bit integer, and llmb's seeds are never negative.
SEED_MAX = 2**63 - 1
# Judged windows the clean room replays from the seed (llmb.audit.evidence).
DEFAULT_REPLAY_STEPS = 2
# The probability that the judge replays the whole headline window (losses, digest, AdamW's moments) rather than its
# first DEFAULT_REPLAY_STEPS, drawn after the worker answered for every step (llmb.judge.replay.draw_replay_steps).
DEFAULT_REPLAY_WHOLE = 0.25
# The share of a run's wall time (the judge's clock, from the worker's start, or the run before, to the result) the
# judge's replay may take when the whole window is not drawn: past the first DEFAULT_REPLAY_STEPS, which it always
# replays, it goes on step by step while the whole replay (device bring-up, model copy, every step) fits, to the whole
# window where it affords it (llmb.judge.replay.replay). Issue 24's bound for the checks; until 2026-11-26 it was
# spent on top of the first steps, which took the replay to 14.3% of an AMP run at batch 64 on an H200 (RESULTS.md
# section 27).
DEFAULT_REPLAY_BUDGET = 0.10
# `llmb sweep`'s defaults for the device it runs on, where not given. A CPU trains the tiny preset at hundreds of
# tokens/s (emulated FP16/BF16 several times slower): its many trials must end in minutes, not hours.
SWEEP_DEFAULTS = {"steps": 50, "warmup_steps": 5, "max_batch_size": 1024, "trial_timeout": 600.0}
SWEEP_DEVICE_DEFAULTS = {"cpu": {"steps": 10, "warmup_steps": 2, "max_batch_size": 16, "trial_timeout": 90.0}}
# `llmb peak`'s shape for a device type where --preset is not given (else the official one): the official shape's
# GEMMs take a CPU minutes per precision, many more where FP16/BF16 matmuls are emulated.
PEAK_DEVICE_PRESETS = {"cpu": "tiny"}
# `llmb check-plugin`: the shapes it may use, and its default steps and batch.
CONFORMANCE_PRESETS = ("tiny", "small")
CONFORMANCE_STEPS = 5
CONFORMANCE_BATCH_SIZE = 2


def expand_precision(requested: str, supported: Container[str]) -> tuple[list[str], list[str]]:
    """A --precision value as (the precisions to run, in llmb's order; the precisions the plugin does not support).

    `all` is every precision of PRECISIONS in ``supported`` (the plugin's `precisions()`); any other value is itself,
    upper-cased, and unchecked here (the backend refuses one it lacks). The one `--precision all` expansion: the run,
    the clean room's worker and the sweep all call it.
    """
    if requested.upper() != ALL_PRECISIONS:
        return [requested.upper()], []
    return [p for p in PRECISIONS if p in supported], [p for p in PRECISIONS if p not in supported]
