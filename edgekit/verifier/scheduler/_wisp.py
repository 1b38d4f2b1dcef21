"""WISP's SLO-aware batch scheduling (WISP sec. 4.2-4.3, Algorithm 1).

At each dispatch epoch t (whenever the engine is free) the waiting works are
split by their latest start time LST = d - v - delta (eq. 17), d being a work's
deadline (eq. 12), v its verification time alone as the estimator predicts it
and delta a guard for the estimator's error: those past it are critical and
go first, earliest deadline first; the others fill what is left of the batch
by utility U = N^v / v (expected committed tokens per millisecond, eq. 16),
highest first. Every addition must keep the batch feasible (FEASIBLEADD): its
rows within the memory budget (eq. 14; here the engine's rows per decode, as
each session's KV is already allocated) and t plus the batch's predicted time
within the deadline of every member (eq. 15). The first addition that does not
fit stops the batch.

What Algorithm 1 leaves open, decided here:
- A work whose deadline cannot be met any more, even alone (late), is not
  dropped (its device waits for the verdict, and its response's speed still
  counts): it goes after the critical works and before the rest, and it is
  served as soon as it can be: its deadline becomes its time alone plus the
  guard from now, so a batch that holds it grows only within the guard.
  Exempting late works from the deadline check instead (an earlier version)
  let every batch under overload grow to the whole queue, as FCFS does: the
  tightest class, late first, then waited behind everyone else's rounds, and
  on the CPU fleet `wisp` violated realtime as often as FCFS with the
  predictor (benchmarks/results/fleet_focus_gemma-270m.json).
- A work that has waited `starvation_s` goes first whatever its deadline or
  utility (oldest first): best-effort work, prefills (worth no tokens of their
  own) and late work all wait a bounded time.
- A batch is never empty while work waits: if nothing else fits, the oldest
  work goes alone.
- `min_efficiency` (0.75 by default; 0 is Algorithm 1 as published): while less than
  this share of a batch's predicted time is work (the rest is the per-batch
  constant c of eq. 19), a deadline does not stop the batch from growing. Where
  c is large against a round (a GPU: WISP's A100 fit has c = 14.86 ms against
  about 1 ms a round), protecting the tightest deadline keeps batches small, and
  under load the verifier spends its time on constants: in the GPU-scale
  simulation (benchmarks/gpu_sim.py) Algorithm 1's goodput fell by half past
  about 150 devices while FCFS's kept rising; at 0.75 it held, and capacity
  doubled. On a CPU a round's rows cost far more than the constant, so the
  floor does not bind there.
- Under overload, deadline order serves no one: the tightest classes' rounds
  are late and go first, and the others wait behind them until they are late
  too (EDF's domino effect). A session more than `unreachable_share` of whose
  recent rounds (an exponential average, weight 0.2 on the newest: from none,
  eleven late rounds in a row) went to the engine too late to meet their
  deadlines even alone is out of reach: its works go after every reachable one, by utility,
  and its deadlines stop no batch from growing, until its rounds go in time
  again (where the load lets them: whatever waits behind the reachable work
  still fills the batch, and `starvation_s` still bounds its wait). The
  tightest classes, late the most, are the first out of reach, and the
  verifier keeps the classes it can still serve. On one CPU core with a 1.5B
  target (qwen-coder), where no system met realtime or interactive from two
  devices on, late-first let relaxed devices miss their speed on 67% of
  responses at 4 devices, where FCFS met it; out of reach, 25%
  (benchmarks/results/side_by_side_qwen-coder_fleet-90s-reach.json). In the GPU-scale
  simulation, 0.9 raised capacity within every class's SLO (realtime 300 to
  340 devices, interactive 320 to 400, standard 340 to 420; with response
  budgets 420 in every class) for at most 1.3% of responses short below
  saturation, where late-first had none (benchmarks/results/gpu_sim_reach.json);
  0.8 cost realtime capacity (5.6% short at 280) and 0.95 held less past
  saturation (12-17% at 360-420). `unreachable_share=1` keeps
  Algorithm 1's order: late work first, always.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from .._estimator import VerifyTimeEstimator, batch_features
from ._base import Batch, Work, WorkQueue

if TYPE_CHECKING:
    from ...config import ServerConfig

__all__ = ["WispScheduler"]

_REACH_WEIGHT = 0.2  # the newest round's weight in a session's share of rounds dispatched late
_REACH_SESSIONS = 4096  # sessions whose share is kept (the least recently seen go first)


class WispScheduler(WorkQueue):
    name = "wisp"

    def __init__(
        self,
        estimator: VerifyTimeEstimator,
        *,
        guard_ms: float = 20.0,
        starvation_s: float = 2.0,
        max_rows: int = 512,
        min_efficiency: float = 0.75,
        unreachable_share: float = 0.9,
        clock: Callable[[], float] = time.perf_counter,
        prefill_chunk: int | None = None,
        max_queue: int | None = None,
    ) -> None:
        if max_rows < 1 or guard_ms < 0 or starvation_s <= 0 or not 0 <= min_efficiency < 1:
            raise ValueError("max_rows must be >= 1, guard_ms >= 0, starvation_s > 0 and min_efficiency in [0, 1)")
        if not 0 < unreachable_share <= 1:
            raise ValueError(f"unreachable_share must be in (0, 1], got {unreachable_share}")
        self.min_efficiency = min_efficiency
        self.unreachable_share = unreachable_share
        self._late: OrderedDict[str, float] = OrderedDict()  # per session: share of its rounds dispatched late
        super().__init__(prefill_chunk=prefill_chunk, max_queue=max_queue)
        self.estimator = estimator
        self.guard_ms = guard_ms
        self.starvation_s = starvation_s
        self.max_rows = max_rows
        self.clock = clock  # the dispatch epoch's time: perf_counter, or a simulation's virtual clock

    def out_of_reach(self, session_id: str) -> bool:
        """Whether more than `unreachable_share` of the session's recent rounds were late when they
        went to the engine."""
        with self._lock:
            return self._out_of_reach(session_id)

    def _out_of_reach(self, session_id: str) -> bool:  # under the lock
        return self._late.get(session_id, 0.0) > self.unreachable_share

    def _count_late(self, works: Sequence[Work], now: float, solo_ms: dict[int, float]) -> None:
        """Each round's session counts whether it went to the engine too late to meet its deadline
        even alone (`solo_ms`, by work; a prefill's lateness says nothing of its session's class).
        Past `_REACH_SESSIONS` sessions the least recently dispatched one's share is forgotten
        (a session that comes back starts from none)."""
        for w in works:
            d = w.objective.deadline
            if d is None or w.feed.n_out == 0:
                continue
            late = now + solo_ms[id(w)] / 1e3 > d
            share = self._late.pop(w.session_id, 0.0)
            self._late[w.session_id] = (1 - _REACH_WEIGHT) * share + _REACH_WEIGHT * late
            if len(self._late) > _REACH_SESSIONS:
                self._late.popitem(last=False)

    def schedule(self) -> Batch | None:
        with self._lock:
            self._queue = [w for w in self._queue if not w.future.cancelled()]  # callers that gave up
            if not self._queue:
                return None
            now = self.clock()
            solo_ms = self._solo_ms(self._queue)
            chosen, estimated_ms = self._plan(self._queue, now, solo_ms)
            self._count_late(chosen, now, solo_ms)
            taken = {id(w) for w in chosen}
            self._queue = [w for w in self._queue if id(w) not in taken]
            for work in chosen:
                work.future.set_running_or_notify_cancel()
            return Batch(tuple(chosen), dispatched=now, estimated_ms=estimated_ms)

    def _solo_ms(self, queue: Sequence[Work]) -> dict[int, float]:
        """Each work's predicted time alone, by id."""
        coef = self.estimator.coefficients.vector()
        return {id(w): float(batch_features([w.feed]) @ coef) for w in queue}

    def plan(self, queue: Sequence[Work], now: float) -> tuple[list[Work], float]:
        """Algorithm 1 at epoch `now` over `queue` (in arrival order): the batch, and its predicted ms."""
        with self._lock:
            return self._plan(queue, now, self._solo_ms(queue))

    def _plan(self, queue: Sequence[Work], now: float, solo_ms: dict[int, float]) -> tuple[list[Work], float]:
        coef = self.estimator.coefficients.vector()
        feats = {id(w): batch_features([w.feed]) for w in queue}
        unreachable = {id(w) for w in queue if self._out_of_reach(w.session_id)}

        def deadline(w: Work) -> float | None:
            return None if id(w) in unreachable else w.objective.deadline

        def late(w: Work) -> bool:
            d = deadline(w)
            return d is not None and now + solo_ms[id(w)] / 1e3 > d

        forced, critical, overdue, rest, hopeless = [], [], [], [], []
        for w in queue:
            d = deadline(w)
            if now - w.arrived >= self.starvation_s:
                forced.append(w)
            elif id(w) in unreachable:
                hopeless.append(w)
            elif late(w):
                overdue.append(w)
            elif d is not None and now >= d - (solo_ms[id(w)] + self.guard_ms) / 1e3:  # past LST (eq. 17)
                critical.append(w)
            else:
                rest.append(w)
        forced.sort(key=lambda w: w.arrived)
        critical.sort(key=lambda w: (w.objective.deadline, w.arrived))  # EDF
        overdue.sort(key=lambda w: (w.objective.deadline, w.arrived))
        # Utility: expected committed tokens per predicted ms (eq. 16); ties go to the older work.
        for group in (rest, hopeless):
            group.sort(key=lambda w: (-w.objective.value / max(solo_ms[id(w)], 1e-3), w.arrived))

        batch: list[Work] = []
        x = np.zeros(len(coef))
        rows = 0
        d_min = float("inf")

        def feasible_add(w: Work, *, check_deadlines: bool = True) -> bool:
            nonlocal x, rows, d_min
            x2 = x + feats[id(w)]
            x2[-1] = 1.0  # one batch: one constant
            rows2 = rows + w.rows
            d = deadline(w)
            if d is not None and late(w):
                d = now + (solo_ms[id(w)] + self.guard_ms) / 1e3  # as soon as possible
            d_min2 = d_min if d is None else min(d_min, d)
            if batch and rows2 > self.max_rows:  # eq. 14 (the first work always fits)
                return False
            t2 = float(x2 @ coef)
            efficient = t2 > 0 and (t2 - coef[-1]) / t2 >= self.min_efficiency
            if batch and check_deadlines and efficient and now + t2 / 1e3 > d_min2:  # eq. 15
                return False
            batch.append(w)
            x, rows, d_min = x2, rows2, d_min2
            return True

        for w in forced:
            if not feasible_add(w, check_deadlines=False):
                break
        stop = False
        for w in critical:
            if not feasible_add(w):
                stop = True  # a violation: the batch stops growing
                break
        if not stop:
            for group in (overdue, rest, hopeless):
                if not all(feasible_add(w) for w in group):
                    break
        if not batch:
            feasible_add(min(queue, key=lambda w: w.arrived), check_deadlines=False)
        return batch, float(x @ coef)


def build(estimator: VerifyTimeEstimator, config: ServerConfig) -> WispScheduler:
    """The policy as `SCHEDULERS` builds it, over the verifier's time estimator."""
    return WispScheduler(
        estimator,
        guard_ms=config.guard_ms,
        starvation_s=config.starvation_s,
        min_efficiency=config.min_efficiency,
        unreachable_share=config.unreachable_share,
        max_rows=config.max_batch_rows,
        prefill_chunk=config.prefill_chunk,
        max_queue=config.max_queue,
    )
