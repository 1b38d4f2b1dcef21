"""Which work the verifier's engine runs next, and whether it is taken at all: the `Scheduler`
seam and its policies, by name in `SCHEDULERS` (`edgekit.registry`: what `ServerConfig.policy` and
`edgekit serve --policy` name; a policy is a module here with a `build(estimator, config)` and a
line there). Each is built with the config's bounds on the queue (`max_queue`), on a
prefill's chunk (`prefill_chunk`) and on a batch's rows (`max_batch_rows`); the engine core only
runs what it schedules."""

from __future__ import annotations

from ...registry import SCHEDULERS
from ._base import Batch, Objective, Scheduler, Work, WorkResult
from ._fcfs import FcfsScheduler
from ._wisp import WispScheduler

__all__ = ["SCHEDULERS", "Batch", "FcfsScheduler", "Objective", "Scheduler", "WispScheduler", "Work", "WorkResult"]
