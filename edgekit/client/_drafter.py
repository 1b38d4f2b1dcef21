"""The device's drafting: the draft model's KV, the tokens drafted past the committed
ones, and how each block is drafted.

`Drafter` holds a session's committed tokens and its `DraftChain` (what was drafted
past them), and keeps the draft's KV following both. It drafts a round's block (the
controller deciding where it ends), blocks ahead while the verifier is silent, and the
next block while the front one is verified (proactive drafting). Several sessions of a
client may share one draft model (`SharedDraft`): whoever drafts takes its lock
(`held`), and a session whose tokens are not the ones in the cache prefills them first.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import numpy as np

from ..config import GenerationConfig
from ..drafting import Controller, Decision
from ..protocol import draft_distribution
from ..runtime import DraftModel, DraftOutput
from ._ahead import DraftChain, DraftedBlock
from ._events import Provisional
from ._text import TextDecoder

__all__ = ["Drafter", "SharedDraft"]


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

    def step_ms(self, tokens: Sequence[int], tries: int = 3) -> float:
        """What one draft step costs here (ms): the least of `tries` one-token steps after the first
        of `tokens` (a prompt's opening: the cheapest steps the draft takes). It empties the
        draft's cache: the next session to draft prefills its tokens again."""
        if not tokens:
            raise ValueError("a draft step needs a token to step on")
        with self.lock:
            self._owner = None
            self.model.truncate(0)
            try:
                self.model.eval(tokens[:1])  # the first step pays for what a model sets up once
                best = float("inf")
                for t in tokens[1 : 1 + tries] if len(tokens) > tries else [tokens[0]] * tries:
                    t0 = time.perf_counter()
                    self.model.eval([t])
                    best = min(best, time.perf_counter() - t0)
            finally:
                self.model.truncate(0)
        return 1e3 * best


class Drafter:
    """A session's draft: its committed tokens, the chain drafted past them, and the
    model's KV that follows both. Every method that runs the draft is called under
    `held()`. `config` and `controller` are the session's, replaced when it is
    reconfigured; `rng` draws the draft's samples; `on_void` is called whenever what was
    drafted past the committed tokens is dropped (the round in flight was drafted there)."""

    def __init__(
        self,
        draft: DraftModel,
        shared: SharedDraft,
        config: GenerationConfig,
        controller: Controller,
        rng: np.random.Generator,
        on_void: Callable[[], None] = lambda: None,
    ) -> None:
        self.draft = draft
        self.shared = shared
        self.config = config
        self.controller = controller
        self._rng = rng
        self._on_void = on_void
        self.committed: list[int] = []  # the tokens the device and the verifier agree on
        self.chain = DraftChain()  # tokens drafted past the committed ones
        self.max_context = draft.n_ctx
        self.provisional_shown = 0  # tokens shown as provisional in this stream
        self.provisional_kept = 0  # of those, tokens now in the output

    # -- the committed tokens and the KV ----------------------------------------------------

    def sequence(self) -> list[int]:
        """The committed tokens and those drafted past them: what the draft's KV follows."""
        return self.committed + self.chain.tokens

    def reset(self, tokens: Sequence[int]) -> None:
        """Starts over on `tokens` (a session opened): nothing drafted, the KV prefilled."""
        self.committed = list(tokens)
        self._on_void()
        with self.shared.lock:
            self.chain.clear(len(self.committed))
            self.shared.claim(self, self.committed)

    @contextmanager
    def held(self) -> Iterator[None]:
        """The shared draft taken and its KV this session's; a chain drafted for another
        point of the conversation (before a new turn) is void."""
        with self.shared.lock:
            if self.chain.base != len(self.committed):
                self.void()
            self.shared.claim(self, self.sequence())
            yield

    def void(self) -> None:
        """Drops what was drafted past the committed tokens (call under the shared lock)."""
        chain = self.chain
        if len(chain) and self.shared.owned_by(self):
            self.draft.truncate(min(self.draft.n_past, chain.base))
        chain.clear(len(self.committed))
        self._on_void()

    def commit(self, sent: int, accepted: int, next_token: int | None, new: Sequence[int]) -> bool:
        """Applies a verdict on the chain's front `sent` tokens: `new` (the accepted ones and
        `next_token`) join the committed tokens; the chain and the KV keep what still follows
        them. Whether the rest of the chain survived."""
        chain = self.chain
        keeps = accepted == sent and len(chain) > sent and chain.tokens[sent] == next_token
        shown = chain.shown
        self.provisional_kept += min(shown, chain.advance(sent, accepted, next_token))
        self.committed.extend(new)
        # What the draft evaluated stays valid up to the last token of the sequence, which it has not run.
        self.draft.truncate(min(self.draft.n_past, len(self.sequence()) - 1))
        return keeps

    # -- drafting a block ---------------------------------------------------------------------

    def pick(self, out: DraftOutput, block: DraftedBlock) -> int:
        """The draft's token from a step: the sampler's greedy choice, or a sample whose
        distribution goes with it. Its penalties read the sequence and the block so far."""
        sampler = self.config.draft_sampler()
        context = [*self.sequence(), *block.tokens] if sampler.penalized else ()
        if self.config.mode != "sample":  # greedy, and semantic (greedy drafting, WISV)
            tok = sampler.best(out.logits, context) if sampler.adjusts else out.stats.argmax()
        else:
            dist = draft_distribution(out.logits, sampler, self.config.draft_top_k, context)
            tok = dist.sample(self._rng)
            block.dists.append(dist)
        block.tokens.append(tok)
        if out.hidden is not None:
            block.rows.append(np.array(out.hidden, dtype=np.float32))  # the draft's buffer is reused next step
        return tok

    def block(self, k: int, *, guess: bool = False, until: Callable[[], bool] | None = None) -> DraftedBlock:
        """A block of at most `k` tokens on top of the sequence, the controller deciding where
        it ends. `guess`: first the token the verifier adds after a whole block (the draft's
        own; no decision), as a block drafted ahead starts with. `until`: stop early once it
        says so (the block so far is kept)."""
        t0 = time.perf_counter()
        seq = self.sequence()
        if self.draft.n_past >= len(seq):
            self.draft.truncate(len(seq) - 1)  # a stop step ran the last token: run it again for its logits
        feed = seq[self.draft.n_past :]
        block = DraftedBlock([])
        hidden = self.config.upload != "tokens"
        steps = 0
        if guess:
            tok = self.pick(self.draft.eval(feed, hidden=hidden), block)
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
            tok = self.pick(out, block)
            if self.draft.is_eog(tok) or decision == Decision.LAST:
                break
            feed = [tok]
        block.draft_ms = (time.perf_counter() - t0) * 1e3
        block.steps = steps
        return block

    def front(self, limit: int) -> DraftedBlock:
        """The chain's next block to send (drafted now if there is none), at most `limit` tokens."""
        if not len(self.chain):
            self.chain.add(self.block(self.controller.window(limit)))
        return self.chain.front(limit)

    # -- drafting past the block: ahead and proactively -----------------------------------------

    def extend(self, limit: int, ahead: int, until: Callable[[], bool] | None = None) -> bool:
        """Drafts one more block past the chain, unless the chain is as long as it may be
        (`ahead` tokens, the context, an end of text); whether it did."""
        chain = self.chain
        free = min(ahead, self.max_context - 2 - len(self.committed)) - len(chain)
        ended = len(chain) and self.config.stop_at_eos and self.draft.is_eog(chain.tokens[-1])
        if free < 2 or ended:
            return False
        guess = bool(chain.ends)  # after a block (even an empty one) comes the verifier's position
        window = self.controller.window(min(limit, free - int(guess)))
        if window < 1 or (until is not None and until()):
            return False  # no drafting (plain decoding), or the verdict is already in
        block = self.block(window, guess=guess, until=until)
        if not block.tokens:
            return False  # the controller stops at once, and would again on the same logits
        chain.add(block)
        return True

    def ahead(self, limit: int, ahead: int) -> Provisional | None:
        """Drafts one more block past the chain, or None when the chain is as long as it may
        be: `ahead` tokens, the context, or an end of text."""
        return self.provisional() if self.extend(limit, ahead) else None

    def proactively(self, limit: int, room: int, until: Callable[[], bool] | None = None) -> tuple[int, ...]:
        """One block past the chain while the front one is verified, cut short once `until()`
        says the verdict is in (the round's time is not the draft's to stretch): the tokens
        added (the guess of the verifier's token first)."""
        before = len(self.chain)
        self.extend(limit, min(room, before + 1 + limit), until=until)
        return tuple(self.chain.tokens[before:])

    def ahead_while(self, busy: Callable[[], bool], limit: int, ahead: int) -> Iterator[Provisional]:
        """Drafts ahead, a block at a time (the shared draft taken around each, never while the
        consumer holds an event), while `busy()` and the chain may grow."""
        while busy():
            with self.held():
                event = self.ahead(limit, ahead)
            if event is None:
                return
            yield event

    def ahead_for(self, seconds: float, limit: int, ahead: int) -> Iterator[Provisional]:
        """Waits `seconds` (before trying the verifier again), drafting ahead meanwhile while
        the chain may grow."""
        until = time.monotonic() + seconds
        yield from self.ahead_while(lambda: bool(ahead) and time.monotonic() < until, limit, ahead)
        time.sleep(max(0.0, until - time.monotonic()))

    def provisional(self) -> Provisional:
        """The chain as a `Provisional` event (all of it is shown from now on)."""
        chain = self.chain
        self.provisional_shown += max(0, len(chain) - chain.shown)
        chain.shown = len(chain)
        decoder = TextDecoder(self.draft)
        return Provisional(decoder.feed(chain.tokens) + decoder.flush(), tuple(chain.tokens))
