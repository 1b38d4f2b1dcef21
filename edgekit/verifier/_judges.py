"""How each acceptance mode judges a verified block: one object per mode, each with the rule that
gives its verdict (how many draft tokens are accepted and the target's next token) and the
acceptance ratios the draft budgets learn from. `Rounds` picks the session's; `protocol.decide`
then makes the verdict of what it found, the same for every mode.

- greedy: the target's argmax at each position (the engine's reduction of plain rows, where it
  made one), the block accepted up to the first token that differs;
- sample: lossless speculative sampling over the target's distribution (in the columns the engine
  kept, for top-k rows);
- semantic: the verifier's decision head may accept a mismatch it judges harmless (lossy, opt-in).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ..protocol import ReceivedBlock, accept_sampling, accept_top1, acceptance_ratios, in_columns
from ._semantic import SemanticMode
from ._sessions import Session
from .scheduler import WorkResult

__all__ = ["Greedy", "Judge", "Judgement", "Sampling", "Semantic", "judges"]


@dataclass(frozen=True)
class Judgement:
    accepted: int  # draft tokens accepted
    next_token: int | None  # the target's token after them
    ratios: Callable[[], float]  # the block's summed acceptance ratios (asked only where budgets learn)
    semantic_accepted: int = 0  # mismatches a semantic head accepted (in `accepted`)


class Judge(Protocol):
    def judge(self, sess: Session, r: ReceivedBlock, ran: WorkResult, logits: np.ndarray, judged: Sequence[int],
              hidden: tuple[tuple[int, ...], np.ndarray] | None) -> Judgement:
        """The block `judged` (the draft as far as the target ran it, and the id after) against the
        target's `logits` rows of it, for session `sess`; `hidden`: the draft's hidden rows received."""
        ...


class Greedy:
    def judge(self, sess: Session, r: ReceivedBlock, ran: WorkResult, logits: np.ndarray, judged: Sequence[int],
              hidden: tuple[tuple[int, ...], np.ndarray] | None) -> Judgement:
        best = ran.best.tolist() if ran.best is not None else sess.sampler.best_of_rows(logits, sess.tokens, judged)
        accepted, nxt = accept_top1(best, judged)
        # each token's ratio: whether it is the target's choice (as acceptance_ratios gives it)
        return Judgement(accepted, nxt, lambda: float(sum(b == t for b, t in zip(best, judged))))


class Sampling:
    def judge(self, sess: Session, r: ReceivedBlock, ran: WorkResult, logits: np.ndarray, judged: Sequence[int],
              hidden: tuple[tuple[int, ...], np.ndarray] | None) -> Judgement:
        dists = r.distributions[: len(judged)]
        columns, kept = (judged, dists) if ran.ids is None else in_columns(ran.ids, judged, dists)
        accepted, nxt = accept_sampling(logits, columns, kept, sess.sampler, sess.rng, sess.tokens)
        nxt = nxt if ran.ids is None or nxt is None else int(ran.ids[nxt])
        return Judgement(accepted, nxt,
                         lambda: float(acceptance_ratios(logits, columns, kept, sess.sampler, sess.tokens).sum()))


class Semantic:
    def __init__(self, semantic: SemanticMode) -> None:
        self.semantic = semantic

    def judge(self, sess: Session, r: ReceivedBlock, ran: WorkResult, logits: np.ndarray, judged: Sequence[int],
              hidden: tuple[tuple[int, ...], np.ndarray] | None) -> Judgement:
        accepted, nxt, semantic_accepted = self.semantic.decide(
            logits, judged, hidden, ran.hidden, sess.semantic_threshold, r.link
        )
        return Judgement(accepted, nxt,
                         lambda: float(acceptance_ratios(logits, judged, (), sess.sampler, sess.tokens).sum()),
                         semantic_accepted)


def judges(semantic: SemanticMode) -> dict[str, Judge]:
    """Each mode's judge, by the mode's name (`Session.mode`)."""
    return {"greedy": Greedy(), "sample": Sampling(), "semantic": Semantic(semantic)}
