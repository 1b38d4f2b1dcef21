"""The calls that change a session: open (prefill), extend (a new turn), verify
(a round, or half of an SH round), close.

A round: the session's last committed token and the draft block go to the
engine in one feed, which gives the K+1 next-token logits; the acceptance rule
of the session's mode and `edgekit.protocol.decide` make the verdict; the
session's next feed starts at its committed prefix, which drops the rejected
rows from the KV (no rollback call). Under SH, a block with mismatches is
first answered with a request for their hidden states and kept pending (its KV
cells in place) until they come; any other request abandons it. An exact retry
of the last applied round (or of a pending first half) gets the same answer
again and is not applied twice. Nothing here knows protobuf.

A session with a token-speed SLO gives each round a budget and a deadline
(`SpeedClasses.objective`, WISP eqs. 5, 6, 12) that the scheduler weighs, and
its answer says whether the deadline was met: a missed deadline is reported,
never hidden. Each verdict goes to the serving statistics (`ServingStats`) under
the session's class: its drafted, accepted and committed tokens, its time on the
server and whether it met its deadline.

A draft and a target may have vocabularies that differ in their trailing padding
entries (`Fingerprint.padding`). Every rule judges over the target's tokens alone
(its logits before the padding columns), so no mode ever commits a padding id,
which the device's draft may not have: greedy's argmax and speculative sampling's
p are the target's over its tokens (renormalised: the same p target-only decoding
uses, see `Baseline`), and an id of the draft's that is no token of the target's
has p = 0. The target runs the block up to that id only; the id itself is judged,
and rejected whatever the mode (sampling then draws from the residual there, as
the lossless rule says).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from ..config import ServerConfig
from ..errors import HiddenStateError, ProtocolError
from ..protocol import (
    ContextSpan,
    EncodedHidden,
    HiddenRequest,
    OpenedSession,
    OpenRequest,
    ReceivedBlock,
    ServerFigures,
    VerifyResult,
    check_base,
    decide,
    decode_hidden,
    mismatch_positions,
    token_logprobs,
    top1_mismatches,
)
from ._budgets import Budgets
from ._core import EngineCore
from ._judges import judges
from ._semantic import SemanticMode
from ._sessions import Caller, PendingRound, Session, SessionTable
from ._slo import SpeedClasses
from ._stats import ServingStats
from ._validation import RequestChecks
from .engine import Feed
from .scheduler import Objective, WorkResult

__all__ = ["VerifyRounds", "rebuild_feeds"]


class VerifyRounds:
    def __init__(
        self,
        core: EngineCore,
        sessions: SessionTable,
        checks: RequestChecks,
        config: ServerConfig,
        slo: SpeedClasses | None = None,
        stats: ServingStats | None = None,
        budgets: Budgets | None = None,
        semantic: SemanticMode | None = None,
    ) -> None:
        self.budgets = budgets  # None: devices choose their blocks
        self.semantic = semantic or SemanticMode(None, core.engine.n_embd)  # no head: the mode is refused
        self.judges = judges(self.semantic)  # each acceptance mode's rule, by name
        self.core = core
        self.engine = core.engine
        self.sessions = sessions
        self.checks = checks
        self.config = config
        self.slo = slo or SpeedClasses()
        self.stats = stats if stats is not None else core.stats

    # -- session lifecycle ------------------------------------------------------------------

    def open(
        self, r: OpenRequest, *, deadline: float | None = None, caller: Caller = Caller()
    ) -> OpenedSession:
        arrived = time.perf_counter()
        self.checks.tokenizer(r.draft)
        if r.mode == "semantic":
            self.semantic.check_open(r.draft_hidden_size, r.semantic_threshold)
        else:
            self.checks.sampling(r.mode, r.sampler)
        self.checks.logprobs(r.logprobs)
        slo_class, speed = self.slo.resolve(r.slo.slo_class or "", r.slo.tokens_per_s or 0.0)
        self.checks.client_id(r.client_id)
        self.checks.prompt(r.prompt_tokens)  # its length before its ids, and before a copy
        history = self.checks.history(len(r.prompt_tokens), r.history)
        tokens = list(r.prompt_tokens)
        sess = self.sessions.create(
            mode=r.mode, sampler=r.sampler, seed=r.seed, slo_class=slo_class, speed=speed, caller=caller
        )
        try:
            with sess.lock:
                run_ms = 0.0
                for feed in rebuild_feeds(sess.seq, tokens, history):
                    run_ms += self._run(sess, feed, deadline, self.slo.prefill(speed, arrived)).run_ms
                sess.tokens = tokens
                sess.draft_vocab = r.draft.vocab_size
                sess.hidden_size = r.draft_hidden_size
                sess.semantic_threshold = r.semantic_threshold
                sess.logprobs = r.logprobs
                sess.began, sess.done = arrived, 0
        except BaseException:
            self.sessions.close(sess.id, caller.tenant)
            raise
        budget = 0
        if self.budgets is not None:  # a client's estimates are its tenant's: another cannot pose as it
            client = f"{caller.tenant}\0{r.client_id}" if r.client_id else ""
            budget = self.budgets.opened(sess.id, context=len(tokens), epoch=self.core.epochs, client=client)
        return OpenedSession(sess.id, len(tokens), self.config.max_context, budget, run_ms, speed or 0.0)

    def extend(
        self,
        session_id: str,
        base_position: int,
        tokens: Sequence[int],
        *,
        deadline: float | None = None,
        caller: Caller = Caller(),
    ) -> tuple[int, float]:
        """Appends a turn; returns the committed length and the prefill's milliseconds."""
        arrived = time.perf_counter()
        with self.sessions.acquire(session_id, caller.tenant) as sess:
            check_base(base_position, len(sess.tokens), what="extension")
            self.checks.extension(len(sess.tokens), tokens)  # the length before the ids: no scan of a huge turn
            self.checks.tokens(tokens, "the extension")
            tokens = list(tokens)
            self._drop_pending(sess)
            # Decode all but the new last token, which stays pending as usual.
            pending = sess.tokens[-1:] + tokens
            feed = Feed(sess.seq, len(sess.tokens) - 1, tuple(pending[:-1]), 0)
            ran = self._run(sess, feed, deadline, self.slo.prefill(sess.speed, arrived))
            sess.tokens.extend(tokens)
            sess.last_round = None
            sess.began, sess.done = arrived, 0  # a new turn: a new response
            return len(sess.tokens), ran.run_ms

    def close(self, session_id: str, caller: Caller = Caller()) -> bool:
        closed = self.sessions.close(session_id, caller.tenant)
        if closed and self.budgets is not None:
            self.budgets.forget(session_id)
        return closed

    # -- rounds ---------------------------------------------------------------------------

    def verify(
        self, r: ReceivedBlock, *, arrived: float = 0.0, deadline: float | None = None, caller: Caller = Caller()
    ) -> VerifyResult | HiddenRequest:
        """One round; under SH, one half of one. `arrived`: time.perf_counter() when the request
        arrived (eq. 12's a); 0: now."""
        arrived = arrived or time.perf_counter()
        with self.sessions.acquire(r.session_id, caller.tenant) as sess:
            if sess.last_round is not None and r.key in sess.last_round[0]:
                return sess.last_round[1]  # a retry of the applied round: same verdict, applied once
            pending = sess.pending
            if pending is not None and pending.key == r.key:
                return pending.answer  # a retried first half: the same request for hidden states
            if r.upload == "sh" and r.hidden is not None and r.hidden.count and not r.draft_tokens:
                return self._second_half(sess, r, pending)
            self._drop_pending(sess)
            check_base(r.base_position, len(sess.tokens))
            self.checks.block(
                len(sess.tokens), r.draft_tokens, r.upload, sess.mode, r.distributions, sess.draft_vocab
            )
            block = r.draft_tokens
            hidden = None
            t0 = time.perf_counter()
            semantic = sess.mode == "semantic" and bool(block)
            if semantic and r.upload not in ("fh", "sh"):
                raise ProtocolError(
                    "semantic mode reads the draft's hidden states at mismatches: upload them with the block (fh) "
                    "or on request (sh), not tokens only"
                )
            if r.upload == "fh":
                offsets = tuple(range(len(block)))
                hidden = (offsets, self._hidden_rows(sess, r.hidden, offsets))
            elif r.hidden is not None:
                what = "SH sends the tokens first" if r.upload == "sh" else "a tokens-only round"
                raise ProtocolError(f"hidden states arrived with the block, but {what}")
            budget = self.budgets.limit(sess.id) if self.budgets is not None else None
            if budget is not None and len(block) > budget:
                # Past the budget the session was told: the block is cut to it and the rest never
                # verified (the verdict reads as a rejection there); the request's key stays, so a
                # retry gets this answer.
                block = block[:budget]
                r = replace(r, draft_tokens=block, distributions=r.distributions[:budget])
                if hidden is not None:
                    hidden = (hidden[0][:budget], hidden[1][:budget])
            objective = self.slo.objective(
                sess.speed, sess.acceptance, len(block), r.draft_ms, r.network_ms, arrived, (sess.done, sess.began)
            )
            checks_ms = (time.perf_counter() - t0) * 1e3
            base = len(sess.tokens)
            run = self._tokens_of_target(block)  # the target runs its own tokens only
            # Greedy over plain logits wants only each row's best id: the engine reduces its rows
            # where they are made (no row of logits copied); logprobs and SH's pending rows want them whole.
            plain = not sess.sampler.adjusts and sess.logprobs < 0 and r.upload != "sh"
            reduced = plain and sess.mode == "greedy"
            # Top-k or min-p sampling wants of each row only what reaches its cut: kept where it is made.
            keep, spread = sess.sampler.support_cut() if plain and sess.mode == "sample" else (0, math.inf)
            feed = Feed(sess.seq, base - 1, (sess.tokens[-1], *block[:run]), run + 1, hidden=semantic,
                        argmax=self.checks.n_real if reduced else 0, keep=keep, within=self.checks.n_real,
                        spread=spread)
            ran = self._run(sess, feed, deadline, objective)
            verify_ms = ran.run_ms + checks_ms
            if r.upload == "sh":
                judged = block[: run + 1]
                best = sess.sampler.best_of_rows(self._judged_logits(ran.logits), sess.tokens, judged)
                positions = tuple(top1_mismatches(best, judged))
                if positions:
                    budget_ms, met = _outcome(objective)
                    answer = HiddenRequest(positions, r.hidden_encoding, ServerFigures(
                        queue_ms=ran.queue_ms, verify_ms=verify_ms, batch_size=ran.batch_size,
                        estimated_ms=ran.estimated_ms, budget_ms=budget_ms, deadline_met=met,
                    ))
                    sess.pending = PendingRound(r.key, r, answer, ran.logits, positions, ran.hidden)
                    return answer
            return self._finish(sess, r, ran, verify_ms, hidden, r.key, objective)

    def _second_half(self, sess: Session, r: ReceivedBlock, pending: PendingRound | None) -> VerifyResult:
        """SH's second half: only the requested rows, naming the round by base and index."""
        if pending is None or (r.base_position, r.round_index) != (
            pending.request.base_position,
            pending.request.round_index,
        ):
            raise ProtocolError(
                f"hidden states for round {r.round_index} at base {r.base_position}, which the verifier "
                "did not ask about; send the block first"
            )
        t0 = time.perf_counter()
        rows = self._hidden_rows(sess, r.hidden, pending.positions)
        # This exchange's own time: the first half reported the target pass.
        own_ms = (time.perf_counter() - t0) * 1e3
        ran = WorkResult(pending.logits, 0.0, 0.0, 1, hidden=pending.target_hidden)
        answer = self._finish(
            sess, pending.request, ran, own_ms, (pending.positions, rows), r.key, None, pending.answer
        )
        sess.pending = None  # only once applied: a second half that failed (a head's error) may be sent again
        return answer

    def _finish(
        self,
        sess: Session,
        r: ReceivedBlock,
        ran: WorkResult,
        verify_ms: float,
        hidden: tuple[tuple[int, ...], np.ndarray] | None,
        key: bytes,
        objective: Objective | None,
        first_half: HiddenRequest | None = None,
    ) -> VerifyResult:
        """Accepts a verified block: the verdict, the session's tokens and KV. `objective`: the
        round's SLO, whose deadline the answer reports on (None: an SH second half, which reports
        what its first half, `first_half`, found)."""
        block = r.draft_tokens
        # The rules see the block as far as the target ran it, and the id after that (no token of
        # the target's: rejected whatever the mode), over the target's tokens.
        judged = block[: self._tokens_of_target(block) + 1]
        logits = self._judged_logits(ran.logits)
        t0 = time.perf_counter()
        judgement = self.judges[sess.mode].judge(sess, r, ran, logits, judged, hidden)
        accepted, nxt, semantic_accepted = judgement.accepted, judgement.next_token, judgement.semantic_accepted
        ratios = judgement.ratios() if self.budgets is not None and block else 0.0
        verdict = decide(
            block,
            accepted,
            nxt,
            base=len(sess.tokens),
            max_context=self.config.max_context,
            is_end=self.engine.is_eog,
            continue_after_eog=r.continue_after_eog,
        )
        if semantic_accepted and verdict.accepted < accepted:  # cut at an accepted end of text: count before it
            semantic_accepted = sum(1 for i in mismatch_positions(logits, judged) if i < verdict.accepted)
        accept_ms = (time.perf_counter() - t0) * 1e3
        # The KV keeps every committed token but the last (not yet decoded); the block's
        # rejected rows after them go when the session's next feed runs (it starts there).
        sess.tokens.extend(verdict.committed)
        self.engine.settle(sess.seq, len(sess.tokens) - 1)  # where its next feed starts: the rest is rejected rows
        sess.last_hidden = hidden
        n_hidden = 0 if hidden is None else len(hidden[0])
        sess.hidden_rows += n_hidden
        sess.acceptance = self.slo.smoothed(sess.acceptance, len(block), accepted)
        sess.done += len(verdict.committed)
        if objective is not None:
            budget_ms, met = _outcome(objective)
        else:  # an SH second half: the round's deadline was kept, or not, by its first half's target pass
            first = first_half.server if first_half else ServerFigures()
            budget_ms, met = first.budget_ms, first.deadline_met
        next_budget = 0
        if self.budgets is not None:
            next_budget = self.budgets.after_round(
                sess.id, drafted=len(block), ratios=ratios, committed=len(verdict.committed), epoch=self.core.epochs,
                context=len(sess.tokens), slo_budget_ms=budget_ms,
            )
        answer = verdict.answer(
            server=ServerFigures(
                queue_ms=ran.queue_ms,
                verify_ms=verify_ms + accept_ms,
                hidden_rows=n_hidden,
                semantic_accepted=semantic_accepted,
                budget_ms=budget_ms,
                deadline_met=met,
                batch_size=ran.batch_size,
                estimated_ms=ran.estimated_ms,
            ),
            next_budget=next_budget,
            semantic_threshold=sess.semantic_threshold if sess.mode == "semantic" else 0.0,
            semantic_head=self.semantic.identity if sess.mode == "semantic" else "",
            logprobs=tuple(token_logprobs(logits[i], tok, sess.logprobs) for i, tok in enumerate(verdict.committed))
            if sess.logprobs >= 0 else (),
        )
        # A retry of the round, whole (its first half, under SH) or its last exchange, gets this answer.
        sess.last_round = ((key, r.key), answer)
        # An SH round waited for and ran its target pass, and met its deadline or not, in its first half.
        self.stats.record_round(
            sess.slo_class,
            drafted=len(block),
            accepted=verdict.accepted,
            committed=len(verdict.committed),
            queue_ms=answer.server.queue_ms + (first_half.server.queue_ms if first_half else 0.0),
            verify_ms=answer.server.verify_ms + (first_half.server.verify_ms if first_half else 0.0),
            deadline_met=answer.server.deadline_met,
            semantic_accepted=semantic_accepted if sess.mode == "semantic" else None,
        )
        return answer

    # -- helpers ----------------------------------------------------------------------------

    def _tokens_of_target(self, block: Sequence[int]) -> int:
        """How many of the block's first ids are tokens of the target's (not padding, not past
        its vocabulary): all of them, unless the draft proposed a padding entry of its own."""
        n_real = self.checks.n_real
        return next((i for i, tok in enumerate(block) if not 0 <= tok < n_real), len(block))

    def _judged_logits(self, logits: np.ndarray) -> np.ndarray:
        """The target's logits over its tokens: its padding columns are never a choice (a view)."""
        return logits[:, : self.checks.n_real]

    def _run(self, sess: Session, feed: Feed, deadline: float | None, objective: Objective) -> WorkResult:
        ran = self.core.run(feed, session_id=sess.id, slo_class=sess.slo_class, objective=objective, deadline=deadline)
        sess.decoded += len(feed.tokens)
        return ran

    def _drop_pending(self, sess: Session) -> None:
        """Abandons a half-done SH round (its block's cells go with the session's next feed)."""
        sess.pending = None

    def _hidden_rows(self, sess: Session, h: EncodedHidden | None, positions: tuple[int, ...]) -> np.ndarray:
        if not sess.hidden_size:
            raise ProtocolError("this session was opened without draft_hidden_size, so it takes no hidden states")
        if h is None:
            raise ProtocolError(f"the round needs hidden states at block offsets {list(positions)}; none were sent")
        try:
            return decode_hidden(h, dim=sess.hidden_size, positions=positions)
        except HiddenStateError as exc:
            raise ProtocolError(str(exc)) from None


def rebuild_feeds(seq: int, tokens: Sequence[int], history: Sequence[ContextSpan]) -> list[Feed]:
    """The feeds that build a context of `tokens` the way its `history` says it was built (its
    spans' lengths add up to len(tokens); none: the whole context is one prompt). The last
    committed token is never run (the next round's first row is), so each span's feed is shifted
    one back: a prompt of P tokens was prefilled at positions 0..P-2, the rounds after it decoded
    P-1 onward, a turn appended at length L was prefilled from L-1. A prompt or turn comes back as
    a prefill from the same start (its chunks cut where they were), a generated span as rows
    decoded the way rounds decode them (`Feed.generated`): the cells, and every logit after them,
    are what they were."""
    if not history:
        history = (ContextSpan(len(tokens)),)
    feeds = []
    begin = 0
    for span in history:
        lo, hi = max(begin - 1, 0), begin + span.length - 1
        if hi > lo:
            feeds.append(Feed(seq, lo, tuple(tokens[lo:hi]), 0, generated=span.generated))
        begin += span.length
    return feeds or [Feed(seq, 0, (), 0)]  # a one-token prompt: nothing to run, as a prefill of nothing


def _outcome(objective: Objective) -> tuple[float | None, bool | None]:
    """The round's budget and whether it kept to it, as of now (its answer is ready)."""
    if objective.deadline is None:
        return None, None
    return objective.budget_ms, time.perf_counter() <= objective.deadline
