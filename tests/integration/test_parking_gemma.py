"""More sessions than the target's context holds: `SequenceSlots` parks the least recently used
sequences and loads them back. Its bookkeeping over a fake context here; the real context's state,
bit for bit, in test_gemma_lossless.py (`test_sessions_parked_out_of_the_context_...`)."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.mark.models
@pytest.mark.numerics
def test_a_sequence_parked_past_the_sliding_window_comes_back_exact_after_its_rows_are_rejected(gemma_paths):
    """gemma 3's sliding-window layers see 512 positions; llama.cpp saves a sequence without the
    cells its window no longer sees. A round's rejected rows cut back after loading would leave
    the window short (the logits moved by up to 2.9 at 1,500 tokens before `settle`): settled
    where its next feed starts, a sequence parked at 700 and 1,500 tokens verifies its next block
    bit for bit as one never parked."""
    from edgekit.verifier import Feed, LlamaEngine
    from edgekit.verifier.engine import default_calibration_dir

    engine = LlamaEngine(str(gemma_paths[1]), max_context=1600, n_seq=3, resident=2, max_block=8, threads=1,
                         cache_dir=default_calibration_dir())  # shared with tests/unit/client/test_exact_reopen.py
    try:
        text = "The verifier keeps each session's KV cache between rounds. def f(x): return 2*x\n"
        toks = engine.model.tokenize(text * 80)
        for n in (700, 1500):
            head, block, again = tuple(toks[:n]), tuple(toks[n : n + 5]), tuple(toks[n + 2 : n + 7])
            results = []
            for parked in (False, True):
                for seq in (0, 1, 2):
                    engine.release(seq)
                engine.run_batch([Feed(0, 0, head[:-1], 0)])
                engine.run_batch([Feed(0, n - 1, (head[-1], *block), 6)])  # two of its rows accepted, say
                engine.settle(0, n + 1)
                if parked:
                    engine.slots.place([1, 2])  # both context sequences taken: 0 is parked
                    assert engine.slots.length(0) == n + 1
                (out,) = engine.run_batch([Feed(0, n + 1, (toks[n + 1], *again), 6)])
                results.append(out.copy())
            assert np.array_equal(results[0], results[1]), (n, float(np.abs(results[0] - results[1]).max()))
        assert engine.slots.parks == 2 and engine.slots.loads == 2
    finally:
        engine.close()
