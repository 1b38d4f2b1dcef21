"""Batching and speculation length (paper 003, sec. III-B, Algorithm 1 and problem P3).

For a window l, tasks sorted by input length are cut into contiguous batches by dynamic
programming: the best cut for the first i tasks tries every last batch j..i on top of the
stored per-step completion times of the first j-1 (eqs. 29-32). Batches that do not fit
in memory are skipped. The window is then the best of 1..l_max, by enumeration (P3).
`exhaustive` tries every ordered set partition instead, for checking the DP on small cases.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from ._serving import ServingModel

__all__ = ["Plan", "batches_for_window", "exhaustive", "plan"]


@dataclass(frozen=True)
class Plan:
    batches: tuple[tuple[int, ...], ...]  # task indices, in pipeline order
    window: int  # speculation length l
    predicted_s: float  # the model's total inference time


def batches_for_window(model: ServingModel, inputs: Sequence[int], window: int) -> Plan | None:
    """Algorithm 1 for one window: the batching with the least modelled latency (None: nothing fits)."""
    order = sorted(range(len(inputs)), key=lambda k: (inputs[k], k))
    n_tasks = len(order)
    if n_tasks == 0:
        return Plan((), window, 0.0)
    steps = model.steps(window)
    up0 = [np.zeros(steps)]  # Upsilon[i, n, 0]: stage-1 completion per step for the first i tasks
    up1 = [np.zeros(steps)]  # Upsilon[i, n, 1]: both stages
    best = [0.0]
    cut = [0]
    for i in range(1, n_tasks + 1):
        chosen: tuple[float, int, np.ndarray, np.ndarray] | None = None
        for j in range(1, i + 1):
            if best[j - 1] == math.inf:
                continue
            size, longest = i - j + 1, inputs[order[i - 1]]
            if not model.fits(size, longest):
                continue
            d, v = model.stage_times(size, longest, window)
            first = up0[j - 1] + d
            both = np.maximum(first, up1[j - 1]) + v
            total = float(both.sum())
            if chosen is None or total <= chosen[0]:
                chosen = (total, j, first, both)
        if chosen is None:
            up0.append(np.zeros(steps))
            up1.append(np.zeros(steps))
            best.append(math.inf)
            cut.append(0)
            continue
        best.append(chosen[0])
        cut.append(chosen[1])
        up0.append(chosen[2])
        up1.append(chosen[3])
    if best[n_tasks] == math.inf:
        return None
    batches = []
    i = n_tasks
    while i > 0:
        j = cut[i]
        batches.append(tuple(order[j - 1 : i]))
        i = j - 1
    batches.reverse()
    return Plan(tuple(batches), window, model.latency(batches, inputs, window))


def plan(model: ServingModel, inputs: Sequence[int], max_window: int) -> Plan:
    """The batching and window (1..max_window) with the least modelled latency."""
    plans = [p for w in range(1, max_window + 1) if (p := batches_for_window(model, inputs, w)) is not None]
    if not plans:
        raise ValueError("no batch of these tasks fits in the draft's memory, not even one task alone")
    return min(plans, key=lambda p: p.predicted_s)


def _ordered_partitions(items: Sequence[int]) -> Iterator[list[tuple[int, ...]]]:
    def partitions(rest: Sequence[int]) -> Iterator[list[tuple[int, ...]]]:
        if not rest:
            yield []
            return
        head, tail = rest[0], rest[1:]
        for p in partitions(tail):
            for i in range(len(p)):
                yield [*p[:i], (head, *p[i]), *p[i + 1 :]]
            yield [(head,), *p]

    for p in partitions(list(items)):
        yield from (list(o) for o in itertools.permutations(p))


def exhaustive(model: ServingModel, inputs: Sequence[int], max_window: int) -> Plan:
    """Every ordered set partition of the tasks and every window: the true optimum of the model
    (for checking `plan`; grows as the ordered Bell numbers, so small cases only)."""
    if len(inputs) > 7:
        raise ValueError("exhaustive search is for at most 7 tasks")
    best: Plan | None = None
    for window in range(1, max_window + 1):
        for batches in _ordered_partitions(range(len(inputs))):
            if not all(model.fits(len(b), max(inputs[k] for k in b)) for b in batches):
                continue
            t = model.latency(batches, inputs, window)
            if best is None or t < best.predicted_s:
                best = Plan(tuple(tuple(sorted(b)) for b in batches), window, t)
    if best is None:
        raise ValueError("no batch of these tasks fits in the draft's memory")
    return best
