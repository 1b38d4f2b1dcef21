"""Logit statistics and features on known logits, against plain definitions,
for every implementation this machine has: the compiled kernel in each of its
instruction sets and the numpy path used without it."""

from __future__ import annotations

import numpy as np
import pytest

import edgekit.runtime._logits as logits_mod
from edgekit.predictors.features import FEATURE_NAMES, TAIL_NATS, LogitFeatures

try:
    from edgekit.runtime import _logitstats
except ImportError:  # pragma: no cover - installed without a C compiler
    _logitstats = None


def _implementations() -> list[str]:
    names = ["numpy"]
    if _logitstats is not None:
        names.extend(_logitstats.KERNELS)  # every kernel this build has that this CPU runs
    return names


@pytest.fixture(params=_implementations())
def impl(request, monkeypatch):
    if request.param == "numpy":
        monkeypatch.setattr(logits_mod, "LogitStats", logits_mod.NumpyLogitStats)
    else:
        _logitstats.use(request.param)
        request.addfinalizer(lambda: _logitstats.use(logits_mod.KERNEL))
    return request.param


def test_the_kernel_is_built_where_a_compiler_is():
    """CI installs with a compiler: the fast path must be there (numpy is the fallback)."""
    assert _logitstats is not None and _logitstats.KERNELS[0] == logits_mod.KERNEL  # the best one
    assert set(_logitstats.KERNELS) <= {"avx512f", "avx2", "neon", "baseline"} and "baseline" in _logitstats.KERNELS


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


def features(z: np.ndarray, position: int = 1, acceptance: float = 0.5) -> dict:
    stats = logits_mod.LogitStats(z)  # the implementation under test
    return dict(zip(FEATURE_NAMES, LogitFeatures()(stats, position, acceptance).tolist()))


def test_uniform_logits(impl):
    values = features(np.zeros(1000, dtype=np.float32), 3, 0.5)
    assert values["confidence"] == pytest.approx(1e-3)
    assert values["entropy"] == pytest.approx(np.log(1000), rel=1e-5)
    assert values["margin"] == pytest.approx(0.0, abs=1e-7)
    assert values["logit_std"] == pytest.approx(0.0, abs=1e-6)
    assert values["position"] == 3 and values["recent_acceptance"] == 0.5


def test_one_dominant_token(impl):
    z = np.full(50, -10.0, dtype=np.float32)
    z[7] = 10.0
    values = features(z.copy())
    ref = reference(z)  # confidence and margin 1 - 1e-7, entropy 2.1e-6
    assert values["confidence"] == pytest.approx(ref["confidence"], abs=1e-6) and values["confidence"] > 0.9999
    assert values["margin"] == pytest.approx(ref["margin"], abs=1e-6)
    assert values["entropy"] == pytest.approx(ref["entropy"], abs=5e-6) and values["entropy"] >= 0


@pytest.mark.parametrize("vocab,scale,seed", [(262_144, 3.0, 0), (151_936, 1.0, 1), (64, 8.0, 2), (1001, 2.0, 3)])
def test_random_logits_match_the_definitions(impl, vocab, scale, seed):
    z = (np.random.default_rng(seed).normal(size=vocab) * scale).astype(np.float32)
    z[5] = z.max() + 0.3  # a clear top-2 structure
    before = z.copy()
    f = features(z, 2, 0.7)
    ref = reference(before)
    for name in ("confidence", "entropy", "margin", "logit_std"):
        assert f[name] == pytest.approx(ref[name], rel=1e-4, abs=1e-6), name
    np.testing.assert_array_equal(z, before)  # the logits are left as they were


@pytest.mark.parametrize("where", [0, 63, 64, 1000, 262_143])
def test_argmax_max_and_second_anywhere_in_the_vocabulary(impl, where):
    z = (np.random.default_rng(where).normal(size=262_144)).astype(np.float32)
    z[where] = 40.0
    z[(where * 7 + 13) % z.size] = 39.5
    st = logits_mod.LogitStats(z)
    assert st.argmax() == where
    m, second, argmax, *_ = st.softmax()
    assert (m, second, argmax) == (40.0, 39.5, where)


def test_ties_take_the_first_index_and_give_zero_margin(impl):
    z = np.zeros(3000, dtype=np.float32)
    z[[2999, 70, 1500]] = 3.0  # the same top three times, spread over lanes and the tail
    st = logits_mod.LogitStats(z)
    assert st.argmax() == int(np.argmax(z)) == 70
    assert features(z)["margin"] == pytest.approx(0.0, abs=1e-7)


def test_masked_logits_stay_finite(impl):
    """Logit masks (grammar, bans) set entries to -inf: they weigh nothing."""
    z = np.full(5000, -np.inf, dtype=np.float32)
    z[[10, 20, 30]] = [2.0, 1.0, 0.0]
    f = features(z)
    p = np.exp(np.array([2.0, 1.0, 0.0]) - 2.0)
    p /= p.sum()
    assert f["confidence"] == pytest.approx(p[0], rel=1e-5)
    assert f["entropy"] == pytest.approx(float(-(p * np.log(p)).sum()), rel=1e-5)
    assert f["margin"] == pytest.approx(p[0] - p[1], rel=1e-5)


@pytest.mark.parametrize(
    "case", ["top-far-past-the-start", "several-jumps", "shifted-up", "shifted-down", "masked-start", "tiny-tail"]
)
def test_one_pass_sums_whatever_the_order_of_the_values(impl, case):
    """The kernel sums exp(z - c) against references c that move up as larger values
    stream in (rescaling what it has summed): the result must not depend on where
    the maximum is or how far it lies above the values before it."""
    rng = np.random.default_rng(8)
    z = rng.normal(size=262_144).astype(np.float32)
    if case == "top-far-past-the-start":
        z[200_001] = 150.0  # 150 nats above everything before it
    elif case == "several-jumps":
        for i, v in ((5_000, 70.0), (40_000, 140.0), (90_001, 210.0), (262_140, 209.0)):
            z[i] = v
    elif case == "shifted-up":
        z += 5000.0
    elif case == "shifted-down":
        z -= 5000.0
    elif case == "masked-start":
        z[:70_000] = -np.inf
        z[100_000] = 30.0
    else:  # a vocabulary that is not a multiple of the SIMD width, top in the scalar tail
        z = z[:100_003].copy()
        z[-1] = 40.0
    f = features(z.copy())
    ref = reference(np.where(np.isinf(z), -1e30, z))  # np.std of -inf is NaN; the kernel's std there is not checked
    for name in ("confidence", "entropy", "margin"):
        assert f[name] == pytest.approx(ref[name], rel=1e-5, abs=1e-6), name
    if case != "masked-start":
        assert f["logit_std"] == pytest.approx(ref["logit_std"], rel=1e-5)
    assert logits_mod.LogitStats(z).argmax() == int(np.argmax(z))


def test_a_long_tail_far_below_the_top(impl):
    """Real logits: a few entries near the top, most tens of nats below. The
    kernel sums them all; the numpy path only those within TAIL_NATS, which
    moves the sums by at most V * exp(-TAIL_NATS) relative."""
    rng = np.random.default_rng(4)
    z = (rng.normal(size=262_144) * 6.8).astype(np.float32)
    z[11] += 45.0
    z[99] += 43.0
    z[500:540] += rng.uniform(20, 40, size=40).astype(np.float32)
    bound = 262_144 * np.exp(-TAIL_NATS) if impl == "numpy" else 1e-5
    f = features(z)
    ref = reference(z)
    assert f["confidence"] == pytest.approx(ref["confidence"], rel=bound)
    assert f["margin"] == pytest.approx(ref["margin"], rel=bound)
    assert f["entropy"] == pytest.approx(ref["entropy"], rel=bound, abs=1e-5)
    assert f["logit_std"] == pytest.approx(ref["logit_std"], rel=1e-5)


def test_features_go_into_the_columns_asked_for(impl):
    z = (np.random.default_rng(5).normal(size=5000) * 3).astype(np.float32)
    full = LogitFeatures()(logits_mod.LogitStats(z), 4, 0.25).copy()
    columns = bytes([FEATURE_NAMES.index(n) for n in ("position", "margin", "confidence")])
    x = np.full((1, 3), np.nan, dtype=np.float32)
    st = logits_mod.LogitStats(z)
    st.features_into(x, columns, 4, 0.25)
    np.testing.assert_array_equal(x[0], full[[4, 2, 0]])
    assert st.argmax() == int(np.argmax(z))  # from the same call


def test_only_the_sums_the_columns_need_and_the_rest_on_demand(impl):
    """Without logit_std the kernel skips the mean and variance; a later softmax() still gets them."""
    z = (np.random.default_rng(7).normal(size=70_000) * 2).astype(np.float32)
    full = LogitFeatures()(logits_mod.LogitStats(z), 4, 0.25).copy()
    for names in (("confidence", "entropy", "margin", "position"), ("position", "recent_acceptance"), ("logit_std",)):
        st = logits_mod.LogitStats(z)
        x = np.full((1, len(names)), np.nan, dtype=np.float32)
        st.features_into(x, bytes(FEATURE_NAMES.index(n) for n in names), 4, 0.25)
        np.testing.assert_array_equal(x[0], full[[FEATURE_NAMES.index(n) for n in names]])
        np.testing.assert_allclose(st.softmax()[3:], logits_mod.LogitStats(z).softmax()[3:], rtol=1e-12)


def test_the_statistics_are_computed_once_per_step(impl):
    z = (np.random.default_rng(6).normal(size=5000)).astype(np.float32)
    st = logits_mod.LogitStats(z)
    first = st.argmax()  # the top pass alone
    values = st.softmax()  # then the sums
    z[first] = -100.0  # a later change to the buffer is not seen: the step's figures are kept
    assert st.argmax() == first and st.softmax() == values


def test_wrong_buffers_are_refused(impl):
    with pytest.raises(ValueError, match="float32"):
        logits_mod.LogitStats(np.zeros(10)).argmax()
    with pytest.raises(ValueError, match="float32"):
        logits_mod.LogitStats(np.zeros(0, dtype=np.float32)).softmax()
    with pytest.raises(TypeError):
        logits_mod.LogitStats(np.zeros(10, dtype=np.float32), softmax=True)
    st = logits_mod.LogitStats(np.zeros(10, dtype=np.float32))
    with pytest.raises(ValueError, match="feature index"):
        st.features_into(np.zeros(1, np.float32), b"\x09", 1, 0.5)
    if impl != "numpy":  # the numpy path writes through any array; the kernel checks what it writes to
        with pytest.raises(ValueError, match="one entry per column"):
            st.features_into(np.zeros(2, np.float32), b"\x00", 1, 0.5)
        with pytest.raises(ValueError, match="float32"):
            st.features_into(np.zeros(1), b"\x00", 1, 0.5)
        with pytest.raises(ValueError):  # a strided view is not contiguous
            logits_mod.LogitStats(np.zeros(20, dtype=np.float32)[::2]).argmax()


@pytest.mark.skipif(_logitstats is None, reason="the kernel is not built")
def test_the_kernel_refuses_a_missing_isa():
    with pytest.raises(ValueError, match="no sse9 kernel"):
        _logitstats.use("sse9")
