"""The verification-time estimator (WISP eqs. 18-19, and the logit rows): features,
the non-negative fit, the online refit with forgetting, calibration on an engine
of known speed and its cache."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from edgekit.testing import ToyLanguageModel
from edgekit.verifier import (
    Coefficients,
    Feed,
    ToyEngine,
    VerifyTimeEstimator,
    batch_features,
    calibrated_estimator,
    fit_coefficients,
    fit_report,
    profile_batches,
)

TRUE = Coefficients(a=1.5, b_compute=0.0007, b_read=0.01, d_out=9.0, c=2.0)


def _random_batches(n: int, seed: int) -> list[list[Feed]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        feeds = []
        for s in range(int(rng.integers(1, 6))):
            new = int(rng.integers(1, 130))
            start = int(rng.integers(0, 3000))
            feeds.append(Feed(s, start, tuple(range(new)), int(rng.integers(0, new + 1))))
        out.append(feeds)
    return out


def test_features_count_new_tokens_interactions_cached_and_logit_rows():
    feeds = [Feed(0, 0, (1,) * 100, 0), Feed(1, 500, (1,) * 5, 5)]
    n_lin, n_int, n_cached, n_out, one = batch_features(feeds)
    assert (n_lin, n_cached, n_out, one) == (105, 500, 5, 1)
    assert n_int == 100 * 100 + 505 * 5  # eq. 18: L_total * L_new per request


def test_the_fit_recovers_known_coefficients():
    batches = _random_batches(60, seed=1)
    x = np.array([batch_features(b) for b in batches])
    y = x @ TRUE.vector()
    fitted = fit_coefficients(x, y)
    np.testing.assert_allclose(fitted.vector(), TRUE.vector(), rtol=1e-6, atol=1e-9)
    report = fit_report(fitted, x, y)
    assert report.r2 == pytest.approx(1.0) and report.mape_pct == pytest.approx(0.0, abs=1e-6)
    # Eq. 19 as published has no logit-row term: it can only approximate these batches.
    published = fit_coefficients(x, y, logit_rows=False)
    assert published.d_out == 0.0 and fit_report(published, x, y).r2 < 1.0


def test_the_fit_is_the_best_non_negative_one():
    rng = np.random.default_rng(3)
    x = np.array([batch_features(b) for b in _random_batches(40, seed=2)])
    # Times where more cached tokens look cheaper: plain least squares would go negative.
    y = x @ np.array([1.0, 0.0, -0.02, 5.0, 30.0]) + rng.normal(0, 5, len(x))
    fitted = fit_coefficients(x, y)
    assert np.all(fitted.vector() >= 0)
    sse = float(((x @ fitted.vector() - y) ** 2).sum())
    # No non-negative least-squares solution on any subset of the columns does better.
    for k in range(1, 6):
        for cols in itertools.combinations(range(5), k):
            w, *_ = np.linalg.lstsq(x[:, cols], y, rcond=None)
            if np.all(w >= 0):
                assert sse <= float(((x[:, cols] @ w - y) ** 2).sum()) * (1 + 1e-9)


def _exhaustive_nnls(g: np.ndarray, h: np.ndarray) -> np.ndarray:
    """The reference: the best of the unconstrained solutions on every subset of the
    coefficients that come out non-negative (31 subsets of five)."""
    best, best_f = np.zeros(len(h)), 0.0
    for k in range(1, len(h) + 1):
        for cols in itertools.combinations(range(len(h)), k):
            idx = list(cols)
            w_s, *_ = np.linalg.lstsq(g[np.ix_(idx, idx)], h[idx], rcond=None)
            if np.all(w_s >= 0):
                w = np.zeros(len(h))
                w[idx] = w_s
                f = float(w @ g @ w - 2 * h @ w)
                if f < best_f:
                    best, best_f = w, f
    return best


def _normal_equations(rng: np.random.Generator, kind: str) -> tuple[np.ndarray, np.ndarray]:
    # Columns of different sizes, as the scaled features are (`_SCALE` brings them near one).
    x = rng.normal(size=(int(rng.integers(3, 40)), 5)) * rng.choice([0.1, 1.0, 10.0], size=5)
    if kind == "zero column":  # a feature the batches never varied from zero
        x[:, int(rng.integers(5))] = 0.0
    elif kind == "collinear":  # two features that moved together
        i, j = rng.choice(5, size=2, replace=False)
        x[:, j] = 2.5 * x[:, i]
    elif kind == "few rows":  # fewer batches than coefficients: G singular
        x = x[:2]
    y = x @ rng.normal(size=5) + rng.normal(scale=0.1, size=len(x))
    if kind == "all negative":
        y = -np.abs(x).sum(axis=1)
    return x.T @ x, x.T @ y


@pytest.mark.parametrize("kind", ["plain", "zero column", "collinear", "few rows", "all negative"])
def test_the_active_set_fit_is_as_good_as_the_exhaustive_search(kind):
    """The online refit's solver against the best over all 31 subsets, cold and started from
    any set of free coefficients: never negative, never a worse fit (to rounding)."""
    from edgekit.verifier._estimator import _nnls_normal

    rng = np.random.default_rng(11)
    for _ in range(150):
        g, h = _normal_equations(rng, kind)
        ref = _exhaustive_nnls(g, h)
        f_ref = float(ref @ g @ ref - 2 * h @ ref)
        tol = 1e-9 * max(abs(f_ref), float(h @ h) ** 0.5, 1e-12)
        for start in (None, rng.random(5) < 0.5, ref > 0, np.ones(5, dtype=bool)):
            w = _nnls_normal(g, h, start)
            assert np.all(w >= 0)
            assert float(w @ g @ w - 2 * h @ w) <= f_ref + tol


def test_a_coefficient_the_solve_leaves_at_zero_as_it_is_freed_stops_nothing():
    """A direction too weak for `lstsq` (its singular value under the cutoff) gets 0 when freed: the
    step towards it is none, not 0/0, and the other coefficient keeps its fit."""
    from edgekit.verifier._estimator import _nnls_normal

    g, h = np.array([[1.0, 0.0], [0.0, 1e-17]]), np.array([1.0, 1e-5])
    with np.errstate(all="raise"):
        w = _nnls_normal(g, h)
    assert w.tolist() == [1.0, 0.0]


def test_the_online_refit_follows_a_machine_that_slows_down():
    prior_batches = _random_batches(40, seed=4)
    x0 = np.array([batch_features(b) for b in prior_batches])
    est = VerifyTimeEstimator(prior=(x0, x0 @ TRUE.vector()), prior_weight=10, forgetting=0.95, refit_every=4)
    np.testing.assert_allclose(est.coefficients.vector(), TRUE.vector(), rtol=1e-6, atol=1e-9)
    slower = Coefficients.of(TRUE.vector() * 2)
    live = _random_batches(200, seed=5)
    for feeds in live:
        est.observe(feeds, float(batch_features(feeds) @ slower.vector()))
    test = _random_batches(30, seed=6)
    errors = [abs(est.predict(b) / float(batch_features(b) @ slower.vector()) - 1) for b in test]
    assert max(errors) < 0.1  # the prior is outweighed; predictions within 10% of the new speed
    assert est.observed == 200


def test_without_a_prior_it_starts_empty_and_learns():
    est = VerifyTimeEstimator(refit_every=1)
    assert not est.calibrated and est.predict([Feed(0, 0, (1, 2), 2)]) == 0.0
    for feeds in _random_batches(50, seed=7):
        est.observe(feeds, float(batch_features(feeds) @ TRUE.vector()))
    assert est.calibrated
    b = _random_batches(1, seed=8)[0]
    assert est.predict(b) == pytest.approx(float(batch_features(b) @ TRUE.vector()), rel=1e-3)


def test_calibration_on_an_engine_of_known_speed(tmp_path):
    # A toy engine that takes the time the coefficients give (sleeping): coarse ms, so a loose check.
    cost = Coefficients(a=0.05, b_compute=0.0, b_read=0.0, d_out=0.8, c=4.0)
    engine = ToyEngine(ToyLanguageModel(seed=1), n_seq=6, max_context=512, cost=VerifyTimeEstimator(cost).predict)
    x, ms, kinds = profile_batches(engine, n_seq=6, max_context=512, max_block=8, prefill_chunk=32, trials=24)
    assert set(kinds) == {"cold", "warm", "mixed"} and len(ms) == 24
    assert all(engine.cached(s) == 0 for s in range(6))  # the profile leaves the sequences empty
    report = fit_report(fit_coefficients(x, ms), x, ms)
    assert report.r2 > 0.9
    # Cached: the second call measures nothing (the engine would fail if it ran).
    kw = dict(n_seq=6, max_context=512, max_block=8, prefill_chunk=32, threads=None, cache_dir=tmp_path, trials=12)
    first = calibrated_estimator(engine, **kw)
    assert first.calibrated and len(list(tmp_path.glob("estimator-*.json"))) == 1
    engine.run_batch = None  # type: ignore[assignment]
    second = calibrated_estimator(engine, measure=False, **kw)
    np.testing.assert_allclose(second.coefficients.vector(), first.coefficients.vector())
    # Another machine or model: not this calibration.
    engine.identity = "another model"
    assert not calibrated_estimator(engine, measure=False, **kw).calibrated


def test_a_verifier_of_fewer_than_three_sequences_is_not_calibrated_and_learns_online(tmp_path, caplog):
    """`edgekit serve --policy wisp --max-sessions 1` failed to start: the profile needs three sequences."""
    engine = ToyEngine(ToyLanguageModel(seed=1), n_seq=2, max_context=512)
    engine.run_batch = None  # type: ignore[assignment]  # nothing may be measured
    est = calibrated_estimator(engine, n_seq=2, max_context=512, max_block=8, prefill_chunk=32, threads=None,
                               cache_dir=tmp_path)
    assert not est.calibrated and not list(tmp_path.iterdir())
    assert "too few to calibrate" in caplog.text


def test_an_estimator_is_settled_by_a_calibration_or_enough_batches_learnt_online():
    from edgekit.verifier._estimator import SETTLED_AFTER

    assert VerifyTimeEstimator(Coefficients(a=1.0)).settled  # given
    online = VerifyTimeEstimator(refit_every=1)
    feeds = [Feed(0, 8, (1, 2, 3), 3)]
    for i in range(SETTLED_AFTER):
        assert not online.settled  # a fit of a few batches is not trusted for a step
        online.observe(feeds, 5.0 + i % 3)
    assert online.calibrated and online.settled
