"""The llama.cpp draft runtime: per-step logits and hidden states, and exact rollback."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.models


@pytest.mark.numerics
def test_each_step_gives_logits_and_hidden_state_and_rollback_is_exact(gemma_draft):
    """Bit for bit on any CPU: a rolled-back step runs the same calls on the same shapes (one row
    on the same cached prefix), and llama.cpp's kernels are deterministic for a given shape and
    thread count; turning hidden states on only copies out the row the logits are computed from."""
    d = gemma_draft
    prompt = d.tokenize("The rain in Spain falls mainly")
    d.truncate(0)
    d.prefill(prompt[:-1])
    first = d.eval(prompt[-1:], hidden=True)
    logits, hidden = first.logits.copy(), first.hidden.copy()
    assert logits.shape == (d.n_vocab,) and hidden.shape == (d.n_embd,) == (640,)
    assert np.isfinite(hidden).all() and np.abs(hidden).max() > 0
    # Two more steps, then roll back to the prompt and step again: same numbers.
    tok = int(np.argmax(logits))
    d.eval([tok], hidden=True)
    d.eval([int(np.argmax(d.eval([tok]).logits))])
    assert d.n_past == len(prompt) + 3
    d.truncate(len(prompt) - 1)
    again = d.eval(prompt[-1:], hidden=True)
    np.testing.assert_array_equal(again.logits, logits)
    np.testing.assert_array_equal(again.hidden, hidden)
    # Hidden states on or off, the logits are the same.
    d.truncate(len(prompt) - 1)
    np.testing.assert_array_equal(d.eval(prompt[-1:], hidden=False).logits, logits)


def test_a_draft_without_room_says_so(gemma_paths):
    from edgekit import LimitExceededError, LlamaDraftModel

    small = LlamaDraftModel(gemma_paths[0], n_ctx=256)
    try:
        small.prefill(list(range(100, 300)))
        with pytest.raises(LimitExceededError, match="draft context full"):
            small.eval(list(range(300, 400)))
    finally:
        small.close()


def test_a_file_that_is_not_a_model_is_refused(tmp_path):
    from edgekit import LlamaDraftModel, ModelLoadError

    bad = tmp_path / "not-a-model.gguf"
    bad.write_bytes(b"GGUF" + bytes(100))
    with pytest.raises(ModelLoadError, match="could not load"):
        LlamaDraftModel(bad)
