"""`EngineCore`: runs the scheduler's batches on the engine, and only that.

Each step asks the scheduler for a batch, runs it on the engine, and hands the
outputs back (`schedule` -> `run_batch` -> `update`, as vLLM's engine core).
There is no engine thread yet: the thread that submits work drives steps, one
at a time under the core's lock, until its own work is done, so a batch may
hold another thread's work. KV rollbacks take the same lock: the engine is
used by one thread at a time.
"""

from __future__ import annotations

import threading
import time

from ..errors import InferenceError
from .engine import Engine, Feed
from .scheduler import Batch, Scheduler, Work, WorkResult

__all__ = ["EngineCore"]


class EngineCore:
    def __init__(self, engine: Engine, scheduler: Scheduler) -> None:
        self.engine = engine
        self.scheduler = scheduler
        self._lock = threading.Lock()

    def run(self, feed: Feed, *, session_id: str = "", slo_class: str = "standard") -> WorkResult:
        """Runs `feed` through the scheduler; its logits and timings, or the engine's error."""
        future = self.scheduler.submit(Work(feed, session_id, slo_class))
        with self._lock:
            while not future.done():
                batch = self.scheduler.schedule()
                if batch is None:
                    raise InferenceError(f"the scheduler has no batch while work of session {session_id!r} waits")
                self._step(batch)
        return future.result()

    def _step(self, batch: Batch) -> None:
        t0 = time.perf_counter()
        try:
            outputs = self.engine.run_batch(batch.feeds)
        except Exception as exc:  # each work's caller raises it
            self.scheduler.update(batch, exc, (time.perf_counter() - t0) * 1e3)
            return
        self.scheduler.update(batch, outputs, (time.perf_counter() - t0) * 1e3)

    def truncate(self, seq: int, length: int) -> None:
        with self._lock:
            self.engine.truncate(seq, length)

    def release(self, seq: int) -> None:
        with self._lock:
            self.engine.release(seq)
