"""Going on through an outage: which failures are worth trying again, when, and how.

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

`through_outages` runs an attempt (a round, a new turn) that way, and reports the
outage it came through as a `Resumed` event; between tries, the caller may draft
ahead. `Background` runs the verify call on a thread of its own, so the device can
draft while it waits.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Generator, Iterator
from typing import Any, TypeVar

from ..config import ClientConfig
from ..errors import (
    EdgekitError,
    LimitExceededError,
    SessionNotFoundError,
    StaleRoundError,
    VerifierUnavailableError,
)
from ._events import Provisional, Resumed

__all__ = ["Background", "Backoff", "drain", "retryable", "through_outages"]

T = TypeVar("T")


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


def through_outages(
    attempt: Callable[[], Generator[Provisional, None, T]],
    config: ClientConfig,
    *,
    reopen: Callable[[], int],
    between: Callable[[float], Iterator[Provisional]],
) -> Generator[Provisional, None, tuple[T, Resumed | None]]:
    """`attempt()`, tried again with back-off while the verifier is lost, `reopen()` first (it
    returns the tokens prefilled again) where the verifier no longer knows the session; its
    result, and the outage if there was one. `between(delay)` waits out each delay (drafting
    ahead meanwhile, as the attempt may). With `on_disconnect="fail"` the first failure is raised."""
    backoff: Backoff | None = None
    again = False
    reprefilled = 0
    reasons: list[str] = []
    while True:
        try:
            if again:
                reprefilled += reopen()
                again = False
            result = yield from attempt()
        except EdgekitError as exc:
            if config.on_disconnect == "fail":
                raise
            backoff = backoff or Backoff(config)
            delay = backoff.next_delay(exc)  # raises once it is not worth trying again
            reasons.append(type(exc).__name__)
            # The verifier lost the session (restarted, evicted) or disagrees about it: open it again.
            again = again or isinstance(exc, (SessionNotFoundError, StaleRoundError))
            yield from between(delay)
            continue
        if backoff is None:
            return result, None
        resumed = Resumed(
            outage_ms=backoff.elapsed() * 1e3, attempts=backoff.attempts, reprefilled_tokens=reprefilled,
            causes=tuple(dict.fromkeys(reasons)),
        )
        return result, resumed


def drain(steps: Generator[Any, None, T]) -> T:
    """Runs a generator to its end, dropping what it yields; its return value."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


class Background:
    """A call on a thread of its own, so that the caller can work while it runs."""

    def __init__(self, call: Callable[[], Any]) -> None:
        self._done = threading.Event()
        self._value: Any = None
        self._error: BaseException | None = None

        def run() -> None:
            try:
                self._value = call()
            except BaseException as exc:  # handed to the caller
                self._error = exc
            finally:
                self._done.set()

        threading.Thread(target=run, name="edgekit-verify", daemon=True).start()

    def wait(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout)

    def done(self) -> bool:
        return self._done.is_set()

    def result(self) -> Any:
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._value
