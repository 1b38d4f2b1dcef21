"""The sampler (`edgekit.Sampler`): each setting on known numbers, the order of operations, the
wire, and speculative sampling with it staying exactly the sampler's distribution.

The statistical test is the one of tests/unit/protocol/test_acceptance.py (chi-square at significance 0.001 of
the joint distribution of the first two committed tokens against the exact one, seeds fixed),
here with a sampler whose penalties read the context, so the second position's distribution
depends on the first token through the penalties as well as the model."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import chisquare

from edgekit import ConfigError, GenerationConfig, Sampler
from edgekit.errors import ProtocolError
from edgekit.protocol import (
    SparseDistribution,
    accept_sampling,
    draft_distribution,
    pb,
    sampler_from_pb,
    sampling_to_pb,
)

ALPHA = 1e-3


def _softmax(z):
    z = np.asarray(z, dtype=np.float64)
    w = np.exp(z - z.max())
    return w / w.sum()


def test_the_defaults_are_a_plain_softmax():
    logits = np.array([1.0, 2.0, 0.5, -1.0], dtype=np.float32)
    np.testing.assert_allclose(Sampler().probs(logits), _softmax(logits), rtol=1e-12)
    np.testing.assert_allclose(Sampler(temperature=0.5).probs(logits), _softmax(logits / 0.5), rtol=1e-12)
    assert Sampler().features() == () and not Sampler().adjusts


def test_each_truncation_keeps_what_it_says():
    logits = np.log(np.array([0.4, 0.3, 0.15, 0.1, 0.05])).astype(np.float32)
    kept = lambda s: np.flatnonzero(s.probs(logits)).tolist()  # noqa: E731
    assert kept(Sampler(top_k=2)) == [0, 1]
    assert kept(Sampler(top_p=0.7)) == [0, 1]  # 0.4 + 0.3 reaches 0.7
    assert kept(Sampler(top_p=0.71)) == [0, 1, 2]
    assert kept(Sampler(min_p=0.3)) == [0, 1, 2]  # p >= 0.3 * 0.4 = 0.12
    assert kept(Sampler(min_p=0.3, top_k=1)) == [0]
    # top_p comes last, over what top_k kept: renormalised 0.4/0.7 = 0.57 alone does not reach 0.6
    assert kept(Sampler(top_k=2, top_p=0.6)) == [0, 1]
    p = Sampler(top_k=3).probs(logits)
    np.testing.assert_allclose(p[:3], np.array([0.4, 0.3, 0.15]) / 0.85, rtol=1e-6)


def test_temperature_comes_before_the_truncations():
    logits = np.log(np.array([0.5, 0.3, 0.2])).astype(np.float32)
    # at T = 1, min_p 0.5 keeps p >= 0.25: two tokens; at T = 0.5 the second has 0.09/0.25 of the first's
    assert np.count_nonzero(Sampler(min_p=0.5).probs(logits)) == 2
    assert np.count_nonzero(Sampler(min_p=0.5, temperature=0.5).probs(logits)) == 1


def test_penalties_follow_llama_cpp_and_openai():
    logits = np.array([2.0, -1.0, 0.5, 1.0], dtype=np.float32)
    context = [0, 1, 1, 3]
    z = Sampler(repetition_penalty=2.0).adjusted(logits, context)
    np.testing.assert_allclose(z, [1.0, -2.0, 0.5, 0.5])  # positive halved, negative doubled, unseen kept
    z = Sampler(frequency_penalty=0.5, presence_penalty=0.25).adjusted(logits, context)
    np.testing.assert_allclose(z, [2.0 - 0.75, -1.0 - 1.25, 0.5, 1.0 - 0.75])
    # only the last penalty_last_n tokens count; -1: all of them; 0: none
    np.testing.assert_allclose(Sampler(presence_penalty=1.0, penalty_last_n=1).adjusted(logits, context),
                               [2.0, -1.0, 0.5, 0.0])
    np.testing.assert_allclose(Sampler(presence_penalty=1.0, penalty_last_n=-1).adjusted(logits, context),
                               [1.0, -2.0, 0.5, 0.0])
    assert Sampler(presence_penalty=1.0, penalty_last_n=0).adjusted(logits, context) is logits


def test_bias_before_penalties_and_greedy_after_both():
    logits = np.array([3.0, 2.5, 0.0], dtype=np.float32)
    s = Sampler(temperature=0.0, repetition_penalty=1.5, logit_bias={2: 1.0})
    np.testing.assert_allclose(s.adjusted(logits, [0]), [2.0, 2.5, 1.0])
    assert s.best(logits, [0]) == 1  # the penalty moved the argmax
    assert s.best(logits, []) == 0
    assert s.probs(logits, [0]).tolist() == [0.0, 1.0, 0.0]
    # a row per block position: row j reads the context and the block's first j tokens
    rows = np.stack([logits, logits])
    assert s.best_of_rows(rows, [], [0]) == [0, 1]


def test_a_large_vocabulary_cuts_as_a_full_sort_would():
    rng = np.random.default_rng(3)
    logits = (rng.normal(size=200_000) * 3).astype(np.float32)
    full = Sampler().probs(logits)
    order = np.lexsort((np.arange(full.size), -full))
    for top_p in (0.05, 0.5, 0.9, 0.999):
        n = int(np.searchsorted(np.cumsum(full[order]), top_p)) + 1
        assert set(np.flatnonzero(Sampler(top_p=top_p).probs(logits))) == set(order[:n].tolist())
    for k in (1, 40, 5000):  # the k highest, and any equal of the k-th (float32 logits tie): the cut is by value
        kth = np.sort(logits)[-k]
        assert set(np.flatnonzero(Sampler(top_k=k).probs(logits))) == set(np.flatnonzero(logits >= kth).tolist())


@pytest.mark.parametrize("bad", [dict(temperature=-1), dict(top_k=-1), dict(top_p=0.0), dict(top_p=1.5),
                                 dict(min_p=1.0), dict(repetition_penalty=0.0), dict(frequency_penalty=3.0),
                                 dict(penalty_last_n=-2), dict(logit_bias={-1: 1.0}), dict(logit_bias={5: 1e9}),
                                 dict(top_p=math.nan)])
def test_settings_out_of_range_are_refused_by_name(bad):
    with pytest.raises(ValueError) as e:
        Sampler(**bad)
    name = next(iter(bad)).split("_")[0]
    assert name in str(e.value) or "finite" in str(e.value)
    with pytest.raises(ConfigError):
        GenerationConfig(mode="sample", **bad)


def test_the_generation_config_builds_the_sampler_of_its_mode():
    assert GenerationConfig(mode="greedy", temperature=0.8, top_p=0.5).sampler().greedy
    sampled = GenerationConfig(mode="sample", temperature=0.7, top_p=0.9, draft_temperature=1.2)
    assert sampled.sampler() == Sampler(temperature=0.7, top_p=0.9)
    assert sampled.draft_sampler() == Sampler(temperature=1.2, top_p=0.9)
    with pytest.raises(ConfigError, match="semantic"):
        GenerationConfig(mode="semantic", upload="fh", repetition_penalty=1.1)


def test_the_wire_carries_every_setting_and_refuses_what_is_out_of_range():
    s = Sampler(temperature=0.5, top_k=20, top_p=0.9, min_p=0.05, repetition_penalty=1.1, frequency_penalty=0.2,
                presence_penalty=-0.1, penalty_last_n=-1, logit_bias={7: -2.5, 3: 1.0})
    back = sampler_from_pb(pb.SamplingParams.FromString(sampling_to_pb("sample", s, 1).SerializeToString()))
    assert back == Sampler(**{**s.__dict__, "temperature": float(np.float32(0.5))})
    # greedy reads temperature 0 whatever was sent; an old client's zeros mean "off"
    assert sampler_from_pb(pb.SamplingParams(mode=pb.ACCEPTANCE_MODE_GREEDY, temperature=1.0)) == Sampler(temperature=0)
    with pytest.raises(ProtocolError, match="top_p"):
        sampler_from_pb(pb.SamplingParams(mode=pb.ACCEPTANCE_MODE_SAMPLING, temperature=1.0, top_p=1.5))


def test_a_draft_distribution_is_the_samplers_cut_to_its_support():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=1000).astype(np.float32)
    s = Sampler(temperature=0.7, min_p=0.2, repetition_penalty=1.3)
    context = np.argsort(-logits)[:3].tolist()  # the three likeliest were seen: the penalty reorders
    d = draft_distribution(logits, s, 16, context)
    p = s.probs(logits, context)
    assert set(d.ids.tolist()) <= set(np.flatnonzero(p).tolist()) and d.ids.size <= 16
    assert abs(float(d.probs.sum()) - 1.0) < 1e-6
    np.testing.assert_allclose(d.probs, p[d.ids] / p[d.ids].sum(), rtol=1e-5)


# -- lossless: speculative sampling with the sampler is distributed as the sampler ---------------

def _model(vocab: int, seed: int):
    """Toy target and draft logits for each prefix of up to two tokens."""
    rng = np.random.default_rng(seed)
    target = {(): rng.normal(size=vocab) * 1.5}
    draft = {(): target[()] + rng.normal(size=vocab)}
    for a in range(vocab):
        target[(a,)] = rng.normal(size=vocab) * 1.5
        draft[(a,)] = target[(a,)] + rng.normal(size=vocab)
        for b in range(vocab):
            target[(a, b)] = rng.normal(size=vocab)
    return {k: v.astype(np.float32) for k, v in target.items()}, {k: v.astype(np.float32) for k, v in draft.items()}


SAMPLERS = {
    "top_k": Sampler(top_k=3),
    "top_p": Sampler(top_p=0.7),
    "min_p": Sampler(min_p=0.2, temperature=0.8),
    "penalties": Sampler(repetition_penalty=1.8, frequency_penalty=0.4, presence_penalty=0.3),
    "logit_bias": Sampler(logit_bias={1: 1.5, 4: -3.0}),
    "combined": Sampler(temperature=0.7, top_k=5, top_p=0.9, min_p=0.05, repetition_penalty=1.5,
                        presence_penalty=0.2, logit_bias={2: 0.5}),
}


@pytest.mark.parametrize("name", list(SAMPLERS))
def test_speculative_sampling_commits_the_samplers_distribution(name):
    sampler = SAMPLERS[name]
    vocab, trials, context = 6, 25_000, [2, 2, 5]  # the prompt's tokens: the penalties read them
    target, draft = _model(vocab, seed=11)
    # the draft samples at another temperature, without the truncations: far from the target's
    draft_sampler = Sampler(temperature=1.3, repetition_penalty=sampler.repetition_penalty)
    rng = np.random.default_rng(5)
    counts = np.zeros((vocab, vocab))
    for _ in range(trials):
        q1 = draft_distribution(draft[()], draft_sampler, vocab, context)
        x1 = q1.sample(rng)
        q2 = draft_distribution(draft[(x1,)], draft_sampler, vocab, [*context, x1])
        x2 = q2.sample(rng)
        rows = np.stack([target[()], target[(x1,)], target[(x1, x2)]])
        a, nxt = accept_sampling(rows, [x1, x2], [q1, q2], sampler, rng, context)
        out = [x1, x2][:a] + [nxt]
        if len(out) < 2:  # one token committed: the next round's first is drawn from the sampler there
            p = sampler.probs(target[(out[0],)], [*context, out[0]])
            out.append(SparseDistribution(np.arange(vocab, dtype=np.int32), p.astype(np.float32)).sample(rng))
        counts[out[0], out[1]] += 1
    p1 = sampler.probs(target[()], context)
    exact = np.array([[p1[a] * sampler.probs(target[(a,)], [*context, a])[b] for b in range(vocab)]
                      for a in range(vocab)])
    seen = exact.ravel() > 0
    assert counts.ravel()[~seen].sum() == 0, "a token the sampler cuts was committed"
    assert chisquare(counts.ravel()[seen], exact.ravel()[seen] * trials).pvalue > ALPHA


ACCEPTS_SAMPLERS = [
    Sampler(), Sampler(temperature=0.6), Sampler(temperature=1.7, min_p=0.02), Sampler(top_k=50),
    Sampler(top_k=9000), Sampler(temperature=0.8, top_k=40, min_p=0.05),
    Sampler(repetition_penalty=1.3, frequency_penalty=0.4, logit_bias={5: 4.0, 17: -100.0}),
    Sampler(top_p=0.9), Sampler(temperature=0.7, top_p=0.5), Sampler(top_k=200, top_p=0.95, min_p=0.001),
    Sampler(temperature=0.0),
]


def _named(sampler: Sampler) -> str:
    return ",".join(f"{k}={v}" for k, v in sampler.describe().items())


@pytest.mark.parametrize("sampler", ACCEPTS_SAMPLERS, ids=_named)
def test_accepts_decides_as_the_whole_distribution_does_and_mostly_without_it(sampler, monkeypatch):
    """`Sampler.accepts` (u q < p at one token, what speculative sampling asks at each position it
    accepts) against the comparison with `probs` itself (and `bounds` holding p, within 5e-5 of it):
    the same answer for every threshold, those a hair either side of p (where only `probs` can
    decide) among them; on whole vocabulary rows, random thresholds are decided without the whole
    distribution."""
    rng = np.random.default_rng(7)
    spec = Sampler.probs
    calls = {"n": 0}

    def counted(self, logits, context=()):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        return spec(self, logits, context)

    for trial in range(12):
        n = 262_144 if trial % 3 else 40_000
        logits = (rng.standard_normal(n) * 2.5).astype(np.float32)
        logits[rng.integers(0, n, 8)] += 16.0  # a few tokens holding most of the mass, as a language model's row
        context = rng.integers(0, 64, 20).tolist()
        p = spec(sampler, logits, context)
        likely = np.flatnonzero(p > 1e-4)
        tokens = [int(rng.choice(likely)), int(rng.integers(0, n)), n + 3]  # a likely, any, past the row
        for x in tokens:
            px = float(p[x]) if x < n else 0.0
            low, high = sampler.bounds(logits, x, context)
            # the bounds' width is the float32 sum's slack (2e-5) on both sides: (1 + 2e-5) / (1 - 2e-5) < 1 + 5e-5
            assert low <= px <= high and high <= low * (1 + 5e-5), (x, low, px, high)
            nudges = (px, np.nextafter(px, 0.0), np.nextafter(px, 1.0), px * (1 - 1e-9), px * (1 + 1e-9))
            for threshold in (*nudges, float(rng.random()) * px * 2, 0.0, float(rng.random())):
                assert sampler.accepts(logits, x, threshold, context) == (threshold < px), (trial, x, threshold, px)
        monkeypatch.setattr(Sampler, "probs", counted)
        calls["n"] = 0
        for _ in range(20):
            x = int(rng.choice(likely))
            threshold = float(rng.random()) * float(p[x]) * 2
            assert sampler.accepts(logits, x, threshold, context) == (threshold < float(p[x]))
        monkeypatch.setattr(Sampler, "probs", spec)
        if not sampler.greedy:
            assert calls["n"] <= 1, f"{calls['n']} of 20 random thresholds needed the whole distribution"
        else:
            assert calls["n"] == 20  # greedy takes `probs` itself


def test_accept_sampling_gives_the_verdicts_it_gave_reading_every_whole_distribution(monkeypatch):
    """The same seeds give the same verdicts whether each position's test reads the whole
    distribution (as `accept_sampling` did before `Sampler.accepts`) or `accepts` decides it: the
    random stream and every decision are unchanged."""

    def whole(self, logits, token, threshold, context=()):  # type: ignore[no-untyped-def]
        return threshold < (float(self.probs(logits, context)[token]) if token < logits.shape[0] else 0.0)

    rng = np.random.default_rng(3)
    vocab = 50_000
    for sampler in (Sampler(temperature=0.9), Sampler(min_p=0.01), Sampler(top_p=0.95)):
        for seed in range(25):
            rows = (rng.standard_normal((5, vocab)) * 2).astype(np.float32)
            rows[:, :6] += 8.0
            block = [int(rng.integers(0, 6)) for _ in range(4)]
            noisy = rows[:4] + rng.standard_normal((4, vocab)).astype(np.float32)
            dists = [draft_distribution(noisy[i], Sampler(temperature=1.3), 64) for i in range(4)]
            fast = accept_sampling(rows, block, dists, sampler, np.random.default_rng(seed))
            with monkeypatch.context() as m:
                m.setattr(Sampler, "accepts", whole)
                read_whole = accept_sampling(rows, block, dists, sampler, np.random.default_rng(seed))
            assert read_whole == fast, (sampler, seed)


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_accepts_at_the_edge_of_the_nucleus_decides_as_the_whole_distribution(temperature):
    """top_p set to the running mass of the likeliest tokens (as `probs` sums it), so whether the
    next one is in the nucleus turns on the last bits: `accepts` must answer as `probs` does for
    the tokens either side of the edge, and for near-equal tokens whose order rounding decides (a
    float32 ulp apart; a bias putting one a float64 ulp above the other)."""
    rng = np.random.default_rng(11)
    n = 100_000
    for trial in range(9):
        logits = (rng.standard_normal(n) * 2.0).astype(np.float32)
        logits[:12] += 12.0 + rng.standard_normal(12).astype(np.float32)
        bias: dict[int, float] = {}
        if trial % 3 == 1:
            logits[5] = np.nextafter(logits[4], np.float32(0))  # two tokens a float32 ulp apart
        elif trial % 3 == 2:  # token 5 biased to a float64 ulp or two above token 4
            above = float(logits[4]) + (trial // 3) * math.ulp(float(logits[4]))
            bias = {5: above - float(logits[5])}
        base = Sampler(temperature=temperature, logit_bias=bias).probs(logits)
        order = np.lexsort((np.arange(n), -base))
        for m in (1, 3, 5, 6):
            top_p = float(np.cumsum(base[order])[m - 1])
            for edge in (top_p, np.nextafter(top_p, 0.0), np.nextafter(top_p, 1.0)):
                if not 0 < edge <= 1:
                    continue
                sampler = Sampler(temperature=temperature, top_p=edge, logit_bias=bias)
                p = sampler.probs(logits)
                for x in order[max(0, m - 2): m + 2]:
                    for threshold in (0.0, float(p[x]) * 0.5, float(p[x]), np.nextafter(float(p[x]), 1.0), 1e-300):
                        assert sampler.accepts(logits, int(x), threshold) == (threshold < float(p[x])), (m, edge, x)


def _reference(sampler: Sampler, logits: np.ndarray, context: list[int]) -> np.ndarray:
    """Steps 3-5 as the module docstring states them, over the whole row, the plain way."""
    z = sampler.adjusted(logits, context).astype(np.float64)
    if sampler.greedy:
        return (np.arange(z.size) == int(np.argmax(z))).astype(np.float64)
    z = z / sampler.temperature
    z -= z.max()
    if sampler.top_k and sampler.top_k < z.size:
        z[z < np.sort(z)[-sampler.top_k]] = -np.inf
    if sampler.min_p > 0:
        z[z < math.log(sampler.min_p)] = -np.inf
    p = np.exp(z) / np.exp(z).sum()
    if sampler.top_p < 1:
        order = np.lexsort((np.arange(z.size), -p))
        kept = order[: int(np.searchsorted(np.cumsum(p[order]), sampler.top_p)) + 1]
        p[np.setdiff1d(np.arange(z.size), kept)] = 0.0
        p /= p.sum()
    return p


@pytest.mark.parametrize("sampler", ACCEPTS_SAMPLERS, ids=_named)
def test_support_is_the_distribution_where_it_is_not_zero(sampler):
    """`Sampler.support` (what a draft's uploaded distribution is cut from) and `probs` against
    the steps done the plain way over the whole row: the same tokens, ascending, with the same
    probabilities (top-k and min-p now take the softmax of the kept tokens only; sums in another
    order: ulps)."""
    rng = np.random.default_rng(5)
    for n in (1_000, 262_144):
        logits = (rng.standard_normal(n) * 2.5).astype(np.float32)
        logits[rng.integers(0, n, 8)] += 12.0
        context = rng.integers(0, 64, 20).tolist()
        ids, probs = sampler.support(logits, context)
        reference = _reference(sampler, logits, context)
        assert ids.tolist() == np.flatnonzero(reference).tolist()
        # float64 throughout, only the sums taken in another order: a few ulps (~1e-15), whatever the CPU
        np.testing.assert_allclose(probs, reference[ids], rtol=1e-12)
        np.testing.assert_allclose(sampler.probs(logits, context), reference, rtol=1e-12, atol=0)
