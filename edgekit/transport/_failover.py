"""`FailoverTransport`: several verifiers serving one target, used one at a time.

Every call goes to the current verifier. When it is unreachable (UNAVAILABLE, a
missed deadline), the next one in the list becomes current and the error goes
up as it was: the session backs off, tries again on the next verifier, finds
its session unknown there and reopens it from its committed tokens (see
`edgekit.client._session`). A verifier is only ever used for the target the
first one to answer served: one whose handshake names another target or
tokenizer is passed over (and the error says so), never used: nothing goes to a
verifier before its handshake has named the target.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

from ..config import ClientConfig
from ..errors import ConfigError, IncompatibleModelsError, VerifierUnavailableError
from ..protocol import (
    BlockRequest,
    Fingerprint,
    GeneratedToken,
    GenerateRequest,
    OpenedSession,
    OpenRequest,
    ServerInfo,
    VerifyResult,
)
from ._base import VerifierTransport

__all__ = ["FailoverTransport"]

T = TypeVar("T")


class FailoverTransport:
    def __init__(self, transports: Sequence[VerifierTransport], config: ClientConfig | None = None) -> None:
        if not transports:
            raise ConfigError("failover needs at least one verifier")
        self.transports = list(transports)
        self.config = config or getattr(self.transports[0], "config", None) or ClientConfig()
        self._current = 0
        self._lock = threading.Lock()
        self._target: tuple[str, Fingerprint] | None = None  # what the first verifier to answer serves
        self._refused: dict[int, str] = {}  # verifiers passed over: why
        self._checked: set[int] = set()  # verifiers whose handshake named the target
        self._hello: tuple[Fingerprint, str, int] | None = None  # the handshake's arguments, to check the next one

    @property
    def address(self) -> str:
        return self.transports[self._current].address

    @property
    def current(self) -> VerifierTransport:
        return self.transports[self._current]

    def _advance(self, failed: int) -> None:
        with self._lock:
            if self._current != failed:
                return  # another call moved on already
            n = len(self.transports)
            for step in range(1, n + 1):
                i = (failed + step) % n
                if i not in self._refused:
                    self._current = i
                    return

    def _checked_current(self) -> int:
        """The current verifier, its handshake checked first if nothing has gone to it yet."""
        i = self._current
        if i not in self._checked and self._hello is not None:
            draft, model, hidden = self._hello
            self.handshake(draft, draft_model=model, draft_hidden_size=hidden)
        return i

    def _call(self, fn: Callable[[VerifierTransport], T]) -> T:
        i = self._checked_current()
        try:
            return fn(self.transports[i])
        except VerifierUnavailableError:
            self._advance(i)
            raise

    # -- the transport protocol ----------------------------------------------------------

    def handshake(self, draft: Fingerprint, *, draft_model: str, draft_hidden_size: int) -> ServerInfo:
        i = self._current
        self._hello = (draft, draft_model, draft_hidden_size)
        try:
            info = self.transports[i].handshake(draft, draft_model=draft_model, draft_hidden_size=draft_hidden_size)
        except VerifierUnavailableError:
            self._advance(i)
            raise
        serves = (info.target_model, info.target_fingerprint)
        if self._target is None:
            self._target = serves
        elif serves != self._target:
            why = f"it serves {info.target_model!r}, not {self._target[0]!r}"
            self._refused[i] = why
            self._advance(i)
            if len(self._refused) == len(self.transports):
                raise IncompatibleModelsError(f"no verifier serves {self._target[0]!r} any more")
            raise VerifierUnavailableError(
                f"verifier at {self.transports[i].address} was passed over: {why}", address=self.transports[i].address
            )
        self._checked.add(i)
        return info

    def ping(self, payload_bytes: int = 0, reply_bytes: int = 0) -> float:
        return self._call(lambda t: t.ping(payload_bytes, reply_bytes))

    def open_session(self, request: OpenRequest) -> OpenedSession:
        return self._call(lambda t: t.open_session(request))

    def extend_session(self, session_id: str, base_position: int, tokens: Sequence[int]) -> int:
        return self._call(lambda t: t.extend_session(session_id, base_position, tokens))

    def verify(self, block: BlockRequest) -> VerifyResult:
        return self._call(lambda t: t.verify(block))

    def close_session(self, session_id: str) -> None:
        self._call(lambda t: t.close_session(session_id))

    def generate(self, request: GenerateRequest) -> Iterator[GeneratedToken]:
        i = self._checked_current()
        try:
            yield from self.transports[i].generate(request)
        except VerifierUnavailableError:
            self._advance(i)
            raise

    def health(self) -> str:
        return self._call(lambda t: t.health())  # type: ignore[attr-defined]

    def close(self) -> None:
        for t in self.transports:
            t.close()
