"""Top-k and min-p sampling rounds reduced where the logits are made (issue 50, part 3): the engine
keeps, of each row, only the logits that reach its k-th largest (ties kept) and its largest less
min-p's spread, and the rules judge the block in those columns. What the tests may expect: the same
verdict as over the whole rows, drawn with the same generator state, since a top-k or min-p sampler's
distribution is zero off the kept ids and the rules read the same numbers in the same order; the one
difference is how NumPy sums a row's probabilities (pairwise, over a longer array with zeros
between), which may move the last bit of a probability, and so a draw, with a chance of the order of
1e-16: not seen in these cases."""

from __future__ import annotations

import math

import numpy as np
import pytest

from edgekit import Sampler
from edgekit.protocol import SparseDistribution, accept_sampling, in_columns
from edgekit.runtime import KERNEL, available_kernels, kept_of, kept_rows, use_kernel
from edgekit.verifier.engine import KeptRows


@pytest.fixture(params=available_kernels() or ["numpy"])
def each_kernel(request):
    """Each compiled kernel this CPU runs in turn (its pass over the blocks differs by instruction
    set), then the best again; numpy's path alone where none is built."""
    if request.param != "numpy":
        use_kernel(request.param)
    yield request.param
    if request.param != "numpy":
        use_kernel(KERNEL)


def test_a_row_keeps_what_reaches_its_kth_logit_ties_included_and_nothing_past_within():
    row = np.array([0.5, 3.0, 2.0, 2.0, -1.0, 2.0, 9.0], dtype=np.float32)
    ids, vals = kept_of(row, 2, within=6)  # the 9.0 is past `within`: a padding entry, never kept
    assert ids.tolist() == [1, 2, 3, 5] and vals.tolist() == [3.0, 2.0, 2.0, 2.0]
    # min-p's cut: within `spread` of the largest (2.0 is 3.0 less 1.0: on the floor, kept), alone and with top-k
    assert kept_of(row, 0, within=6, spread=1.0)[0].tolist() == [1, 2, 3, 5]
    assert kept_of(row, 0, within=6, spread=0.5)[0].tolist() == [1]
    assert kept_of(row, 1, within=6, spread=1.0)[0].tolist() == [1]
    assert kept_of(row, 4, within=6, spread=4.0)[0].tolist() == [1, 2, 3, 5]
    with pytest.raises(ValueError, match="one of them must cut"):
        kept_of(row, 0, within=6)
    kept = KeptRows.of([(ids, vals), (np.array([0, 4]), np.array([1.0, 1.5], dtype=np.float32))])
    assert kept.ids.tolist() == [0, 1, 2, 3, 4, 5]
    assert np.array_equal(kept.logits, [[-np.inf, 3, 2, 2, -np.inf, 2], [1.0, -np.inf, -np.inf, -np.inf, 1.5, -np.inf]])


def _rows(rng: np.random.Generator, kind: str, m: int, n: int) -> np.ndarray:
    rows = (rng.standard_normal((m, n)) * 3).astype(np.float32)
    if kind == "ties":
        rows = np.round(rows).astype(np.float32)  # a dozen distinct values: ties at every k, and among blocks' maxima
    elif kind == "masked":
        rows[:, rng.random(n) < 0.3] = -np.inf  # masked entries, some rows' k-th among them
    elif kind == "mostly masked":
        rows[:, rng.random(n) < 0.97] = -np.inf  # whole blocks of -inf: the k-th block maximum may be -inf
    elif kind == "ascending":
        rows.sort(axis=1)  # every block's maximum enters the heap: the kernel's slowest order
    elif kind == "constant":
        rows[:] = 1.5
    return rows


@pytest.mark.parametrize("kind", ["normal", "ties", "masked", "mostly masked", "ascending", "constant"])
@pytest.mark.parametrize("spread", [math.inf, 0.0, 0.5, 3.0, 40.0])
def test_kept_rows_of_a_batch_are_each_rows_kept_of(kind, spread, each_kernel):
    """Each kernel (where it is built) against numpy's partition: the same ids and logits for
    any keep (none where a spread cuts, 1, past the number of blocks, past `within`), any
    spread (none, the top's ties only, a few blocks', every value), any `within`, rows of any length."""
    rng = np.random.default_rng(3)
    for case in range(60):
        m, n = int(rng.integers(1, 6)), int(rng.integers(1, 2_000))
        keeps = [1, 2, 40, 1 + n // 2, n, n + 7] + ([0, 0] if spread < math.inf else [])
        within, keep = int(rng.integers(1, n + 1)), int(rng.choice(keeps))
        rows = _rows(rng, kind, m, n)
        got = kept_rows(rows, keep, within, spread)
        assert len(got) == m
        for r, (ids, vals) in enumerate(got):
            want = kept_of(rows[r], keep, within, spread)
            assert ids.dtype == np.int64 and vals.dtype == np.float32
            assert ids.tolist() == want[0].tolist() and np.array_equal(vals, want[1]), (kind, case, r)


@pytest.mark.parametrize("kind", ["normal", "ties", "masked"])
def test_a_spreads_floor_keeps_exactly_the_logits_within_it_in_float64(kind, each_kernel):
    """The floor against its definition in float64: the logits whose float64 value reaches the largest
    less `spread`, no more (a floor between two float32s is not rounded down onto the lower one)."""
    rng = np.random.default_rng(11)
    rows = [np.array([1.0, 0.7, 0.7, -2.0], dtype=np.float32)]
    spreads = [1.0 - float(np.float32(0.7)) - 1e-12]  # the floor just above 0.7's float32: cut, not kept
    for _ in range(200):
        n = int(rng.integers(1, 3_000))
        rows.append(_rows(rng, kind, 1, n)[0] * np.float32(rng.choice([0.01, 1.0, 30.0])))
        spreads.append(float(rng.choice([0.0, rng.random() * 5, 1e-7])))
    for case, (row, spread) in enumerate(zip(rows, spreads, strict=True)):
        want = np.flatnonzero(row.astype(np.float64) >= float(row.max()) - spread).tolist()
        assert kept_of(row, 0, row.size, spread)[0].tolist() == want, case
        assert kept_rows(row[None, :], 0, row.size, spread)[0][0].tolist() == want, case
    assert kept_of(rows[0], 0, 4, spreads[0])[0].tolist() == [0]


@pytest.mark.parametrize("temperature", [0.05, 0.7, 1.0, 2.5])
@pytest.mark.parametrize("min_p", [1e-4, 0.05, 0.3, 0.9])
def test_a_min_p_samplers_support_lies_within_its_cut_and_the_cut_keeps_little_more(temperature, min_p):
    """`Sampler.support_cut`: every token the sampler gives p > 0 (its own float64 test) is kept,
    at the edge too (logits placed on the exact boundary), and what else is kept lies within 1e-4
    of the boundary."""
    sampler = Sampler(temperature=temperature, min_p=min_p)
    keep, spread = sampler.support_cut()
    assert keep == 0 and spread > -temperature * math.log(min_p)
    rng = np.random.default_rng(5)
    edge = -temperature * math.log(min_p)
    for case in range(40):
        row = (rng.standard_normal(5_000) * 4).astype(np.float32)
        top = float(row.max())
        row[rng.integers(5_000, size=8)] = np.float32(top - edge)  # on min-p's boundary, give or take rounding
        ids, _ = kept_of(row, keep, row.size, spread)
        support = np.flatnonzero(sampler.probs(row) > 0)
        assert set(support.tolist()) <= set(ids.tolist()), case
        extra = np.setdiff1d(ids, support)
        assert np.all(row[extra].astype(np.float64) >= top - edge - 1e-4 * (1 + edge)), case


def test_kept_rows_of_a_vocabulary_sized_batch_and_a_row_with_a_nan(each_kernel):
    rng = np.random.default_rng(4)
    rows = _rows(rng, "normal", 8, 152_064)
    rows[3, rng.integers(152_064, size=40)] = rows.max()  # a tie at the top of one row
    # top-k alone; min-p alone (0.05 at temperature 1, and at 4: thousands kept); both
    for keep, spread in ((1, math.inf), (40, math.inf), (1_000, math.inf), (0, 3.0), (0, 12.0), (40, 3.0)):
        got = kept_rows(rows, keep, 151_000, spread)  # the ids past `within` (a target's padding) never kept
        for r, (ids, vals) in enumerate(got):
            want = kept_of(rows[r], keep, 151_000, spread)
            assert ids.tolist() == want[0].tolist() and np.array_equal(vals, want[1]), (keep, r)
    rows[5, 77] = np.nan  # numpy orders a NaN above every value; the kernel refuses the call, numpy answers
    for keep, spread in ((40, math.inf), (0, 3.0)):
        for r, (ids, vals) in enumerate(kept_rows(rows, keep, 152_064, spread)):
            want = kept_of(rows[r], keep, 152_064, spread)
            assert ids.tolist() == want[0].tolist() and np.array_equal(vals, want[1], equal_nan=True)
    with pytest.raises(ValueError, match="keep"):
        kept_rows(rows, 0, 100)
    with pytest.raises(ValueError, match="spread"):
        kept_rows(rows, 40, 100, -1.0)


@pytest.mark.skipif(KERNEL == "numpy", reason="the kernel is not built here")
def test_the_kernels_kept_answers_rows_one_after_another_and_refuses_what_it_cannot_read():
    from edgekit.runtime import _logitstats  # private: the compiled kernel itself, against numpy

    rows = np.array([[0.5, 3.0, 2.0, 2.0, -1.0, 2.0, 9.0], [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]], dtype=np.float32)
    ids, vals, counts = _logitstats.kept(rows, 2, 6, math.inf)  # the 9.0 is past `within`
    assert np.frombuffer(counts, np.int64).tolist() == [4, 6]
    assert np.frombuffer(ids, np.int64).tolist() == [1, 2, 3, 5, 0, 1, 2, 3, 4, 5]
    assert np.frombuffer(vals, np.float32).tolist() == [3, 2, 2, 2, 1, 1, 1, 1, 1, 1]
    ids, vals, counts = _logitstats.kept(rows, 0, 6, 0.5)  # min-p's cut alone: 3.0's row keeps it alone
    assert np.frombuffer(counts, np.int64).tolist() == [1, 6]
    assert np.frombuffer(ids, np.int64).tolist() == [1, 0, 1, 2, 3, 4, 5]
    rows[1, 3] = np.nan
    assert _logitstats.kept(rows, 2, 6, math.inf) is None
    with pytest.raises(ValueError, match="2-d float32"):
        _logitstats.kept(rows.astype(np.float64), 2, 6, math.inf)
    with pytest.raises(ValueError, match="within"):
        _logitstats.kept(rows, 2, 8, math.inf)
    for keep, spread in ((0, math.inf), (-1, 1.0), (2, -0.5), (2, math.nan)):
        with pytest.raises(ValueError, match="keep"):
            _logitstats.kept(rows, keep, 6, spread)


@pytest.mark.parametrize("settings", [dict(top_k=5, temperature=0.8), dict(top_k=20, temperature=1.3, top_p=0.9),
                                      dict(top_k=3, temperature=0.5, min_p=0.1),
                                      dict(temperature=0.8, min_p=0.05), dict(temperature=1.5, min_p=0.02, top_p=0.9)])
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
        keep, spread = sampler.support_cut()
        kept = KeptRows.of([kept_of(row, keep, vocab, spread) for row in logits])
        columns, kept_dists = in_columns(kept.ids, block, dists)
        accepted, at = accept_sampling(kept.logits, columns, kept_dists, sampler, np.random.default_rng(seed))
        assert (accepted, int(kept.ids[at])) == whole, case


def test_a_top_k_or_min_p_round_asks_the_engine_for_kept_rows_and_a_penalised_or_top_p_one_does_not(monkeypatch):
    from edgekit.testing import ToyEngine, ToyLanguageModel, toy_client

    feeds = []
    run = ToyEngine.run_batch
    monkeypatch.setattr(ToyEngine, "run_batch", lambda self, batch: feeds.extend(batch) or run(self, batch))
    target = ToyLanguageModel(seed=5)
    # the session's sampler, as the wire carries it (the temperature a float32, min_p a double)
    min_p = Sampler(temperature=float(np.float32(0.9)), min_p=0.1).support_cut()[1]
    for settings, keep, spread in ((dict(top_k=6), 6, math.inf), (dict(min_p=0.1), 0, min_p),
                                   (dict(top_k=6, repetition_penalty=1.2), 0, math.inf),
                                   (dict(top_p=0.8), 0, math.inf)):
        feeds.clear()
        # seeded sampling never takes the target-only stream (`_route.may_stream`): the route is speculative
        client = toy_client(target, noise=1.0, mode="sample", temperature=0.9, seed=3, max_tokens=30,
                            stop_at_eos=False, draft_k=4, **settings)
        final = client.generate("kept rows").until_done()
        rounds = [f for f in feeds if f.n_out]
        assert len(final.token_ids) == 30 and rounds
        # penalties move logits before the cut, and top-p's edge needs the whole row's mass: whole rows
        assert {(f.keep, f.spread) for f in rounds} == {(keep, spread)}


@pytest.mark.parametrize("settings, reduced", [
    (dict(mode="greedy"), "argmax"),
    (dict(mode="sample", temperature=0.9, top_k=6), "keep"),
    (dict(mode="sample", temperature=1.3, top_k=20, top_p=0.8, min_p=0.05), "keep"),
    (dict(mode="sample", temperature=0.9, min_p=0.08), "keep"),  # min-p alone: its spread cuts
    (dict(mode="sample", temperature=1.2, min_p=0.05, top_p=0.9), "keep"),
    (dict(mode="sample", temperature=0.9, top_k=6, repetition_penalty=1.2), None),  # penalties: whole rows
    (dict(mode="sample", temperature=0.9), None),  # no top-k or min-p: no cut to keep to
    (dict(mode="sample", temperature=0.9, top_p=0.8), None),  # top-p's edge: the whole row's mass
])
def test_a_target_only_stream_reduces_its_rows_where_they_are_made_and_draws_the_same_tokens(
        monkeypatch, settings, reduced):
    """The target-only stream (Generate) asks the engine for best ids (greedy) or kept rows (top-k, min-p),
    as rounds do, and streams what it streamed over whole rows: a stream asking for logprobs takes
    whole rows (it reports them), so the two are compared with one seed. The same tokens, not only
    the same distribution: over kept rows the sampler's probabilities are the whole row's floats
    where they are not zero, in the same order, and the draw reads one uniform against their sums."""
    from edgekit.protocol import GenerateRequest
    from edgekit.testing import ToyEngine, ToyLanguageModel, toy_verifier

    feeds = []
    run = ToyEngine.run_batch
    monkeypatch.setattr(ToyEngine, "run_batch", lambda self, batch: feeds.extend(batch) or run(self, batch))
    mode = settings.pop("mode")
    sampler = Sampler(**settings) if settings else Sampler(temperature=0.0)
    service = toy_verifier(ToyLanguageModel(vocab_size=300, seed=9)).service
    for seed in range(6):
        ask = dict(prompt_tokens=[5, 6, 7 + seed], mode=mode, seed=seed, max_tokens=40, sampler=sampler)
        feeds.clear()
        plain = [t.token for t in service.baseline.generate(GenerateRequest(**ask))]
        steps = [f for f in feeds if f.n_out]
        assert len(plain) == 40 == len(steps)
        assert all(bool(f.argmax) == (reduced == "argmax") and f.cuts == (reduced == "keep") for f in steps)
        feeds.clear()
        whole = [t.token for t in service.baseline.generate(GenerateRequest(**ask, logprobs=0))]
        assert not any(f.argmax or f.cuts for f in feeds)
        assert plain == whole, seed
