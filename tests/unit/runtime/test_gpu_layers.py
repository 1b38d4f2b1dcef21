"""Layers on a GPU (`--gpu-layers`, EDGEKIT_GPU_LAYERS, `LlamaModel(gpu_layers=...)`): read and
checked here on a CPU-only llama.cpp, which ignores them; benchmarks/gpu/ runs them on a GPU."""

from __future__ import annotations

import pytest

from edgekit.runtime import env_gpu_layers


def test_the_environment_variable_is_read_and_a_typo_is_refused(monkeypatch):
    monkeypatch.delenv("EDGEKIT_GPU_LAYERS", raising=False)
    assert env_gpu_layers() is None  # llama.cpp's default: every layer, where there is a GPU
    monkeypatch.setenv("EDGEKIT_GPU_LAYERS", "-1")
    assert env_gpu_layers() == -1
    monkeypatch.setenv("EDGEKIT_GPU_LAYERS", "all")
    with pytest.raises(ValueError, match="EDGEKIT_GPU_LAYERS='all': expected a whole number"):
        env_gpu_layers()
