"""The verifier service in this process, reached as over gRPC: `InProcessTransport`."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf.message import Message

from ..config import ClientConfig
from ..errors import EdgekitError
from ..protocol import (
    BlockRequest,
    OpenedSession,
    OpenRequest,
    VerifyResult,
    error_from_status,
    status_of,
)
from ..transport import MessageTransport
from ._link import SimulatedLink

if TYPE_CHECKING:  # the verifier loads only with a toy verifier (edgekit.testing stays light to import)
    from ..verifier import VerifierService


class InProcessTransport(MessageTransport):
    """edgekit.verifier.v1 into a `VerifierService` in this process, as serialized
    messages: what gRPC would carry, minus the network. Refusals arrive as the
    same edgekit errors as through gRPC.

    With a `SimulatedLink`, each exchange takes the link's time for its message
    sizes plus the verifier's reported time; without one, the time it took.
    `open_calls` and `verify_calls` keep every session opened and every block given to `verify`,
    for tests to read back.
    """

    def __init__(
        self,
        service: VerifierService,
        *,
        link: SimulatedLink | None = None,
        address: str = "in-process",
        config: ClientConfig | None = None,
    ) -> None:
        self.service = service
        self.link = link
        self.address = address
        self.config = config or ClientConfig()
        self.open_calls: list[OpenRequest] = []
        self.verify_calls: list[BlockRequest] = []

    def open_session(self, request: OpenRequest) -> OpenedSession:
        self.open_calls.append(request)
        return super().open_session(request)

    def verify(self, block: BlockRequest) -> VerifyResult:
        self.verify_calls.append(block)
        return super().verify(block)

    def _unary(
        self, method: str, request: Message, *, during: str, timeout: float | None = None
    ) -> tuple[Message, float]:
        raw = request.SerializeToString()
        t0 = _now_ms()
        try:
            answer = self.service.call(method, raw)
        except EdgekitError as exc:
            raise self._error(exc, during) from None
        if self.link is None:
            return answer, _now_ms() - t0
        timings: Any = getattr(answer, "timings", None)
        server_ms = timings.queue_ms + timings.verify_ms if timings is not None else 0.0
        return answer, self.link.exchange_ms(len(raw), answer.ByteSize()) + server_ms

    def _stream(self, method: str, request: Message, *, during: str, timeout: float) -> Iterator[Message]:
        try:
            yield from self.service.call_stream(method, request.SerializeToString())
        except EdgekitError as exc:
            raise self._error(exc, during) from None

    def _error(self, exc: EdgekitError, during: str) -> EdgekitError:
        """What a client of this verifier raises: the refusal through its status code, as over gRPC."""
        status = status_of(exc)
        if status.code == grpc.StatusCode.INTERNAL:
            return exc  # a verifier bug: the test sees the original error
        return error_from_status(status.code, status.message, status.trailers, address=self.address, during=during)


def _now_ms() -> float:
    return time.perf_counter() * 1e3
