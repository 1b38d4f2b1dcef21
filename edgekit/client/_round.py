"""One round on the wire: the request a drafted block makes, and what its verdict changes.

`RoundDriver` builds a round's `BlockRequest` from the chain's front block (the same one
again while a round is in flight: a verifier that applied it before a failure answers
it again, and nothing is applied twice), makes the verify call, and applies the
verdict: the accepted prefix and the verifier's token join the committed tokens, the
link estimate and the cost model learn from the exchange, and the round's figures come
out as `RoundStats`. `run` does the three, drafting past the block while it is out
(proactively, and ahead when the verifier is silent). `check_supported` refuses,
before any round, what the verifier cannot do.
"""

from __future__ import annotations

import time
from collections.abc import Generator
from dataclasses import dataclass, replace

import numpy as np

from ..config import GenerationConfig
from ..errors import ConfigError, ProtocolError
from ..link import LinkEstimator, LinkPolicy
from ..protocol import BlockRequest, Exchange, ServerInfo, TokenLogprobs, VerifyResult
from ..transport import VerifierTransport
from ._drafter import Drafter
from ._events import Provisional
from ._resilience import Background
from ._stats import RoundStats

__all__ = ["InFlight", "RoundDriver", "check_supported"]


@dataclass(frozen=True)
class InFlight:
    """A round sent and not yet answered: what to re-send, and what drafting it took."""

    request: BlockRequest
    draft_ms: float
    steps: int


class RoundDriver:
    """A session's rounds: their count, the verifier's last budget, the link time the next
    is expected to take, and the round in flight."""

    def __init__(self, transport: VerifierTransport, drafter: Drafter, link: LinkEstimator, policy: LinkPolicy) -> None:
        self.transport = transport
        self.drafter = drafter
        self.link = link
        self.policy = policy
        self.index = 0
        self.budget = 0  # the draft budget the verifier assigned last (0: none)
        self.logprobs: tuple[TokenLogprobs, ...] = ()  # the target's, of the last round's committed tokens
        # The link time the next round is expected to take (for the verifier's SLO budget, WISP eq. 6):
        # the last round's, and before any round the measured RTT.
        self.network_ms = link.state().rtt_ms
        self.inflight: InFlight | None = None  # the chain's front block, sent and not yet answered
        # Semantic mode: the threshold and head identity of the last verdict (None before one).
        self.semantic_decider: tuple[float, str] | None = None

    def forget(self) -> None:
        """Drops the round in flight (what it sent was drafted on tokens now void)."""
        self.inflight = None

    def request(self, limit: int, session_id: str) -> InFlight:
        """This round's request (under the shared draft): the one a failure left unanswered
        (the same block again, on the session as it is now), or the chain's next block
        (drafted now if there is none)."""
        if self.inflight is not None:
            request = replace(self.inflight.request, session_id=session_id, link=self.link.state())
            self.inflight = replace(self.inflight, request=request)
            return self.inflight
        d = self.drafter
        blk = d.front(limit)
        upload = self.policy.upload_for(len(blk.tokens))
        request = BlockRequest(
            session_id=session_id,
            base_position=len(d.committed),
            draft_tokens=blk.tokens,
            draft_distributions=blk.dists,
            link=self.link.state(),
            round_index=self.index,
            continue_after_eog=not d.config.stop_at_eos,
            upload=upload,
            hidden=np.stack(blk.rows) if upload != "tokens" else None,
            hidden_encoding=self.policy.encoding,
            draft_ms=blk.draft_ms,
            network_ms=self.network_ms,
        )
        self.inflight = InFlight(request, blk.draft_ms, blk.steps)
        return self.inflight

    def run(
        self, limit: int, session_id: str, *, ahead: int = 0, room: int = 0, proactive: bool = False,
        ahead_after: float = 0.0,
    ) -> Generator[Provisional, None, tuple[list[int], RoundStats, bool]]:
        """A round of at most `limit` tokens: drafted, sent, its verdict applied. With `proactive`
        drafting the next block is drafted while this one is verified (within `room` tokens past
        the output); with `ahead`, once the call has been silent for `ahead_after` seconds, the
        device drafts up to `ahead` tokens past the output, yielding each `Provisional`."""
        drafter = self.drafter
        if not ahead:  # the draft is this session's for the whole round
            with drafter.held():
                sent = self.request(limit, session_id)
                if not proactive:
                    return self.apply(sent, *self.verify(sent.request))
                call = Background(lambda: self.verify(sent.request))
                drafted = drafter.proactively(limit, room, until=call.done)
                verdict, t1, t2 = call.result()
                return self.apply(sent, verdict, t1, t2, proactive=drafted)
        # Drafting ahead yields events mid-round: the draft is taken around each use of it,
        # never held while the consumer has an event.
        with drafter.held():
            sent = self.request(limit, session_id)
            call = Background(lambda: self.verify(sent.request))
            drafted = drafter.proactively(limit, room, until=call.done) if proactive else ()
        if not call.wait(ahead_after):
            yield from drafter.ahead_while(lambda: not call.done(), limit, ahead)
        verdict, t1, t2 = call.result()
        with drafter.held():
            return self.apply(sent, verdict, t1, t2, proactive=drafted)

    def verify(self, request: BlockRequest) -> tuple[VerifyResult, float, float]:
        """The verify call, and when it began and ended (perf_counter seconds)."""
        t1 = time.perf_counter()
        verdict = self.transport.verify(request)
        return verdict, t1, time.perf_counter()

    def apply(
        self, sent: InFlight, verdict: VerifyResult, t1: float, t2: float, proactive: tuple[int, ...] = ()
    ) -> tuple[list[int], RoundStats, bool]:
        """Commits a verdict (under the shared draft): the accepted prefix and the verifier's
        token; the newly committed tokens, the round's figures and whether the context is full.
        `proactive`: what was drafted past the block while it was verified (the guess of the
        verifier's token first)."""
        request = sent.request
        base, block, upload = request.base_position, list(request.draft_tokens), request.upload
        server = verdict.server
        exchanges = verdict.exchanges or (Exchange((t2 - t1) * 1e3, server.verify_ms + server.queue_ms, 0, 0),)
        for ex in exchanges:
            if ex.server_ms is not None:  # without the server's time, a round trip says nothing about the link
                self.link.add_exchange(ex.round_trip_ms, ex.server_ms, ex.uplink_bytes, ex.downlink_bytes)
        # The next round's expected time on the link (its SLO budget leaves it out): this one's.
        self.network_ms = sum(max(0.0, e.round_trip_ms - (e.server_ms or 0.0)) for e in exchanges)
        a = verdict.accepted
        if verdict.semantic_head:  # what decided this session's last semantic round
            self.semantic_decider = (verdict.semantic_threshold, verdict.semantic_head)
        new = block[:a] + ([verdict.next_token] if verdict.next_token is not None else [])
        if not 0 <= a <= len(block) or not new or verdict.committed_length != base + len(new):
            raise ProtocolError(
                f"verifier at {self.transport.address} sent an inconsistent verdict: accepted {a} of {len(block)}, "
                f"committed {verdict.committed_length} on base {base}"
            )
        self.inflight = None
        self.logprobs = verdict.logprobs  # the target's, of `new`, when the session asked
        keeps = self.drafter.commit(len(block), a, verdict.next_token, new)
        self.budget = verdict.next_budget
        self.drafter.controller.observe(len(block), a)
        self.policy.costs.observe(
            drafted=len(block),
            accepted=a,
            draft_ms=sent.draft_ms,
            draft_steps=sent.steps,
            verify_ms=verdict.server.verify_ms + verdict.server.queue_ms,
            mismatches=len(verdict.hidden_requested) if upload == "sh" else None,
        )
        stats = RoundStats(
            index=self.index,
            base_position=base,
            drafted=len(block),
            accepted=a,
            bonus=verdict.bonus,
            committed=len(new),
            wasted=len(block) - a,
            draft_ms=sent.draft_ms,
            draft_steps=sent.steps,
            round_trip_ms=(t2 - t1) * 1e3,
            server=verdict.server,
            upload=upload,
            exchanges=len(exchanges),
            uplink_bytes=sum(e.uplink_bytes for e in exchanges),
            downlink_bytes=sum(e.downlink_bytes for e in exchanges),
            proactive_drafted=len(proactive),
            proactive_used=len(proactive) if keeps else 0,
        )
        self.index += 1
        return new, stats, verdict.context_full


def check_supported(config: GenerationConfig, server: ServerInfo, address: str) -> None:
    """Refuses settings the verifier cannot serve (an acceptance mode, a draft top-k, an
    upload): never a silent downgrade."""
    if config.mode not in server.modes or (config.mode == "semantic" and not server.semantic_head):
        hint = (
            "; it needs a semantic decision head, which an edgekit verifier has when started with "
            "--semantic-head" if config.mode == "semantic" else ""
        )
        raise ConfigError(
            f"the verifier at {address} does not support {config.mode!r} acceptance "
            f"(it offers: {', '.join(m for m in server.modes if m != 'semantic')}){hint}"
        )
    if config.mode == "sample" and config.draft_top_k > server.max_draft_top_k:
        raise ConfigError(f"draft_top_k {config.draft_top_k} exceeds the verifier's {server.max_draft_top_k}")
    if config.logprobs is not None and not server.max_top_logprobs:
        raise ConfigError(f"the verifier at {address} does not return the target's log-probabilities")
    if config.logprobs is not None and config.logprobs > server.max_top_logprobs:
        raise ConfigError(f"logprobs {config.logprobs} exceeds the {server.max_top_logprobs} alternatives the "
                          f"verifier at {address} returns per token")
    lacking = [f for f in config.sampler().features() if f not in server.sampler_features]
    if lacking:
        offers = ", ".join(server.sampler_features) or "the temperature only"
        raise ConfigError(
            f"the verifier at {address} does not apply {' or '.join(lacking)} to its target's logits "
            f"(it applies {offers}): speculative decoding with them would not be the target's own sampling; "
            "drop them, or use a verifier that applies them (edgekit serve does)"
        )
    needs = {"tokens": (), "fh": ("fh",), "sh": ("sh",), "auto": ("fh", "sh"), "rtt": ("fh", "sh")}[config.upload]
    missing = [u for u in needs if u not in server.upload_protocols]
    if missing:
        raise ConfigError(
            f"upload {config.upload!r} needs {' and '.join(u.upper() for u in missing)} uploads, which the verifier "
            f"at {address} does not take (it offers: {', '.join(server.upload_protocols) or 'none'}); "
            "use upload='tokens'"
        )
