"""First come, first served, one work per batch: the baseline policy."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future

import numpy as np

from ._base import Batch, Work, WorkResult

__all__ = ["FcfsScheduler"]


class FcfsScheduler:
    """Runs works in the order they arrive, each in a batch of its own."""

    def __init__(self) -> None:
        self._queue: deque[Work] = deque()
        self._lock = threading.Lock()

    def submit(self, work: Work) -> Future[WorkResult]:
        with self._lock:
            self._queue.append(work)
        return work.future

    def schedule(self) -> Batch | None:
        with self._lock:
            return Batch((self._queue.popleft(),)) if self._queue else None

    def update(self, batch: Batch, outputs: Sequence[np.ndarray] | BaseException, run_ms: float) -> None:
        for i, work in enumerate(batch.works):
            if isinstance(outputs, BaseException):
                work.future.set_exception(outputs)
            else:
                queue_ms = (batch.dispatched - work.submitted) * 1e3
                work.future.set_result(WorkResult(outputs[i], queue_ms, run_ms, len(batch.works)))
