"""The scheduler seam: what runs on the engine next, and nothing else.

As vLLM v1 splits it (`vllm/v1/core/sched/interface.py`): work is `submit`ted
and gets a future; `schedule` picks the next batch; `update` hands a batch's
results back to its futures. The engine core drives the loop
(`schedule` -> `Engine.run_batch` -> `update`); the scheduler never touches the
engine and the engine never decides. Policies (FCFS now; SLO-aware batching,
budgets) are schedulers.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from ..engine import Feed

__all__ = ["Batch", "Scheduler", "Work", "WorkResult"]


@dataclass(frozen=True)
class WorkResult:
    logits: np.ndarray  # [n_out, n_vocab]
    queue_ms: float  # from submission to dispatch
    run_ms: float  # the batch it ran in, on the engine
    batch_size: int  # works in that batch


@dataclass(eq=False)
class Work:
    """One feed for the engine, on behalf of a session (what a policy decides on)."""

    feed: Feed
    session_id: str = ""
    slo_class: str = "standard"
    submitted: float = field(default_factory=time.perf_counter)
    future: Future[WorkResult] = field(default_factory=Future)

    @property
    def rows(self) -> int:
        """Tokens it puts through the engine."""
        return len(self.feed.tokens)


@dataclass(frozen=True)
class Batch:
    works: tuple[Work, ...]
    dispatched: float = field(default_factory=time.perf_counter)

    @property
    def feeds(self) -> list[Feed]:
        return [w.feed for w in self.works]


class Scheduler(Protocol):
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

    def update(self, batch: Batch, outputs: Sequence[np.ndarray] | BaseException, run_ms: float) -> None:
        """A batch ran: its outputs (one per work, in order) or the error that stopped it."""
        ...
