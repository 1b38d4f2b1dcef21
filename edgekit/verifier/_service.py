"""The verifier's service: protobuf in, protobuf out, and nothing else.

Requests arrive as raw bytes and are parsed here, so a message that is not
valid protobuf, or larger than the configured limit, is refused with
INVALID_ARGUMENT (gRPC's own deserializer would answer INTERNAL). Each RPC
converts its message into the values the verifier's parts take (`VerifyRounds`,
`Baseline`, `RequestChecks`) and their answer back into a message, with the
conversions `edgekit.protocol` holds for both ends: no field is mapped here. A refusal
is an edgekit error, turned into its gRPC status by `edgekit.protocol.status_of`;
no refusal touches another session.

`call` and `call_stream` are the service on bytes, which `handlers()` puts
behind gRPC and an in-process transport calls directly. Each call is made by a
`Caller` (its token's tenant, and the client it counts as): sessions belong to
the tenant that opened them. An error that is not an edgekit error (a bug) is
logged and answered INTERNAL with a message, never left to gRPC as UNKNOWN.

A round is known again by its key (`edgekit.protocol.round_key`), a hash of what
decides its verdict, not of the link figures and timings a client measures afresh
when it re-sends the round after a failure: so a verdict applied before the
failure is answered again, never applied twice.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import closing
from typing import NoReturn

import grpc
from google.protobuf.message import DecodeError, Message

from ..__version__ import __version__
from ..config import ServerConfig
from ..errors import EdgekitError, InternalError, ProtocolError, SessionNotFoundError, VerifierUnavailableError
from ..protocol import (
    MAX_TOP_LOGPROBS,
    PROTOCOL_VERSION,
    SAMPLER_FEATURES,
    SERVICE_NAME,
    ServerInfo,
    fingerprint_from_pb,
    generate_request_from_pb,
    generated_to_pb,
    open_request_from_pb,
    opened_to_pb,
    pb,
    server_info_to_pb,
    status_of,
    verify_request_from_pb,
    verify_response_to_pb,
)
from ..registry import BUDGET_POLICIES, SCHEDULERS
from ._baseline import Baseline
from ._budgets import Budgets, BudgetState, capacity_within
from ._calibration import DECODE_STEP_CONTEXT
from ._core import EngineCore
from ._estimator import VerifyTimeEstimator
from ._peers import Peers
from ._rounds import VerifyRounds
from ._semantic import DecisionHead, SemanticMode
from ._sessions import Caller, SessionTable
from ._slo import BEST_EFFORT, SpeedClasses
from ._stages import mark
from ._stats import ServingStats
from ._streams import StreamLimits
from ._validation import RequestChecks, clip
from .engine import Engine, Feed
from .scheduler import Scheduler

__all__ = ["VerifierService"]

log = logging.getLogger("edgekit.verifier")


_NO_DEADLINE = 7 * 86400.0  # seconds: a call that has more is one without a deadline (grpcurl's default, a proxy's)

class VerifierService:
    """The verifier over `engine`: sessions, rounds and the target-only baseline,
    with the engine's work ordered by `scheduler` (by default the policy the
    config names, with its queue bound and prefill chunk) and planned with
    `estimator` (by default an uncalibrated one, which learns from the batches
    that run). `stats` counts what it has served."""

    def __init__(
        self,
        engine: Engine,
        config: ServerConfig,
        *,
        scheduler: Scheduler | None = None,
        estimator: VerifyTimeEstimator | None = None,
        semantic_head: DecisionHead | None = None,
        clock: Callable[[], float] = time.monotonic,
        timed_step_ms: float = 0.0,
    ) -> None:
        """`semantic_head`: the decision head of the semantic mode (default: the one the config
        names, loaded here; neither: the mode is not offered). `timed_step_ms`: a target step as
        timed before serving (`time_decode_step`), said until the estimator knows better. `clock`: seconds, what session
        idleness and draining are measured on (tests pass a virtual one); the engine's
        deadlines stay on `time.monotonic`."""
        self.clock = clock
        self.timed_step_ms = timed_step_ms
        self.engine = engine
        self.config = config
        self.fingerprint = engine.fingerprint()
        self.estimator = estimator or VerifyTimeEstimator()
        if scheduler is None:
            scheduler = SCHEDULERS.load(config.policy)(self.estimator, config)
        self.policy = scheduler.name
        self.sessions = SessionTable(
            config.max_sessions,
            config.idle_timeout,
            reclaim_after=config.reclaim_after,
            max_per_client=config.max_sessions_per_client,
            clock=clock,
        )
        assert not isinstance(config.slo_classes, str)  # the config parsed it
        self.slo = SpeedClasses(config.slo_classes, budget=config.slo_budget)
        self.stats = ServingStats(
            classes=[*self.slo.classes, BEST_EFFORT], queue_depth=scheduler.waiting, sessions=self.sessions.__len__
        )
        self.core = EngineCore(engine, scheduler, estimator=self.estimator, stats=self.stats)
        self.checks = RequestChecks(config, self.fingerprint)
        self.budgets = _budgets(config, self.estimator, self.sessions)
        if semantic_head is None and config.semantic_head:
            from ._semantic_head import SemanticHead  # onnxruntime, loaded only for a head

            semantic_head = SemanticHead(config.semantic_head)
        self.semantic = SemanticMode(semantic_head, engine.n_embd)
        self.rounds = VerifyRounds(
            self.core, self.sessions, self.checks, config, self.slo, self.stats, self.budgets, self.semantic
        )
        self.baseline = Baseline(self.core, self.sessions, self.checks, config, self.slo, self.stats)
        self.peers = Peers(config.trusted_proxies)
        self.streams = StreamLimits(
            config.max_streams or config.max_sessions, config.max_sessions_per_client,
            idle_s=config.stream_idle_timeout, clock=clock,
        )
        # Draining (`drain`): new sessions are refused, calls on open ones still served.
        self.draining: float | None = None  # when the verifier expects to be back, on `clock`
        self.round_streams = False  # whether Rounds is served: `handlers()` serves it
        self._in_flight = 0
        self._last_call = clock()
        self._calls = threading.Lock()
        self._unary: dict[str, tuple[type[Message], Callable[[Message, float | None, Caller], Message]]] = {
            "Handshake": (pb.HandshakeRequest, self.handshake),
            "Ping": (pb.PingRequest, self.ping),
            "OpenSession": (pb.OpenSessionRequest, self.open_session),
            "ExtendSession": (pb.ExtendSessionRequest, self.extend_session),
            "Verify": (pb.VerifyRequest, self.verify),
            "CloseSession": (pb.CloseSessionRequest, self.close_session),
        }

    def close(self) -> None:
        """Finishes the engine's queued work and stops its thread."""
        self.core.close()

    def drain(self, back_in: float) -> None:
        """From now on new sessions are refused (UNAVAILABLE, back in about `back_in` seconds);
        calls on open sessions go on being served."""
        self.draining = self.clock() + back_in

    def quiet_for(self) -> float:
        """Seconds since the last call ended (0 while one is in flight)."""
        with self._calls:
            return 0.0 if self._in_flight else self.clock() - self._last_call

    def idle(self) -> bool:
        """No session open and no call in flight: nothing left to serve."""
        with self._calls:
            return not self._in_flight and not len(self.sessions)

    def _refuse_if_draining(self, what: str) -> None:
        if self.draining is not None:
            wait = max(1.0, self.draining - self.clock())
            raise VerifierUnavailableError(
                f"the verifier is draining for a restart and takes no new {what}; try again in {wait:.0f} s",
                retry_after=wait,
            )

    def _enter(self) -> None:
        with self._calls:
            self._in_flight += 1

    def _leave(self) -> None:
        with self._calls:
            self._in_flight -= 1
            self._last_call = self.clock()

    # -- the service on bytes ------------------------------------------------------------

    def call(self, method: str, raw: bytes, deadline: float | None = None, caller: Caller = Caller()) -> Message:
        """A unary RPC on a serialized request; raises edgekit errors. `deadline`
        (a `time.monotonic()`): work for the engine not started by then is withdrawn."""
        cls, fn = self._unary[method]
        self._enter()
        timing = self.stats.stages.begin(method)
        try:
            req = self._parse(cls, raw)
            mark("decode")
            return fn(req, deadline, caller)
        except EdgekitError:
            raise
        except Exception as exc:  # a bug: say so, as INTERNAL, and keep serving
            log.exception("%s failed", method)
            raise InternalError(f"{method} failed inside the verifier: {type(exc).__name__}") from exc
        finally:
            timing.end()
            self._leave()

    def call_stream(
        self, method: str, raw: bytes, is_active: Callable[[], bool] = lambda: True, caller: Caller = Caller()
    ) -> Generator[Message, None, None]:
        """A server-streaming RPC (Generate) on a serialized request."""
        if method != "Generate":
            raise KeyError(method)
        req = self._parse(pb.GenerateRequest, raw)
        assert isinstance(req, pb.GenerateRequest)
        self._refuse_if_draining("generations")
        self._enter()
        try:
            yield from self.generate(req, is_active, caller)
        except EdgekitError:
            raise
        except Exception as exc:
            log.exception("Generate failed")
            raise InternalError(f"Generate failed inside the verifier: {type(exc).__name__}") from exc
        finally:
            self._leave()

    def _parse(self, cls: type[Message], raw: bytes) -> Message:
        if len(raw) > self.config.max_message_bytes:
            raise ProtocolError(f"request of {len(raw)} bytes exceeds the limit of {self.config.max_message_bytes}")
        try:
            return cls.FromString(raw)
        except DecodeError as exc:
            raise ProtocolError(f"malformed {cls.__name__}: {exc}") from None

    def handlers(self, tenant_of: Callable[[grpc.ServicerContext], str] = lambda context: "") -> grpc.GenericRpcHandler:
        """The service behind gRPC: refusals become status codes (and trailers); Rounds, a
        session's rounds on one stream, each served as a Verify call. `tenant_of` names the
        tenant of a call's token ("" where tokens are not used)."""
        self.round_streams = True

        def caller(context: grpc.ServicerContext) -> Caller:
            tenant = tenant_of(context)
            if tenant:
                return Caller(tenant, f"tenant:{tenant}")
            return Caller(tenant, f"host:{self.peers.host(context.peer(), context.invocation_metadata())}")

        def unary(method: str) -> Callable[[bytes, grpc.ServicerContext], Message]:
            def handler(raw: bytes, context: grpc.ServicerContext) -> Message:
                try:
                    return self.call(method, raw, _deadline(context), caller(context))
                except EdgekitError as exc:
                    _abort(context, exc, method)

            return handler

        def rounds(requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[Message]:
            # a session's rounds, each served as a Verify call; a refusal ends the stream
            who = caller(context)
            try:
                with self.streams.admit(who.client, context.cancel) as open_stream:
                    for raw in requests:
                        with open_stream.working():
                            answer = self.call("Verify", raw, _deadline(context), who)
                        yield answer
                        open_stream.moved()
            except EdgekitError as exc:
                _abort(context, exc, "Rounds")

        def stream(raw: bytes, context: grpc.ServicerContext) -> Iterator[Message]:
            who = caller(context)
            try:
                with self.streams.admit(who.client, context.cancel) as open_stream, \
                        closing(self.call_stream("Generate", raw, context.is_active, who)) as tokens:
                    while True:
                        with open_stream.working():
                            message = next(tokens, None)
                        if message is None:
                            return
                        yield message
                        open_stream.moved()
            except EdgekitError as exc:
                _abort(context, exc, "Generate")

        methods: dict[str, grpc.RpcMethodHandler] = {
            name: grpc.unary_unary_rpc_method_handler(unary(name), response_serializer=_serialize)
            for name in self._unary
        }
        methods["Generate"] = grpc.unary_stream_rpc_method_handler(stream, response_serializer=_serialize)
        methods["Rounds"] = grpc.stream_stream_rpc_method_handler(rounds, response_serializer=_serialize)
        return grpc.method_handlers_generic_handler(SERVICE_NAME, methods)

    # -- one method per RPC ---------------------------------------------------------------

    def handshake(self, req: Message, deadline: float | None = None, caller: Caller = Caller()) -> pb.HandshakeResponse:
        assert isinstance(req, pb.HandshakeRequest)
        version = self.checks.protocol_version(req.protocol_version)
        draft = fingerprint_from_pb(req.draft_tokenizer)
        if draft.vocab_size:  # an empty fingerprint only asks which target this is (nothing is opened)
            self.checks.tokenizer(draft)
        return server_info_to_pb(self.server_info(version))

    def server_info(self, version: int = PROTOCOL_VERSION) -> ServerInfo:
        """What this verifier is and does, as a handshake at protocol `version` tells it."""
        c = self.config
        return ServerInfo(
            protocol_version=version,
            target_model=self.engine.name,
            target_fingerprint=self.fingerprint,
            target_hidden_size=self.engine.n_embd,
            modes=("greedy", "sample", *(("semantic",) if self.rounds.semantic.offered else ())),
            upload_protocols=("tokens", "fh", "sh"),
            hidden_encodings=("fp16", "int8"),
            max_block=c.max_block,
            max_context=c.max_context,
            max_sessions=c.max_sessions,
            assigns_budgets=self.budgets is not None,
            prefix_cache=True,
            max_draft_top_k=c.max_draft_top_k,
            max_message_bytes=c.max_message_bytes,
            sampler_features=SAMPLER_FEATURES,
            max_top_logprobs=MAX_TOP_LOGPROBS,
            exact_numerics=self.engine.exact,
            invariant_batch=self.engine.invariant_batch,
            slo_classes=dict(self.slo.classes) if version >= 2 else {},
            scheduling_policy=self.policy if version >= 2 else "",
            semantic_head=self.rounds.semantic.identity,
            semantic_threshold=self.rounds.semantic.default_threshold,
            server_version=__version__,
            chat_template=self.engine.chat_template() or None,
            recommended_sampling=self.engine.sampling_defaults(),
            decode_step_ms=self.decode_step_ms(),
            round_streams=self.round_streams,
        )

    def decode_step_ms(self) -> float:
        """What one target step of one sequence takes (a token of an unloaded target-only stream,
        at `DECODE_STEP_CONTEXT` cached tokens): the estimator's forecast once it is calibrated or
        has learnt from enough batches (`VerifyTimeEstimator.settled`), before that
        `timed_step_ms` (0: not known)."""
        if not self.estimator.settled:
            return self.timed_step_ms
        step = Feed(0, DECODE_STEP_CONTEXT, (0,), 1)
        return max(0.0, self.estimator.predict([step]))

    def ping(self, req: Message, deadline: float | None = None, caller: Caller = Caller()) -> pb.PingResponse:
        assert isinstance(req, pb.PingRequest)
        self.checks.ping_reply(req.reply_bytes)
        return pb.PingResponse(
            payload=bytes(req.reply_bytes), client_send_time=req.client_send_time, server_time=time.time()
        )

    def open_session(
        self, req: Message, deadline: float | None = None, caller: Caller = Caller()
    ) -> pb.OpenSessionResponse:
        assert isinstance(req, pb.OpenSessionRequest)
        self._refuse_if_draining("sessions")
        return opened_to_pb(self.rounds.open(open_request_from_pb(req), deadline=deadline, caller=caller))

    def extend_session(
        self, req: Message, deadline: float | None = None, caller: Caller = Caller()
    ) -> pb.ExtendSessionResponse:
        assert isinstance(req, pb.ExtendSessionRequest)
        committed, ms = self.rounds.extend(
            req.session_id, req.base_position, req.tokens, deadline=deadline, caller=caller
        )
        return pb.ExtendSessionResponse(committed_length=committed, prefill_ms=ms)

    def verify(self, req: Message, deadline: float | None = None, caller: Caller = Caller()) -> pb.VerifyResponse:
        """One round; under SH, one half of one (see the HiddenRequest message)."""
        assert isinstance(req, pb.VerifyRequest)
        arrived = time.perf_counter()
        # Sizes before anything is copied out of the message.
        self.checks.block_size(len(req.draft_tokens), len(req.draft_distributions))
        block = verify_request_from_pb(req)
        mark("decode")
        answer = self.rounds.verify(block, arrived=arrived, deadline=deadline, caller=caller)
        mark("accept")
        return verify_response_to_pb(answer)

    def close_session(
        self, req: Message, deadline: float | None = None, caller: Caller = Caller()
    ) -> pb.CloseSessionResponse:
        assert isinstance(req, pb.CloseSessionRequest)
        if not self.rounds.close(req.session_id, caller):
            raise SessionNotFoundError(f"session {clip(req.session_id)} is unknown or was evicted")
        return pb.CloseSessionResponse()

    def generate(
        self, req: pb.GenerateRequest, is_active: Callable[[], bool] = lambda: True, caller: Caller = Caller()
    ) -> Iterator[pb.GenerateResponse]:
        for t in self.baseline.generate(generate_request_from_pb(req), is_active=is_active, caller=caller):
            yield generated_to_pb(t)


def _budgets(config: ServerConfig, estimator: VerifyTimeEstimator, sessions: SessionTable) -> Budgets | None:
    """The budget policy the config names, with its C: fixed, or from the estimator and the SLOs
    (without a calibrated estimator, as without SLOs: `DEFAULT_WINDOW` per session)."""
    policy = BUDGET_POLICIES.load(config.budgets)
    if policy is None:  # "none": the devices choose
        return None
    lo, hi = 1, config.max_block

    def capacity(states: Sequence[BudgetState]) -> int:
        if config.token_budget:
            return config.token_budget
        if not estimator.calibrated:
            states = [BudgetState() for _ in states]
        return capacity_within(estimator.predict_features, states, lo, hi)

    return Budgets(
        policy(), capacity=capacity, lo=lo, hi=hi, eta=config.budget_eta,
        beta=config.budget_beta, is_live=sessions.__contains__,
    )


def _deadline(context: grpc.ServicerContext) -> float | None:
    """The call's deadline as a `time.monotonic()`; None for a call without one."""
    remaining = context.time_remaining()  # a call without a deadline: gRPC's "forever", ~2^63 ns
    return time.monotonic() + remaining if remaining is not None and remaining < _NO_DEADLINE else None


def _serialize(msg: Message) -> bytes:
    return msg.SerializeToString()


def _abort(context: grpc.ServicerContext, exc: EdgekitError, method: str) -> NoReturn:
    status = status_of(exc)
    if status.code == grpc.StatusCode.INTERNAL:
        log.exception("internal error in %s", method)
    if status.trailers:
        context.set_trailing_metadata(status.trailers)
    context.abort(status.code, status.message)
