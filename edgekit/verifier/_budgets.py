"""Draft budgets the verifier assigns: GOODSPEED's gradient scheduling (sec. III, eqs. 3-5).

Each session keeps two smoothed estimates, updated with each of its verdicts:

    alpha_i <- (1 - eta) alpha_i + eta * (1/S) sum_j min(1, p_j(s_j) / q_j(s_j))    (eq. 3)
    X_i     <- (1 - beta) X_i + beta * x_i                                         (eq. 4)

where the sum runs over the block's S tokens (past the first rejection too: the
target pass scored them all; in greedy mode the term is whether the draft token is
the target's top-1) and x_i is what the round committed (accepted + 1). At each of
the engine's dispatch epochs (GOODSPEED's time slots) the budgets of the sessions
active lately are set by eq. 5:

    max  sum_i U_i'(X_i) * (1 - alpha_i^(S_i + 1)) / (1 - alpha_i)
    s.t. sum_i S_i <= C,   lo <= S_i <= hi,   S_i integer

with log utility, U_i'(X) = w_i / X (proportional fairness; w_i a client's weight,
1 by default). The objective is separable and each term is concave in S_i: its
increment from S to S + 1 is U_i' * alpha_i^(S+1), which falls as S grows. So
handing the C tokens out one at a time, each to the largest increment, is exact
(`allocate`; tests/unit/verifier/test_budgets.py checks it against brute force).

Every verdict and OpenSession answer carries the session's budget (`next_budget`);
the device drafts at most that many tokens (its own controller may stop earlier). A
block longer than its budget is cut to it before verification: the tokens past the
budget are not verified, and the verdict reads as a rejection there, which a device
handles like any other (lossless; the cut tokens count as wasted).

GOODSPEED's clients are devices, each a stream of prompts; edgekit's sessions are one
conversation each, often shorter than eq. 3 takes to forget its prior. A session opened
with a client id (OpenSession's `client_id`; the SDK sends one per `EdgeClient`) starts
from the estimates its client's last session ended with, so a device's acceptance and
goodput carry from one answer to the next, as the paper's per-client estimates do.

`fixed` (S_i = C / N) and `random` (random S_i with sum <= C) are GOODSPEED's
baselines, selectable in the same server.
"""

from __future__ import annotations

import heapq
import math
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

__all__ = ["BudgetState", "Budgets", "allocate", "capacity_within", "expected_goodput"]

DEFAULT_WINDOW = 4  # tokens per session per pass when nothing else bounds C (the devices' default window)
MAX_CLIENTS = 4096  # clients whose estimates are remembered between their sessions (least recently seen go first)


def expected_goodput(alpha: float, s: int) -> float:
    """x_hat(S): tokens a round of S draft tokens commits on average, (1 - a^(S+1)) / (1 - a)."""
    if alpha >= 1.0:
        return float(s + 1)
    return (1.0 - alpha ** (s + 1)) / (1.0 - alpha)


def allocate(weights: Sequence[float], alphas: Sequence[float], capacity: int, lo: int, hi: int) -> list[int]:
    """Eq. 5: the integer S maximising sum_i weights_i * x_hat(alpha_i, S_i) with sum S <= capacity
    and lo <= S_i <= hi. Everyone gets `lo` first (even past the capacity: a session is never
    starved), then each further token goes to the largest increment weights_i * alpha_i^(S_i+1)."""
    n = len(weights)
    out = [lo] * n
    left = capacity - lo * n
    heap = [(-w * a ** (lo + 1), i) for i, (w, a) in enumerate(zip(weights, alphas, strict=True)) if lo < hi]
    heapq.heapify(heap)
    while left > 0 and heap:
        gain, i = heapq.heappop(heap)
        if -gain <= 0.0:
            break  # nothing more to win (alpha 0: a longer block commits nothing more)
        out[i] += 1
        left -= 1
        if out[i] < hi:
            heapq.heappush(heap, (-weights[i] * alphas[i] ** (out[i] + 1), i))
    return out


@dataclass
class BudgetState:
    """One session's estimates and budget."""

    alpha: float = 0.5  # eq. 3 (a prior of 0.5 until its first verdict)
    goodput: float = 1.0  # X_i, eq. 4: tokens committed per round
    budget: int = 1
    weight: float = 1.0
    told: int = 1  # the budget the session was last told: the one its blocks are held to
    seen: float = 0.0  # when its last verdict (or its open) was, on the owner's clock
    rounds: int = 0
    context: int = 0  # committed tokens (for the verify-time estimate behind C)
    slo_budget_ms: float | None = None  # the last round's budget under its SLO (WISP eq. 6); None: best effort
    client: str = ""  # whose estimates it carries on ("": its own only)


class BudgetPolicy(Protocol):
    name: str

    def assign(self, states: Sequence[BudgetState], capacity: int, lo: int, hi: int) -> list[int]: ...


class GoodSpeed:
    """Eq. 5 with log utility: gradient w_i / X_i."""

    name = "goodspeed"

    def assign(self, states: Sequence[BudgetState], capacity: int, lo: int, hi: int) -> list[int]:
        grads = [s.weight / max(s.goodput, 1e-6) for s in states]
        return allocate(grads, [min(max(s.alpha, 0.0), 1.0) for s in states], capacity, lo, hi)


class FixedShare:
    """Fixed-S: C / N each (the remainder to the first sessions), within the bounds."""

    name = "fixed"

    def assign(self, states: Sequence[BudgetState], capacity: int, lo: int, hi: int) -> list[int]:
        n = len(states)
        share, extra = divmod(max(capacity, 0), n) if n else (0, 0)
        return [min(hi, max(lo, share + (i < extra))) for i in range(n)]


class RandomShare:
    """Random-S: random S_i whose sum stays within C (a uniform random split of what is
    left after `lo` each), within the bounds."""

    name = "random"

    def __init__(self, seed: int | None = None) -> None:
        self._rng = random.Random(seed)

    def assign(self, states: Sequence[BudgetState], capacity: int, lo: int, hi: int) -> list[int]:
        n = len(states)
        out = [lo] * n
        left = max(0, capacity - lo * n)
        cuts = sorted(self._rng.randint(0, left) for _ in range(n - 1)) if n else []
        parts = [b - a for a, b in zip([0, *cuts], [*cuts, left], strict=True)]
        return [min(hi, s + p) for s, p in zip(out, parts, strict=True)]


# By name in edgekit.registry.BUDGET_POLICIES (what ServerConfig.budgets and --budgets name).


class Budgets:
    """The sessions' estimates and budgets, reassigned once per dispatch epoch.

    `capacity(states)` gives C for the sessions active now; sessions with no verdict for
    `active_s` seconds, or that `is_live` no longer knows (evicted), are left out of the
    allocation (an inactive one is back at `lo`). A session's blocks are held to the budget
    it was last told, not to one reassigned since (it could not know)."""

    def __init__(
        self,
        policy: BudgetPolicy,
        *,
        capacity: Callable[[Sequence[BudgetState]], int],
        lo: int = 1,
        hi: int = 32,
        eta: float = 0.05,
        beta: float = 0.5,
        active_s: float = 10.0,
        is_live: Callable[[str], bool] = lambda session_id: True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not (0 < eta <= 1 and 0 < beta <= 1):
            raise ValueError("eta and beta must be in (0, 1]")
        self.policy = policy
        self.capacity = capacity
        self.lo, self.hi = lo, max(lo, hi)
        self.eta, self.beta = eta, beta
        self.active_s = active_s
        self.is_live = is_live
        self._clock = clock
        self._states: dict[str, BudgetState] = {}
        self._clients: OrderedDict[str, tuple[float, float]] = OrderedDict()  # client -> (alpha, goodput)
        self._lock = threading.Lock()
        self._epoch: int | None = None
        self.last_capacity = 0

    def opened(self, session_id: str, *, context: int, weight: float = 1.0, epoch: int = 0, client: str = "") -> int:
        """A new session: its state (from its client's last estimates, if `client` names one seen
        before), and the budget of its first round."""
        with self._lock:
            self._prune()  # an evicted session of this client's leaves its estimates first
            state = self._states[session_id] = BudgetState(
                weight=weight, budget=self.lo, context=context, seen=self._clock(), client=client
            )
            if client in self._clients:
                state.alpha, state.goodput = self._clients[client]
            self._assign()
            self._epoch = epoch
            state.told = state.budget
            return state.told

    def limit(self, session_id: str) -> int | None:
        """The budget the session was told (None: not a session this knows)."""
        with self._lock:
            state = self._states.get(session_id)
            return None if state is None else state.told

    def after_round(
        self,
        session_id: str,
        *,
        drafted: int,
        ratios: float,
        committed: int,
        epoch: int,
        context: int = 0,
        slo_budget_ms: float | None = None,
    ) -> int:
        """Updates the session's estimates with a verdict (`ratios`: the sum of eq. 3's terms over
        its `drafted` tokens); reassigns the budgets when a new epoch began; the session's next budget."""
        with self._lock:
            state = self._states.setdefault(session_id, BudgetState(budget=self.lo))
            state.context, state.slo_budget_ms = context, slo_budget_ms
            if drafted and math.isfinite(ratios):
                state.alpha = (1 - self.eta) * state.alpha + self.eta * min(max(ratios / drafted, 0.0), 1.0)
            state.goodput = (1 - self.beta) * state.goodput + self.beta * committed
            state.seen = self._clock()
            state.rounds += 1
            if epoch != self._epoch:
                self._assign()
                self._epoch = epoch
            state.told = state.budget
            return state.told

    def forget(self, session_id: str) -> None:
        with self._lock:
            self._remember(self._states.pop(session_id, None))

    def _remember(self, state: BudgetState | None) -> None:
        """Keeps a session's estimates for its client's next session."""
        if state is None or not state.client or not state.rounds:
            return
        self._clients[state.client] = (state.alpha, state.goodput)
        self._clients.move_to_end(state.client)
        while len(self._clients) > MAX_CLIENTS:
            self._clients.popitem(last=False)

    def states(self) -> dict[str, BudgetState]:
        with self._lock:
            return {k: BudgetState(**vars(v)) for k, v in self._states.items()}

    def _prune(self) -> None:
        now = self._clock()
        for sid in [s for s, st in self._states.items() if now - st.seen > 10 * self.active_s or not self.is_live(s)]:
            self._remember(self._states.pop(sid))  # gone without a close (evicted, or its device vanished)

    def _assign(self) -> None:
        self._prune()
        now = self._clock()
        active = []
        for sid, st in self._states.items():
            if now - st.seen <= self.active_s:
                active.append((sid, st))
            else:
                st.budget = self.lo  # idle: it takes no share until it comes back
        if not active:
            return
        capacity = self.capacity([st for _, st in active])
        self.last_capacity = capacity
        budgets = self.policy.assign([st for _, st in active], capacity, self.lo, self.hi)
        for (_, st), b in zip(active, budgets, strict=True):
            st.budget = int(b)


def capacity_within(
    predict_ms: Callable[[np.ndarray], float], states: Sequence[BudgetState], lo: int, hi: int
) -> int:
    """C by default: the most draft tokens per pass (lo to hi per session) whose predicted verify
    time (`predict_ms` of the batch's features, `batch_features`' layout) still meets the tightest
    round budget of the sessions with an SLO; without one, DEFAULT_WINDOW per session. The extra
    tokens of an uneven split are put on the longest contexts (the costliest case)."""
    n = len(states)
    budgets = [s.slo_budget_ms for s in states if s.slo_budget_ms is not None and math.isfinite(s.slo_budget_ms)]
    if not budgets:
        return max(n * lo, min(n * hi, n * DEFAULT_WINDOW))
    tightest = min(budgets)
    contexts = np.sort(np.array([max(s.context - 1, 0) for s in states], dtype=np.float64))[::-1]

    def fits(c: int) -> bool:
        rows = np.full(n, c // n + 1, dtype=np.float64)  # each session's block and the token before it
        rows[: c % n] += 1
        x = np.array([rows.sum(), ((contexts + rows) * rows).sum(), contexts.sum(), rows.sum(), 1.0])
        return predict_ms(x) <= tightest

    low, high = n * lo, n * hi  # the predicted time grows with c: the largest c that fits, by bisection
    if not fits(low):
        return low  # never under the floor
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if fits(mid) else (low, mid - 1)
    return low
