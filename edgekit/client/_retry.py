"""Trying again after losing the verifier: which failures are worth it, and when.

A generation that loses its verifier mid-answer (it is unreachable, it missed a
deadline, its queue or session table is full, or it no longer knows the session
after a restart or an eviction) backs off and tries again until `retry_for`
seconds have passed since the first failure (a session it no longer knows, or
whose length it disagrees on, is reopened first): exponential delays from
`retry_initial` to `retry_max`, each drawn from its upper half (jitter, so a
fleet that lost the same verifier does not come back in step), and never
shorter than the verifier's own retry hint. Anything else (a refused token, a
malformed request, incompatible models) is not retried: trying again would get
the same answer.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from ..config import ClientConfig
from ..errors import (
    EdgekitError,
    LimitExceededError,
    SessionNotFoundError,
    StaleRoundError,
    VerifierUnavailableError,
)

__all__ = ["Backoff", "retryable"]


def retryable(exc: BaseException) -> bool:
    """Whether trying again (after a while, or with the session reopened) may succeed."""
    if isinstance(exc, LimitExceededError):
        return exc.retry_after is not None  # a full queue or table; a block or context limit is final
    # A session the verifier lost, or whose committed length it no longer agrees on (a round it
    # applied after its caller stopped waiting): reopened from the client's committed tokens.
    return isinstance(exc, (VerifierUnavailableError, SessionNotFoundError, StaleRoundError))


class Backoff:
    """The delays of one outage. `wait(exc)` sleeps before the next try, or raises
    `exc` (with how long was tried) once the outage has lasted `retry_for`."""

    def __init__(
        self,
        config: ClientConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
    ) -> None:
        self.config = config
        self._clock, self._sleep = clock, sleep
        self._rng = rng or random.Random()
        self.started = clock()
        self.attempts = 0

    def elapsed(self) -> float:
        return self._clock() - self.started

    def delay(self, exc: BaseException) -> float:
        c = self.config
        step = min(c.retry_max, c.retry_initial * 2**self.attempts)
        hint = getattr(exc, "retry_after", None) or 0.0
        return max(step * self._rng.uniform(0.5, 1.0), hint)

    def next_delay(self, exc: EdgekitError) -> float:
        """How long to wait before the next try; raises `exc` once trying again is not worth it."""
        delay = self.delay(exc)
        if not retryable(exc) or self.elapsed() + delay > self.config.retry_for:
            add_note = getattr(exc, "add_note", None)  # Python 3.11+
            if self.attempts and add_note is not None:
                add_note(f"edgekit tried again {self.attempts} times over {self.elapsed():.1f} s")
            raise exc
        self.attempts += 1
        return delay

    def wait(self, exc: EdgekitError) -> None:
        """Sleeps before the next try (see `next_delay`)."""
        self._sleep(self.next_delay(exc))
