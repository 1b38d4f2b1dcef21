"""Running a plan: the tasks of a batch start each round together.

`Phaser` is a barrier whose parties may leave (a task that has finished, or failed,
stops holding the others). `Paced` wraps a task's drafting controller so that the
first window it is asked for in a round waits for the batch's other tasks: their draft
steps then coincide and run as one decode in the draft pool, and the batch's blocks go
out for verification together. Batches are not synchronised with each other, so while
one batch waits for its verdicts the next one drafts (the pipeline of paper 003, Fig. 4).
"""

from __future__ import annotations

import threading

from ..drafting import Controller, Decision
from ..runtime import DraftOutput

__all__ = ["Paced", "Phaser"]


class Phaser:
    def __init__(self, parties: int) -> None:
        self._cond = threading.Condition()
        self._parties = parties
        self._arrived = 0
        self._phase = 0

    def arrive_and_wait(self, timeout: float | None = None) -> None:
        with self._cond:
            phase = self._phase
            self._arrived += 1
            if self._arrived >= self._parties:
                self._advance()
                return
            if not self._cond.wait_for(lambda: self._phase != phase, timeout):
                self._arrived -= 1  # gave up waiting: no longer counted in this phase

    def leave(self) -> None:
        with self._cond:
            self._parties -= 1
            if self._parties > 0 and self._arrived >= self._parties:
                self._advance()

    def _advance(self) -> None:
        self._arrived = 0
        self._phase += 1
        self._cond.notify_all()


class Paced:
    """A controller whose rounds start when the batch's do (one wait per round)."""

    def __init__(self, inner: Controller, phaser: Phaser, timeout: float = 60.0) -> None:
        self.inner = inner
        self.phaser = phaser
        self.timeout = timeout  # a batch-mate stuck longer than this is not waited for
        self.name = inner.name
        self._waited = False

    def window(self, limit: int) -> int:
        if not self._waited:
            self._waited = True
            self.phaser.arrive_and_wait(self.timeout)
        return self.inner.window(limit)

    def draft_next(self, index: int, step: DraftOutput) -> Decision | bool:
        return self.inner.draft_next(index, step)

    def observe(self, drafted: int, accepted: int) -> None:
        self._waited = False
        self.inner.observe(drafted, accepted)
