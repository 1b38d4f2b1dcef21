"""Layers on a GPU (`--gpu-layers`, EDGEKIT_GPU_LAYERS, `LlamaModel(gpu_layers=...)`): read and
checked here on a CPU-only llama.cpp, which ignores them; benchmarks/gpu/ runs them on a GPU."""

from __future__ import annotations

import pytest

from edgekit import ServerConfig
from edgekit.runtime import LlamaModel, gpu_offload
from edgekit.verifier import LlamaEngine


@pytest.mark.models
@pytest.mark.skipif(gpu_offload(), reason="this llama.cpp offloads to a GPU (benchmarks/gpu/ checks that build)")
def test_a_cpu_build_loads_whatever_is_asked_and_says_it_offloads_nothing(gemma_paths, monkeypatch):
    _, target = gemma_paths
    monkeypatch.setenv("EDGEKIT_GPU_LAYERS", "0")
    assert LlamaModel(target, vocab_only=True).gpu_layers == 0
    assert LlamaModel(target, vocab_only=True, gpu_layers=-1).gpu_layers == -1  # the argument wins
    engine = LlamaEngine(str(target), max_context=256, n_seq=1, max_block=4, exact=False, gpu_layers=-1)
    try:
        assert ":gpu-layers" not in engine.identity  # nothing offloaded: the CPU's calibrations hold
    finally:
        engine.close()
    assert ServerConfig(gpu_layers=-1).gpu_layers == -1
