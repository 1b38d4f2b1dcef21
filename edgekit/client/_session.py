"""The speculative loop: one conversation's committed tokens and its rounds.

The device and the verifier agree on the committed sequence; neither model has
run its last token yet. A round: draft a block on top of it (the controller
says when to stop), send it with the base position, apply the verdict (accepted
prefix plus the verifier's next token), roll the draft KV back to what is still
valid. All of a round's state lives in `SpeculativeSession`.

What the draft produced past the committed tokens is a `DraftChain`: the block
a round sends is its front. A round whose verdict does not arrive stays in
flight: the next try re-sends the same request (same base position and block),
which a verifier that applied it before the failure recognises and answers
again; nothing is applied twice. `stream` tries again through an outage
(`edgekit.client._retry`): it backs off, reopens the session from the committed
tokens when the verifier no longer knows it (the verifier prefills them again,
and must still serve the same target), and reports the outage as a `Resumed`
event. Nothing committed is lost or duplicated.

While the verifier is silent (`ClientConfig.on_disconnect="draft"`: a round
with no verdict for `draft_ahead_after` seconds, or between tries), the device
drafts further blocks onto the chain and streams them as `Provisional` events.
When a verifier answers, the rounds send them block by block: each verdict that
accepts a whole block and whose next token is the one drafted after it leaves
the rest of the chain standing; any other voids it. The output is still the
verifier's: lossless.
"""

from __future__ import annotations

import secrets
import threading
import time
import weakref
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import numpy as np

from ..config import ClientConfig, GenerationConfig
from ..drafting import Controller, ControllerFactory, Decision
from ..errors import (
    ConfigError,
    EdgekitError,
    IncompatibleModelsError,
    ProtocolError,
    SessionNotFoundError,
    StaleRoundError,
)
from ..link import LinkEstimator, LinkPolicy, probe
from ..protocol import BlockRequest, Exchange, ServerInfo, SpeedObjective, VerifyResult, draft_distribution
from ..runtime import DraftModel, DraftOutput, device_load, process_cpu_seconds
from ..transport import VerifierTransport
from ._ahead import DraftChain, DraftedBlock
from ._events import Event, FinalStats, Provisional, Resumed, RoundEvent, TextDelta
from ._metrics import GenerationStats, RoundStats
from ._retry import Backoff
from ._text import TextDecoder

__all__ = ["SharedDraft", "SpeculativeSession"]

T = TypeVar("T")


class SharedDraft:
    """One draft model (one KV sequence) shared by several sessions of a client:
    the lock that orders their rounds, and which session's tokens its cache
    holds. A session whose tokens are not the ones in the cache re-prefills
    them first (`claim`)."""

    def __init__(self, model: DraftModel) -> None:
        self.model = model
        self.lock = threading.Lock()
        self._owner: weakref.ref[object] | None = None  # weak: a finished session need not stay alive

    def owned_by(self, owner: object) -> bool:
        return self._owner is not None and self._owner() is owner

    def claim(self, owner: object, tokens: Sequence[int]) -> None:
        """Makes the cache hold `tokens` but the last for `owner`; call under `lock`."""
        if self._owner is None or self._owner() is not owner:
            self.model.truncate(0)
            self.model.prefill(tokens[:-1])
            self._owner = weakref.ref(owner)


@dataclass(frozen=True)
class _InFlight:
    """A round sent and not yet answered: what to re-send, and what drafting it took."""

    request: BlockRequest
    draft_ms: float
    steps: int


class SpeculativeSession:
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
    ) -> None:
        """`controller` replaces the drafting policy the config names until a
        drafting setting is reconfigured; `controller_factory` builds it otherwise (one for
        the draft and target by name when not given). `shared`: the draft as the client's other
        sessions use it; `link`: the client's link estimate; `client`: how long to keep trying
        through an outage (by default the transport's config); `on_close`: called once, when
        the session closes (a draft slot given back)."""
        if config.mode not in server.modes or (config.mode == "semantic" and not server.semantic_head):
            hint = (
                "; it needs a semantic decision head, which an edgekit verifier has when started with "
                "--semantic-head" if config.mode == "semantic" else ""
            )
            raise ConfigError(
                f"the verifier at {transport.address} does not support {config.mode!r} acceptance "
                f"(it offers: {', '.join(m for m in server.modes if m != 'semantic')}){hint}"
            )
        if config.mode == "sample" and config.draft_top_k > server.max_draft_top_k:
            raise ConfigError(f"draft_top_k {config.draft_top_k} exceeds the verifier's {server.max_draft_top_k}")
        _check_upload(config, server, transport.address)
        self.draft = draft
        self._shared = shared or SharedDraft(draft)
        self.transport = transport
        self.server = server
        self.config = config
        # The client's link estimate (shared by its sessions): sent with each
        # round, updated from each exchange; the policy reads it every round.
        self.link = link or LinkEstimator()
        self.policy = LinkPolicy(config, self.link, hidden_dim=draft.n_embd, n_vocab=draft.n_vocab)
        self._factory = controller_factory or ControllerFactory(draft.name, server.target_model)
        self.controller = controller or self._factory.build(config, self.policy)
        self.seed = config.seed if config.seed is not None else secrets.randbits(63)
        # Independent streams for the two sides: the verifier's acceptance draw
        # must not be the number the draft sampled its token with, or min(1, p/q)
        # is biased. One seed still reproduces the whole run.
        draft_seq, verifier_seq = np.random.SeedSequence(self.seed).spawn(2)
        self._rng = np.random.default_rng(draft_seq)
        self._verifier_seed = int(verifier_seq.generate_state(1, np.uint64)[0] >> 1)
        self.tokens: list[int] = []
        self.session_id: str | None = None
        self.max_context = min(server.max_context, draft.n_ctx)
        self._round_index = 0
        self._budget = 0  # the draft budget the verifier assigned last (0: none)
        self.target_speed: float | None = None  # tokens/s the verifier holds the session to (None: best effort)
        # The link time the next round is expected to take (for the verifier's SLO budget, WISP eq. 6):
        # the last round's, and before any round the measured RTT.
        self._network_ms = self.link.state().rtt_ms
        self.retry = client or getattr(transport, "config", None) or ClientConfig()
        self._inflight: _InFlight | None = None  # the chain's front block, sent and not yet answered
        self._chain = DraftChain()  # tokens drafted past the committed ones
        self.provisional_shown = 0  # tokens shown as provisional in this stream
        self.provisional_kept = 0  # of those, tokens now in the output
        self._on_close = on_close
        # Semantic mode: the threshold and head identity of the last verdict (None before one).
        self.semantic_decider: tuple[float, str] | None = None

    # Settings the verifier knows about: changing one needs a new session.
    _SERVER_SIDE = ("mode", "temperature", "seed", "slo_class", "target_speed", "semantic_threshold")
    _DRAFTING = ("drafting", "draft_k", "max_window", "predictor", "predictor_threshold", "p_min")

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
        _check_upload(config, self.server, self.transport.address)
        if any(k in self._DRAFTING or k == "upload" for k in changes):
            with self._shared.lock:
                self._void_chain()  # drafted under the old settings (without the rows an upload needs)
        self.config = config
        self.policy.configure(config)
        if any(k in self._DRAFTING for k in changes):
            self.controller = self._factory.build(config, self.policy)
        return True

    # -- session lifecycle -----------------------------------------------------------

    def open(self, prompt_tokens: Sequence[int]) -> float:
        """Opens the verifier session and prefills both models; returns milliseconds taken."""
        if not prompt_tokens:
            raise ConfigError("the prompt is empty")
        if len(prompt_tokens) + 2 > self.max_context:
            raise ConfigError(f"the prompt has {len(prompt_tokens)} tokens; the context holds {self.max_context}")
        t0 = time.perf_counter()
        if self._needs_rates():
            # The latency model weighs payloads by the link's rates; measure them once (a second or less).
            probe(self.transport, self.link, pings=5, tries=2, payload_bytes=64 * 1024)
        self._open_remote(prompt_tokens)
        self.tokens = list(prompt_tokens)
        self._inflight = None
        with self._shared.lock:
            self._chain.clear(len(self.tokens))
            self._shared.claim(self, self.tokens)
        return (time.perf_counter() - t0) * 1e3

    def _open_remote(self, tokens: Sequence[int]) -> None:
        """Opens the verifier's side of the session on `tokens` (it prefills them)."""
        opened = self.transport.open_session(
            tokens,
            mode=self.config.mode,
            temperature=self.config.temperature,
            seed=self._verifier_seed,
            slo=SpeedObjective(self.config.slo_class, self.config.target_speed),
            draft=self.draft.fingerprint(),
            draft_hidden_size=self.draft.n_embd,
            client_id=self.retry.client_id,
            semantic_threshold=self.semantic_threshold,
        )
        self.session_id = opened.session_id
        self._budget = opened.next_budget
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
        self._open_remote(self.tokens)
        return len(self.tokens)

    def _needs_rates(self) -> bool:
        # The latency model weighs payloads by the rates; the semantic head's CSI is made of them.
        uses_model = self.config.upload == "auto" or self.config.drafting == "latency" or self.config.mode == "semantic"
        # Once per client: a server without an echo endpoint (or a link too fast to time)
        # leaves the rates at 0, and probing again at each session would not change that.
        return uses_model and not self.link.probed and not (self.link.uplink_mbps and self.link.downlink_mbps)

    def extend(self, tokens: Sequence[int]) -> float:
        """Appends tokens to the conversation without verifying them (a new user turn)."""
        if self.session_id is None:
            raise EdgekitError("the session is not open")
        t0 = time.perf_counter()
        def attempt() -> Generator[Provisional, None, int]:
            return self.transport.extend_session(self.session_id or "", len(self.tokens), tokens)
            yield  # a generator that drafts nothing ahead: a new turn has nothing to draft

        committed, _ = _drain(self._through_outages(attempt))
        self.tokens.extend(tokens)
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

    def _sequence(self) -> list[int]:
        """The committed tokens and those drafted past them: what the draft's KV follows."""
        return self.tokens + self._chain.tokens

    def _hold_draft(self) -> None:
        """Makes the draft model's KV this session's (call under the shared lock); a chain
        drafted for another point of the conversation (before a new turn) is void."""
        if self._chain.base != len(self.tokens):
            self._void_chain()
        self._shared.claim(self, self._sequence())

    def _void_chain(self) -> None:
        """Drops what was drafted past the committed tokens, and the round in flight with it."""
        chain = self._chain
        if len(chain) and self._shared.owned_by(self):
            self.draft.truncate(min(self.draft.n_past, chain.base))
        chain.clear(len(self.tokens))
        self._inflight = None

    def _pick(self, out: DraftOutput, block: DraftedBlock) -> int:
        """The draft's token from a step (argmax, or a sample whose distribution goes with it)."""
        if self.config.mode != "sample":  # greedy, and semantic (greedy drafting, WISV)
            tok = out.stats.argmax()
        else:
            temperature = self.config.draft_temperature or self.config.temperature
            dist = draft_distribution(out.logits, temperature, self.config.draft_top_k)
            tok = dist.sample(self._rng)
            block.dists.append(dist)
        block.tokens.append(tok)
        if out.hidden is not None:
            block.rows.append(np.array(out.hidden, dtype=np.float32))  # the draft's buffer is reused next step
        return tok

    def _draft_block(self, k: int, *, guess: bool = False, until: Callable[[], bool] | None = None) -> DraftedBlock:
        """A block of at most `k` tokens on top of the sequence, the controller deciding where
        it ends. `guess`: first the token the verifier adds after a whole block (the draft's
        own; no decision), as a block drafted ahead starts with. `until`: stop early once it
        says so (the block so far is kept)."""
        t0 = time.perf_counter()
        seq = self._sequence()
        if self.draft.n_past >= len(seq):
            self.draft.truncate(len(seq) - 1)  # a stop step ran the last token: run it again for its logits
        feed = seq[self.draft.n_past :]
        block = DraftedBlock([])
        hidden = self.config.upload != "tokens"
        steps = 0
        if guess:
            tok = self._pick(self.draft.eval(feed, hidden=hidden), block)
            steps += 1
            feed = [tok]
            if self.config.stop_at_eos and self.draft.is_eog(tok):
                k = 0
        for index in range(1, k + 1):
            if until is not None and until():
                break
            out = self.draft.eval(feed, hidden=hidden)
            steps += 1
            decision = self.controller.draft_next(index, out)
            if not decision:
                break
            tok = self._pick(out, block)
            if self.draft.is_eog(tok) or decision == Decision.LAST:
                break
            feed = [tok]
        block.draft_ms = (time.perf_counter() - t0) * 1e3
        block.steps = steps
        return block

    def _request(self, limit: int) -> _InFlight:
        """This round's request: the one a failure left unanswered (the same block again, on
        the session as it is now), or the chain's next block (drafted now if there is none)."""
        if self._inflight is not None:
            request = replace(self._inflight.request, session_id=self.session_id or "", link=self.link.state())
            self._inflight = replace(self._inflight, request=request)
            return self._inflight
        if not len(self._chain):
            self._chain.add(self._draft_block(self.controller.window(limit)))
        blk = self._chain.front(limit)
        upload = self.policy.upload_for(len(blk.tokens))
        request = BlockRequest(
            session_id=self.session_id or "",
            base_position=len(self.tokens),
            draft_tokens=blk.tokens,
            draft_distributions=blk.dists,
            link=self.link.state(),
            round_index=self._round_index,
            continue_after_eog=not self.config.stop_at_eos,
            upload=upload,
            hidden=np.stack(blk.rows) if upload != "tokens" else None,
            hidden_encoding=self.policy.encoding,
            draft_ms=blk.draft_ms,
            network_ms=self._network_ms,
        )
        self._inflight = _InFlight(request, blk.draft_ms, blk.steps)
        return self._inflight

    def _verify(self, request: BlockRequest) -> tuple[VerifyResult, float, float]:
        """The verify call, and when it began and ended (perf_counter seconds)."""
        t1 = time.perf_counter()
        verdict = self.transport.verify(request)
        return verdict, t1, time.perf_counter()

    def round(self, limit: int) -> tuple[list[int], RoundStats, bool]:
        """Runs one round drafting at most `limit` tokens; returns the newly committed
        tokens, the round's figures and whether the context is full. A failure leaves the
        round in flight: the next call sends it again."""
        if self.session_id is None:
            raise EdgekitError("the session is not open")
        with self._shared.lock:
            self._hold_draft()
            sent = self._request(limit)
            return self._apply(sent, *self._verify(sent.request))

    def _apply(
        self, sent: _InFlight, verdict: VerifyResult, t1: float, t2: float, proactive: tuple[int, ...] = ()
    ) -> tuple[list[int], RoundStats, bool]:
        """Commits a verdict: the accepted prefix and the verifier's token; the chain and the
        draft's KV keep what still follows them. `proactive`: what was drafted past the block
        while it was verified (the guess of the verifier's token first)."""
        request = sent.request
        base, block, upload = request.base_position, list(request.draft_tokens), request.upload
        exchanges = verdict.exchanges or (Exchange((t2 - t1) * 1e3, verdict.verify_ms + verdict.queue_ms, 0, 0),)
        for ex in exchanges:
            if ex.server_ms is not None:  # without the server's time, a round trip says nothing about the link
                self.link.add_exchange(ex.round_trip_ms, ex.server_ms, ex.uplink_bytes, ex.downlink_bytes)
        # The next round's expected time on the link (its SLO budget leaves it out): this one's.
        self._network_ms = sum(max(0.0, e.round_trip_ms - (e.server_ms or 0.0)) for e in exchanges)
        a = verdict.accepted
        if verdict.semantic_head:  # what decided this session's last semantic round
            self.semantic_decider = (verdict.semantic_threshold, verdict.semantic_head)
        new = block[:a] + ([verdict.next_token] if verdict.next_token is not None else [])
        if not 0 <= a <= len(block) or not new or verdict.committed_length != base + len(new):
            raise ProtocolError(
                f"verifier at {self.transport.address} sent an inconsistent verdict: accepted {a} of {len(block)}, "
                f"committed {verdict.committed_length} on base {base}"
            )
        self._inflight = None
        chain = self._chain  # whether what follows the block survives the verdict (the chain's rule)
        keeps = a == len(block) and len(chain) > len(block) and chain.tokens[len(block)] == verdict.next_token
        shown = self._chain.shown
        self.provisional_kept += min(shown, self._chain.advance(len(block), a, verdict.next_token))
        self.tokens.extend(new)
        self._budget = verdict.next_budget
        # What the draft evaluated stays valid up to the last token of the sequence, which it has not run.
        self.draft.truncate(min(self.draft.n_past, len(self._sequence()) - 1))
        self.controller.observe(len(block), a)
        self.policy.costs.observe(
            drafted=len(block),
            accepted=a,
            draft_ms=sent.draft_ms,
            draft_steps=sent.steps,
            verify_ms=verdict.verify_ms + verdict.queue_ms,
            mismatches=len(verdict.hidden_requested) if upload == "sh" else None,
        )
        stats = RoundStats(
            index=self._round_index,
            base_position=base,
            drafted=len(block),
            accepted=a,
            bonus=verdict.bonus,
            committed=len(new),
            wasted=len(block) - a,
            draft_ms=sent.draft_ms,
            draft_steps=sent.steps,
            round_trip_ms=(t2 - t1) * 1e3,
            server_verify_ms=verdict.verify_ms,
            server_queue_ms=verdict.queue_ms,
            upload=upload,
            exchanges=len(exchanges),
            uplink_bytes=sum(e.uplink_bytes for e in exchanges),
            downlink_bytes=sum(e.downlink_bytes for e in exchanges),
            hidden_rows=verdict.hidden_rows,
            server_budget_ms=verdict.budget_ms,
            deadline_met=verdict.deadline_met,
            proactive_drafted=len(proactive),
            proactive_used=len(proactive) if keeps else 0,
            semantic_accepted=verdict.semantic_accepted,
        )
        self._round_index += 1
        return new, stats, verdict.context_full

    # -- through an outage ---------------------------------------------------------------

    def resilient_round(self, limit: int) -> tuple[list[int], RoundStats, bool, Resumed | None]:
        """`round`, tried again through an outage (see the module's docstring): the round's
        tokens, figures and whether the context is full, and the outage it came through, if any."""
        return _drain(self._round_through_outages(limit, ahead=0))

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

        def attempt() -> Generator[Provisional, None, tuple[list[int], RoundStats, bool]]:
            if not self._drafts_ahead(ahead):  # the draft is this session's for the whole round
                with self._shared.lock:
                    self._hold_draft()
                    sent = self._request(limit)
                    if not self.config.proactive:
                        return self._apply(sent, *self._verify(sent.request))
                    call = _Background(lambda: self._verify(sent.request))
                    drafted = self._draft_proactively(limit, room, until=lambda: call.wait(0))
                    verdict, t1, t2 = call.result()
                    return self._apply(sent, verdict, t1, t2, proactive=drafted)
            # Drafting ahead yields events mid-round: the lock is taken around each use of the
            # draft, never held while the consumer has an event.
            with self._shared.lock:
                self._hold_draft()
                sent = self._request(limit)
            at_once: list[int] = []  # with proactive drafting: the block drafted at once
            verdict, t1, t2 = yield from self._verify_drafting_ahead(sent.request, limit, ahead, room, at_once)
            with self._shared.lock:
                self._hold_draft()
                return self._apply(sent, verdict, t1, t2, proactive=tuple(at_once))

        (new, stats, full), resumed = yield from self._through_outages(attempt, limit=limit, ahead=ahead)
        return new, stats, full, resumed

    def _through_outages(
        self, attempt: Callable[[], Generator[Provisional, None, T]], *, limit: int = 1, ahead: int = 0
    ) -> Generator[Provisional, None, tuple[T, Resumed | None]]:
        """`attempt()`, tried again with back-off while the verifier is lost, the session reopened
        first where the verifier no longer knows it; its result, and the outage if there was one.
        Between tries the device drafts ahead (see `_round_through_outages`)."""
        backoff: Backoff | None = None
        reopen = False
        reprefilled = 0
        reasons: list[str] = []
        while True:
            try:
                if reopen:
                    reprefilled += self.reopen()
                    reopen = False
                result = yield from attempt()
            except EdgekitError as exc:
                if self.retry.on_disconnect == "fail":
                    raise
                backoff = backoff or Backoff(self.retry)
                delay = backoff.next_delay(exc)  # raises once it is not worth trying again
                reasons.append(type(exc).__name__)
                # The verifier lost the session (restarted, evicted) or disagrees about it: open it again.
                reopen = reopen or isinstance(exc, (SessionNotFoundError, StaleRoundError))
                yield from self._wait_drafting_ahead(delay, limit, ahead)
                continue
            if backoff is None:
                return result, None
            resumed = Resumed(
                outage_ms=backoff.elapsed() * 1e3, attempts=backoff.attempts, reprefilled_tokens=reprefilled,
                causes=tuple(dict.fromkeys(reasons)),
            )
            return result, resumed

    def _drafts_ahead(self, ahead: int) -> bool:
        return self.retry.on_disconnect == "draft" and ahead > 0

    def _verify_drafting_ahead(
        self, request: BlockRequest, limit: int, ahead: int, room: int = 0, proactive: list[int] | None = None
    ) -> Generator[Provisional, None, tuple[VerifyResult, float, float]]:
        """The verify call; when drafting ahead, on a thread of its own, the device drafting
        past the block once the call has been silent for `draft_ahead_after` seconds (and,
        with proactive drafting, one block at once, into `proactive`)."""
        if not self._drafts_ahead(ahead):
            return self._verify(request)
        call = _Background(lambda: self._verify(request))
        if self.config.proactive and proactive is not None:
            with self._shared.lock:
                self._hold_draft()
                proactive.extend(self._draft_proactively(limit, room, until=lambda: call.wait(0)))
        if not call.wait(self.retry.draft_ahead_after):
            while not call.wait(0):
                with self._shared.lock:
                    self._hold_draft()
                    event = self._draft_ahead(limit, ahead)
                if event is None:
                    call.wait()
                    break
                yield event
        return call.result()

    def _wait_drafting_ahead(self, delay: float, limit: int, ahead: int) -> Iterator[Provisional]:
        """Waits `delay` seconds before trying again, drafting ahead meanwhile where it may."""
        until = time.monotonic() + delay
        while self._drafts_ahead(ahead) and time.monotonic() < until:
            with self._shared.lock:
                self._hold_draft()
                event = self._draft_ahead(limit, ahead)
            if event is None:
                break
            yield event
        time.sleep(max(0.0, until - time.monotonic()))

    def _draft_ahead(self, limit: int, ahead: int) -> Provisional | None:
        """Drafts one more block past the chain (under the shared lock), or None when the chain
        is as long as it may be: `ahead` tokens, the context, or an end of text."""
        return self._provisional() if self._extend_chain(limit, ahead) else None

    def _draft_proactively(self, limit: int, room: int, until: Callable[[], bool] | None = None) -> tuple[int, ...]:
        """One block past the chain (under the shared lock) while the front one is verified, cut
        short once `until()` says the verdict is in (the round's time is not the draft's to
        stretch): the tokens added (the guess of the verifier's token first)."""
        before = len(self._chain)
        self._extend_chain(limit, min(room, before + 1 + limit), until=until)
        return tuple(self._chain.tokens[before:])

    def _extend_chain(self, limit: int, ahead: int, until: Callable[[], bool] | None = None) -> bool:
        """Drafts one more block past the chain (under the shared lock), unless the chain is as
        long as it may be (`ahead` tokens, the context, an end of text); whether it did."""
        chain = self._chain
        free = min(ahead, self.max_context - 2 - len(self.tokens)) - len(chain)
        ended = len(chain) and self.config.stop_at_eos and self.draft.is_eog(chain.tokens[-1])
        if free < 2 or ended:
            return False
        guess = bool(chain.ends)  # after a block (even an empty one) comes the verifier's position
        window = self.controller.window(min(limit, free - int(guess)))
        if window < 1 or (until is not None and until()):
            return False  # no drafting (plain decoding), or the verdict is already in
        block = self._draft_block(window, guess=guess, until=until)
        if not block.tokens:
            return False  # the controller stops at once, and would again on the same logits
        chain.add(block)
        return True

    def _provisional(self) -> Provisional:
        """The chain as a `Provisional` event (all of it is shown from now on)."""
        chain = self._chain
        self.provisional_shown += max(0, len(chain) - chain.shown)
        chain.shown = len(chain)
        decoder = TextDecoder(self.draft)
        return Provisional(decoder.feed(chain.tokens) + decoder.flush(), tuple(chain.tokens))

    def stream(self, max_tokens: int | None = None, *, prefill_ms: float = 0.0) -> Iterator[Event]:
        """Rounds until EOS, `max_tokens` or a full context, as events."""
        max_tokens = max_tokens or self.config.max_tokens
        stats = GenerationStats(
            mode=self.config.mode,
            draft_k=self.config.draft_k,
            drafting=self.controller.name,
            prompt_tokens=len(self.tokens),
            prefill_ms=prefill_ms,
            target_speed=self.target_speed,
        )
        decoder = TextDecoder(self.draft)
        out: list[int] = []
        text_parts: list[str] = []
        start, cpu_start = time.perf_counter(), process_cpu_seconds()
        finish: str | None = None
        self.provisional_shown = self.provisional_kept = 0
        plain_before = getattr(self.controller, "plain_rounds", 0)
        self._chain.shown = 0  # what an earlier stream showed is not this one's to count
        showing = False  # whether the consumer was last shown provisional tokens
        while finish is None:
            remaining = max_tokens - len(out)
            room = self.max_context - len(self.tokens) - 1  # base + K + 1 must fit
            if room < 1:
                finish = "context"
                break
            # A round commits up to K+1 tokens: keep K+1 within what is left to produce.
            limit = max(1, min(self.server.max_block, room, remaining - 1))
            if self._budget:
                limit = min(limit, self._budget)  # the verifier's assigned budget bounds every policy
            shown = self.provisional_shown
            ahead = min(self.retry.max_provisional, remaining)
            new, rstats, context_full, resumed = yield from self._round_through_outages(
                limit, ahead=ahead, room=remaining
            )
            showing = showing or self.provisional_shown > shown
            if resumed is not None:
                stats.add_outage(resumed)
                yield resumed
            stats.add_round(rstats)
            emitted: list[int] = []
            for tok in new:
                if len(out) >= max_tokens:
                    finish = "length"
                    break
                out.append(tok)
                emitted.append(tok)
                if self.config.stop_at_eos and self.draft.is_eog(tok):
                    finish = "eos"
                    break
            if finish is None and len(out) >= max_tokens:
                finish = "length"
            if finish is None and context_full:
                finish = "context"
            if stats.time_to_first_token_ms is None and emitted:
                stats.time_to_first_token_ms = prefill_ms + (time.perf_counter() - start) * 1e3
            text = decoder.feed(emitted)
            if text or emitted:
                text_parts.append(text)
                yield TextDelta(text, tuple(emitted))
            if showing:  # what is still ahead of the output, or nothing
                ahead_now = self._provisional() if finish is None else Provisional("", ())
                showing = bool(ahead_now.token_ids)
                yield ahead_now
            yield RoundEvent(rstats)
        tail = decoder.flush()
        if tail:
            text_parts.append(tail)
            yield TextDelta(tail, ())
        stats.completion_tokens = len(out)
        stats.provisional_tokens, stats.provisional_kept = self.provisional_shown, self.provisional_kept
        stats.plain_rounds = getattr(self.controller, "plain_rounds", 0) - plain_before
        stats.elapsed_s = time.perf_counter() - start + prefill_ms / 1e3
        stats.finish_reason = finish
        if self.config.mode == "semantic":
            stats.semantic_threshold, stats.semantic_head = self.semantic_decider or (
                self.semantic_threshold, self.server.semantic_head
            )
        stats.device = device_load(cpu_start, time.perf_counter() - start).as_dict()
        yield FinalStats(stats, tuple(out), "".join(text_parts))


def _drain(steps: Generator[Any, None, T]) -> T:
    """Runs a generator to its end, dropping what it yields; its return value."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


class _Background:
    """A call on a thread of its own, so that the caller can work while it runs."""

    def __init__(self, call: Callable[[], T]) -> None:
        self._done = threading.Event()
        self._value: Any = None
        self._error: BaseException | None = None

        def run() -> None:
            try:
                self._value = call()
            except BaseException as exc:  # handed to the caller
                self._error = exc
            finally:
                self._done.set()

        threading.Thread(target=run, name="edgekit-verify", daemon=True).start()

    def wait(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout)

    def result(self) -> Any:
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._value


def _check_upload(config: GenerationConfig, server: ServerInfo, address: str) -> None:
    """Refuses an upload the verifier cannot take: never a silent downgrade."""
    needs = {"tokens": (), "fh": ("fh",), "sh": ("sh",), "auto": ("fh", "sh"), "rtt": ("fh", "sh")}[config.upload]
    missing = [u for u in needs if u not in server.upload_protocols]
    if missing:
        raise ConfigError(
            f"upload {config.upload!r} needs {' and '.join(u.upper() for u in missing)} uploads, which the verifier "
            f"at {address} does not take (it offers: {', '.join(server.upload_protocols) or 'none'}); "
            "use upload='tokens'"
        )
