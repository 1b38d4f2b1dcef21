"""`MessageTransport`: the client side of edgekit.verifier.v1, whatever carries it.

Everything but how one message travels: each request built and each answer read
by `edgekit.protocol`'s conversions, and SH's second exchange. A subclass provides `_unary` (one request,
its answer and the round trip) and `_stream` (a server-streaming call), and may carry a
round's exchanges its own way (`_round`: gRPC puts a session's rounds on one stream):
`GrpcTransport` over gRPC, `edgekit.testing.InProcessTransport` into a verifier
service in this process. Failures arrive from both as the same edgekit errors
(`edgekit.protocol.error_from_status`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import replace

from google.protobuf.message import Message

from ..config import ClientConfig
from ..errors import ConfigError, HiddenStateError, ProtocolError
from ..protocol import (
    MIN_PROTOCOL_VERSION,
    PROTOCOL_VERSION,
    BlockRequest,
    EncodedHidden,
    Exchange,
    Fingerprint,
    GeneratedToken,
    GenerateRequest,
    HiddenRequest,
    OpenedSession,
    OpenRequest,
    ServerInfo,
    SpeedObjective,
    VerifyResult,
    encode_hidden,
    fingerprint_to_pb,
    generate_request_to_pb,
    generated_from_pb,
    hidden_answer_to_pb,
    open_request_to_pb,
    opened_from_pb,
    pb,
    server_info_from_pb,
    verify_request_to_pb,
    verify_response_from_pb,
)

__all__ = ["MessageTransport"]


class MessageTransport:
    address: str
    config: ClientConfig
    _version: int = PROTOCOL_VERSION  # what the handshake agreed on
    _round_streams: bool = False  # whether the verifier takes a session's rounds on one stream
    _step_ms: float = 0.0  # the verifier's target step, as its handshake says (0: not said)

    # -- how a message travels: the subclass's part ------------------------------------

    def _unary(
        self, method: str, request: Message, *, during: str, timeout: float | None = None
    ) -> tuple[Message, float]:
        """Sends `request` to RPC `method`; returns its answer and the round trip in ms."""
        raise NotImplementedError

    def _stream(self, method: str, request: Message, *, during: str, timeout: float) -> Iterator[Message]:
        """The answers of a server-streaming RPC, as they come."""
        raise NotImplementedError

    def _round(self, request: pb.VerifyRequest, *, during: str) -> tuple[Message, float]:
        """One exchange of a round: a Verify call, unless the subclass carries it otherwise."""
        return self._unary("Verify", request, during=during)

    def close(self) -> None:
        pass

    # -- the transport protocol ----------------------------------------------------------

    def handshake(self, draft: Fingerprint, *, draft_model: str, draft_hidden_size: int) -> ServerInfo:
        r, _ = self._unary(
            "Handshake",
            pb.HandshakeRequest(
                protocol_version=PROTOCOL_VERSION,
                draft_tokenizer=fingerprint_to_pb(draft),
                draft_model=draft_model,
                draft_hidden_size=draft_hidden_size,
            ),
            during="the handshake",
            timeout=self.config.connect_timeout,
        )
        assert isinstance(r, pb.HandshakeResponse)
        if not MIN_PROTOCOL_VERSION <= r.protocol_version <= PROTOCOL_VERSION:
            raise ProtocolError(
                f"verifier at {self.address} answered with protocol version {r.protocol_version}; this client "
                f"speaks {MIN_PROTOCOL_VERSION} to {PROTOCOL_VERSION}",
                address=self.address,
            )
        self._version = r.protocol_version
        info = server_info_from_pb(r)
        self._round_streams = info.round_streams
        self._step_ms = info.decode_step_ms
        return info

    def ping(self, payload_bytes: int = 0, reply_bytes: int = 0) -> float:
        """One echo; returns its round-trip time in milliseconds."""
        request = pb.PingRequest(payload=bytes(payload_bytes), reply_bytes=reply_bytes, client_send_time=time.time())
        return self._unary("Ping", request, during="a ping")[1]

    def open_session(self, request: OpenRequest) -> OpenedSession:
        self._check_slo(request.slo)
        r, _ = self._unary(
            "OpenSession", open_request_to_pb(request), during="opening a session", timeout=self._open_timeout(request)
        )
        assert isinstance(r, pb.OpenSessionResponse)
        return opened_from_pb(r)

    def _open_timeout(self, request: OpenRequest) -> float:
        """The call's deadline, longer by what rebuilding a reopened context's generated spans may
        take: a row at a time, each about a target step (`decode_step_ms`, 50 ms where the verifier
        does not say), thrice that for a busy verifier; a prompt's prefill is in the timeout."""
        generated = sum(span.length for span in request.history if span.generated)
        return self.config.timeout + 3 * generated * (self._step_ms or 50.0) / 1e3

    def _check_slo(self, slo: SpeedObjective) -> None:
        if not slo.best_effort and self._version < 2:
            raise ConfigError(
                f"verifier at {self.address} speaks protocol version {self._version}, which has no token-speed "
                "SLOs; leave slo_class and target_speed unset, or upgrade the verifier"
            )

    def extend_session(self, session_id: str, base_position: int, tokens: Sequence[int]) -> int:
        r, _ = self._unary(
            "ExtendSession",
            pb.ExtendSessionRequest(session_id=session_id, base_position=base_position, tokens=tokens),
            during="extending the session",
        )
        assert isinstance(r, pb.ExtendSessionResponse)
        return r.committed_length

    def verify(self, block: BlockRequest) -> VerifyResult:
        req = verify_request_to_pb(block)
        if self._version < 2:  # no field a version 1 peer does not know
            req.ClearField("draft_ms")
            req.ClearField("network_ms")
        exchanges: list[Exchange] = []
        answers: list[VerifyResult | HiddenRequest] = []
        answer = self._exchange(req, block, exchanges, answers)
        requested: tuple[int, ...] = ()
        if isinstance(answer, HiddenRequest):
            requested = answer.positions
            rows = hidden_answer_to_pb(block, self._requested_rows(block, requested))
            answer = self._exchange(rows, block, exchanges, answers)
            if not isinstance(answer, VerifyResult):
                raise ProtocolError(
                    f"verifier at {self.address} asked for hidden states twice in round {block.round_index}",
                    address=self.address,
                )
        # The round's figures on the server are both exchanges' (under SH with mismatches).
        return replace(
            answer,
            server=sum((a.server for a in answers[1:]), answers[0].server),
            exchanges=tuple(exchanges),
            hidden_requested=requested,
        )

    def _exchange(
        self,
        req: pb.VerifyRequest,
        block: BlockRequest,
        exchanges: list[Exchange],
        answers: list[VerifyResult | HiddenRequest],
    ) -> VerifyResult | HiddenRequest:
        r, ms = self._round(req, during=f"round {block.round_index}")
        assert isinstance(r, pb.VerifyResponse)
        answer = verify_response_from_pb(r)
        if answer is None:
            raise ProtocolError(
                f"verifier at {self.address} sent neither a verdict nor a request", address=self.address
            )
        exchanges.append(Exchange(ms, answer.server.queue_ms + answer.server.verify_ms, req.ByteSize(), r.ByteSize()))
        answers.append(answer)
        return answer

    def _requested_rows(self, block: BlockRequest, positions: tuple[int, ...]) -> EncodedHidden:
        """The rows an SH verifier asked for, encoded; a request the block cannot answer is the verifier's fault."""
        k = len(block.draft_tokens)
        if block.upload != "sh" or block.hidden is None:
            raise ProtocolError(
                f"verifier at {self.address} asked for hidden states, which this round did not offer",
                address=self.address,
            )
        if not positions or list(positions) != sorted(set(positions)) or positions[-1] >= k:
            raise ProtocolError(
                f"verifier at {self.address} asked for hidden states at offsets {list(positions)} of a block of {k}",
                address=self.address,
            )
        try:
            return encode_hidden(block.hidden[list(positions)], block.hidden_encoding, positions)
        except HiddenStateError as exc:
            raise ProtocolError(f"cannot send hidden states to {self.address}: {exc}", address=self.address) from None

    def close_session(self, session_id: str) -> None:
        self._unary("CloseSession", pb.CloseSessionRequest(session_id=session_id), during="closing the session")

    def generate(self, request: GenerateRequest) -> Iterator[GeneratedToken]:
        self._check_slo(request.slo)
        req = generate_request_to_pb(request)
        # The stream's deadline scales with its length; each token must still come quickly.
        deadline = self.config.timeout + request.max_tokens * 2.0
        for r in self._stream("Generate", req, during="generation", timeout=deadline):
            assert isinstance(r, pb.GenerateResponse)
            yield generated_from_pb(r)
