"""First come, first served: the baseline policy (SLED's verifier, and today's)."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future

import numpy as np

from ._base import Batch, Work, WorkResult

__all__ = ["FcfsScheduler"]


class FcfsScheduler:
    """Batches works in the order they arrived: each batch takes the oldest
    waiting works while they fit in `max_rows` rows and `max_works` works
    (`max_works=1`: one session at a time). The oldest work always goes, however
    many rows it has: nothing waits forever."""

    def __init__(self, *, max_rows: int = 512, max_works: int | None = None) -> None:
        if max_rows < 1 or (max_works is not None and max_works < 1):
            raise ValueError("a batch needs room for at least one row and one work")
        self.max_rows = max_rows
        self.max_works = max_works
        self._queue: deque[Work] = deque()
        self._lock = threading.Lock()

    def submit(self, work: Work) -> Future[WorkResult]:
        with self._lock:
            self._queue.append(work)
        return work.future

    def waiting(self) -> int:
        with self._lock:
            return len(self._queue)

    def schedule(self) -> Batch | None:
        with self._lock:
            works: list[Work] = []
            rows = 0
            while self._queue and (self.max_works is None or len(works) < self.max_works):
                work = self._queue[0]
                if work.future.cancelled():  # its caller gave up before it ran
                    self._queue.popleft()
                    continue
                if works and rows + work.rows > self.max_rows:
                    break
                works.append(self._queue.popleft())
                rows += work.rows
            for work in works:
                work.future.set_running_or_notify_cancel()
            return Batch(tuple(works)) if works else None

    def update(self, batch: Batch, outputs: Sequence[np.ndarray] | BaseException, run_ms: float) -> None:
        for i, work in enumerate(batch.works):
            if isinstance(outputs, BaseException):
                work.future.set_exception(outputs)
            else:
                queue_ms = (batch.dispatched - work.submitted) * 1e3
                work.future.set_result(WorkResult(outputs[i], queue_ms, run_ms, len(batch.works)))
