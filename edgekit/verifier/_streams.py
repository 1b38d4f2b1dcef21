"""Open streams (Rounds, Generate): how many at once, how many per client, how long one may idle.

gRPC Python gives a stream one worker thread for its whole life, whether a message moves or not.
Left alone, a client that opens streams and sends nothing (or stops reading a Generate) holds
threads until none is left for the devices' rounds and the health checks. So a stream is
admitted only while fewer than `max_open` are open (and, with `max_per_client`, fewer than that
of its client's), else refused at once (RESOURCE_EXHAUSTED) before it waits for anything; and
one that has moved no message for `idle_s` seconds while the verifier was not working on it is
cancelled by `reap`. A device's transport opens another stream for its next round when its
last one ended between two rounds, so an honest session loses nothing but one call's set-up.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from ..errors import LimitExceededError

__all__ = ["OpenStream", "StreamLimits"]


@dataclass(eq=False)
class OpenStream:
    """One admitted stream: its client, when a message last moved, and whether the verifier is
    working on it (a round in the engine's queue is not the client's idling)."""

    client: str
    cancel: Callable[[], object]
    last: float
    busy: int = 0
    ended: bool = False  # cancelled for idling; out of the table once its call has unwound
    _limits: StreamLimits | None = field(default=None, repr=False)

    @contextmanager
    def working(self) -> Iterator[None]:
        """While the verifier serves one of its messages: never idle."""
        assert self._limits is not None
        with self._limits._lock:
            self.busy += 1
        try:
            yield
        finally:
            with self._limits._lock:
                self.busy -= 1
                self.last = self._limits.clock()

    def moved(self) -> None:
        """A message came in or went out."""
        assert self._limits is not None
        self.last = self._limits.clock()


class StreamLimits:
    """The streams open on one verifier (see the module's docstring)."""

    def __init__(
        self, max_open: int, max_per_client: int = 0, idle_s: float = 60.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.max_open = max_open
        self.max_per_client = max_per_client
        self.idle_s = idle_s
        self.clock = clock
        self._lock = threading.Lock()
        self._open: set[OpenStream] = set()
        self.refused = 0
        self.reaped = 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._open)

    @contextmanager
    def admit(self, client: str, cancel: Callable[[], object]) -> Iterator[OpenStream]:
        """The stream's place for as long as the block runs; `cancel` ends the call (gRPC's
        `context.cancel`) when it idles too long. Raises LimitExceededError where no place is left."""
        with self._lock:
            if len(self._open) >= self.max_open:
                self.refused += 1
                raise LimitExceededError(
                    f"the verifier has {self.max_open} streams open, its most; try again shortly", retry_after=1.0
                )
            if self.max_per_client and sum(s.client == client for s in self._open) >= self.max_per_client:
                self.refused += 1
                raise LimitExceededError(
                    f"this client has {self.max_per_client} streams open, the most one client may", retry_after=1.0
                )
            stream = OpenStream(client, cancel, self.clock(), _limits=self)
            self._open.add(stream)
        try:
            yield stream
        finally:
            with self._lock:
                self._open.discard(stream)

    def reap(self) -> int:
        """Cancels the streams idle longer than `idle_s`; returns how many."""
        now = self.clock()
        with self._lock:
            idle = [s for s in self._open if not (s.busy or s.ended) and now - s.last > self.idle_s]
            for stream in idle:
                stream.ended = True
            self.reaped += len(idle)
        for stream in idle:  # outside the lock: a cancel's callbacks may end the stream's block
            stream.cancel()
        return len(idle)
