"""The verifier transport seam: what a client can ask of any verifier.

Implementations: `GrpcTransport` (edgekit.verifier.v1 over gRPC), the stock
servers' `OpenAITransport` and `SGLangTransport` (which report what they cannot
do in `ServerInfo`), and, for tests, `edgekit.testing.InProcessTransport` (the
real verifier service in this process). The values they exchange are
`edgekit.protocol`'s.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol

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

__all__ = ["VerifierTransport"]


class VerifierTransport(Protocol):
    @property
    def address(self) -> str:
        """The verifier's address, for messages ("host:port", a URL)."""
        ...

    def ping(self, payload_bytes: int = 0, reply_bytes: int = 0) -> float:
        """One echo carrying `payload_bytes` up and `reply_bytes` back; its round trip in ms."""
        ...

    def handshake(self, draft: Fingerprint, *, draft_model: str, draft_hidden_size: int) -> ServerInfo: ...

    def open_session(self, request: OpenRequest) -> OpenedSession:
        """Opens a session on the request's prompt (the verifier prefills it)."""
        ...

    def extend_session(self, session_id: str, base_position: int, tokens: Sequence[int]) -> int: ...

    def verify(self, block: BlockRequest) -> VerifyResult: ...

    def close_session(self, session_id: str) -> None: ...

    def generate(self, request: GenerateRequest) -> Iterator[GeneratedToken]:
        """The target-only stream: the verifier decodes every token of the answer."""
        ...

    def close(self) -> None: ...
