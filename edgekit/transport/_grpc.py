"""`GrpcTransport`: edgekit.verifier.v1 over gRPC.

Every call carries a deadline (each round on a session's stream its own); gRPC failures are mapped into the edgekit
error tree here, with the verifier's address in the message. Nothing is
retried here: a round that fails is the session's to re-send (the verifier
recognises a retry of the last round and answers it again), after its own
back-off (`edgekit.client._resilience`).

Every call also carries routing metadata a proxy in front of several verifiers can hash on
(`deploy/`): `x-edgekit-client`, the client's id (`ClientConfig.client_id`), on every call, and
`x-edgekit-session`, the session's id, on the calls of a session. A session's id is given by the
verifier that opens it, so OpenSession cannot carry it: the recipes hash on the client's id,
which sends a client's opening and its later calls to the same replica; the session id is there
for logs and for a proxy that routes by a table of sessions.

Where the verifier offers it, a session's rounds go on one stream (`RoundStream`), opened at
its first round and closed with the session; the other calls are unary. Where a proxy or a
replica on the way turns out to carry no Rounds call, the transport goes back to Verify calls.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
from google.protobuf.message import Message

from ..config import ClientConfig
from ..errors import EdgekitError, LimitExceededError
from ..protocol import SERVICE_NAME, pb, pb_grpc
from ._message import MessageTransport
from ._round_stream import RoundStream
from ._rpc_error import map_rpc_error

__all__ = ["CLIENT_HEADER", "SESSION_HEADER", "GrpcTransport", "map_rpc_error"]

CLIENT_HEADER = "x-edgekit-client"
KEEPALIVE_MS = 30_000  # a ping this often during a call: a dead link is found without waiting for TCP
SESSION_HEADER = "x-edgekit-session"


class GrpcTransport(MessageTransport):
    """Talks to an edgekit verifier at `host:port` over gRPC."""

    def __init__(self, address: str, config: ClientConfig | None = None) -> None:
        self.address = address.removeprefix("grpc://")
        self.config = config or ClientConfig()
        c = self.config
        options = [
            ("grpc.max_receive_message_length", c.max_message_bytes),
            ("grpc.max_send_message_length", c.max_message_bytes),
            ("grpc.keepalive_time_ms", KEEPALIVE_MS),
            ("grpc.enable_retries", 0),  # a round is never resent behind the session's back
            # After an outage the channel tries to reconnect within a second or two, not gRPC's
            # default of up to two minutes: the session's own back-off paces the calls.
            ("grpc.initial_reconnect_backoff_ms", 200),
            ("grpc.max_reconnect_backoff_ms", 2000),
        ]
        if c.tls:
            roots = Path(c.root_certificates).read_bytes() if c.root_certificates else None
            key = Path(c.tls_key).read_bytes() if c.tls_key else None  # mutual TLS: this client's identity
            chain = Path(c.tls_cert).read_bytes() if c.tls_cert else None
            creds = grpc.ssl_channel_credentials(roots, private_key=key, certificate_chain=chain)
            self._channel = grpc.secure_channel(self.address, creds, options=options)
        else:
            self._channel = grpc.insecure_channel(self.address, options=options)
        self._stub = pb_grpc.VerifierStub(self._channel)
        self._metadata: tuple[tuple[str, str], ...] = (("authorization", f"Bearer {c.token}"),) if c.token else ()
        # EdgeClient gives its config an id; a transport built on its own draws one for its calls
        self._metadata += ((CLIENT_HEADER, c.client_id or uuid.uuid4().hex),)
        self._streams: dict[str, RoundStream] = {}  # session id -> its stream of rounds
        self._streams_lock = threading.Lock()

    def _metadata_for(self, request: Message) -> tuple[tuple[str, str], ...]:
        session = getattr(request, "session_id", "")
        return (*self._metadata, (SESSION_HEADER, session)) if session else self._metadata

    def _unary(
        self, method: str, request: Message, *, during: str, timeout: float | None = None
    ) -> tuple[Message, float]:
        # No wait_for_ready: a refused connection fails at once (UNAVAILABLE),
        # a silent or slow host fails at the deadline; both name the address.
        deadline = timeout or self.config.timeout
        t0 = time.perf_counter()
        try:
            answer = getattr(self._stub, method)(request, timeout=deadline, metadata=self._metadata_for(request))
        except grpc.RpcError as exc:
            raise map_rpc_error(exc, self.address, during=during, deadline=deadline) from None
        return answer, (time.perf_counter() - t0) * 1e3

    def _round(self, request: pb.VerifyRequest, *, during: str, again: bool = True) -> tuple[Message, float]:
        """A round's exchange on its session's stream where the verifier offers one (and the
        config allows it), else a Verify call. A stream the verifier ended while it idled (it
        cancels streams that move nothing for a while) is replaced, and the round sent again on
        the new one (the verifier knows a round it has answered by its key); a new stream the
        verifier refuses for want of room (it bounds the streams open) sends its round as a Verify
        call instead."""
        fresh = False
        with self._streams_lock:
            stream = self._streams.get(request.session_id)
            if stream is not None and stream.over:  # it failed, or ended between two rounds
                del self._streams[request.session_id]
                stream.close()  # its request feed ends with it
                self._round_streams &= not stream.unsupported
                stream = None
            if self._round_streams and self.config.round_streams and stream is None:
                stream = self._streams[request.session_id] = RoundStream(
                    self._stub.Rounds, self._metadata_for(request), self.address
                )
                fresh = True
        if stream is None:
            return self._unary("Verify", request, during=during)
        try:
            return stream.exchange(request, during=during, timeout=self.config.timeout)
        except EdgekitError as exc:
            if again and getattr(exc, "code", None) == "CANCELLED":
                self._end_stream(request.session_id, stream)
                return self._round(request, during=during, again=False)
            if fresh and isinstance(exc, LimitExceededError):
                self._end_stream(request.session_id, stream)
                return self._unary("Verify", request, during=during)
            if not stream.unsupported:
                raise
            # A replica or a proxy on the way has no Rounds call: Verify calls from now on, this
            # exchange at once (the verifier knows a round it has answered by its key).
            self._round_streams = False
            return self._unary("Verify", request, during=during)
        finally:
            if stream.over:
                self._end_stream(request.session_id, stream)

    def _end_stream(self, session_id: str, stream: RoundStream | None = None) -> None:
        """Closes the session's stream (`stream`, if it is still the one held)."""
        with self._streams_lock:
            held = self._streams.get(session_id)
            if held is None or (stream is not None and held is not stream):
                return
            del self._streams[session_id]
            self._round_streams &= not held.unsupported
        held.close()

    def close_session(self, session_id: str) -> None:
        self._end_stream(session_id)
        super().close_session(session_id)

    def _stream(self, method: str, request: Message, *, during: str, timeout: float) -> Iterator[Message]:
        stream = getattr(self._stub, method)(request, timeout=timeout, metadata=self._metadata_for(request))
        try:
            yield from stream
        except grpc.RpcError as exc:
            raise map_rpc_error(exc, self.address, during=during) from None
        finally:
            stream.cancel()

    def health(self) -> str:
        """The server's grpc.health.v1 status for the verifier service."""
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        stub = health_pb2_grpc.HealthStub(self._channel)
        try:
            r = stub.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=self.config.timeout)
        except grpc.RpcError as exc:
            raise map_rpc_error(exc, self.address, during="the health check") from None
        return health_pb2.HealthCheckResponse.ServingStatus.Name(r.status)

    def close(self) -> None:
        with self._streams_lock:
            streams, self._streams = list(self._streams.values()), {}
        for stream in streams:
            stream.close()
        self._channel.close()

    def __enter__(self) -> GrpcTransport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
