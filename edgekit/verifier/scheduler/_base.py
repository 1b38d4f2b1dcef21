"""The scheduler seam: what runs on the engine next, and nothing else.

As vLLM v1 splits it (`vllm/v1/core/sched/interface.py`): work is `submit`ted
and gets a future; `schedule` picks the next batch; `update` hands a batch's
results back to its futures; `withdraw` takes back work whose call gave up (as
vLLM's `finish_requests` aborts a request). The engine core drives the loop
(`schedule` -> `Engine.run_batch` -> `update`) and decides nothing; the scheduler
never touches the engine. What runs, when, and whether it is taken at all is the
scheduler's to decide:

- admission: with `max_queue` works waiting, `submit` refuses new work with a
  back-off hint, about as long as the engine needs to run what waits (at the
  time per row of the batches `update` has been told of);
- chunked prefill: a prompt or a turn longer than `prefill_chunk` tokens runs in
  chunks, each a work of its own, queued once the one before has run: other
  sessions' rounds run between them, and no prefill holds the engine for more
  than one chunk (as vLLM's and SGLang's schedulers do);
- order and batching: the policy (FCFS, WISP's SLO-aware batching) picks each
  batch from what waits.

`WorkQueue` does the first two for every policy; a policy adds `schedule`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np

from ...errors import LimitExceededError
from ..engine import Feed, FeedOutput, KeptRows, split_output

__all__ = ["Batch", "Objective", "Scheduler", "Work", "WorkQueue", "WorkResult", "complete"]


@dataclass(frozen=True)
class Objective:
    """What a work is for, as a policy weighs it (WISP sec. 4.2)."""

    deadline: float | None = None  # time.perf_counter() by which its round should be answered (eq. 12); None: none
    budget_ms: float | None = None  # the round's server-side budget tau (eq. 6)
    value: float = 0.0  # tokens it is expected to commit (eq. 5, plus the verifier's own)
    arrived: float | None = None  # time.perf_counter() when its request arrived; None: when submitted


_NO_LOGITS = np.empty((0, 0), dtype=np.float32)


@dataclass(frozen=True)
class WorkResult:
    logits: np.ndarray  # [n_out, n_vocab]; [0, 0] for an `argmax` feed
    queue_ms: float  # from submission to dispatch
    run_ms: float  # the batch it ran in, on the engine
    batch_size: int  # works in that batch
    estimated_ms: float = 0.0  # what the scheduler's estimator expected of that batch (0: no estimate)
    hidden: np.ndarray | None = None  # [n_out, n_embd], the target's hidden rows when the feed asked for them
    best: np.ndarray | None = None  # [n_out], each row's best id, for an `argmax` feed (its logits never copied)
    ids: np.ndarray | None = None  # a cutting feed's: the vocabulary ids of `logits`' columns (`KeptRows`)


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
        """Queues `work`; its future completes when a batch holding it (all of it, for a
        prefill the scheduler runs in chunks) has run. Raises `LimitExceededError`, with a
        back-off hint, to refuse it."""
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

    def withdraw(self, work: Work) -> bool:
        """Takes back a submitted `work` whose call gave up: True when none of it runs now (none
        of it ever will). False when some of it runs: what runs completes; a work run in one
        piece gets its result, a prefill in chunks gets it if that was its last chunk, and is
        cancelled (its future's `result` raises `CancelledError`) if not."""
        ...


def complete(batch: Batch, outputs: Sequence[FeedOutput] | BaseException, run_ms: float) -> None:
    """Hands a batch's outputs (or the error that stopped it) to its works' futures."""
    for i, work in enumerate(batch.works):
        if isinstance(outputs, BaseException):
            work.future.set_exception(outputs)
        else:
            queue_ms = (batch.dispatched - work.submitted) * 1e3
            raw, hidden = split_output(outputs[i])
            out, ids = (raw.logits, raw.ids) if isinstance(raw, KeptRows) else (raw, None)
            logits, best = (_NO_LOGITS, out) if work.feed.argmax else (out, None)
            work.future.set_result(
                WorkResult(logits, queue_ms, run_ms, len(batch.works), batch.estimated_ms, hidden, best, ids)
            )


@dataclass(eq=False)
class _Prefill:
    """A prefill run in chunks: the submitted work (its future answers for the whole) and the
    chunk of it queued or running now."""

    work: Work
    chunk: Work
    queue_ms: float = 0.0  # of the chunks that ran
    run_ms: float = 0.0
    withdrawn: bool = False  # its call gave up while a chunk ran: no chunk after that one


class WorkQueue:
    """What every policy shares: the waiting works, in arrival order, under a lock;
    admission (at most `max_queue` works waiting) and chunked prefill (`prefill_chunk`
    tokens a chunk); `update` hands results back and queues a prefill's next chunk.
    None, the default: an unbounded queue, prefills in one piece (the service builds its
    policy with the config's bounds). A policy adds `schedule`."""

    def __init__(self, *, prefill_chunk: int | None = None, max_queue: int | None = None) -> None:
        if (prefill_chunk is not None and prefill_chunk < 1) or (max_queue is not None and max_queue < 1):
            raise ValueError("prefill_chunk and max_queue must be at least 1 (or None: no limit)")
        self.prefill_chunk = prefill_chunk
        self.max_queue = max_queue
        self._queue: list[Work] = []
        self._lock = threading.Lock()
        self._prefills: dict[Work, _Prefill] = {}  # by the chunk queued or running
        self._ms_per_row = 0.0  # the engine's recent time per row, for back-off hints

    def submit(self, work: Work) -> Future[WorkResult]:
        chunked = self.prefill_chunk is not None and work.feed.n_out == 0 and work.rows > self.prefill_chunk
        first = self._chunk(work, 0) if chunked else work
        with self._lock:
            waiting = len(self._queue)
            if self.max_queue is not None and waiting >= self.max_queue:
                # Back off for about as long as the engine needs to run what waits.
                wait = max(0.05, waiting * max(first.rows, 1) * self._ms_per_row / 1e3)
                raise LimitExceededError(
                    f"the verifier's queue is full ({waiting} works waiting); try again in {wait:.2f} s",
                    retry_after=wait,
                )
            if chunked:
                self._prefills[first] = _Prefill(work, first)
            self._queue.append(first)
        return work.future

    def waiting(self) -> int:
        with self._lock:
            return len(self._queue)

    def update(self, batch: Batch, outputs: Sequence[FeedOutput] | BaseException, run_ms: float) -> None:
        complete(batch, outputs, run_ms)
        with self._lock:
            if not isinstance(outputs, BaseException):
                rows = sum(w.rows for w in batch.works)
                self._ms_per_row = 0.8 * self._ms_per_row + 0.2 * run_ms / max(rows, 1)
            for chunk in batch.works:
                prefill = self._prefills.pop(chunk, None)
                if prefill is not None:
                    self._next_chunk(prefill)

    def withdraw(self, work: Work) -> bool:
        with self._lock:  # a prefill's future and chunk change together, in `update`, under it too
            prefill = next((p for p in self._prefills.values() if p.work is work), None)
            if prefill is None:
                return work.future.cancel()  # still queued: a policy drops it unrun
            if prefill.chunk.future.cancel():  # its chunk waits: neither it nor the rest ever run
                del self._prefills[prefill.chunk]
                return work.future.cancel()
            prefill.withdrawn = True
            return False

    def _chunk(self, work: Work, offset: int) -> Work:
        # Every chunk keeps the prefill's objective, its arrival with it: a policy's bound on
        # waiting holds for the whole prefill.
        assert self.prefill_chunk is not None
        feed = work.feed
        part = replace(feed, start=feed.start + offset, tokens=feed.tokens[offset : offset + self.prefill_chunk])
        return Work(part, work.session_id, work.slo_class, work.objective)

    def _next_chunk(self, prefill: _Prefill) -> None:
        """The chunk that ran hands over to the next, or its prefill's future completes."""
        chunk, work = prefill.chunk, prefill.work
        if work.future.cancelled():  # by its caller, not through `withdraw`: the rest never runs
            return
        error = chunk.future.exception()
        if error is not None:
            work.future.set_exception(error)
            return
        ran = chunk.future.result()
        prefill.queue_ms += ran.queue_ms
        prefill.run_ms += ran.run_ms
        offset = chunk.feed.start - work.feed.start + chunk.rows
        if offset >= work.rows:  # its last chunk: the prefill's logits are that chunk's none
            work.future.set_result(WorkResult(ran.logits, prefill.queue_ms, prefill.run_ms, ran.batch_size))
        elif prefill.withdrawn:
            work.future.cancel()
        else:
            prefill.chunk = self._chunk(work, offset)
            self._prefills[prefill.chunk] = prefill
            self._queue.append(prefill.chunk)
