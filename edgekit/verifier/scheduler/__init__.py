"""Which work the verifier's engine runs next: the `Scheduler` seam and its policies."""

from ._base import Batch, Scheduler, Work, WorkResult
from ._fcfs import FcfsScheduler

__all__ = ["Batch", "FcfsScheduler", "Scheduler", "Work", "WorkResult"]
