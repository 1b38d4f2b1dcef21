"""First come, first served: the baseline policy (SLED's verifier, and today's)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._base import Batch, Work, WorkQueue

if TYPE_CHECKING:
    from ...config import ServerConfig
    from .._estimator import VerifyTimeEstimator

__all__ = ["FcfsScheduler"]


class FcfsScheduler(WorkQueue):
    """Batches works in the order they arrived: each batch takes the oldest
    waiting works while they fit in `max_rows` rows and `max_works` works
    (`max_works=1`: one session at a time). The oldest work always goes, however
    many rows it has: nothing waits forever. `prefill_chunk`, `max_queue`: as
    `WorkQueue` takes them."""

    name = "fcfs"

    def __init__(
        self,
        *,
        max_rows: int = 512,
        max_works: int | None = None,
        prefill_chunk: int | None = None,
        max_queue: int | None = None,
    ) -> None:
        if max_rows < 1 or (max_works is not None and max_works < 1):
            raise ValueError("a batch needs room for at least one row and one work")
        super().__init__(prefill_chunk=prefill_chunk, max_queue=max_queue)
        self.max_rows = max_rows
        self.max_works = max_works

    def schedule(self) -> Batch | None:
        with self._lock:
            works: list[Work] = []
            rows = 0
            while self._queue and (self.max_works is None or len(works) < self.max_works):
                work = self._queue[0]
                if work.future.cancelled():  # its caller gave up before it ran
                    self._queue.pop(0)
                    continue
                if works and rows + work.rows > self.max_rows:
                    break
                works.append(self._queue.pop(0))
                rows += work.rows
            for work in works:
                work.future.set_running_or_notify_cancel()
            return Batch(tuple(works)) if works else None


def build(estimator: VerifyTimeEstimator, config: ServerConfig) -> FcfsScheduler:
    """The policy as `SCHEDULERS` builds it (it needs no estimate of the time a batch takes)."""
    return FcfsScheduler(max_rows=config.max_batch_rows, prefill_chunk=config.prefill_chunk, max_queue=config.max_queue)
