"""The softmax statistics of one draft step's logits, computed once.

A greedy draft step needs the argmax of 150k-262k logits; the rejection
predictor's features (WISP sec. 3.3) need the softmax sums over the same
vector. Right after a llama.cpp decode the vocabulary is cold in every cache,
and each separate numpy or Python call over it pays for that again, so both come
from one `LogitStats` per step, filled by one call of the compiled kernel
`edgekit.runtime._logitstats` (a C extension built at install; AVX-512, AVX2,
NEON or baseline SIMD) in one pass over the vocabulary: the max, the second largest
and the argmax, and, only when features are wanted, the sums below.

Without the kernel (installed without a C compiler) numpy computes the same
figures, several times slower: its softmax sums take only the logits within
`TAIL_NATS` of the maximum (each one further down weighs under e^-20 = 2e-9 of
the top one, so at most V x 2e-9 relative for V entries).

`EDGEKIT_KERNEL` picks another implementation than the best this CPU runs: one of
the kernel's `KERNELS`, or `numpy` (to profile what a device without AVX-512, or
without the compiled kernel, would pay).
"""

from __future__ import annotations

import math
import os
import warnings
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np

_kernel: ModuleType | None
try:
    from . import _logitstats as _kernel
except ImportError:  # built without a C compiler: the numpy path below
    _kernel = None

_wanted = os.environ.get("EDGEKIT_KERNEL", "").strip()
if _wanted == "numpy":
    _kernel = None
elif _wanted and _kernel is not None and _wanted in _kernel.KERNELS:
    _kernel.use(_wanted)
elif _wanted:  # a typo, or a kernel this CPU or build lacks: say so, and keep the best there is
    warnings.warn(
        f"EDGEKIT_KERNEL={_wanted}: no such kernel here (this CPU runs "
        f"{', '.join([*(_kernel.KERNELS if _kernel is not None else ()), 'numpy'])}); using "
        f"{_kernel.ISA if _kernel is not None else 'numpy'}",
        RuntimeWarning,
        stacklevel=2,
    )

__all__ = [
    "ALL_COLUMNS",
    "FEATURE_NAMES",
    "KERNEL",
    "TAIL_NATS",
    "LogitStats",
    "NumpyLogitStats",
    "available_kernels",
    "current_kernel",
    "kept_of",
    "kept_rows",
    "use_kernel",
]

FEATURE_NAMES = ("confidence", "entropy", "margin", "logit_std", "position", "recent_acceptance")
"""The rejection predictor's per-token features, in the order the kernel numbers them."""

ALL_COLUMNS = bytes(range(len(FEATURE_NAMES)))
"""`LogitStats.features_into` columns for every feature, in FEATURE_NAMES order."""

KERNEL = _kernel.ISA if _kernel is not None else "numpy"
"""Which implementation computes the statistics: avx512f, avx2, neon, baseline (the C kernel) or numpy."""

TAIL_NATS = 20.0


def current_kernel() -> str:
    """The implementation computing the statistics now (`KERNEL`, unless `use_kernel` switched
    the compiled kernel since)."""
    return _kernel.ISA if _kernel is not None else "numpy"


def available_kernels() -> tuple[str, ...]:
    """The compiled kernels this CPU runs, best first (none without the compiled kernel)."""
    return tuple(_kernel.KERNELS) if _kernel is not None else ()


def use_kernel(name: str) -> None:
    """Switches the compiled kernel (one of `available_kernels()`) for every statistics computed
    from now on; ValueError if this CPU or build has no such kernel. (`EDGEKIT_KERNEL=numpy`
    before the import is the way to the numpy path.)"""
    if _kernel is None or name not in _kernel.KERNELS:
        raise ValueError(f"no {name} kernel here; available: {', '.join(available_kernels()) or 'none (numpy)'}")
    _kernel.use(name)

_STD = FEATURE_NAMES.index("logit_std")  # the one feature that needs the mean and variance

_NAN7 = [math.nan] * 7


class NumpyLogitStats:
    """`LogitStats` without the kernel: the same figures with numpy.

    `softmax()` is [max, second largest, argmax, s, t, mean, variance] with
    s = sum exp(z - max) and t = sum exp(z - max) (z - max), so that the top
    probability is 1/s and the entropy log s - t/s.
    """

    __slots__ = ("_level", "_out", "logits")

    def __init__(self, logits: np.ndarray) -> None:
        self.logits = logits
        self._out = _NAN7
        self._level = 0  # as the kernel's: 1 the top two, 2 and s, t; 3 and the moments

    def argmax(self) -> int:
        """The first index of the largest logit (as numpy's argmax)."""
        return int(self._ensure(1)[2])

    def softmax(self) -> list[float]:
        """[max, second, argmax, s, t, mean, variance] as Python floats."""
        return list(self._ensure(3))

    def features_into(self, x: np.ndarray, columns: bytes, position: int, recent_acceptance: float) -> None:
        """Writes the features `columns` (FEATURE_NAMES indices, as bytes) into the
        float32 array `x`, one per column."""
        if any(c >= len(FEATURE_NAMES) for c in columns):
            raise ValueError("a column is not a feature index (0-5)")
        level = max((3 if c == _STD else 2 if c < _STD else 1 for c in columns), default=1)
        f = _derive(self._ensure(level), position, recent_acceptance)
        x.reshape(-1)[:] = [f[c] for c in columns]

    def _ensure(self, level: int) -> list[float]:
        if self._level < level:
            self._out = _numpy_stats(self.logits, level)
            self._level = level
        return self._out


if TYPE_CHECKING:  # the kernel's Stats has NumpyLogitStats's methods
    LogitStats = NumpyLogitStats
else:
    LogitStats = _kernel.Stats if _kernel is not None else NumpyLogitStats
"""The statistics of one float32 logit vector, computed on first use and kept:
`argmax()`, `softmax()` ([max, second, argmax, s, t, mean, variance]) and
`features_into(x, columns, position, recent_acceptance)`. The kernel's
`Stats` when it is built (one pass over the vocabulary for each, and only the
sums the columns need), else `NumpyLogitStats`."""


def _derive(st: list[float], position: float, acceptance: float) -> list[float]:
    """FEATURE_NAMES from the statistics (the kernel's `derive`, for the numpy path)."""
    m, second, _, s, t, _mean, var = st
    return [
        1.0 / s,
        max(math.log(s) - t / s, 0.0),  # float rounding leaves a few 1e-7 below 0 at one-hot
        (1.0 - math.exp(second - m)) / s,  # exp(-inf) = 0: a single entry
        math.sqrt(var) if var > 0.0 else 0.0,  # NaN (masked logits) as 0, as the kernel
        position,
        acceptance,
    ]


def _numpy_stats(z: np.ndarray, level: int) -> list[float]:
    """The kernel's figures with numpy (see the module docstring for the tail),
    up to `level`. Float32 throughout and no full-size temporary but the
    comparison mask (and, for the moments, one shifted copy): every numpy call
    here starts cold after a decode, and a large allocation costs page faults
    on top."""
    if z.dtype != np.float32 or z.ndim != 1 or z.size == 0:
        raise ValueError("logits must be a non-empty contiguous float32 array")
    i = int(np.argmax(z))
    m = float(z[i])
    if level == 1:
        return [m, math.nan, i, math.nan, math.nan, math.nan, math.nan]
    near = z[z > m - TAIL_NATS]  # a copy, about 16% of a real vocabulary
    near -= m
    e = np.exp(near)
    s, t = float(e.sum(dtype=np.float64)), float(np.dot(e, near))
    # the second largest: mask one top entry; a tie leaves another 0 (margin 0)
    near[int(np.argmax(near))] = -np.inf
    second = float(near.max()) + m if near.size > 1 else -math.inf
    if level == 2:
        return [m, second, i, s, t, math.nan, math.nan]
    # the moments about the mean of the first finite logits (as the kernel takes them), near the
    # others, so the variance does not cancel
    head = z[:64].astype(np.float64)
    head = head[np.isfinite(head)]
    h = float(head.mean()) if head.size else 0.0
    y = z - np.float32(h)
    mean = float(np.dot(y, _ones(z.shape[0]))) / z.shape[0]
    return [m, second, i, s, t, h + mean, float(np.dot(y, y)) / z.shape[0] - mean * mean]


def _cuts(keep: int, spread: float) -> None:
    if keep < 0 or not spread >= 0 or (keep == 0 and spread == math.inf):
        raise ValueError(f"keep must be 0 or more and spread 0 or more, and one of them must cut, not {keep}, {spread}")


def kept_of(row: np.ndarray, keep: int, within: int, spread: float = math.inf) -> tuple[np.ndarray, np.ndarray]:
    """A row's ids (ascending) whose logits, among the first `within`, reach both its `keep`-th
    largest (ties included; 0: no such cut) and its floor, the largest less `spread` (in float64;
    inf: no such cut), and those logits (copies): all a top-`keep` sampler's
    distribution covers, or a min-p one's (`Sampler.support_cut`). With numpy: `kept_rows` does
    the same for a batch's rows, with the kernel where it is built."""
    _cuts(keep, spread)
    view = row[:within]
    cut = -np.inf
    if keep:
        k = min(keep, view.shape[0])
        cut = np.partition(view, view.shape[0] - k)[view.shape[0] - k]
    if spread < math.inf:
        floor = float(view.max()) - spread
        at_least = np.float32(floor)
        if float(at_least) < floor:  # rounded down: a float32 there would not reach the floor
            at_least = np.nextafter(at_least, np.float32(np.inf))
        cut = max(cut, at_least)
    ids = np.flatnonzero(view >= cut)
    return ids, view[ids].copy()


def kept_rows(rows: np.ndarray, keep: int, within: int,
              spread: float = math.inf) -> list[tuple[np.ndarray, np.ndarray]]:
    """`kept_of` of each row of a 2-d float32 array, the same ids and logits. The kernel, where it is
    built, takes the maximum of each block of 32 logits in one vector pass over the row, then reads
    again only the blocks whose maxima reach the `keep`-th largest of those maxima and the floor (the
    only ones that can hold a kept value: about `keep` blocks under top-k), selects the `keep`-th
    largest among them and takes what reaches it and the floor, letting go of the GIL throughout
    (numpy's partition moves the whole row); a row holding a NaN, which numpy orders last and the
    selection cannot, has the whole call made with numpy."""
    _cuts(keep, spread)
    within = min(within, rows.shape[-1])
    readable = rows.dtype == np.float32 and rows.ndim == 2 and rows.flags.c_contiguous and within > 0
    kept = (_kernel.kept(rows, keep, within, float(spread))
            if _kernel is not None and readable and rows.shape[0] else None)
    if kept is None:  # no kernel, rows it cannot read, or a NaN
        return [kept_of(row, keep, within, spread) for row in rows]
    ids, logits = np.frombuffer(kept[0], np.int64), np.frombuffer(kept[1], np.float32)
    cut = np.cumsum(np.frombuffer(kept[2], np.int64)[:-1])
    return list(zip(np.split(ids, cut), np.split(logits, cut), strict=True))


_ONES: dict[int, np.ndarray] = {}


def _ones(n: int) -> np.ndarray:
    """Sums as BLAS dot products with ones (3x faster than numpy's sum here)."""
    ones = _ONES.get(n)
    if ones is None:
        ones = _ONES[n] = np.ones(n, dtype=np.float32)
        ones.flags.writeable = False
    return ones
