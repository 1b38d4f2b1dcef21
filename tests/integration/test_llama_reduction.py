"""Greedy rows reduced by llama.cpp where they are made (`ServerConfig.reduce_rows`, llama.cpp's
backend sampling): each row's argmax comes back instead of the whole row.

What these tests may expect, and why: the reduction reads the very logits tensor that llama.cpp
copies out for the host (the same decode, the same kernels), so its ids must equal the host's
argmax of the copied rows exactly, in either numerics, wherever a row's largest logit is unique
(asserted: llama.cpp's argmax kernel settles a tie its own way); and a sequence's whole rows
beside the reduced ones stay bit-identical."""

from __future__ import annotations

import math

import numpy as np
import pytest

from edgekit import ServerConfig
from edgekit.errors import ConfigError
from edgekit.runtime import kept_of
from edgekit.verifier import Feed, LlamaEngine
from edgekit.verifier.engine import KeptRows

pytestmark = pytest.mark.models

PROMPT = "def fibonacci(n):\n    '''Return the n-th Fibonacci number.'''\n    if n < 2:\n        return n\n"
TEXTS = [PROMPT, "The capital of France is Paris, and the capital of Italy is Rome.\n",
         "import numpy as np\n\ndef normalize(x):\n    return x / np.linalg.norm(x)\n", "1, 2, 3, 5, 8, 13, 21, 34"]


def test_the_config_names_where_rows_are_reduced():
    assert ServerConfig().reduce_rows == "host"
    with pytest.raises(ConfigError, match="reduce_rows"):
        ServerConfig(reduce_rows="gpu")  # type: ignore[arg-type]


def _engines(gemma_paths, exact: bool) -> list[LlamaEngine]:
    return [LlamaEngine(str(gemma_paths[1]), max_context=256, n_seq=5, max_block=8, exact=exact, reduce_rows=way)
            for way in ("host", "llama")]


def _unique_top(rows: np.ndarray) -> bool:
    top = rows.max(axis=1, keepdims=True)
    return bool(((rows == top).sum(axis=1) == 1).all())


def _run(engine: LlamaEngine) -> list:
    tokens = tuple(engine.model.tokenize(PROMPT))
    head, block = tokens[:-6], tokens[-6:]
    engine.run_batch([Feed(seq, 0, head, 0) for seq in range(5)])
    n = len(block)
    return engine.run_batch([
        Feed(0, len(head), block, n),  # whole rows, beside the reduced ones in the same calls
        Feed(1, len(head), block, n, argmax=engine.n_vocab),
        Feed(2, len(head), block, n, argmax=1000),  # the ids past 1000 never chosen (a target's padding)
        Feed(3, len(head), block, n, keep=20, within=engine.n_vocab),  # a top-k sampler's rows
        Feed(4, len(head), block, n, within=engine.n_vocab, spread=3.0),  # a min-p one's (0.05 at temperature 1)
    ])


@pytest.mark.parametrize("exact", [True, False])
def test_rows_llama_cpp_reduces_name_the_argmax_of_the_whole_rows(gemma_paths, exact):
    host, llama = _engines(gemma_paths, exact)
    try:
        assert llama.reduces_in_llama and not host.reduces_in_llama
        want, got = _run(host), _run(llama)
        full = want[0]
        assert _unique_top(full)
        assert np.array_equal(got[0], full)  # the whole rows, unchanged by the reductions beside them
        assert got[1].tolist() == np.argmax(full, axis=1).tolist() == want[1].tolist()
        # llama.cpp's argmax takes the whole row: where an id past 1000 won it, the feed is decoded
        # again with whole rows, and the best among the first 1000 taken
        assert np.argmax(full, axis=1).max() >= 1000 and llama._redo == [2]
        assert got[2].tolist() == np.argmax(full[:, :1000], axis=1).tolist()
        for cut in (3, 4):
            assert np.array_equal(got[cut].ids, want[cut].ids) and np.array_equal(got[cut].logits, want[cut].logits)
        if exact:  # every sequence's rows bit-identical: the kept ones are the whole rows' own
            for cut, keep, spread in ((3, 20, math.inf), (4, 0, 3.0)):
                whole = KeptRows.of([kept_of(row, keep, llama.n_vocab, spread) for row in full])
                assert np.array_equal(got[cut].ids, whole.ids) and np.array_equal(got[cut].logits, whole.logits)
        assert llama._ctx.reduces(1) and not llama._ctx.reduces(0) and not llama._ctx.reduces(2)
    finally:
        host.close()
        llama.close()


@pytest.mark.parametrize("exact", [False, True])
def test_batches_of_one_shape_but_other_sequences_get_their_own_rows(gemma_paths, exact):
    """Batches alike in shape, each holding other sequences (llama.cpp would reuse the first one's
    graph, whose reductions read the rows where that batch had each sequence's), and sequences
    changing between whole rows (a round with logprobs) and reduced ones: every sequence's ids and
    rows are those of the same batches on a host-reducing engine."""
    host, llama = _engines(gemma_paths, exact)
    try:
        heads = [tuple(host.model.tokenize(t)) for t in TEXTS]
        for e in (host, llama):
            e.run_batch([Feed(s, 0, h[:-5], 0) for s, h in enumerate(heads)])
        for seqs, whole in (((0, 1), ()), ((2, 3), ()), ((1, 2), (2,)), ((3, 0), ()), ((0, 1, 2, 3), (1, 3)),
                            ((1, 0), ()), ((3, 2, 1, 0), ())):
            feeds = [Feed(s, len(heads[s]) - 5, heads[s][-5:], 5, argmax=0 if s in whole else host.n_vocab)
                     for s in seqs]
            want, got = host.run_batch(feeds), llama.run_batch(feeds)
            for s, w, g in zip(seqs, want, got):
                assert np.array_equal(g, w), (seqs, s)
                assert llama._ctx.reduces(s) == (s not in whole)
    finally:
        host.close()
        llama.close()


def test_a_large_calls_reductions_are_split_over_threads_and_name_the_same_ids(gemma_paths, monkeypatch):
    """The host's reductions of a call whose rows are many (a GPU step's) run on a few threads: each
    feed's ids are still the argmax of its whole rows, and its kept logits those of the same calls
    on an engine that reduces them all on its own thread (same model, same batches: the same rows)."""
    # private: the reduction's thresholds set so that this machine takes each path
    from edgekit.verifier.engine import _llama

    plain = LlamaEngine(str(gemma_paths[1]), max_context=256, n_seq=5, max_block=8, exact=False)
    try:
        _, _, _, kept_here, spread_here = _run(plain)
        assert plain._reduce_pool is None
    finally:
        plain.close()
    monkeypatch.setattr(_llama, "SPLIT_REDUCTION_FROM", 0)
    monkeypatch.setattr(_llama, "physical_cores", lambda: 2)
    engine = LlamaEngine(str(gemma_paths[1]), max_context=256, n_seq=5, max_block=8, exact=False)
    try:
        full, best, fewer, kept, spread = _run(engine)
        assert engine._reduce_pool is not None  # the split ran
        assert best.tolist() == np.argmax(full, axis=1).tolist()
        assert fewer.tolist() == np.argmax(full[:, :1000], axis=1).tolist()
        assert np.array_equal(kept.ids, kept_here.ids) and np.array_equal(kept.logits, kept_here.logits)
        assert np.array_equal(spread.ids, spread_here.ids) and np.array_equal(spread.logits, spread_here.logits)
    finally:
        engine.close()


def test_sessions_parked_out_of_the_context_keep_their_own_rows(gemma_paths):
    """More sessions than the context holds (parked and loaded back into whichever context sequence
    is free, that sequence's reduction set for whoever runs there): every session's ids and rows are
    those of the same batches on a host-reducing engine holding all of them."""
    host = LlamaEngine(str(gemma_paths[1]), max_context=256, n_seq=4, max_block=8, exact=False, reduce_rows="host")
    llama = LlamaEngine(str(gemma_paths[1]), max_context=256, n_seq=4, resident=2, max_block=8, exact=False,
                        reduce_rows="llama")
    try:
        heads = [tuple(host.model.tokenize(t)) for t in TEXTS]
        for e in (host, llama):
            for s, h in enumerate(heads):
                e.run_batch([Feed(s, 0, h[:-5], 0)])
        for seqs, whole in (((0, 1), ()), ((2, 3), (3,)), ((1, 2), ()), ((3, 0), ()), ((2, 1), (1,))):
            feeds = [Feed(s, len(heads[s]) - 5, heads[s][-5:], 5, argmax=0 if s in whole else host.n_vocab)
                     for s in seqs]
            want, got = host.run_batch(feeds), llama.run_batch(feeds)
            for s, w, g in zip(seqs, want, got):
                assert np.array_equal(g, w), (seqs, s)
        assert llama.slots.parks > 0 and llama.slots.loads > 0
    finally:
        host.close()
        llama.close()


def test_where_llama_cpp_refuses_a_reduction_the_host_reduces_every_row(gemma_paths):
    """A backend that takes one sequence's reduction and refuses the next (llama.cpp's `set_sampler`
    returning false): the engine takes back what it set and reduces every row itself from then on."""
    host, llama = _engines(gemma_paths, exact=False)
    taken = llama._ctx.reduce_rows
    calls = {"on": 0}

    def first_only(seq: int, on: bool) -> bool:
        if on:
            calls["on"] += 1
            if calls["on"] > 1:
                return False
        return taken(seq, on)

    llama._ctx.reduce_rows = first_only  # type: ignore[method-assign]
    try:
        want, got = _run(host), _run(llama)
        assert calls["on"] == 2 and not llama.reduces_in_llama
        assert not any(llama._ctx.reduces(s) for s in range(4))
        for w, g in zip(want[:3], got[:3]):
            assert np.array_equal(g, w)
    finally:
        host.close()
        llama.close()
