"""Logit features on known logits, against plain definitions."""

from __future__ import annotations

import numpy as np
import pytest

from edgekit.predictors.features import FEATURE_NAMES, LogitFeatures


def reference(z: np.ndarray) -> dict:
    z64 = z.astype(np.float64)
    p = np.exp(z64 - z64.max())
    p /= p.sum()
    top2 = np.sort(p)[-2:]
    return {
        "confidence": p.max(),
        "entropy": float(-(p[p > 0] * np.log(p[p > 0])).sum()),
        "margin": top2[1] - top2[0],
        "logit_std": z64.std(),
    }


def test_uniform_logits():
    f = LogitFeatures(1000)(np.zeros(1000, dtype=np.float32), 3, 0.5)
    values = dict(zip(FEATURE_NAMES, f))
    assert values["confidence"] == pytest.approx(1e-3)
    assert values["entropy"] == pytest.approx(np.log(1000), rel=1e-5)
    assert values["margin"] == pytest.approx(0.0, abs=1e-7)
    assert values["logit_std"] == pytest.approx(0.0, abs=1e-6)
    assert values["position"] == 3 and values["recent_acceptance"] == 0.5


def test_one_dominant_token():
    z = np.full(50, -10.0, dtype=np.float32)
    z[7] = 10.0
    values = dict(zip(FEATURE_NAMES, LogitFeatures(50)(z.copy(), 1, 1.0)))
    ref = reference(z)  # confidence and margin 1 - 1e-7, entropy 2.1e-6
    assert values["confidence"] == pytest.approx(ref["confidence"], abs=1e-6) and values["confidence"] > 0.9999
    assert values["margin"] == pytest.approx(ref["margin"], abs=1e-6)
    # Near zero, entropy is a difference of numbers around 10: a few 1e-6 nats of float32 error.
    assert values["entropy"] == pytest.approx(ref["entropy"], abs=5e-6) and values["entropy"] >= 0


@pytest.mark.parametrize("vocab,scale,seed", [(262_144, 3.0, 0), (151_936, 1.0, 1), (64, 8.0, 2)])
def test_random_logits_match_the_definitions(vocab, scale, seed):
    z = (np.random.default_rng(seed).normal(size=vocab) * scale).astype(np.float32)
    z[5] = z.max() + 0.3  # a clear top-2 structure
    before = z.copy()
    f = dict(zip(FEATURE_NAMES, LogitFeatures(vocab)(z, 2, 0.7)))
    ref = reference(before)
    for name in ("confidence", "entropy", "margin", "logit_std"):
        assert f[name] == pytest.approx(ref[name], rel=1e-4, abs=1e-6), name
    np.testing.assert_array_equal(z, before)  # the logits are left as they were


def test_ties_at_the_top_give_zero_margin():
    z = np.array([1.0, 3.0, 3.0, 0.0], dtype=np.float32)
    assert dict(zip(FEATURE_NAMES, LogitFeatures(4)(z, 1, 0.0)))["margin"] == pytest.approx(0.0, abs=1e-7)


def test_a_long_tail_far_below_the_top_is_bounded():
    """Real logits: a few entries near the top, most tens of nats below. Only
    those within TAIL_NATS enter the softmax sums; the rest may move them by
    at most V * exp(-TAIL_NATS) relative."""
    from edgekit.predictors.features import TAIL_NATS

    rng = np.random.default_rng(4)
    z = (rng.normal(size=262_144) * 6.8).astype(np.float32)
    z[11] += 45.0
    z[99] += 43.0
    z[500:540] += rng.uniform(20, 40, size=40).astype(np.float32)
    bound = 262_144 * np.exp(-TAIL_NATS)
    f = dict(zip(FEATURE_NAMES, LogitFeatures(z.size)(z, 1, 0.5)))
    ref = reference(z)
    assert f["confidence"] == pytest.approx(ref["confidence"], rel=bound)
    assert f["margin"] == pytest.approx(ref["margin"], rel=bound)
    assert f["entropy"] == pytest.approx(ref["entropy"], rel=bound, abs=1e-5)
    assert f["logit_std"] == pytest.approx(ref["logit_std"], rel=1e-5)


def test_only_the_features_asked_for_are_computed():
    z = (np.random.default_rng(5).normal(size=5000) * 3).astype(np.float32)
    full = LogitFeatures(z.size)(z, 2, 0.5).copy()
    part = LogitFeatures(z.size, ("confidence", "entropy", "margin", "position"))(z, 2, 0.5)
    std = FEATURE_NAMES.index("logit_std")
    assert np.isnan(part[std]) and not np.isnan(full[std])
    keep = [i for i in range(len(FEATURE_NAMES)) if i != std]
    np.testing.assert_array_equal(part[keep], full[keep])
