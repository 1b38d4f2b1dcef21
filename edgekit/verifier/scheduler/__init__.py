"""Which work the verifier's engine runs next, and whether it is taken at all: the `Scheduler`
seam and its policies, by name in `SCHEDULERS` (what `ServerConfig.policy` and `edgekit serve
--policy` name). Each is built with the config's bounds on the queue (`max_queue`), on a
prefill's chunk (`prefill_chunk`) and on a batch's rows (`max_batch_rows`); the engine core only
runs what it schedules."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ._base import Batch, Objective, Scheduler, Work, WorkResult
from ._fcfs import FcfsScheduler
from ._wisp import WispScheduler

if TYPE_CHECKING:
    from ...config import ServerConfig
    from .._estimator import VerifyTimeEstimator

__all__ = ["SCHEDULERS", "Batch", "FcfsScheduler", "Objective", "Scheduler", "WispScheduler", "Work", "WorkResult"]


def _fcfs(estimator: VerifyTimeEstimator, config: ServerConfig) -> Scheduler:
    return FcfsScheduler(max_rows=config.max_batch_rows, prefill_chunk=config.prefill_chunk, max_queue=config.max_queue)


def _wisp(estimator: VerifyTimeEstimator, config: ServerConfig) -> Scheduler:
    return WispScheduler(
        estimator,
        guard_ms=config.guard_ms,
        starvation_s=config.starvation_s,
        min_efficiency=config.min_efficiency,
        unreachable_share=config.unreachable_share,
        max_rows=config.max_batch_rows,
        prefill_chunk=config.prefill_chunk,
        max_queue=config.max_queue,
    )


# A policy by name: built from the verifier's time estimator and its config.
SCHEDULERS: dict[str, Callable[[VerifyTimeEstimator, ServerConfig], Scheduler]] = {
    "fcfs": _fcfs,
    "wisp": _wisp,
}
