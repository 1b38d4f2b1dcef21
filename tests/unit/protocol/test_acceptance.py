"""The acceptance rules, on known numbers.

The statistical tests check the defining property of lossless speculative
sampling: whatever the draft distribution q, the committed tokens are
distributed exactly as the target p. We run the real `accept_sampling` many
times on small vocabularies and compare the empirical joint distribution of the
first two committed tokens with the exact one by a chi-square goodness-of-fit
test at significance 0.001. Seeds are fixed, so a pass is reproducible; an
error in the residual (e.g. resampling from p instead of max(0, p - q), or
comparing against q of the wrong token) shifts these distributions by far more
than the test's resolution (checked below with a deliberately broken rule).
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import chisquare

from edgekit.protocol import (
    Sampler,
    SparseDistribution,
    accept_greedy,
    accept_sampling,
    acceptance_ratios,
    draft_distribution,
)

ALPHA = 1e-3
PLAIN = Sampler()  # softmax at temperature 1


def test_greedy_accepts_prefix_and_corrects_first_mismatch():
    logits = np.full((4, 5), -1.0, dtype=np.float32)
    for row, best in enumerate([2, 3, 0, 4]):
        logits[row, best] = 1.0
    assert accept_greedy(logits, [2, 3, 0]) == (3, 4)  # all accepted, bonus from the last row
    assert accept_greedy(logits, [2, 1, 0]) == (1, 3)  # mismatch at 1: target's argmax there
    assert accept_greedy(logits, [0, 3, 0]) == (0, 2)


def test_draft_distribution_is_renormalised_top_k_softmax():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=1000).astype(np.float32)
    d = draft_distribution(logits, Sampler(temperature=0.7), 16)
    assert d.ids.size == 16 and np.unique(d.ids).size == 16
    assert set(d.ids) == set(np.argsort(logits)[-16:])
    assert d.probs.dtype == np.float32 and abs(float(d.probs.sum()) - 1.0) < 1e-6
    expect = np.exp((logits[d.ids] - logits[d.ids].max()) / 0.7)
    np.testing.assert_allclose(d.probs, expect / expect.sum(), rtol=1e-5)


def _sparse_q(rng: np.random.Generator, vocab: int, support: int) -> SparseDistribution:
    ids = rng.choice(vocab, size=support, replace=False).astype(np.int32)
    probs = rng.dirichlet(np.ones(support)).astype(np.float32)
    probs /= probs.sum(dtype=np.float32)
    return SparseDistribution(ids, probs)


def _chain(vocab: int, seed: int):
    """A toy target and draft whose second position depends on the first token."""
    rng = np.random.default_rng(seed)
    p_logits = {(): rng.normal(0, 1.5, vocab)}
    for x1 in range(vocab):
        p_logits[(x1,)] = rng.normal(0, 1.5, vocab)
        for x2 in range(vocab):
            p_logits[(x1, x2)] = rng.normal(0, 1.5, vocab)
    q = {(): _sparse_q(rng, vocab, vocab - 1)}  # the draft cannot even produce one token
    for x1 in range(vocab):
        q[(x1,)] = _sparse_q(rng, vocab, vocab - 2)
    return p_logits, q


def _speculate(p_logits, q, rng, accept=accept_sampling):
    x1 = q[()].sample(rng)
    x2 = q[(x1,)].sample(rng)
    rows = np.stack([p_logits[()], p_logits[(x1,)], p_logits[(x1, x2)]]).astype(np.float32)
    a, nxt = accept(rows, [x1, x2], [q[()], q[(x1,)]], PLAIN, rng)
    out = [x1, x2][:a] + [nxt]
    if len(out) < 2:  # the round committed one token; the next round starts at position 2
        out.append(SparseDistribution(np.arange(len(rows[0]), dtype=np.int32), _p(p_logits[(out[0],)])).sample(rng))
    return out[0], out[1]


def _p(logits):
    return PLAIN.probs(np.asarray(logits, dtype=np.float32)).astype(np.float32)


def _joint_pvalue(accept, trials: int = 60_000, vocab: int = 5, seed: int = 7) -> float:
    p_logits, q = _chain(vocab, seed)
    rng = np.random.default_rng(seed + 1)
    counts = np.zeros((vocab, vocab))
    for _ in range(trials):
        x1, x2 = _speculate(p_logits, q, rng, accept)
        counts[x1, x2] += 1
    p1 = PLAIN.probs(p_logits[()].astype(np.float32))
    exact = np.array([[p1[a] * PLAIN.probs(p_logits[(a,)].astype(np.float32))[b] for b in range(vocab)]
                      for a in range(vocab)])
    return float(chisquare(counts.ravel(), exact.ravel() * trials).pvalue)


def test_speculative_sampling_commits_tokens_distributed_as_target():
    assert _joint_pvalue(accept_sampling) > ALPHA


def test_the_statistical_test_detects_a_wrong_residual():
    def resample_from_p(rows, draft, dists, sampler, rng):
        # Wrong: on rejection draw from p itself instead of max(0, p - q).
        for i, x in enumerate(draft):
            p = sampler.probs(rows[i])
            if rng.random() * dists[i].prob_of(x) < p[x]:
                continue
            return i, int(rng.choice(p.size, p=p))
        return len(draft), int(rng.choice(rows.shape[1], p=sampler.probs(rows[-1])))

    assert _joint_pvalue(resample_from_p) < ALPHA


@pytest.mark.parametrize("temperature", [0.5, 1.3])
def test_sampling_with_identical_draft_accepts_everything(temperature):
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 50)).astype(np.float32)
    draft = []
    dists = []
    for row in logits[:2]:
        probs = Sampler(temperature=temperature).probs(row).astype(np.float32)
        full = SparseDistribution(np.arange(50, dtype=np.int32), probs)
        dists.append(full)
        draft.append(full.sample(rng))
    accepted = [accept_sampling(logits, draft, dists, Sampler(temperature=temperature), rng)[0] for _ in range(200)]
    # p/q is 1 up to float32 rounding of q: rejection only by rounding, if ever.
    assert sum(a == 2 for a in accepted) >= 198


def test_draft_ids_past_the_targets_logits_have_target_probability_zero():
    """A verifier judges over its target's tokens; a draft whose vocabulary has more padding
    entries may propose one past the logits (ids 5 and 6 here, of q's mass 0.3): never accepted,
    never drawn, and the committed token is still distributed as p (chi-square at 0.001)."""
    vocab, trials = 5, 40_000
    rng = np.random.default_rng(11)
    logits = rng.normal(0, 1.5, (2, vocab)).astype(np.float32)
    q = SparseDistribution(np.array([6, 0, 2, 5, 3], dtype=np.int32),
                           np.array([0.2, 0.3, 0.2, 0.1, 0.2], dtype=np.float32))
    counts = np.zeros(vocab)
    for _ in range(trials):
        x = q.sample(rng)
        accepted, nxt = accept_sampling(logits, [x], [q], Sampler(temperature=1.0), rng)
        if x >= vocab:
            assert accepted == 0
        counts[x if accepted else nxt] += 1
    assert chisquare(counts, PLAIN.probs(logits[0]) * trials).pvalue > ALPHA
    assert accept_greedy(logits, [6]) == (0, int(np.argmax(logits[0])))
    assert acceptance_ratios(logits, [6], [q]).tolist() == [0.0]
