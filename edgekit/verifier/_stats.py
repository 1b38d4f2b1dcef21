"""`ServingStats`: what the verifier has served, for its operators.

The engine core records each batch it runs, the rounds each verdict, the
target-only baseline each token, and every call its time by stage (`stages`,
see `_stages`); everything else (a Prometheus endpoint, a benchmark, a test)
reads a `StatsSnapshot`. No third-party import: the
endpoint that turns a snapshot into Prometheus text (`_metrics`) is optional.

The speculative-decoding counters are vLLM's: a draft is a verified block with
at least one draft token; accepted tokens are the draft tokens a verdict kept
(never the verifier's own correction or bonus token); position i of the
per-position counts is counted when the i-th draft token of a block (from 0)
was accepted, so `accepted_per_position[0] / drafts` is the first token's
acceptance. Goodput is committed tokens per second (WISP sec. 5): every token
a verdict or a target-only step committed, whatever its SLO class.
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from itertools import accumulate

from ._stages import StageTimes

__all__ = ["TIME_BUCKETS_S", "ClassStats", "Histogram", "ServingStats", "StatsSnapshot"]

# Upper bounds of the queue and verify time histograms, in seconds (an SLO budget is tens to hundreds of ms).
TIME_BUCKETS_S: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)


@dataclass(frozen=True)
class Histogram:
    """Observations by bucket: `cumulative[i]` counts those <= `bounds[i]`, and one more
    entry, the last, counts them all (Prometheus' `+Inf`)."""

    bounds: tuple[float, ...]
    cumulative: tuple[int, ...]
    sum: float

    @property
    def count(self) -> int:
        return self.cumulative[-1]


@dataclass(frozen=True)
class ClassStats:
    """One SLO class's rounds (speculative rounds only; target-only steps add committed tokens)."""

    rounds: int
    with_deadline: int  # rounds that had a deadline (none in best effort)
    missed: int  # rounds answered after their deadline
    committed_tokens: int  # target-only steps' tokens included
    queue_s: Histogram  # each round's wait for the engine
    verify_s: Histogram  # each round's time being verified (the batch it ran in, the checks, the acceptance)

    @property
    def violation_ratio(self) -> float:
        """Missed deadlines over rounds that had one (0 without any)."""
        return self.missed / self.with_deadline if self.with_deadline else 0.0


@dataclass(frozen=True)
class StatsSnapshot:
    """The counters at one moment; counters only grow while the server runs."""

    batch_sizes: Mapping[int, int]  # batches run, by how many works each held
    batch_rows: Mapping[int, int]  # batches run, by how many rows each put through the engine
    engine_s: float  # the engine's time running them
    estimated_batches: int  # of those, batches the verification-time estimator had a forecast for
    estimated_s: float  # its forecasts for them
    estimate_error_s: float  # sum over them of |forecast - measured|
    queue_depth: int  # works waiting for the engine now
    sessions: int  # sessions open now (target-only generations included)
    classes: Mapping[str, ClassStats]
    drafts: int
    draft_tokens: int
    accepted_tokens: int
    accepted_per_position: tuple[int, ...]  # as long as the longest block verified
    committed_tokens: int  # by verdicts and target-only steps
    generated_tokens: int  # of those, by target-only steps (Generate)
    goodput: float  # committed tokens per second over the window
    window_s: float  # the window goodput was measured over (shorter than asked for just after start)
    semantic_rounds: int = 0  # rounds verified in semantic mode (lossy, WISV)
    semantic_accepted: int = 0  # mismatches its decision head accepted in them (counted in accepted_tokens too)
    # Seconds by call and stage, and calls ({method: {"calls": n, stage: s}}; `StageTimes.totals`).
    stages: Mapping[str, Mapping[str, float]] = field(default_factory=dict)

    @property
    def batches(self) -> int:
        return sum(self.batch_sizes.values())

    @property
    def acceptance_rate(self) -> float:
        """Accepted over drafted tokens (0 before any draft)."""
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0


class _Histogram:
    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1  # the first bucket whose bound is >= value
        self.sum += value

    def frozen(self) -> Histogram:
        return Histogram(self.bounds, tuple(accumulate(self.counts)), self.sum)


class _Class:
    def __init__(self) -> None:
        self.rounds = self.with_deadline = self.missed = self.committed = 0
        self.queue_s = _Histogram(TIME_BUCKETS_S)
        self.verify_s = _Histogram(TIME_BUCKETS_S)

    def frozen(self) -> ClassStats:
        return ClassStats(
            self.rounds, self.with_deadline, self.missed, self.committed, self.queue_s.frozen(), self.verify_s.frozen()
        )


class ServingStats:
    """Thread-safe serving counters. `queue_depth` and `sessions` are read live when a
    snapshot is taken; `classes` are SLO classes to report (with zeros) before their
    first round; goodput's gauge counts the last `window_s` seconds, to the second."""

    def __init__(
        self,
        *,
        classes: Iterable[str] = (),
        queue_depth: Callable[[], int] = lambda: 0,
        sessions: Callable[[], int] = lambda: 0,
        window_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not window_s > 0:
            raise ValueError(f"window_s must be positive, got {window_s}")
        self._queue_depth = queue_depth
        self._sessions = sessions
        self.window_s = window_s
        self._clock = clock
        self._started = clock()
        self._lock = threading.Lock()
        self._batch_sizes: Counter[int] = Counter()
        self._batch_rows: Counter[int] = Counter()
        self._engine_s = self._estimated_s = self._error_s = 0.0
        self._estimated_batches = 0
        self._classes = {name: _Class() for name in classes}
        self._drafts = self._draft_tokens = self._accepted = 0
        self._per_position: list[int] = []
        self._committed = self._generated = 0
        self._semantic_rounds = self._semantic_accepted = 0
        self._recent: deque[list[int]] = deque()  # [second, tokens committed in it], oldest first
        self.stages = StageTimes()  # where calls and the engine loop spend their time; recorded by them

    # -- what the verifier's parts record --------------------------------------------------------

    def record_batch(self, works: int, rows: int, run_ms: float, estimated_ms: float) -> None:
        """A batch the engine ran: how many works and rows, its time and its forecast (0: none,
        as from an estimator that has not seen a batch yet)."""
        with self._lock:
            self._batch_sizes[works] += 1
            self._batch_rows[rows] += 1
            self._engine_s += run_ms / 1e3
            if estimated_ms > 0:
                self._estimated_batches += 1
                self._estimated_s += estimated_ms / 1e3
                self._error_s += abs(estimated_ms - run_ms) / 1e3

    def record_round(
        self,
        slo_class: str,
        *,
        drafted: int,
        accepted: int,
        committed: int,
        queue_ms: float,
        verify_ms: float,
        deadline_met: bool | None,
        semantic_accepted: int | None = None,
    ) -> None:
        """A verdict: the block's length, the draft tokens it kept, the tokens it committed,
        the round's time on the server, whether it met its deadline (None: it had none) and,
        in semantic mode, how many mismatches its head accepted (None: another mode)."""
        with self._lock:
            if semantic_accepted is not None:
                self._semantic_rounds += 1
                self._semantic_accepted += semantic_accepted
            c = self._class(slo_class)
            c.rounds += 1
            if deadline_met is not None:
                c.with_deadline += 1
                c.missed += not deadline_met
            c.committed += committed
            c.queue_s.observe(queue_ms / 1e3)
            c.verify_s.observe(verify_ms / 1e3)
            if drafted > 0:
                self._drafts += 1
                self._draft_tokens += drafted
                self._accepted += accepted
                if len(self._per_position) < drafted:
                    self._per_position += [0] * (drafted - len(self._per_position))
                for i in range(accepted):
                    self._per_position[i] += 1
            self._commit(committed)

    def record_generated(self, slo_class: str, tokens: int = 1) -> None:
        """Tokens a target-only step (Generate) committed."""
        with self._lock:
            self._class(slo_class).committed += tokens
            self._generated += tokens
            self._commit(tokens)

    # -- what readers see ----------------------------------------------------------------------

    def snapshot(self) -> StatsSnapshot:
        depth, sessions = self._queue_depth(), self._sessions()
        stages = self.stages.totals()
        with self._lock:
            now = self._clock()
            self._prune(now)
            span = min(self.window_s, now - self._started)
            recent = sum(n for _, n in self._recent)
            return StatsSnapshot(
                batch_sizes=dict(self._batch_sizes),
                batch_rows=dict(self._batch_rows),
                engine_s=self._engine_s,
                estimated_batches=self._estimated_batches,
                estimated_s=self._estimated_s,
                estimate_error_s=self._error_s,
                queue_depth=depth,
                sessions=sessions,
                classes={name: c.frozen() for name, c in self._classes.items()},
                drafts=self._drafts,
                draft_tokens=self._draft_tokens,
                accepted_tokens=self._accepted,
                accepted_per_position=tuple(self._per_position),
                committed_tokens=self._committed,
                generated_tokens=self._generated,
                semantic_rounds=self._semantic_rounds,
                semantic_accepted=self._semantic_accepted,
                # Not below one second: a token in the first instant is not a rate of thousands.
                goodput=recent / max(span, 1.0),
                window_s=span,
                stages=stages,
            )

    @property
    def batch_sizes(self) -> Counter[int]:
        """Batches run so far, by how many works each held (a copy)."""
        with self._lock:
            return self._batch_sizes.copy()

    @property
    def batch_rows(self) -> Counter[int]:
        """Batches run so far, by how many rows each put through the engine (a copy)."""
        with self._lock:
            return self._batch_rows.copy()

    # -- helpers (under the lock) --------------------------------------------------------------

    def _class(self, name: str) -> _Class:
        c = self._classes.get(name)
        if c is None:
            c = self._classes[name] = _Class()
        return c

    def _commit(self, tokens: int) -> None:
        self._committed += tokens
        now = self._clock()
        second = int(now)
        if self._recent and self._recent[-1][0] == second:
            self._recent[-1][1] += tokens
        else:
            self._recent.append([second, tokens])
        self._prune(now)

    def _prune(self, now: float) -> None:
        # A second's bucket stays while any of it lies inside the window.
        while self._recent and self._recent[0][0] + 1 <= now - self.window_s:
            self._recent.popleft()
