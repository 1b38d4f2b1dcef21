"""Top-k sampling rounds reduced where the logits are made (issue 50, part 3): the engine keeps, of
each row, only the logits that reach its k-th largest (ties kept), and the rules judge the block in
those columns. What the tests may expect: the same verdict as over the whole rows, drawn with the
same generator state, since a top-k sampler's distribution is zero off the kept ids and the rules
read the same numbers in the same order; the one difference is how NumPy sums a row's
probabilities (pairwise, over a longer array with zeros between), which may move the last bit of
a probability, and so a draw, with a chance of the order of 1e-16: not seen in these cases."""

from __future__ import annotations

import numpy as np
import pytest

from edgekit import Sampler
from edgekit.protocol import SparseDistribution, accept_sampling, in_columns
from edgekit.verifier.engine import KeptRows, kept_of


def test_a_row_keeps_what_reaches_its_kth_logit_ties_included_and_nothing_past_within():
    row = np.array([0.5, 3.0, 2.0, 2.0, -1.0, 2.0, 9.0], dtype=np.float32)
    ids, vals = kept_of(row, 2, within=6)  # the 9.0 is past `within`: a padding entry, never kept
    assert ids.tolist() == [1, 2, 3, 5] and vals.tolist() == [3.0, 2.0, 2.0, 2.0]
    kept = KeptRows.of([(ids, vals), (np.array([0, 4]), np.array([1.0, 1.5], dtype=np.float32))])
    assert kept.ids.tolist() == [0, 1, 2, 3, 4, 5]
    assert np.array_equal(kept.logits, [[-np.inf, 3, 2, 2, -np.inf, 2], [1.0, -np.inf, -np.inf, -np.inf, 1.5, -np.inf]])


@pytest.mark.parametrize("settings", [dict(top_k=5, temperature=0.8), dict(top_k=20, temperature=1.3, top_p=0.9),
                                      dict(top_k=3, temperature=0.5, min_p=0.1)])
def test_the_verdict_over_kept_rows_is_the_verdict_over_whole_rows(settings):
    sampler = Sampler(**settings)
    rng = np.random.default_rng(7)
    vocab, k = 300, 4
    for case in range(200):
        logits = (rng.standard_normal((k + 1, vocab)) * 3).astype(np.float32)
        logits[:, rng.integers(vocab, size=5)] = logits.max()  # ties at the top now and then
        # a draft that often proposes the target's likely tokens, sometimes others
        block = [int(np.argsort(-row)[rng.integers(0, 8)]) for row in logits[:k]]
        dists = []
        for tok in block:
            others = rng.choice(vocab, size=6, replace=False)
            ids = np.unique(np.append(others, tok)).astype(np.int32)
            probs = rng.random(ids.size).astype(np.float32) + 0.05
            dists.append(SparseDistribution(ids, (probs / probs.sum()).astype(np.float32)))
        seed = 1000 + case
        whole = accept_sampling(logits, block, dists, sampler, np.random.default_rng(seed))
        kept = KeptRows.of([kept_of(row, sampler.top_k, vocab) for row in logits])
        columns, kept_dists = in_columns(kept.ids, block, dists)
        accepted, at = accept_sampling(kept.logits, columns, kept_dists, sampler, np.random.default_rng(seed))
        assert (accepted, int(kept.ids[at])) == whole, case


def test_a_top_k_sampling_round_asks_the_engine_for_kept_rows_and_a_penalised_one_does_not(monkeypatch):
    from edgekit.testing import ToyEngine, ToyLanguageModel, toy_client

    feeds = []
    run = ToyEngine.run_batch
    monkeypatch.setattr(ToyEngine, "run_batch", lambda self, batch: feeds.extend(batch) or run(self, batch))
    target = ToyLanguageModel(seed=5)
    for settings, keep in ((dict(top_k=6), 6), (dict(top_k=6, repetition_penalty=1.2), 0)):
        feeds.clear()
        # seeded sampling never takes the target-only stream (`_route.may_stream`): the route is speculative
        client = toy_client(target, noise=1.0, mode="sample", temperature=0.9, seed=3, max_tokens=30,
                            stop_at_eos=False, draft_k=4, **settings)
        final = client.generate("kept rows").until_done()
        rounds = [f for f in feeds if f.n_out]
        assert len(final.token_ids) == 30 and rounds
        assert {f.keep for f in rounds} == {keep}  # penalties move logits before the top-k: whole rows
