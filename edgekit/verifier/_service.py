"""The gRPC service of the reference verifier: messages in, engine calls, messages out.

Requests arrive as raw bytes and are parsed here, so a message that is not
valid protobuf, or larger than the configured limit, is refused with
INVALID_ARGUMENT (gRPC's own deserializer would answer INTERNAL). Every
refusal names what was wrong; no refusal touches another session.
"""

from __future__ import annotations

import hashlib
import logging
import time
from typing import Callable, Iterator

import grpc
import numpy as np
from google.protobuf.message import DecodeError, Message

from .. import __version__
from .._config import ServerConfig
from .._errors import EdgekitError, LimitExceededError, SessionNotFoundError
from .._llama import KVCacheFullError
from .._proto import verifier_pb2 as pb
from .._hidden import HiddenError, decode_hidden
from .._wire import MODE_FROM_PB, SLO_FROM_PB, UPLOAD_FROM_PB, fingerprint_from_pb, fingerprint_to_pb, hidden_from_pb
from .._sampling import (
    SparseDistribution,
    accept_greedy,
    accept_sampling,
    cut_at_end,
    mismatch_positions,
    target_probs,
)
from ..transport._base import PROTOCOL_VERSION
from ._engine import TargetEngine
from ._sessions import PendingRound, Session, SessionTable

__all__ = ["VerifierService", "SERVICE_NAME"]

SERVICE_NAME = "edgekit.verifier.v1.Verifier"
log = logging.getLogger("edgekit.verifier")

class _Refusal(Exception):
    def __init__(self, code: grpc.StatusCode, message: str, trailers: tuple = ()) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.trailers = trailers


def _invalid(message: str) -> _Refusal:
    return _Refusal(grpc.StatusCode.INVALID_ARGUMENT, message)


class VerifierService:
    def __init__(self, engine: TargetEngine, config: ServerConfig) -> None:
        self.engine = engine
        self.config = config
        self.model = engine.model
        self.sessions = SessionTable(config.max_sessions, config.idle_timeout, engine.drop)
        self.fingerprint = self.model.fingerprint()

    # -- plumbing ----------------------------------------------------------------

    def handlers(self) -> grpc.GenericRpcHandler:
        unary = {
            "Handshake": (pb.HandshakeRequest, self.handshake),
            "Ping": (pb.PingRequest, self.ping),
            "OpenSession": (pb.OpenSessionRequest, self.open_session),
            "ExtendSession": (pb.ExtendSessionRequest, self.extend_session),
            "Verify": (pb.VerifyRequest, self.verify),
            "CloseSession": (pb.CloseSessionRequest, self.close_session),
        }
        methods = {
            name: grpc.unary_unary_rpc_method_handler(self._wrap_unary(cls, fn), response_serializer=_serialize)
            for name, (cls, fn) in unary.items()
        }
        methods["Generate"] = grpc.unary_stream_rpc_method_handler(
            self._wrap_stream(pb.GenerateRequest, self.generate), response_serializer=_serialize
        )
        return grpc.method_handlers_generic_handler(SERVICE_NAME, methods)

    def _parse(self, cls: type[Message], raw: bytes) -> Message:
        if len(raw) > self.config.max_message_bytes:
            raise _invalid(f"request of {len(raw)} bytes exceeds the limit of {self.config.max_message_bytes}")
        try:
            return cls.FromString(raw)
        except DecodeError as exc:
            raise _invalid(f"malformed {cls.__name__}: {exc}") from None

    def _wrap_unary(self, cls: type[Message], fn: Callable) -> Callable:
        def handler(raw: bytes, context: grpc.ServicerContext) -> Message:
            try:
                return fn(self._parse(cls, raw), context)
            except _Refusal as r:
                _abort(context, r)
            except SessionNotFoundError as exc:
                _abort(context, _Refusal(grpc.StatusCode.NOT_FOUND, str(exc)))
            except (LimitExceededError, KVCacheFullError) as exc:
                _abort(context, _Refusal(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc)))
            except EdgekitError as exc:
                log.exception("internal error in %s", fn.__name__)
                _abort(context, _Refusal(grpc.StatusCode.INTERNAL, str(exc)))

        return handler

    def _wrap_stream(self, cls: type[Message], fn: Callable) -> Callable:
        def handler(raw: bytes, context: grpc.ServicerContext) -> Iterator[Message]:
            try:
                yield from fn(self._parse(cls, raw), context)
            except _Refusal as r:
                _abort(context, r)
            except (LimitExceededError, KVCacheFullError) as exc:
                _abort(context, _Refusal(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc)))

        return handler

    # -- handshake ---------------------------------------------------------------

    def _check_tokenizer(self, draft: pb.TokenizerFingerprint) -> None:
        fp = self.fingerprint
        if not fp.same_tokenizer(fingerprint_from_pb(draft)):
            what = (
                f"vocabulary {draft.vocab_size} vs {fp.vocab_size} tokens"
                if draft.vocab_size != fp.vocab_size
                else "same vocabulary size, different tokens or special tokens"
            )
            raise _Refusal(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"draft model {draft.model_name or '(unnamed)'!r} does not share a tokenizer with target model "
                f"{fp.model_name!r} ({what}); use a draft from the target's family",
            )

    def handshake(self, req: pb.HandshakeRequest, context: grpc.ServicerContext) -> pb.HandshakeResponse:
        if req.protocol_version != PROTOCOL_VERSION:
            raise _Refusal(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"protocol version {req.protocol_version} is not supported; this verifier speaks {PROTOCOL_VERSION}",
            )
        self._check_tokenizer(req.draft_tokenizer)
        c = self.config
        return pb.HandshakeResponse(
            protocol_version=PROTOCOL_VERSION,
            target_tokenizer=fingerprint_to_pb(self.fingerprint),
            target_model=self.model.name,
            target_hidden_size=self.model.n_embd,
            capabilities=pb.Capabilities(
                acceptance_modes=[pb.ACCEPTANCE_MODE_GREEDY, pb.ACCEPTANCE_MODE_SAMPLING],
                upload_protocols=[
                    pb.UPLOAD_PROTOCOL_TOKENS_ONLY,
                    pb.UPLOAD_PROTOCOL_FULL_HIDDEN,
                    pb.UPLOAD_PROTOCOL_SELECTIVE_HIDDEN,
                ],
                hidden_encodings=[pb.HIDDEN_ENCODING_FP16, pb.HIDDEN_ENCODING_INT8],
                max_block=c.max_block,
                max_context=c.max_context,
                max_sessions=c.max_sessions,
                assigns_budgets=False,
                max_draft_top_k=c.max_draft_top_k,
                prefix_cache=True,
                max_message_bytes=c.max_message_bytes,
                exact_numerics=self.engine.exact,
                invariant_batch=self.engine.invariant_batch,
            ),
            server_version=__version__,
            chat_template=self.model.chat_template() or "",
        )

    def ping(self, req: pb.PingRequest, context: grpc.ServicerContext) -> pb.PingResponse:
        if req.reply_bytes > self.config.max_message_bytes // 2:
            raise _invalid(f"reply_bytes {req.reply_bytes} exceeds {self.config.max_message_bytes // 2}")
        return pb.PingResponse(
            payload=bytes(req.reply_bytes), client_send_time=req.client_send_time, server_time=time.time()
        )

    # -- sessions ------------------------------------------------------------------

    def _check_tokens(self, tokens, what: str) -> None:
        n_vocab = self.model.n_vocab
        for t in tokens:
            if not 0 <= t < n_vocab:
                raise _invalid(f"{what} holds token id {t}, outside the vocabulary of {n_vocab}")

    def _sampling(self, s: pb.SamplingParams) -> tuple[str, float]:
        mode = MODE_FROM_PB.get(s.mode)
        if mode not in ("greedy", "sample"):
            raise _invalid(f"acceptance mode {pb.AcceptanceMode.Name(s.mode)} is not supported by this verifier")
        if mode == "sample" and not s.temperature > 0:
            raise _invalid(f"sampling needs a temperature > 0, got {s.temperature}")
        return mode, float(s.temperature)

    def _check_prompt(self, tokens) -> None:
        if not tokens:
            raise _invalid("the prompt is empty")
        if len(tokens) + 1 > self.config.max_context:
            raise _invalid(f"prompt of {len(tokens)} tokens exceeds the context limit of {self.config.max_context}")
        self._check_tokens(tokens, "the prompt")

    def open_session(self, req: pb.OpenSessionRequest, context: grpc.ServicerContext) -> pb.OpenSessionResponse:
        self._check_tokenizer(req.draft_tokenizer)
        mode, temperature = self._sampling(req.sampling)
        tokens = list(req.prompt_tokens)
        self._check_prompt(tokens)
        sess = self.sessions.create(
            mode=mode, temperature=temperature, seed=req.sampling.seed, slo_class=SLO_FROM_PB.get(req.slo_class, "standard")
        )
        with sess.lock:
            try:
                _, _, prefill_ms = self.engine.run(sess.seq, tokens[:-1], 0, 0)
            except BaseException:
                self.sessions.close(sess.id)
                raise
            sess.tokens = tokens
            sess.n_kv = len(tokens) - 1
            sess.hidden_size = req.draft_hidden_size
            sess.decoded += len(tokens) - 1
        return pb.OpenSessionResponse(
            session_id=sess.id,
            committed_length=len(tokens),
            max_context=self.config.max_context,
            prefill_ms=prefill_ms,
        )

    def extend_session(self, req: pb.ExtendSessionRequest, context: grpc.ServicerContext) -> pb.ExtendSessionResponse:
        sess = self.sessions.get(req.session_id)
        tokens = list(req.tokens)
        self._check_tokens(tokens, "the extension")
        with sess.lock:
            self._check_base(sess, req.base_position)
            if len(sess.tokens) + len(tokens) + 1 > self.config.max_context:
                raise _Refusal(
                    grpc.StatusCode.OUT_OF_RANGE,
                    f"extending to {len(sess.tokens) + len(tokens)} tokens exceeds the context limit of "
                    f"{self.config.max_context}",
                )
            self._drop_pending(sess)
            # Decode all but the new last token, which stays pending as usual.
            pending = sess.tokens[sess.n_kv :] + tokens
            _, _, ms = self.engine.run(sess.seq, pending[:-1], sess.n_kv, 0)
            sess.decoded += len(pending) - 1
            sess.tokens.extend(tokens)
            sess.n_kv = len(sess.tokens) - 1
            sess.last_round = None
            return pb.ExtendSessionResponse(committed_length=len(sess.tokens), prefill_ms=ms)

    def close_session(self, req: pb.CloseSessionRequest, context: grpc.ServicerContext) -> pb.CloseSessionResponse:
        if not self.sessions.close(req.session_id):
            raise SessionNotFoundError(f"session {req.session_id!r} is unknown or was evicted")
        return pb.CloseSessionResponse()

    def _check_base(self, sess: Session, base: int) -> None:
        if base != len(sess.tokens):
            raise _Refusal(
                grpc.StatusCode.ABORTED,
                f"stale round: base position {base} but the session has {len(sess.tokens)} committed tokens",
                (("edgekit-committed-length", str(len(sess.tokens))),),
            )

    # -- rounds --------------------------------------------------------------------

    def verify(self, req: pb.VerifyRequest, context: grpc.ServicerContext) -> pb.VerifyResponse:
        """One round; under SH, one half of one (see the HiddenRequest message)."""
        sess = self.sessions.get(req.session_id)
        key = _key(req)
        upload = req.upload_protocol or pb.UPLOAD_PROTOCOL_TOKENS_ONLY
        with sess.lock:
            if sess.last_round is not None and sess.last_round[0] == key:
                return sess.last_round[1]  # an exact retry of the applied round: same verdict, applied once
            pending = sess.pending
            if pending is not None and pending.key == key:
                return pending.response  # a retried first half: the same request for hidden states
            if upload == pb.UPLOAD_PROTOCOL_SELECTIVE_HIDDEN and req.hidden.count and not req.draft_tokens:
                # SH's second half: only the requested rows, naming the round by base and index.
                first = pending.request if pending is not None else None
                if first is None or (req.base_position, req.round_index) != (first.base_position, first.round_index):
                    raise _invalid(
                        f"hidden states for round {req.round_index} at base {req.base_position}, which the verifier "
                        "did not ask about; send the block first"
                    )
                t0 = time.perf_counter()
                rows = self._hidden_rows(sess, req.hidden, pending.positions)
                sess.pending = None
                # This exchange's own time: the first half reported the target pass.
                own_ms = (time.perf_counter() - t0) * 1e3
                return self._finish(sess, first, pending.logits, 0.0, own_ms, (pending.positions, rows), key)
            self._drop_pending(sess)
            self._check_base(sess, req.base_position)
            block = list(req.draft_tokens)
            self._check_block(sess, req, block)
            hidden = None
            t0 = time.perf_counter()
            if upload == pb.UPLOAD_PROTOCOL_FULL_HIDDEN:
                offsets = tuple(range(len(block)))
                hidden = (offsets, self._hidden_rows(sess, req.hidden, offsets))
            elif req.hidden.count or req.hidden.data:
                what = "SH sends the tokens first" if upload == pb.UPLOAD_PROTOCOL_SELECTIVE_HIDDEN else "a tokens-only round"
                raise _invalid(f"hidden states arrived with the block, but {what}")
            checks_ms = (time.perf_counter() - t0) * 1e3
            feed = sess.tokens[sess.n_kv :] + block
            logits, queue_ms, decode_ms = self.engine.run(sess.seq, feed, sess.n_kv, len(block) + 1)
            decode_ms += checks_ms
            sess.decoded += len(feed)
            if upload == pb.UPLOAD_PROTOCOL_SELECTIVE_HIDDEN:
                positions = tuple(mismatch_positions(logits, block))
                if positions:
                    resp = pb.VerifyResponse(
                        hidden_request=pb.HiddenRequest(positions=positions, encoding=req.hidden.encoding or pb.HIDDEN_ENCODING_FP16),
                        timings=pb.ServerTimings(queue_ms=queue_ms, verify_ms=decode_ms, batch_size=1),
                    )
                    sess.pending = PendingRound(key, req, resp, logits, positions)
                    return resp
            return self._finish(sess, req, logits, queue_ms, decode_ms, hidden, key)

    def _finish(
        self,
        sess: Session,
        req: pb.VerifyRequest,
        logits: np.ndarray,
        queue_ms: float,
        decode_ms: float,
        hidden: tuple[tuple[int, ...], np.ndarray] | None,
        key: bytes,
    ) -> pb.VerifyResponse:
        """Accepts a verified block: the verdict, the session's tokens and KV."""
        block = list(req.draft_tokens)
        base = len(sess.tokens)
        t0 = time.perf_counter()
        if sess.mode == "greedy":
            accepted, nxt = accept_greedy(logits, block)
        else:
            dists = [
                SparseDistribution(np.asarray(d.token_ids, dtype=np.int32), np.asarray(d.probs, dtype=np.float32))
                for d in req.draft_distributions
            ]
            accepted, nxt = accept_sampling(logits, block, dists, sess.temperature, sess.rng)
        end: int | None = nxt
        if not req.continue_after_eog:
            accepted, end = cut_at_end(accepted, nxt, block, self.model.is_eog)
        accept_ms = (time.perf_counter() - t0) * 1e3
        new = block[:accepted] + ([end] if end is not None else [])
        # The KV keeps every committed token but the last (which is not yet decoded).
        sess.n_kv = base + len(new) - 1
        self.engine.truncate(sess.seq, sess.n_kv)
        sess.tokens.extend(new)
        sess.last_hidden = hidden
        n_hidden = 0 if hidden is None else len(hidden[0])
        sess.hidden_rows += n_hidden
        committed = len(sess.tokens)
        resp = pb.VerifyResponse(
            verdict=pb.Verdict(
                accepted=accepted,
                next_token=end if end is not None else -1,
                bonus=end is not None and accepted == len(block),
                committed_length=committed,
                context_full=committed + 2 > self.config.max_context,
                ended=end is None,
                hidden_rows=n_hidden,
            ),
            timings=pb.ServerTimings(queue_ms=queue_ms, verify_ms=decode_ms + accept_ms, batch_size=1),
        )
        sess.last_round = (key, resp)
        return resp

    def _drop_pending(self, sess: Session) -> None:
        """Abandons a half-done SH round: its block leaves the KV cache."""
        if sess.pending is not None:
            sess.pending = None
            self.engine.truncate(sess.seq, sess.n_kv)

    def _hidden_rows(self, sess: Session, h: pb.HiddenStates, positions: tuple[int, ...]) -> np.ndarray:
        if not sess.hidden_size:
            raise _invalid("this session was opened without draft_hidden_size, so it takes no hidden states")
        try:
            return decode_hidden(hidden_from_pb(h), dim=sess.hidden_size, positions=positions)
        except HiddenError as exc:
            raise _invalid(str(exc)) from None

    def _check_block(self, sess: Session, req: pb.VerifyRequest, block: list[int]) -> None:
        # An empty block is a plain target step (a controller that predicts the
        # first draft token rejected sends none: WISP eq. 25 allows K = 0).
        if len(block) > self.config.max_block:
            raise _invalid(f"draft block of {len(block)} tokens exceeds max_block={self.config.max_block}")
        self._check_tokens(block, "the draft block")
        if len(sess.tokens) + len(block) + 1 > self.config.max_context:
            raise _Refusal(
                grpc.StatusCode.OUT_OF_RANGE,
                f"a block of {len(block)} on {len(sess.tokens)} committed tokens exceeds the context limit of "
                f"{self.config.max_context}",
            )
        if req.upload_protocol not in UPLOAD_FROM_PB and req.upload_protocol != pb.UPLOAD_PROTOCOL_UNSPECIFIED:
            raise _invalid(f"upload protocol {req.upload_protocol} is not one this verifier knows")
        if sess.mode == "sample":
            self._check_distributions(req, block)

    def _check_distributions(self, req: pb.VerifyRequest, block: list[int]) -> None:
        dists = req.draft_distributions
        if len(dists) != len(block):
            raise _invalid(f"sampling needs one draft distribution per draft token: {len(dists)} for {len(block)}")
        for i, (d, tok) in enumerate(zip(dists, block)):
            if len(d.token_ids) != len(d.probs) or not d.token_ids:
                raise _invalid(f"draft distribution {i} has {len(d.token_ids)} ids and {len(d.probs)} probabilities")
            if len(d.token_ids) > self.config.max_draft_top_k:
                raise _invalid(f"draft distribution {i} has {len(d.token_ids)} entries, over {self.config.max_draft_top_k}")
            ids = np.asarray(d.token_ids)
            probs = np.asarray(d.probs, dtype=np.float64)
            if ids.min() < 0 or ids.max() >= self.model.n_vocab or np.unique(ids).size != ids.size:
                raise _invalid(f"draft distribution {i} has token ids out of range or repeated")
            if not np.all(np.isfinite(probs)) or probs.min() <= 0 or abs(probs.sum() - 1.0) > 1e-3:
                raise _invalid(f"draft distribution {i} is not a probability distribution (sum {probs.sum():.6f})")
            if tok not in d.token_ids:
                raise _invalid(f"draft token {tok} at offset {i} is outside its draft distribution")

    # -- centralized baseline --------------------------------------------------------

    def generate(self, req: pb.GenerateRequest, context: grpc.ServicerContext) -> Iterator[pb.GenerateResponse]:
        mode, temperature = self._sampling(req.sampling)
        tokens = list(req.prompt_tokens)
        self._check_prompt(tokens)
        if not 1 <= req.max_tokens <= self.config.max_generate_tokens:
            raise _invalid(f"max_tokens must be between 1 and {self.config.max_generate_tokens}")
        stops = set(req.stop_tokens)
        sess = self.sessions.create(
            mode=mode, temperature=temperature, seed=req.sampling.seed, slo_class="batch", prefix="g-"
        )
        try:
            with sess.lock:
                _, _, prefill_ms = self.engine.run(sess.seq, tokens[:-1], 0, 0)
                pos = len(tokens) - 1
                last = tokens[-1]
                for index in range(req.max_tokens):
                    if not context.is_active():
                        return
                    logits, _, ms = self.engine.run(sess.seq, [last], pos, 1)
                    pos += 1
                    if mode == "greedy":
                        tok = int(np.argmax(logits[0]))
                    else:
                        p = target_probs(logits[0], temperature)
                        tok = int(sess.rng.choice(p.size, p=p))
                    sess.last_used = time.monotonic()
                    reason = pb.FINISH_REASON_UNSPECIFIED
                    if self.model.is_eog(tok) or tok in stops:
                        reason = pb.FINISH_REASON_EOS
                    elif index + 1 == req.max_tokens:
                        reason = pb.FINISH_REASON_LENGTH
                    elif pos + 1 >= self.config.max_context:
                        reason = pb.FINISH_REASON_CONTEXT
                    yield pb.GenerateResponse(
                        token=tok,
                        index=index,
                        decode_ms=ms,
                        finish_reason=reason,
                        prefill_ms=prefill_ms if index == 0 else 0.0,
                    )
                    if reason != pb.FINISH_REASON_UNSPECIFIED:
                        return
                    last = tok
        finally:
            self.sessions.close(sess.id)


def _key(req: pb.VerifyRequest) -> bytes:
    """What identifies a round request: a hash of its bytes."""
    return hashlib.sha256(req.SerializeToString(deterministic=True)).digest()


def _serialize(msg: Message) -> bytes:
    return msg.SerializeToString()


def _abort(context: grpc.ServicerContext, r: _Refusal) -> None:
    if r.trailers:
        context.set_trailing_metadata(r.trailers)
    context.abort(r.code, r.message)
