"""A GPU's step times and what speculation gains from them: the qwen2.5-7b shape's roofline on an H200
as a cost model for a toy engine (`rows_ms`, `step_ms`: `serve_load.py --kinds 7b`), and the gain a
block of K drafts gives over plain decoding at acceptance a on a measured step curve (`best_gain`,
`gpu/goodput.py`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

# A step of B sequences x T new tokens of the qwen2.5-7b shape at 1,024 cached tokens on an H200,
# in ms: /work/shared/gpu/roofline_h200.md (flash_1k_h200.json, `verify_roofline.py`, bf16, CUDA
# graphs). Plain decoding is T = 1 (B rows), verifying 4 drafts T = 5 (5B rows).
ROOFLINE_7B: dict[int, tuple[float, float]] = {  # B: (plain ms, verify T=5 ms)
    1: (5.8, 6.2),
    8: (6.1, 6.5),
    32: (6.6, 7.9),
    64: (7.2, 11.9),
    128: (8.6, 20.2),
    256: (13.0, 39.3),
}
ROOFLINE_KS = (1, 2, 4, 8)  # the blocks the rooflines choose the best of, as roofline_h200.md does


def interp(x: float, xs: Sequence[float], ys: Sequence[float]) -> float:
    """Linear through the points; flat below the first (a step's fixed cost), the last slope above."""
    if x <= xs[0]:
        return ys[0]
    for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return ys[-1] + (ys[-1] - ys[-2]) * (x - xs[-1]) / (xs[-1] - xs[-2])


def rows_ms(rows: float, works: float) -> float:
    """A 7B step's ms for `works` sequences putting `rows` tokens through: the plain (T = 1) and
    verify (T = 5) curves of the roofline, each by rows, blended by the tokens per sequence."""
    b = sorted(ROOFLINE_7B)
    plain = interp(rows, b, [ROOFLINE_7B[x][0] for x in b])
    verify = interp(rows, [5 * x for x in b], [ROOFLINE_7B[x][1] for x in b])
    w = min(max((rows / max(works, 1) - 1) / 4, 0.0), 1.0)
    return (1 - w) * plain + w * verify


def step_ms(feeds: Sequence[Any]) -> float:
    """The `ToyEngine` cost of a batch of feeds (`--kinds 7b`)."""
    return rows_ms(sum(len(f.tokens) for f in feeds), len(feeds))


def expected(a: float, k: int) -> float:
    """E(a, K): tokens a block of K commits at per-token acceptance a (the bonus token included)."""
    return float(k + 1) if a >= 1.0 else (1 - a ** (k + 1)) / (1 - a)


def acceptance_for(committed_per_round: float, k: int) -> float:
    """The per-token acceptance a whose E(a, K) is the measured tokens per round (bisection)."""
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected(mid, k) < committed_per_round else (lo, mid)
    return (lo + hi) / 2


def best_gain(step: Callable[[int, int], float], batch: int, a: float, ks: Sequence[int]) -> dict[str, float]:
    """The roofline gain at `batch` sequences: max over K of E(a, K) t(B, 1) / t(B, K + 1)."""
    plain = step(batch, 1)
    gains = {k: expected(a, k) * plain / step(batch, k + 1) for k in ks}
    k = max(gains, key=gains.__getitem__)
    return {"gain": gains[k], "k": k}


def curve_lookup(rows: Sequence[dict]) -> Callable[[int, int], float]:
    """t(B, T) in ms from measured rows ({batch, tokens, ms}), linear in B between measured batches."""
    table: dict[int, dict[int, float]] = {}
    for r in rows:
        table.setdefault(int(r["tokens"]), {})[int(r["batch"])] = float(r["ms"])

    def step(batch: int, tokens: int) -> float:
        by_batch = table[tokens]
        xs = sorted(by_batch)
        if batch in by_batch:
            return by_batch[batch]
        lo = max((x for x in xs if x < batch), default=xs[0])
        hi = min((x for x in xs if x > batch), default=xs[-1])
        if lo == hi:
            return by_batch[lo]
        return by_batch[lo] + (by_batch[hi] - by_batch[lo]) * (batch - lo) / (hi - lo)

    return step
