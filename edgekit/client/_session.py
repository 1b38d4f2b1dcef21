"""The speculative loop: one conversation's committed tokens and its rounds.

The device and the verifier agree on the committed sequence; neither model has
run its last token yet. A round: draft a block on top of it (the controller
says when to stop), send it with the base position, apply the verdict (accepted
prefix plus the verifier's next token), roll the draft KV back to what is still
valid. `SpeculativeSession` opens, extends and closes the verifier's side and
runs the rounds, with its parts each doing one job: the `Drafter` (the draft's
KV and what was drafted past the committed tokens), `RoundDriver` (a round's request
and its verdict), `through_outages` (retries, back-off, reopening) and a
`StatsAccumulator` (the stream's figures).

A round whose verdict does not arrive stays in flight and is sent again, as it
was; through an outage `stream` backs off, reopens the session from the committed
tokens where the verifier lost it, and reports the outage as a `Resumed` event
(`_resilience`); while the verifier is silent the device may draft ahead,
streamed as `Provisional` events (`_ahead`). The output is still the verifier's:
lossless, nothing committed lost or duplicated.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from ..config import ClientConfig, GenerationConfig
from ..drafting import Controller, ControllerFactory
from ..errors import ConfigError, EdgekitError, IncompatibleModelsError, ProtocolError
from ..link import CostTracker, LinkEstimator, LinkPolicy, probe
from ..protocol import ContextSpan, OpenRequest, ServerInfo, SpeedObjective
from ..runtime import DraftModel
from ..transport import VerifierTransport
from ._accumulator import StatsAccumulator
from ._drafter import Drafter, SharedDraft
from ._events import Event, Provisional, Resumed
from ._loop import run
from ._resilience import drain, through_outages
from ._round import RoundDriver, check_supported
from ._stats import GenerationStats, RoundStats
from ._text import TextDecoder

__all__ = ["SharedDraft", "SpeculativeSession"]


class SpeculativeSession:
    """One verifier session and its speculative rounds (see this module): `open` prefills a
    prompt on both sides, `stream` runs rounds as events until EOS or a limit, `extend` appends a
    turn, `reconfigure` changes what needs no new session, `close` ends it. Made by
    `EdgeClient.session` (and `generate`, which opens and closes one per call)."""

    def __init__(
        self,
        draft: DraftModel,
        transport: VerifierTransport,
        server: ServerInfo,
        config: GenerationConfig,
        *,
        controller: Controller | None = None,
        controller_factory: ControllerFactory | None = None,
        shared: SharedDraft | None = None,
        link: LinkEstimator | None = None,
        client: ClientConfig | None = None,
        on_close: Callable[[], None] | None = None,
        costs: CostTracker | None = None,
    ) -> None:
        """`controller` replaces the drafting policy the config names until a
        drafting setting is reconfigured; `controller_factory` builds it otherwise (one for
        the draft and target by name when not given). `shared`: the draft as the client's other
        sessions use it; `link`: the client's link estimate; `client`: how long to keep trying
        through an outage (by default the transport's config); `on_close`: called once, when
        the session closes (a draft slot given back); `costs`: the client's estimate of what a
        round costs (draft step, verify line, acceptance), carried across its sessions."""
        check_supported(config, server, transport.address)
        self.draft = draft
        self.transport = transport
        self.server = server
        # The client's link estimate (shared by its sessions): sent with each
        # round, updated from each exchange; the policy reads it every round.
        self.link = link or LinkEstimator()
        self.policy = LinkPolicy(config, self.link, hidden_dim=draft.n_embd, n_vocab=draft.n_vocab, costs=costs)
        self._factory = controller_factory or ControllerFactory(draft.name, server.target_model)
        self.seed = config.seed if config.seed is not None else secrets.randbits(63)
        # Independent streams for the two sides: the verifier's acceptance draw
        # must not be the number the draft sampled its token with, or min(1, p/q)
        # is biased. One seed still reproduces the whole run.
        draft_seq, verifier_seq = np.random.SeedSequence(self.seed).spawn(2)
        self._verifier_seed = int(verifier_seq.generate_state(1, np.uint64)[0] >> 1)
        self.drafter = Drafter(
            draft,
            shared or SharedDraft(draft),
            config,
            controller or self._factory.build(config, self.policy),
            np.random.default_rng(draft_seq),
            on_void=lambda: self.rounds.forget(),
        )
        self.rounds = RoundDriver(transport, self.drafter, self.link, self.policy)
        self.session_id: str | None = None
        self.max_context = min(server.max_context, draft.n_ctx)
        self.target_speed: float | None = None  # tokens/s the verifier holds the session to (None: best effort)
        self.retry = client or getattr(transport, "config", None) or ClientConfig()
        self.progress: StatsAccumulator | None = None  # the figures of the stream under way (or the last one)
        self._built: tuple[ContextSpan, ...] = ()  # how the verifier built the tokens up to the last turn
        self._on_close = on_close

    # Settings the verifier knows about: changing one needs a new session.
    _SERVER_SIDE = ("mode", "seed", "slo_class", "target_speed", "semantic_threshold", "logprobs")
    _DRAFTING = ("drafting", "draft_k", "max_window", "predictor", "predictor_threshold", "predictor_schedule",
                 "p_min")

    @property
    def config(self) -> GenerationConfig:
        return self.drafter.config

    @property
    def controller(self) -> Controller:
        return self.drafter.controller

    @property
    def tokens(self) -> list[int]:
        """The committed tokens: the prompt, the turns and every verdict's."""
        return self.drafter.committed

    @property
    def max_context(self) -> int:
        return self.drafter.max_context

    @max_context.setter
    def max_context(self, value: int) -> None:
        self.drafter.max_context = value

    @property
    def semantic_threshold(self) -> float:
        """The threshold semantic rounds are decided at: the config's, else the verifier's head's."""
        if self.config.mode != "semantic":
            return 0.0
        t = self.config.semantic_threshold
        return self.server.semantic_threshold if t is None else t

    def reconfigure(self, **changes: Any) -> bool:
        """Applies client-side changes (window, limits, uploads) at once; returns False,
        and changes nothing, if a setting the verifier holds would change."""
        if any(k in self._SERVER_SIDE and changes[k] != getattr(self.config, k) for k in changes):
            return False
        config = replace(self.config, **changes)
        if config.sampler() != self.config.sampler():  # the verifier samples the target with it
            return False
        check_supported(config, self.server, self.transport.address)
        if any(k in self._DRAFTING or k == "upload" for k in changes):
            with self.drafter.shared.lock:
                self.drafter.void()  # drafted under the old settings (without the rows an upload needs)
        self.drafter.config = config
        self.policy.configure(config)
        if any(k in self._DRAFTING for k in changes):
            self.drafter.controller = self._factory.build(config, self.policy)
        return True

    # -- session lifecycle -----------------------------------------------------------

    def open(self, prompt_tokens: Sequence[int], history: Sequence[ContextSpan] = ()) -> float:
        """Opens the verifier session and prefills both models; returns milliseconds taken.
        `history`: how a verifier built these tokens before (a target-only stream's prompt and
        the tokens it generated, going on speculatively), span by span; (): they are one prompt."""
        if not prompt_tokens:
            raise ConfigError("the prompt is empty")
        if len(prompt_tokens) + 2 > self.max_context:
            raise ConfigError(f"the prompt has {len(prompt_tokens)} tokens; the context holds {self.max_context}")
        if history and sum(span.length for span in history) != len(prompt_tokens):
            raise ConfigError(f"the history spans {sum(s.length for s in history)} tokens, not the prompt's "
                              f"{len(prompt_tokens)}")
        t0 = time.perf_counter()
        if self.policy.needs_rates():  # measured once (a second or less)
            probe(self.transport, self.link, pings=5, tries=2, payload_bytes=64 * 1024)
        built = tuple(history) or (ContextSpan(len(prompt_tokens)),)
        self._open_remote(prompt_tokens, built)
        self.drafter.reset(prompt_tokens)
        self._built = built
        return (time.perf_counter() - t0) * 1e3

    def history(self) -> tuple[ContextSpan, ...]:
        """How the verifier built the committed tokens, span by span: the prompt and each turn
        prefilled, the tokens the rounds committed between them generated. A reopened session
        sends it, so that the verifier rebuilds its KV as it was (`OpenRequest.history`)."""
        tail = len(self.tokens) - sum(span.length for span in self._built)
        return (*self._built, ContextSpan(tail, generated=True)) if tail else self._built

    def _open_remote(self, tokens: Sequence[int], history: Sequence[ContextSpan]) -> None:
        """Opens the verifier's side of the session on `tokens`, built as `history` says."""
        opened = self.transport.open_session(
            OpenRequest(
                tuple(tokens),  # not the live list the rounds go on extending
                mode=self.config.mode,
                sampler=self.config.sampler(),
                seed=self._verifier_seed,
                draft=self.draft.fingerprint(),
                draft_hidden_size=self.draft.n_embd,
                slo=SpeedObjective(self.config.slo_class, self.config.target_speed),
                client_id=self.retry.client_id,
                semantic_threshold=self.semantic_threshold,
                logprobs=-1 if self.config.logprobs is None else self.config.logprobs,
                history=history,
            )
        )
        self.session_id = opened.session_id
        self.rounds.budget = opened.next_budget
        self.target_speed = opened.target_speed or None
        self.max_context = min(self.max_context, opened.max_context)

    def reopen(self) -> int:
        """Opens the session again on the committed tokens (the verifier restarted, or
        evicted it); returns how many tokens the verifier prefilled. The verifier must
        serve the target the session began with: another is refused, never used."""
        d = self.draft
        info = self.transport.handshake(d.fingerprint(), draft_model=d.name, draft_hidden_size=d.n_embd)
        if info.target_model != self.server.target_model or info.target_fingerprint != self.server.target_fingerprint:
            raise IncompatibleModelsError(
                f"the verifier at {self.transport.address} now serves {info.target_model!r}, not "
                f"{self.server.target_model!r} as when this session began; its tokens would differ, so it is not used"
            )
        old, self.session_id = self.session_id, None
        if old is not None:
            try:
                self.transport.close_session(old)  # a stale session the verifier still holds
            except EdgekitError:
                pass
        self._open_remote(self.tokens, self.history())
        return len(self.tokens)

    def extend(self, tokens: Sequence[int]) -> float:
        """Appends tokens to the conversation without verifying them (a new user turn)."""
        if self.session_id is None:
            raise EdgekitError("the session is not open")
        t0 = time.perf_counter()

        def attempt() -> Generator[Provisional, None, int]:
            return self.transport.extend_session(self.session_id or "", len(self.tokens), tokens)
            yield  # a generator that drafts nothing ahead: a new turn has nothing to draft

        committed, _ = drain(self._through_outages(attempt))
        built = self.history()
        self.tokens.extend(tokens)
        self._built = (*built, ContextSpan(len(tokens)))
        if committed != len(self.tokens):
            raise ProtocolError(f"verifier reports {committed} committed tokens, the client has {len(self.tokens)}")
        return (time.perf_counter() - t0) * 1e3

    def close(self) -> None:
        if self.session_id is not None:
            sid, self.session_id = self.session_id, None
            try:
                self.transport.close_session(sid)
            except EdgekitError:
                pass  # the verifier may have evicted it or be gone; nothing is lost
        on_close, self._on_close = self._on_close, None
        if on_close is not None:
            on_close()

    # -- rounds ------------------------------------------------------------------------

    def round(self, limit: int) -> tuple[list[int], RoundStats, bool]:
        """Runs one round drafting at most `limit` tokens; returns the newly committed
        tokens, the round's figures and whether the context is full. A failure leaves the
        round in flight: the next call sends it again."""
        if self.session_id is None:
            raise EdgekitError("the session is not open")
        return drain(self.rounds.run(limit, self.session_id))

    def _round_through_outages(
        self, limit: int, *, ahead: int, room: int = 0
    ) -> Generator[Provisional, None, tuple[list[int], RoundStats, bool, Resumed | None]]:
        """A round, tried again through an outage; while the verifier is silent (it has not
        answered for `draft_ahead_after` seconds, or failed) and `on_disconnect` is "draft",
        the device drafts up to `ahead` tokens past the output, yielding each `Provisional`.
        With `proactive` drafting, while the block is verified the next one is drafted (within
        `room` tokens past the output)."""
        if self.session_id is None:
            raise EdgekitError("the session is not open")
        ahead = ahead if self.retry.on_disconnect == "draft" else 0

        def attempt() -> Generator[Provisional, None, tuple[list[int], RoundStats, bool]]:
            return self.rounds.run(
                limit, self.session_id or "", ahead=ahead, room=room, proactive=self.config.proactive,
                ahead_after=self.retry.draft_ahead_after,
            )

        (new, stats, full), resumed = yield from self._through_outages(attempt, limit=limit, ahead=ahead)
        return new, stats, full, resumed

    def _through_outages(
        self, attempt: Callable[[], Generator[Provisional, None, Any]], *, limit: int = 1, ahead: int = 0
    ) -> Generator[Provisional, None, tuple[Any, Resumed | None]]:
        """`attempt()` through an outage, reopening the session where the verifier lost it;
        between tries the device drafts up to `ahead` tokens past the output."""
        return (
            yield from through_outages(
                attempt, self.retry, reopen=self.reopen, between=lambda s: self.drafter.ahead_for(s, limit, ahead)
            )
        )

    def stream(self, max_tokens: int | None = None, *, prefill_ms: float = 0.0) -> Iterator[Event]:
        """Rounds until EOS, `max_tokens` or a full context, as events; their figures are
        counted in `progress` (for a consumer that stops early, the figures so far)."""
        self.progress = StatsAccumulator(
            GenerationStats(
                mode=self.config.mode,
                draft_k=self.config.draft_k,
                drafting=self.controller.name,
                sampler=self.config.sampler().describe(),
                prompt_tokens=len(self.tokens),
                prefill_ms=prefill_ms,
                target_speed=self.target_speed,
            ),
            TextDecoder(self.draft),
            self.config.stop,
            self.config.stop_tokens,
        )
        return run(
            self.drafter, self.rounds, self.server, self.retry, progress=self.progress,
            max_tokens=max_tokens or self.config.max_tokens,
            play_round=lambda limit, ahead, room: self._round_through_outages(limit, ahead=ahead, room=room),
            semantic=lambda: (self.semantic_threshold, self.server.semantic_head),
        )
