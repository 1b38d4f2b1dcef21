"""The scheduler seam: what runs on the engine next, and nothing else.

As vLLM v1 splits it (`vllm/v1/core/sched/interface.py`): work is `submit`ted
and gets a future; `schedule` picks the next batch; `update` hands a batch's
results back to its futures. The engine core drives the loop
(`schedule` -> `Engine.run_batch` -> `update`); the scheduler never touches the
engine and the engine never decides. Policies (FCFS now; SLO-aware batching,
budgets) are schedulers.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from ..engine import Feed, FeedOutput, split_output

__all__ = ["Batch", "Objective", "Scheduler", "Work", "WorkQueue", "WorkResult", "complete"]


@dataclass(frozen=True)
class Objective:
    """What a work is for, as a policy weighs it (WISP sec. 4.2)."""

    deadline: float | None = None  # time.perf_counter() by which its round should be answered (eq. 12); None: none
    budget_ms: float | None = None  # the round's server-side budget tau (eq. 6)
    value: float = 0.0  # tokens it is expected to commit (eq. 5, plus the verifier's own)
    arrived: float | None = None  # time.perf_counter() when its request arrived; None: when submitted


@dataclass(frozen=True)
class WorkResult:
    logits: np.ndarray  # [n_out, n_vocab]
    queue_ms: float  # from submission to dispatch
    run_ms: float  # the batch it ran in, on the engine
    batch_size: int  # works in that batch
    estimated_ms: float = 0.0  # what the scheduler's estimator expected of that batch (0: no estimate)
    hidden: np.ndarray | None = None  # [n_out, n_embd], the target's hidden rows when the feed asked for them


@dataclass(eq=False)
class Work:
    """One feed for the engine, on behalf of a session (what a policy decides on)."""

    feed: Feed
    session_id: str = ""
    slo_class: str = "best-effort"
    objective: Objective = field(default_factory=Objective)
    submitted: float = field(default_factory=time.perf_counter)
    future: Future[WorkResult] = field(default_factory=Future)

    @property
    def rows(self) -> int:
        """Tokens it puts through the engine."""
        return len(self.feed.tokens)

    @property
    def arrived(self) -> float:
        """When its request arrived (its waiting counts from there)."""
        a = self.objective.arrived
        return self.submitted if a is None else a


@dataclass(frozen=True)
class Batch:
    works: tuple[Work, ...]
    dispatched: float = field(default_factory=time.perf_counter)
    estimated_ms: float = 0.0  # the policy's forecast of its run time (0: none)

    @property
    def feeds(self) -> list[Feed]:
        return [w.feed for w in self.works]


class Scheduler(Protocol):
    name: str  # the policy, as the handshake names it ("fcfs", "wisp")

    def submit(self, work: Work) -> Future[WorkResult]:
        """Queues `work`; its future completes when a batch holding it has run.
        A work whose future is cancelled before it is scheduled never runs."""
        ...

    def waiting(self) -> int:
        """Works queued and not yet scheduled."""
        ...

    def schedule(self) -> Batch | None:
        """The next batch to run, taken out of the queue (its works' futures set
        running); None when nothing waits."""
        ...

    def update(self, batch: Batch, outputs: Sequence[FeedOutput] | BaseException, run_ms: float) -> None:
        """A batch ran: its outputs (one per work, in order) or the error that stopped it."""
        ...


def complete(batch: Batch, outputs: Sequence[FeedOutput] | BaseException, run_ms: float) -> None:
    """Hands a batch's outputs (or the error that stopped it) to its works' futures."""
    for i, work in enumerate(batch.works):
        if isinstance(outputs, BaseException):
            work.future.set_exception(outputs)
        else:
            queue_ms = (batch.dispatched - work.submitted) * 1e3
            logits, hidden = split_output(outputs[i])
            work.future.set_result(
                WorkResult(logits, queue_ms, run_ms, len(batch.works), batch.estimated_ms, hidden)
            )


class WorkQueue:
    """What every policy shares: the waiting works, in arrival order, under a lock;
    `update` hands results back. A policy adds `schedule`."""

    def __init__(self) -> None:
        self._queue: list[Work] = []
        self._lock = threading.Lock()

    def submit(self, work: Work) -> Future[WorkResult]:
        with self._lock:
            self._queue.append(work)
        return work.future

    def waiting(self) -> int:
        with self._lock:
            return len(self._queue)

    def update(self, batch: Batch, outputs: Sequence[FeedOutput] | BaseException, run_ms: float) -> None:
        complete(batch, outputs, run_ms)
