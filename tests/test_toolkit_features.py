"""The shared training features (llmb.toolkit.features) are offered once: the cpu and cuda plugins take their
settings, checks, post-processing and FP8 fact from there (real torch on the CPU; the cuda plugin's post-processing is
device-agnostic, so it runs here without a GPU)."""

from __future__ import annotations

import llmb_cuda
import pytest
import torch

from llmb import CpuBackend
from llmb.model import LlamaModel
from llmb.registry.plugins import resolve_settings
from llmb.spec.presets import build_config
from llmb.toolkit import checkpointing, features

FEATURES = ("compile", "activation_checkpointing", "fp8", "fp8_emulate")


@pytest.mark.parametrize("backend", [CpuBackend(), llmb_cuda.CudaBackend()], ids=["cpu", "cuda"])
def test_each_plugin_declares_the_features_from_the_toolkit(backend):
    shared = {s.name: s for s in features.settings()}
    declared = {s.name: s for s in backend.settings()}
    for name in FEATURES:
        assert declared[name].help == shared[name].help, name  # one text, the toolkit's
    assert declared["activation_checkpointing"].choices == checkpointing.MODES
    assert set(declared["compile"].choices) <= set(features.COMPILE_MODES)


def test_plugins_keep_their_own_defaults():
    cpu = resolve_settings(CpuBackend(), {})
    assert cpu["compile"] == "none" and cpu["fp8_emulate"] is True
    cuda = resolve_settings(llmb_cuda.CudaBackend(), {})
    assert cuda["compile"] == "default" and cuda["fp8_emulate"] is False
    assert "reduce-overhead" not in {c for s in CpuBackend().settings() if s.name == "compile" for c in s.choices}


@pytest.mark.parametrize("backend", [CpuBackend(), llmb_cuda.CudaBackend()], ids=["cpu", "cuda"])
def test_post_processing_is_the_toolkits(backend):
    torch.manual_seed(0)
    model = LlamaModel(build_config("tiny", num_hidden_layers=2))
    values = {**resolve_settings(backend, {}), "compile": "none"}
    assert backend.process_model(model, None, torch.device("cpu"), "FP32", values) is model
    wrapped = backend.process_model(
        model, None, torch.device("cpu"), "FP32", {**values, "activation_checkpointing": "full"}
    )
    assert all(isinstance(layer, checkpointing.CheckpointedLayer) for layer in wrapped.layers)


def test_the_fp8_fact_is_one_name_for_every_plugin():
    for backend in (CpuBackend(), llmb_cuda.CudaBackend()):
        values = {**resolve_settings(backend, {}), "fp8": "rowwise"}
        facts = {f.name: f for f in backend.precision_facts(torch.device("cpu"), "BF16", values)}
        assert facts[features.FP8_FACT].value == "rowwise" and facts[features.FP8_FACT].implies == "FP8"
    assert features.facts({"fp8": "none"})[0].implies is None


def test_a_subclass_that_declares_its_own_settings_gets_the_features_off():
    """llmb.CpuBackend is public for plugins whose hardware also runs on the host: a subclass that declares only its
    own settings (tests/llmb_oomtest.py does) sets up and post-processes with every feature off, never a KeyError."""

    class OwnSettings(CpuBackend):
        name = "own"

        def settings(self):
            return []

    torch.manual_seed(0)
    model = LlamaModel(build_config("tiny", num_hidden_layers=2))
    backend = OwnSettings()
    backend.setup(torch.device("cpu"), "FP32", {"threads": 1})
    assert backend.process_model(model, None, torch.device("cpu"), "FP32", {}) is model
    assert backend.precision_facts(torch.device("cpu"), "FP32", {})[0].implies is None
