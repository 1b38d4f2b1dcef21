"""The GPU target where no weights can be downloaded (benchmarks/gpu/make_target.py, issue 51 item 1),
on the CPU as CI runs it: the shapes are the published models', and a toy-sized target written with
gemma's tokenizer, F16 and requantized to Q4_K_M, loads in llama.cpp, serves behind the verifier,
and the gemma draft drafts for it (speculative output equals the target's own: exact numerics)."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.rigs.target_shapes import SHAPES, tensors


@pytest.mark.parametrize("shape, billions", [("qwen2.5-7b", 7.61), ("qwen2.5-14b", 14.7), ("qwen2.5-32b", 32.5)])
def test_each_shape_has_its_models_parameters(shape, billions):
    # the model cards' counts, with Qwen2.5's 152,064-row embedding and untied output
    params = sum(int(np.prod(dims)) for _, dims, _ in tensors(SHAPES[shape], 152_064))
    assert params / 1e9 == pytest.approx(billions, rel=0.01)
