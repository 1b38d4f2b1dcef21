"""The softmax statistics of one draft step's logits, computed once.

A greedy draft step needs the argmax of 150k-262k logits; the rejection
predictor's features (WISP sec. 3.3) need the softmax sums over the same
vector. Right after a llama.cpp decode the vocabulary is cold in every cache,
and each separate numpy or Python call over it pays for that again, so both come
from one `LogitStats` per step, filled by one call of the compiled kernel
`edgekit._logitstats` (a C extension built at install; AVX-512, AVX2 or
baseline SIMD): the first pass gives the max, the second largest and the
argmax; the second, only when features are wanted, the sums below.

Without the kernel (installed without a C compiler) numpy computes the same
figures, several times slower: its softmax sums take only the logits within
`TAIL_NATS` of the maximum (each one further down weighs under e^-20 = 2e-9 of
the top one, so at most V x 2e-9 relative for V entries).
"""

from __future__ import annotations

import math

import numpy as np

try:
    from . import _logitstats as _kernel
except ImportError:  # built without a C compiler: the numpy path below
    _kernel = None

__all__ = ["ALL_COLUMNS", "FEATURE_NAMES", "KERNEL", "TAIL_NATS", "LogitStats"]

FEATURE_NAMES = ("confidence", "entropy", "margin", "logit_std", "position", "recent_acceptance")
"""The rejection predictor's per-token features, in the order the kernel numbers them."""

ALL_COLUMNS = bytes(range(len(FEATURE_NAMES)))
"""`LogitStats.features_into` columns for every feature, in FEATURE_NAMES order."""

KERNEL = _kernel.ISA if _kernel is not None else "numpy"
"""Which implementation computes the statistics: avx512f, avx2, baseline (the C kernel) or numpy."""

TAIL_NATS = 20.0

_NAN7 = [math.nan] * 7


class LogitStats:
    """Statistics of one logit vector, computed on first use and kept.

    `softmax()` is [max, second largest, argmax, s, t, sum z, sum z^2] with
    s = sum exp(z - max) and t = sum exp(z - max) (z - max), so that the top
    probability is 1/s and the entropy log s - t/s. `argmax()` alone costs one
    pass over the vocabulary; `softmax()` one more.
    """

    __slots__ = ("logits", "_out", "_full", "_argmax")

    def __init__(self, logits: np.ndarray) -> None:
        self.logits = logits
        self._out: np.ndarray | None = None
        self._full = False
        self._argmax = -1

    def argmax(self) -> int:
        """The first index of the largest logit (as numpy's argmax)."""
        if self._argmax < 0:
            self._compute(full=False)
        return self._argmax

    def softmax(self) -> list[float]:
        """[max, second, argmax, s, t, sum z, sum z^2] as Python floats."""
        if not self._full:
            self._compute(full=True)
        return self._out.tolist()  # type: ignore[union-attr]

    def features_into(self, x: np.ndarray, columns: bytes, position: int, recent_acceptance: float) -> None:
        """Writes the features `columns` (FEATURE_NAMES indices, as bytes) into the
        float32 array `x`, one per column: the predictor's bound input. With the
        kernel and nothing computed yet for this step, that is a single call."""
        if _kernel is not None and not self._full:
            if self._out is None:
                self._out = np.empty(7, dtype=np.float64)
            self._argmax = _kernel.features(self.logits, self._out, x, columns, position, recent_acceptance)
            self._full = True
            return
        f = _derive(self.softmax(), self.logits.shape[0], position, recent_acceptance)
        x.reshape(-1)[:] = [f[c] for c in columns]

    def _compute(self, *, full: bool) -> None:
        out = self._out
        if out is None:
            out = self._out = np.empty(7, dtype=np.float64)
        if _kernel is not None:
            self._argmax = _kernel.stats(self.logits, out, full)
        else:
            self._argmax = _numpy_stats(self.logits, out, full)
        self._full = full


def _derive(st: list[float], n: int, position: float, acceptance: float) -> list[float]:
    """FEATURE_NAMES from the statistics (the kernel's `derive`, for the numpy path)."""
    m, second, _, s, t, total, squares = st
    mean = total / n
    var = squares / n - mean * mean
    return [
        1.0 / s,
        max(math.log(s) - t / s, 0.0),  # float rounding leaves a few 1e-7 below 0 at one-hot
        (1.0 - math.exp(second - m)) / s,  # exp(-inf) = 0: a single entry
        math.sqrt(var) if var > 0.0 else 0.0,  # NaN (masked logits) as 0, as the kernel
        position,
        acceptance,
    ]


def _numpy_stats(z: np.ndarray, out: np.ndarray, full: bool) -> int:
    """The kernel's figures with numpy (see the module docstring for the tail).
    Float32 throughout and no full-size temporary but the comparison mask: every
    numpy call here starts cold after a decode, and a large allocation costs
    page faults on top."""
    i = int(np.argmax(z))
    m = float(z[i])
    if not full:
        out[:] = _NAN7
        out[0], out[2] = m, i
        return i
    near = z[z > m - TAIL_NATS]  # a copy, about 16% of a real vocabulary
    near -= m
    e = np.exp(near)
    s, t = float(e.sum(dtype=np.float64)), float(np.dot(e, near))
    # the second largest: mask one top entry; a tie leaves another 0 (margin 0)
    near[int(np.argmax(near))] = -np.inf
    second = float(near.max()) + m if near.size > 1 else -math.inf
    out[:] = (m, second, i, s, t, float(np.dot(z, _ones(z.shape[0]))), float(np.dot(z, z)))
    return i


_ONES: dict[int, np.ndarray] = {}


def _ones(n: int) -> np.ndarray:
    """Sums as BLAS dot products with ones (3x faster than numpy's sum here)."""
    ones = _ONES.get(n)
    if ones is None:
        ones = _ONES[n] = np.ones(n, dtype=np.float32)
        ones.flags.writeable = False
    return ones
