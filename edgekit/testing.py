"""Fakes for the seams, for tests of code built on edgekit (and edgekit's own).

`ToyLanguageModel` is a deterministic stand-in for an LM: the logits of a
context are a pseudo-random function of its last tokens. `FakeDraftModel`
drives one through the `DraftModel` protocol, `ToyPoolBackend` through a
`DraftPool` (several sequences, batched steps). `toy_verifier(target)` is the
real verifier service over a toy target, reached through `InProcessTransport`:
every request goes as the protobuf bytes gRPC would carry, through the same
checks, rounds and acceptance as `edgekit serve`, so speculative output through
the fakes equals the toy target's own decoding. `SimulatedLink` gives each
exchange the time a modelled link would take, without waiting.

`toy_client(target, ...)` is an `EdgeClient` over all of these in one call: the toy verifier
of `target` and a fake draft of it with some noise, GenerationConfig's fields as keywords.

`ScriptedTransport` is a verifier transport whose every call a test decides, as httpx's
`MockTransport` takes a handler: a `script` of faults at the n-th call of a method (a request
dropped, an answer lost, an error raised), a `handler` for anything else, and an `inner`
transport (the toy verifier, a gRPC one) that a call is forwarded to; it records every `Call`.
(A semantic decision head that reads only the link: `edgekit.semantic.head.link_only_head`,
with the training tooling.)
"""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, TypeAlias

import grpc
import numpy as np
from google.protobuf.message import Message

from .client import EdgeClient
from .config import ClientConfig, GenerationConfig, ServerConfig
from .errors import EdgekitError, VerifierUnavailableError
from .link import MIN_RTO_MS
from .protocol import (
    BlockRequest,
    Fingerprint,
    GeneratedToken,
    GenerateRequest,
    OpenedSession,
    OpenRequest,
    ServerInfo,
    VerifyResult,
    error_from_status,
    status_of,
)
from .runtime import DraftModel, DraftOutput, DraftPool, Step, ToyLanguageModel
from .transport import MessageTransport, VerifierTransport
from .verifier import Coefficients, ToyEngine, VerifierService, VerifyTimeEstimator

__all__ = [
    "Call",
    "FakeDraftModel",
    "InProcessTransport",
    "ManualClock",
    "ScriptedTransport",
    "SimulatedLink",
    "ToyLanguageModel",
    "ToyPoolBackend",
    "toy_client",
    "toy_verifier",
]


class ManualClock:
    """A clock whose time passes only when a test says (`clock.now += 1.5`): pass it as
    `VerifierServer(..., clock=)` and session idleness and draining no longer depend on how fast
    the machine runs the test."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class FakeDraftModel:
    """A `DraftModel` over a toy LM; its "KV cache" is the list of tokens it has evaluated."""

    def __init__(self, lm: ToyLanguageModel, *, n_ctx: int = 4096, n_embd: int = 8) -> None:
        self.lm = lm
        self.n_embd = n_embd
        self.name = lm.name
        self.n_vocab = lm.vocab_size
        self.n_ctx = n_ctx
        self.evaluated: list[int] = []
        self.eval_calls = 0

    @property
    def n_past(self) -> int:
        return len(self.evaluated)

    def fingerprint(self) -> Fingerprint:
        return self.lm.fingerprint()

    def tokenize(self, text: str, *, add_special: bool = True) -> list[int]:
        ids = [2 + (b % (self.lm.real_vocab_size - 2)) for b in text.encode()]  # never a padding entry
        return ([0] if add_special else []) + ids

    def token_bytes(self, token: int, *, special: bool = False) -> bytes:
        if token < 2:
            return (b"<bos>", b"<eos>")[token] if special else b""
        if token >= self.lm.real_vocab_size:  # a padding entry: a placeholder, no text
            return f"[PAD{token}]".encode() if special else b""
        return bytes([ord("a") + token % 26])

    def detokenize(self, tokens: Sequence[int]) -> str:
        return b"".join(self.token_bytes(t) for t in tokens).decode()

    def is_eog(self, token: int) -> bool:
        return token == self.lm.eos

    def chat_template(self) -> str | None:
        return None

    def prefill(self, tokens: Sequence[int]) -> None:
        self.evaluated.extend(tokens)

    def eval(self, tokens: Sequence[int], *, hidden: bool = False) -> DraftOutput:
        if not tokens:
            raise ValueError("eval needs at least one token")
        self.eval_calls += 1
        self.evaluated.extend(tokens)
        logits = self.lm.logits(self.evaluated)
        h = np.resize(logits, self.n_embd) if hidden else None  # a stand-in that differs from step to step
        return DraftOutput(logits, h)

    def truncate(self, length: int) -> None:
        del self.evaluated[length:]

    def close(self) -> None:
        pass  # nothing held (LlamaDraftModel frees its model)


class ToyPoolBackend:
    """A `DraftPool`'s backend over a toy LM: each sequence a list of tokens; each batch's size
    is recorded in `batches`, and each takes `delay_s` (so that concurrent steps pile up)."""

    def __init__(self, lm: ToyLanguageModel, *, slots: int, n_ctx_seq: int = 4096, max_rows: int = 64,
                 delay_s: float = 0.0, n_embd: int = 8) -> None:
        self.vocab = FakeDraftModel(lm, n_ctx=n_ctx_seq, n_embd=n_embd)
        self.lm = lm
        self.n_seq = slots
        self.n_ctx_seq = n_ctx_seq
        self.max_rows = max_rows
        self.delay_s = delay_s
        self.sequences: list[list[int]] = [[] for _ in range(slots)]
        self.batches: list[int] = []

    def run(self, steps: Sequence[Step]) -> list[DraftOutput | None]:
        assert sum(len(s.tokens) for s in steps) <= self.max_rows and len({s.hidden for s in steps}) == 1
        if self.delay_s:
            time.sleep(self.delay_s)
        self.batches.append(len(steps))
        out: list[DraftOutput | None] = []
        for s in steps:
            seq = self.sequences[s.seq]
            assert s.start == len(seq), f"sequence {s.seq} holds {len(seq)} tokens, the step starts at {s.start}"
            seq.extend(s.tokens)
            logits = self.lm.logits(seq)
            out.append(DraftOutput(logits, np.resize(logits, self.vocab.n_embd) if s.hidden else None)
                       if s.output else None)
        return out

    def truncate(self, seq: int, length: int) -> None:
        del self.sequences[seq][length:]

    def close(self) -> None:
        pass


class SimulatedLink:
    """Times of exchanges over a modelled link, without waiting: base RTT, rates
    each way, Gaussian jitter and, with probability `loss`, one retransmission
    timeout (seeded, so tests are exact)."""

    def __init__(
        self,
        rtt_ms: float = 0.0,
        uplink_mbps: float = 1e6,
        downlink_mbps: float = 1e6,
        jitter_ms: float = 0.0,
        loss: float = 0.0,
        rto_ms: float = MIN_RTO_MS,
        seed: int = 0,
    ) -> None:
        self.rtt_ms, self.uplink_mbps, self.downlink_mbps = rtt_ms, uplink_mbps, downlink_mbps
        self.jitter_ms, self.loss, self.rto_ms = jitter_ms, loss, rto_ms
        self._rng = np.random.default_rng(seed)

    def exchange_ms(self, up_bytes: int, down_bytes: int) -> float:
        t = self.rtt_ms + up_bytes * 8 / (self.uplink_mbps * 1e3) + down_bytes * 8 / (self.downlink_mbps * 1e3)
        t += abs(self._rng.normal(0.0, self.jitter_ms)) if self.jitter_ms else 0.0
        if self.loss and self._rng.random() < self.loss:
            t += self.rto_ms
        return t


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


def toy_verifier(
    target: ToyLanguageModel,
    *,
    max_block: int = 32,
    max_context: int = 4096,
    max_sessions: int = 64,
    hidden_size: int = 8,
    link: SimulatedLink | None = None,
    address: str = "in-process",
    cost: Coefficients | None = None,
    semantic_head: Any = None,
    **config: Any,
) -> InProcessTransport:
    """The reference verifier over a toy target, in this process: a transport to it.

    `config` takes other `ServerConfig` fields (idle_timeout, max_message_bytes, policy, ...).
    With no `link`, a `SimulatedLink()`: instant, so timings are the verifier's own.
    With `cost`, every batch takes the time these coefficients give it (eq. 19 and
    the logit rows), and the verifier's estimator starts out knowing them. `semantic_head`:
    a decision head (`edgekit.semantic.SemanticHead`, or any `DecisionHead`) for semantic mode."""
    c = ServerConfig(port=0, max_block=max_block, max_context=max_context, max_sessions=max_sessions, **config)
    engine = ToyEngine(
        target,
        n_seq=c.max_sessions,
        max_context=c.max_context,
        hidden_size=hidden_size,
        cost=None if cost is None else VerifyTimeEstimator(cost).predict,
    )
    service = VerifierService(
        engine, c, estimator=VerifyTimeEstimator(cost) if cost is not None else None, semantic_head=semantic_head
    )
    return InProcessTransport(service, link=link or SimulatedLink(), address=address)


def toy_client(
    target: ToyLanguageModel | None = None,
    *,
    noise: float = 1.0,
    draft: ToyLanguageModel | DraftModel | DraftPool | None = None,
    verifier: VerifierTransport | None = None,
    config: ClientConfig | None = None,
    generation: GenerationConfig | None = None,
    **fields: Any,
) -> EdgeClient:
    """An `EdgeClient` over the toy verifier of `target` (default `ToyLanguageModel()`) and a fake
    draft of it, for a test of the client:

    >>> client = toy_client(ToyLanguageModel(seed=4), max_tokens=200, draft_k=3, stop_at_eos=False)

    The draft is `target` with `noise` (its seed, vocabulary and end of text: a draft that
    disagrees now and then; with 0, never), or `draft`: another toy LM (driven by a
    `FakeDraftModel`), a draft model or a `DraftPool`. `verifier`: a transport in place of
    `toy_verifier(target)` (one with options, a `ScriptedTransport`); `fields`: GenerationConfig's,
    over `generation`. The client's transport and draft are `client.transport` and `client.draft`.
    """
    if target is None:
        target = ToyLanguageModel()
    if draft is None:
        draft = ToyLanguageModel(target.vocab_size, seed=target.seed, order=target.order, noise=noise,
                                 eos=target.eos, eos_bias=target.eos_bias, name=target.name,
                                 padding=target.padding, padding_logit=target.padding_logit)
    if isinstance(draft, ToyLanguageModel):
        draft = FakeDraftModel(draft)
    return EdgeClient(
        verifier if verifier is not None else toy_verifier(target),
        draft_model=draft,
        generation=replace(generation or GenerationConfig(), **fields),
        config=config,
    )


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


Fault: TypeAlias = Literal["drop", "lose"] | BaseException | Callable[[Call], Any]
"""What a `ScriptedTransport`'s script does at a call: see there."""


class ScriptedTransport:
    """A verifier transport whose calls a test decides, as httpx's `MockTransport`: each call
    (`handshake`, `ping`, `open_session`, `extend_session`, `verify`, `close_session`,
    `generate`) becomes a `Call`, recorded in `calls`, and is answered by

    - `script[method][n]`, at the n-th call of that method: "drop" (the request never arrives:
      `VerifierUnavailableError`, nothing applied), "lose" (forwarded and applied, its answer lost:
      `VerifierUnavailableError`; a stream runs to its end first), an exception (raised instead of
      the call), or a function of the `Call` (its return is the answer; it may raise);
    - else `handler(call)`, if given: it may return an answer, raise, wait for an event, swap
      `inner`, or `call.forward()` (a handler sees every method; the ones it leaves alone it forwards);
    - else `call.forward()`: the same call on `inner`.

    A verifier whose third and seventh verdicts are lost, and one that answers pings without a verifier:

    >>> lossy = ScriptedTransport(toy_verifier(target), script={"verify": {3: "lose", 7: "lose"}})
    >>> def ping(call):
    ...     if call.arguments["payload_bytes"]:
    ...         raise VerifierUnavailableError("no answer within 2 s")
    ...     return 8.0
    >>> probe(ScriptedTransport(handler=ping))

    Attributes it does not have are `inner`'s (`transport.service`, `transport.verify_calls` of a
    toy verifier). `address` and `config` are `inner`'s at the start unless given. Calls may come
    from several threads (the client verifies on one of its own): `calls` and `count` are safe to read.
    """

    def __init__(
        self,
        inner: VerifierTransport | None = None,
        *,
        handler: Callable[[Call], Any] | None = None,
        script: Mapping[str, Mapping[int, Fault]] | None = None,
        config: ClientConfig | None = None,
        address: str | None = None,
    ) -> None:
        for method, faults in (script or {}).items():
            if method not in _SCRIPTED:
                raise ValueError(f"no transport call {method!r} to script; there are {', '.join(_SCRIPTED)}")
            for n, fault in faults.items():
                if isinstance(fault, str) and fault not in ("drop", "lose"):
                    raise ValueError(f"{method} call {n}: {fault!r} is no fault (\"drop\", \"lose\")")
        self.inner = inner
        self.handler = handler
        self.script = script or {}
        self.config: ClientConfig = config or getattr(inner, "config", None) or ClientConfig()
        self.address: str = address or getattr(inner, "address", None) or "scripted"
        self.calls: list[Call] = []
        self._counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    def count(self, method: str) -> int:
        """How many calls of `method` it has been asked to make."""
        with self._lock:
            return self._counts[method]

    def __getattr__(self, name: str) -> Any:
        inner = self.__dict__.get("inner")
        if inner is None or name.startswith("__"):
            raise AttributeError(f"{type(self).__name__} has no attribute {name!r} (nor has its inner transport)")
        return getattr(inner, name)

    def _call(self, method: str, **arguments: Any) -> Any:
        with self._lock:
            self._counts[method] += 1
            call = Call(method, arguments, self._counts[method], self)
            self.calls.append(call)
        fault = self.script.get(method, {}).get(call.n)
        if fault is None:
            return self.handler(call) if self.handler is not None else call.forward()
        if fault == "drop":
            raise VerifierUnavailableError(f"{call} to {self.address} dropped (scripted)", address=self.address)
        if fault == "lose":
            answer = call.forward()
            if isinstance(answer, Iterator):
                deque(answer, maxlen=0)
            raise VerifierUnavailableError(f"the answer to {call} from {self.address} was lost (scripted)",
                                           address=self.address)
        if isinstance(fault, BaseException):
            raise fault
        assert callable(fault)
        return fault(call)

    # -- the transport protocol: every call through _call ---------------------------------

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


_SCRIPTED = ("handshake", "ping", "open_session", "extend_session", "verify", "close_session", "generate")


def _now_ms() -> float:
    return time.perf_counter() * 1e3
