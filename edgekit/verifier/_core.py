"""`EngineCore`: runs the scheduler's batches on the engine, and only that.

One thread, the core's, owns the engine: it takes a batch from the scheduler,
runs it, hands the outputs back (`schedule` -> `Engine.run_batch` -> `update`,
as vLLM's engine core), and takes the next. Handlers submit work and wait on
its future; whatever queues while a batch runs goes into the next one, so
sessions are verified together as soon as they are waiting together. The thread
starts with the first work and leaves after a while idle.

A prompt or a turn longer than `prefill_chunk` tokens goes in chunks, each a
work of its own: other sessions' rounds run between them, and no prefill holds
the engine for more than one chunk (chunked prefill, as vLLM and SGLang do).
A work still queued when its call's deadline passes is withdrawn, never run.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout

import numpy as np

from ..errors import LimitExceededError, VerifierUnavailableError
from .engine import Engine, Feed
from .scheduler import Batch, Scheduler, Work, WorkResult

__all__ = ["EngineCore"]


class EngineCore:
    def __init__(self, engine: Engine, scheduler: Scheduler, *, prefill_chunk: int = 128, idle_s: float = 5.0) -> None:
        self.engine = engine
        self.scheduler = scheduler
        self.prefill_chunk = prefill_chunk
        self.idle_s = idle_s
        self.batch_sizes: Counter[int] = Counter()  # batches run so far, by how many works each held
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False

    def run(
        self, feed: Feed, *, session_id: str = "", slo_class: str = "standard", deadline: float | None = None
    ) -> WorkResult:
        """Runs `feed`: its logits and timings, or the engine's error. `deadline` is a
        `time.monotonic()` by which the work must have started."""
        if feed.n_out == 0 and len(feed.tokens) > self.prefill_chunk:
            return self._chunked(feed, session_id, slo_class, deadline)
        return self._wait(self._submit(Work(feed, session_id, slo_class)), deadline)

    def _chunked(self, feed: Feed, session_id: str, slo_class: str, deadline: float | None) -> WorkResult:
        queue_ms = run_ms = 0.0
        batch_size = 1
        for lo in range(0, len(feed.tokens), self.prefill_chunk):
            part = Feed(feed.seq, feed.start + lo, feed.tokens[lo : lo + self.prefill_chunk], 0)
            done = self._wait(self._submit(Work(part, session_id, slo_class)), deadline)
            queue_ms, run_ms, batch_size = queue_ms + done.queue_ms, run_ms + done.run_ms, done.batch_size
        return WorkResult(np.empty((0, self.engine.n_vocab), dtype=np.float32), queue_ms, run_ms, batch_size)

    def _submit(self, work: Work) -> Future[WorkResult]:
        with self._wake:
            if self._closed:
                raise VerifierUnavailableError("the verifier is shutting down")
            future = self.scheduler.submit(work)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="edgekit-engine", daemon=True)
                self._thread.start()
            self._wake.notify()
        return future

    def _wait(self, future: Future[WorkResult], deadline: float | None) -> WorkResult:
        if deadline is not None:
            try:
                return future.result(timeout=max(deadline - time.monotonic(), 0.0))
            except FutureTimeout:
                if future.cancel():  # still queued: it never runs
                    raise LimitExceededError(
                        "the verifier could not start this work before the call's deadline", code="DEADLINE_EXCEEDED"
                    ) from None
                # already running: its result is applied (a retry of the call finds it)
        return future.result()

    def _loop(self) -> None:
        while True:
            with self._wake:
                batch = self.scheduler.schedule()
                while batch is None:
                    woken = self._wake.wait(timeout=self.idle_s)
                    batch = self.scheduler.schedule()
                    if batch is None and (self._closed or not woken):
                        self._thread = None
                        return
            self._step(batch)

    def _step(self, batch: Batch) -> None:
        t0 = time.perf_counter()
        try:
            outputs = self.engine.run_batch(batch.feeds)
        except Exception as exc:  # each work's caller raises it
            self.scheduler.update(batch, exc, (time.perf_counter() - t0) * 1e3)
            return
        self.batch_sizes[len(batch.works)] += 1
        self.scheduler.update(batch, outputs, (time.perf_counter() - t0) * 1e3)

    def close(self, timeout: float = 10.0) -> None:
        """Runs what is queued, then stops the thread; later work is refused."""
        with self._wake:
            self._closed = True
            thread = self._thread
            self._wake.notify()
        if thread is not None:
            thread.join(timeout)
