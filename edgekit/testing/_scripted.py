"""A verifier transport whose calls a test decides: `ScriptedTransport`."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..config import ClientConfig
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
from ..transport import VerifierTransport

METHODS = ("handshake", "ping", "open_session", "extend_session", "verify", "close_session", "generate")


@dataclass(frozen=True)
class Call:
    """One call a `ScriptedTransport` was asked to make: `method` (`"verify"`, ...), its
    `arguments` by parameter name (`call.arguments["block"]`) and which call of that method it
    is (`n`, from 1)."""

    method: str
    arguments: dict[str, Any]
    n: int
    transport: ScriptedTransport = field(repr=False, compare=False)

    def forward(self) -> Any:
        """The call, made on the transport's inner transport as it is now: its answer (or its error)."""
        inner = self.transport.inner
        if inner is None:
            raise RuntimeError(f"a ScriptedTransport without an inner transport cannot forward {self}")
        return getattr(inner, self.method)(**self.arguments)

    def __str__(self) -> str:
        return f"{self.method} call {self.n}"


class ScriptedTransport:
    """A verifier transport whose calls a test decides, as httpx's `MockTransport`: each call
    becomes a `Call`, recorded in `calls`, and `handler(call)` answers it (its return is the
    answer; it may raise, wait for an event, swap `inner`, or `call.forward()` it to `inner`).
    Without a handler every call is forwarded. `faults(...)` builds a handler from a script of
    faults at the n-th call of a method.

    >>> lossy = ScriptedTransport(toy_verifier(target), handler=faults({"verify": {3: "lose"}}))
    >>> def ping(call):
    ...     if call.arguments["payload_bytes"]:
    ...         raise VerifierUnavailableError("no answer within 2 s")
    ...     return 8.0
    >>> probe(ScriptedTransport(handler=ping))

    It forwards nothing implicitly: what a test reads of the verifier behind it, it reads of
    `inner`; what it asked, of `calls`. `address` and `config` are `inner`'s unless given. Calls
    may come from several threads (the client verifies on one of its own): `calls` and `count`
    are safe to read.
    """

    def __init__(self, inner: VerifierTransport | None = None, *, handler: Callable[[Call], Any] | None = None,
                 config: ClientConfig | None = None, address: str | None = None) -> None:
        self.inner = inner
        self.handler: Callable[[Call], Any] = handler or Call.forward
        self.config: ClientConfig = config or getattr(inner, "config", None) or ClientConfig()
        self.address: str = address or getattr(inner, "address", None) or "scripted"
        self.calls: list[Call] = []
        self._counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    def count(self, method: str) -> int:
        """How many calls of `method` it has been asked to make."""
        with self._lock:
            return self._counts[method]

    def _call(self, method: str, **arguments: Any) -> Any:
        with self._lock:
            self._counts[method] += 1
            call = Call(method, arguments, self._counts[method], self)
            self.calls.append(call)
        return self.handler(call)

    # -- the transport protocol: every call through the handler ---------------------------

    def handshake(self, draft: Fingerprint, *, draft_model: str, draft_hidden_size: int) -> ServerInfo:
        return self._call("handshake", draft=draft, draft_model=draft_model, draft_hidden_size=draft_hidden_size)

    def ping(self, payload_bytes: int = 0, reply_bytes: int = 0) -> float:
        return self._call("ping", payload_bytes=payload_bytes, reply_bytes=reply_bytes)

    def open_session(self, request: OpenRequest) -> OpenedSession:
        return self._call("open_session", request=request)

    def extend_session(self, session_id: str, base_position: int, tokens: Sequence[int]) -> int:
        return self._call("extend_session", session_id=session_id, base_position=base_position, tokens=tokens)

    def verify(self, block: BlockRequest) -> VerifyResult:
        return self._call("verify", block=block)

    def close_session(self, session_id: str) -> None:
        self._call("close_session", session_id=session_id)

    def generate(self, request: GenerateRequest) -> Iterator[GeneratedToken]:
        # A generator, as the other transports': the call is made when the stream is first read.
        yield from self._call("generate", request=request)

    def close(self) -> None:
        if self.inner is not None:
            self.inner.close()
