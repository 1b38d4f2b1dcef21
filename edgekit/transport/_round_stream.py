"""`RoundStream`: a session's rounds on one gRPC call (the Rounds RPC).

A verifier that offers it (`ServerInfo.round_streams`) answers each VerifyRequest written
to the stream, in order, with what a Verify call would have answered; a message of a stream
costs gRPC Python's server less than a unary call (benchmarks/grpc_call_cost.py). Each exchange keeps
a deadline of its own: the answer not read by then, the call is cancelled (the verifier then
withdraws the round's work if it has not started) and the exchange fails as a Verify call
past its deadline would. A refusal ends the stream with the status Verify would have had,
raised here as the same edgekit error. A stream that has failed, or that ended between two rounds (a
proxy's idle timeout, a verifier restarted), is over: the transport opens another for the
session's next exchange, or, where the failure says the way there carries no
Rounds call (`unsupported`), goes back to Verify calls.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
from google.protobuf.message import Message

from ..errors import EdgekitError
from ..protocol import error_from_status
from ._rpc_error import map_rpc_error

__all__ = ["RoundStream"]

_END = object()


class RoundStream:
    """One Rounds call, opened with `method` (the stub's) and `metadata`; exchange answers in turn."""

    def __init__(self, method: Callable[..., Any], metadata: tuple[tuple[str, str], ...], address: str) -> None:
        self.address = address
        self._requests: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._answers: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._failed: EdgekitError | None = None
        # What failed it says the way there carries no Rounds call: a verifier or a proxy that
        # does not know the method (UNIMPLEMENTED), or a proxy that forwarded it as a unary call
        # (one answer, then the end of the stream without a status).
        self.unsupported = False
        self._call = method(iter(self._requests.get, _END), metadata=metadata)
        self._reader = threading.Thread(target=self._read, name="edgekit-rounds", daemon=True)
        self._reader.start()

    @property
    def over(self) -> bool:
        """The call has ended (a refusal, a failure, a deadline missed, or, between two rounds, a
        proxy's or the verifier's end of it): it takes no more rounds."""
        # between exchanges nothing is waiting to be read unless the call has ended meanwhile
        return self._failed is not None or not self._answers.empty()

    def exchange(self, request: Message, *, during: str, timeout: float) -> tuple[Message, float]:
        """Writes `request`; returns its answer and the round trip in ms, or raises the edgekit
        error the call ended with."""
        if self._failed is not None:
            raise self._failed
        t0 = time.perf_counter()
        self._requests.put(request)
        try:
            answer = self._answers.get(timeout=timeout)
        except queue.Empty:
            self._fail(error_from_status(
                grpc.StatusCode.DEADLINE_EXCEEDED, "", address=self.address, during=during, deadline=timeout
            ))
            raise self._failed from None  # type: ignore[misc]
        if isinstance(answer, Message):
            return answer, (time.perf_counter() - t0) * 1e3
        if isinstance(answer, grpc.RpcError):
            self._fail(map_rpc_error(answer, self.address, during=during))
        else:  # the stream ended without a status: what a verifier never does while a round is open
            self.unsupported = True
            self._fail(error_from_status(
                grpc.StatusCode.UNAVAILABLE, "it ended the stream of rounds", address=self.address, during=during
            ))
        raise self._failed  # type: ignore[misc]

    def close(self) -> None:
        """Ends the call (the verifier's side ends with it)."""
        if self._failed is None:
            self._failed = error_from_status(
                grpc.StatusCode.CANCELLED, "the stream of rounds was closed", address=self.address, during="a round"
            )
        self._requests.put(_END)
        self._call.cancel()

    def _fail(self, error: EdgekitError) -> None:
        self._failed = error
        self._requests.put(_END)
        self._call.cancel()

    def _read(self) -> None:
        answers: Iterator[Message] = self._call
        try:
            for answer in answers:
                self._answers.put(answer)
        except grpc.RpcError as exc:
            self.unsupported = exc.code() == grpc.StatusCode.UNIMPLEMENTED
            self._answers.put(exc)
            return
        self.unsupported = True  # ended without a status, which a verifier's Rounds never does
        self._answers.put(_END)
