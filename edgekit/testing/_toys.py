"""A toy verifier (in this process, or served over gRPC) and a client over it, each in one call."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from ..client import EdgeClient
from ..config import ClientConfig, GenerationConfig, ServerConfig
from ..runtime import DraftModel, DraftPool, ToyLanguageModel
from ..transport import VerifierTransport
from ..verifier import Coefficients, Feed, ToyEngine, VerifierServer, VerifierService, VerifyTimeEstimator
from ._inprocess import InProcessTransport
from ._link import SimulatedLink
from ._models import FakeDraftModel


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


def toy_server(
    target: ToyLanguageModel | None = None,
    *,
    hidden_size: int = 8,
    cost: Callable[[Sequence[Feed]], float] | None = None,
    clock: Callable[[], float] = time.monotonic,
    **config: Any,
) -> VerifierServer:
    """The reference verifier over a toy target (default `ToyLanguageModel()`) served over real gRPC,
    as `edgekit serve` serves a model: `config` takes `ServerConfig` fields (port 0, a free loopback
    port, unless given), the engine holds `max_sessions` sequences of `max_context` tokens. Not
    started: use it as a context manager (or `.start()` and `.stop()`); clients reach its `address`.

    >>> with toy_server(ToyLanguageModel(seed=3), max_sessions=4, token="s3cret") as server:
    ...     client = EdgeClient(server.address, draft=FakeDraftModel(ToyLanguageModel(seed=3)))

    `cost`: milliseconds each batch takes (the toy sleeps them, as `ToyEngine` does); `clock`: the
    server's clock (a `ManualClock`), for tests of what it times out."""
    c = ServerConfig(**({"port": 0} | config))
    engine = ToyEngine(target if target is not None else ToyLanguageModel(), n_seq=c.max_sessions,
                       max_context=c.max_context, hidden_size=hidden_size, cost=cost)
    return VerifierServer(engine, c, clock=clock)


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
        draft=draft,
        generation=replace(generation or GenerationConfig(), **fields),
        config=config,
    )
