"""`EngineCore`: runs the scheduler's batches on the engine, and only that.

One thread, the core's, owns the engine: it takes a batch from the scheduler,
runs it, hands the outputs back (`schedule` -> `Engine.run_batch` -> `update`,
as vLLM's engine core), and takes the next. Handlers submit work and wait on
its future; whatever queues while a batch runs goes into the next one, so
sessions are verified together as soon as they are waiting together. The thread
starts with the first work and leaves after a while idle.

The core decides nothing about the work: the scheduler does (`scheduler/`), from
whether a work is taken at all (a full queue refuses it with a back-off hint) and
how a long prefill is cut into chunks, to what each batch holds. When a call's
deadline passes, the core asks the scheduler to withdraw its work, and answers the
call DEADLINE_EXCEEDED if none of it had started. Every batch's run time goes to
the verification-time estimator (which the SLO-aware policy plans with), to the
serving statistics with its size and forecast, to the scheduler with the outputs,
and, at debug level, to the log beside that forecast.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from concurrent.futures import CancelledError, Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import replace

from ..errors import LimitExceededError, VerifierUnavailableError
from ._estimator import VerifyTimeEstimator, batch_features
from ._stats import ServingStats
from .engine import Engine, Feed
from .scheduler import Batch, Objective, Scheduler, Work, WorkResult

__all__ = ["EngineCore"]

log = logging.getLogger("edgekit.verifier")


class EngineCore:
    def __init__(
        self,
        engine: Engine,
        scheduler: Scheduler,
        *,
        estimator: VerifyTimeEstimator | None = None,
        idle_s: float = 5.0,
        stats: ServingStats | None = None,
    ) -> None:
        self.engine = engine
        self.scheduler = scheduler
        self.estimator = estimator or VerifyTimeEstimator()
        self.idle_s = idle_s
        self.stats = stats if stats is not None else ServingStats(queue_depth=scheduler.waiting)
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False
        self.epochs = 0  # batches dispatched: the time slots of the budget policy

    @property
    def batch_sizes(self) -> Counter[int]:
        """Batches run so far, by how many works each held."""
        return self.stats.batch_sizes

    @property
    def batch_rows(self) -> Counter[int]:
        """Batches run so far, by how many rows each put through."""
        return self.stats.batch_rows

    def run(
        self,
        feed: Feed,
        *,
        session_id: str = "",
        slo_class: str = "best-effort",
        objective: Objective | None = None,
        deadline: float | None = None,
    ) -> WorkResult:
        """Runs `feed`: its logits and timings, or the engine's error. `objective` is what
        the policy weighs; `deadline` a `time.monotonic()` by which the work (each chunk of
        it, for a prefill the scheduler cuts) must have started (the call's own deadline)."""
        objective = objective or Objective(arrived=time.perf_counter())
        work = Work(feed, session_id, slo_class, objective)
        with self._wake:
            if self._closed:
                raise VerifierUnavailableError("the verifier is shutting down")
            future = self.scheduler.submit(work)  # or its refusal, LimitExceededError
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="edgekit-engine", daemon=True)
                self._thread.start()
            self._wake.notify()
        return self._wait(work, future, deadline)

    def _wait(self, work: Work, future: Future[WorkResult], deadline: float | None) -> WorkResult:
        try:
            if deadline is not None:
                try:
                    return future.result(timeout=max(deadline - time.monotonic(), 0.0))
                except FutureTimeout:
                    if self.scheduler.withdraw(work):  # none of it had started: none of it runs
                        raise _late() from None
                    # some of it runs: that completes, and its result is applied (a retry of the call finds it)
            return future.result()
        except CancelledError:  # a prefill withdrawn while one of its chunks ran: the rest never starts
            raise _late() from None

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
        self.epochs += 1
        feeds = batch.feeds
        x = batch_features(feeds)
        if not batch.estimated_ms:  # the policy did not plan with the estimator: what it says all the same
            batch = replace(batch, estimated_ms=self.estimator.predict_features(x))
        estimated = batch.estimated_ms
        t0 = time.perf_counter()
        try:
            outputs = self.engine.run_batch(feeds)
        except Exception as exc:  # each work's caller raises it
            self.scheduler.update(batch, exc, (time.perf_counter() - t0) * 1e3)
            return
        ms = (time.perf_counter() - t0) * 1e3
        rows = sum(len(f.tokens) for f in feeds)
        self.stats.record_batch(len(batch.works), rows, ms, estimated)
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "batch: %d works, %d rows, %d cached, estimated %.1f ms, ran %.1f ms",
                len(feeds), rows, int(x[2]), estimated, ms,
            )
        self.estimator.observe_features(x, ms)
        self.scheduler.update(batch, outputs, ms)

    def close(self, timeout: float = 10.0) -> None:
        """Runs what is queued, then stops the thread; later work is refused."""
        with self._wake:
            self._closed = True
            thread = self._thread
            self._wake.notify()
        if thread is not None:
            thread.join(timeout)


def _late() -> LimitExceededError:
    return LimitExceededError(
        "the verifier could not start this work before the call's deadline", code="DEADLINE_EXCEEDED"
    )
