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
and, at debug level, to the log beside that forecast. The loop's time by stage (idle,
scheduling, the run, the bookkeeping after it) and each caller's wait, split into its
queue, its batch's run and the handoff back, go to the statistics' `stages` (`_stages`).
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
from ._stages import ENGINE_STEP, mark, mark_wait
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
        mark("checks")  # the caller's part, up to here
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
        mark("submit")
        result = self._wait(work, future, deadline)
        mark_wait(work.submitted + result.queue_ms / 1e3, result.run_ms / 1e3)
        return result

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
            began = time.perf_counter()
            with self._wake:
                scheduling = time.perf_counter()
                batch = self.scheduler.schedule()
                while batch is None:
                    woken = self._wake.wait(timeout=self.idle_s)
                    scheduling = time.perf_counter()
                    batch = self.scheduler.schedule()
                    if batch is None and (self._closed or not woken):
                        self._thread = None
                        return
                scheduled = time.perf_counter()
            self._step(batch, {"idle": scheduling - began, "schedule": scheduled - scheduling})

    def _step(self, batch: Batch, loop_s: dict[str, float]) -> None:
        """Runs `batch`; `loop_s`: the loop's seconds before it (waiting for work, scheduling),
        counted with the step's own stages (`_stages`)."""
        t_plan = time.perf_counter()
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
        t_ran = time.perf_counter()
        ms = (t_ran - t0) * 1e3
        rows = sum(len(f.tokens) for f in feeds)
        self.stats.record_batch(len(batch.works), rows, ms, estimated)
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "batch: %d works, %d rows, %d cached, estimated %.1f ms, ran %.1f ms",
                len(feeds), rows, int(x[2]), estimated, ms,
            )
        self.estimator.observe_features(x, ms)
        t_recorded = time.perf_counter()
        self.scheduler.update(batch, outputs, ms)
        loop_s.update(plan=t0 - t_plan, run=t_ran - t0, record=t_recorded - t_ran,
                      update=time.perf_counter() - t_recorded)
        self.stats.stages.add(ENGINE_STEP, loop_s)

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
