"""`GrpcTransport`: the client side of edgekit.verifier.v1.

Every call carries a deadline; gRPC failures are mapped into the edgekit
error tree here, with the verifier's address in the message.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Iterator, Sequence

import grpc

from .._config import ClientConfig
from .._errors import (
    AuthenticationError,
    IncompatibleModelsError,
    LimitExceededError,
    ProtocolError,
    SessionNotFoundError,
    StaleRoundError,
    VerifierError,
    VerifierUnavailableError,
)
from .._hidden import EncodedHidden, HiddenError, encode_hidden
from .._llama import Fingerprint
from .._proto import verifier_pb2 as pb
from .._proto import verifier_pb2_grpc as pb_grpc
from .._wire import (
    FINISH_FROM_PB,
    MODE_FROM_PB,
    SLO_TO_PB,
    UPLOAD_FROM_PB,
    fingerprint_from_pb,
    fingerprint_to_pb,
    hidden_answer_to_pb,
    sampling_to_pb,
    verify_request_to_pb,
)
from ._base import (
    PROTOCOL_VERSION,
    BlockRequest,
    Exchange,
    GeneratedToken,
    OpenedSession,
    ServerInfo,
    VerifyResult,
)

__all__ = ["GrpcTransport", "map_rpc_error"]

def map_rpc_error(exc: grpc.RpcError, address: str, *, during: str, deadline: float | None = None) -> VerifierError:
    """Turns a gRPC failure into the edgekit error that says what to do."""
    code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
    detail = (exc.details() if hasattr(exc, "details") else None) or str(exc)
    name = code.name if code else "UNKNOWN"
    kw = {"address": address, "code": name}
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        within = f"within {deadline:g} s" if deadline else "within the deadline"
        return VerifierUnavailableError(
            f"verifier at {address} did not answer {during} {within}; is it overloaded, or the address wrong?", **kw
        )
    if code == grpc.StatusCode.UNAVAILABLE:
        return VerifierUnavailableError(
            f"verifier at {address} is unavailable ({detail}); is `edgekit serve` running there?", **kw
        )
    if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
        return AuthenticationError(f"verifier at {address} refused the token: {detail}", **kw)
    if code == grpc.StatusCode.NOT_FOUND:
        return SessionNotFoundError(f"verifier at {address}: {detail}", **kw)
    if code == grpc.StatusCode.ABORTED:
        committed = None
        for key, value in exc.trailing_metadata() or ():
            if key == "edgekit-committed-length":
                committed = int(value)
        return StaleRoundError(f"verifier at {address}: {detail}", committed_length=committed, **kw)
    if code in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.OUT_OF_RANGE):
        return LimitExceededError(f"verifier at {address}: {detail}", **kw)
    if code == grpc.StatusCode.FAILED_PRECONDITION and "tokenizer" in detail:
        return IncompatibleModelsError(f"verifier at {address}: {detail}")
    if code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.FAILED_PRECONDITION):
        return ProtocolError(f"verifier at {address} refused {during}: {detail}", **kw)
    return VerifierError(f"verifier at {address} failed {during}: {name}: {detail}", **kw)


class GrpcTransport:
    """Talks to an edgekit verifier at `host:port` over gRPC."""

    def __init__(self, address: str, config: ClientConfig | None = None) -> None:
        self.address = address.removeprefix("grpc://")
        self.config = config or ClientConfig()
        c = self.config
        options = [
            ("grpc.max_receive_message_length", c.max_message_bytes),
            ("grpc.max_send_message_length", c.max_message_bytes),
            ("grpc.keepalive_time_ms", 30_000),
            ("grpc.enable_retries", 0),  # rounds are retried by us, by base position
        ]
        if c.tls:
            roots = Path(c.root_certificates).read_bytes() if c.root_certificates else None
            self._channel = grpc.secure_channel(self.address, grpc.ssl_channel_credentials(roots), options=options)
        else:
            self._channel = grpc.insecure_channel(self.address, options=options)
        self._stub = pb_grpc.VerifierStub(self._channel)
        self._metadata = (("authorization", f"Bearer {c.token}"),) if c.token else ()

    def _call(self, method, request, *, during: str, timeout: float | None = None):  # type: ignore[no-untyped-def]
        # No wait_for_ready: a refused connection fails at once (UNAVAILABLE),
        # a silent or slow host fails at the deadline; both name the address.
        deadline = timeout or self.config.timeout
        try:
            return method(request, timeout=deadline, metadata=self._metadata)
        except grpc.RpcError as exc:
            raise map_rpc_error(exc, self.address, during=during, deadline=deadline) from None

    def handshake(self, draft: Fingerprint, *, draft_model: str, draft_hidden_size: int) -> ServerInfo:
        r = self._call(
            self._stub.Handshake,
            pb.HandshakeRequest(
                protocol_version=PROTOCOL_VERSION,
                draft_tokenizer=fingerprint_to_pb(draft),
                draft_model=draft_model,
                draft_hidden_size=draft_hidden_size,
            ),
            during="the handshake",
            timeout=self.config.connect_timeout,
        )
        c = r.capabilities
        return ServerInfo(
            protocol_version=r.protocol_version,
            target_model=r.target_model,
            target_fingerprint=fingerprint_from_pb(r.target_tokenizer),
            target_hidden_size=r.target_hidden_size,
            modes=tuple(MODE_FROM_PB[m] for m in c.acceptance_modes if m in MODE_FROM_PB),
            upload_protocols=tuple(UPLOAD_FROM_PB[u] for u in c.upload_protocols if u in UPLOAD_FROM_PB),
            max_block=c.max_block,
            max_context=c.max_context,
            max_sessions=c.max_sessions,
            assigns_budgets=c.assigns_budgets,
            prefix_cache=c.prefix_cache,
            max_draft_top_k=c.max_draft_top_k,
            chat_template=r.chat_template or None,
            server_version=r.server_version,
            exact_numerics=c.exact_numerics,
            invariant_batch=c.invariant_batch,
        )

    def ping(self, payload_bytes: int = 0, reply_bytes: int = 0) -> float:
        """One echo; returns its round-trip time in milliseconds."""
        t0 = time.perf_counter()
        self._call(
            self._stub.Ping,
            pb.PingRequest(payload=bytes(payload_bytes), reply_bytes=reply_bytes, client_send_time=time.time()),
            during="a ping",
        )
        return (time.perf_counter() - t0) * 1e3

    def open_session(
        self,
        prompt_tokens: Sequence[int],
        *,
        mode: str,
        temperature: float,
        seed: int,
        slo_class: str,
        draft: Fingerprint,
        draft_hidden_size: int = 0,
    ) -> OpenedSession:
        r = self._call(
            self._stub.OpenSession,
            pb.OpenSessionRequest(
                prompt_tokens=prompt_tokens,
                sampling=sampling_to_pb(mode, temperature, seed),
                slo_class=SLO_TO_PB.get(slo_class, pb.SLO_CLASS_STANDARD),
                draft_tokenizer=fingerprint_to_pb(draft),
                draft_hidden_size=draft_hidden_size,
            ),
            during="opening a session",
        )
        return OpenedSession(
            session_id=r.session_id,
            committed_length=r.committed_length,
            max_context=r.max_context,
            next_budget=r.next_budget,
            prefill_ms=r.prefill_ms,
            reused_tokens=r.reused_tokens,
        )

    def extend_session(self, session_id: str, base_position: int, tokens: Sequence[int]) -> int:
        r = self._call(
            self._stub.ExtendSession,
            pb.ExtendSessionRequest(session_id=session_id, base_position=base_position, tokens=tokens),
            during="extending the session",
        )
        return r.committed_length

    def verify(self, block: BlockRequest) -> VerifyResult:
        req = verify_request_to_pb(block)
        exchanges: list[Exchange] = []
        timings: list[tuple[float, float]] = []  # (queue, verify) of each answer
        r = self._exchange(req, block, exchanges, timings)
        requested: tuple[int, ...] = ()
        if r.WhichOneof("result") == "hidden_request":
            requested = tuple(r.hidden_request.positions)
            answer = hidden_answer_to_pb(block, requested_rows(block, requested, self.address))
            r = self._exchange(answer, block, exchanges, timings)
            if r.WhichOneof("result") != "verdict":
                raise ProtocolError(
                    f"verifier at {self.address} asked for hidden states twice in round {block.round_index}",
                    address=self.address,
                )
        elif r.WhichOneof("result") != "verdict":
            raise ProtocolError(f"verifier at {self.address} sent neither a verdict nor a request", address=self.address)
        v, t = r.verdict, r.timings
        return VerifyResult(
            accepted=v.accepted,
            next_token=None if v.ended else v.next_token,
            bonus=v.bonus,
            committed_length=v.committed_length,
            next_budget=v.next_budget,
            context_full=v.context_full,
            queue_ms=sum(q for q, _ in timings),
            verify_ms=sum(v for _, v in timings),
            batch_size=t.batch_size or 1,
            exchanges=tuple(exchanges),
            hidden_rows=v.hidden_rows,
            hidden_requested=requested,
        )

    def _exchange(
        self, req: pb.VerifyRequest, block: BlockRequest, exchanges: list[Exchange], timings: list[tuple[float, float]]
    ) -> pb.VerifyResponse:
        t0 = time.perf_counter()
        r = self._call(self._stub.Verify, req, during=f"round {block.round_index}")
        ms = (time.perf_counter() - t0) * 1e3
        t = r.timings
        exchanges.append(Exchange(ms, t.queue_ms + t.verify_ms, req.ByteSize(), r.ByteSize()))
        timings.append((t.queue_ms, t.verify_ms))
        return r


    def close_session(self, session_id: str) -> None:
        self._call(self._stub.CloseSession, pb.CloseSessionRequest(session_id=session_id), during="closing the session")

    def generate(
        self,
        prompt_tokens: Sequence[int],
        *,
        mode: str,
        temperature: float,
        seed: int,
        max_tokens: int,
    ) -> Iterator[GeneratedToken]:
        req = pb.GenerateRequest(
            prompt_tokens=prompt_tokens,
            sampling=sampling_to_pb(mode, temperature, seed),
            max_tokens=max_tokens,
        )
        # The stream's deadline scales with its length; each token must still come quickly.
        deadline = self.config.timeout + max_tokens * 2.0
        stream = self._stub.Generate(req, timeout=deadline, metadata=self._metadata)
        try:
            for r in stream:
                yield GeneratedToken(
                    token=r.token,
                    index=r.index,
                    decode_ms=r.decode_ms,
                    prefill_ms=r.prefill_ms,
                    finish_reason=FINISH_FROM_PB.get(r.finish_reason),
                )
        except grpc.RpcError as exc:
            raise map_rpc_error(exc, self.address, during="generation") from None
        finally:
            stream.cancel()

    def health(self) -> str:
        """The server's grpc.health.v1 status for the verifier service."""
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        stub = health_pb2_grpc.HealthStub(self._channel)
        try:
            r = stub.Check(
                health_pb2.HealthCheckRequest(service="edgekit.verifier.v1.Verifier"), timeout=self.config.timeout
            )
        except grpc.RpcError as exc:
            raise map_rpc_error(exc, self.address, during="the health check") from None
        return health_pb2.HealthCheckResponse.ServingStatus.Name(r.status)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "GrpcTransport":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def requested_rows(block: BlockRequest, positions: tuple[int, ...], address: str) -> EncodedHidden:
    """The rows an SH verifier asked for, encoded; a request the block cannot answer is the verifier's fault."""
    k = len(block.draft_tokens)
    if block.upload != "sh" or block.hidden is None:
        raise ProtocolError(f"verifier at {address} asked for hidden states, which this round did not offer", address=address)
    if not positions or list(positions) != sorted(set(positions)) or positions[-1] >= k:
        raise ProtocolError(
            f"verifier at {address} asked for hidden states at offsets {list(positions)} of a block of {k}",
            address=address,
        )
    try:
        return encode_hidden(block.hidden[list(positions)], block.hidden_encoding, positions)
    except HiddenError as exc:
        raise ProtocolError(f"cannot send hidden states to {address}: {exc}", address=address) from None
