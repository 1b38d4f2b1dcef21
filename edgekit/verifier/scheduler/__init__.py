"""Which work the verifier's engine runs next: the `Scheduler` seam and its policies."""

from ._base import Batch, Objective, Scheduler, Work, WorkResult
from ._fcfs import FcfsScheduler
from ._wisp import WispScheduler

__all__ = ["Batch", "FcfsScheduler", "Objective", "Scheduler", "WispScheduler", "Work", "WorkResult"]
