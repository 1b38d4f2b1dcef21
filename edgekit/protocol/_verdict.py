"""The verdict of a round, the one rule every verifier path applies.

An acceptance rule (greedy, speculative sampling, or a stock server's top-1
tokens) gives how many draft tokens are accepted and the target's next token.
The verdict then ends the round at the first accepted end-of-text token
(nothing is drawn after the end of the text, unless the round asked to go on),
says which tokens it commits, and whether the context has room for another
round. `check_base` is the other half of the protocol's sequence invariant: a
round must name the committed length it was drafted on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import StaleRoundError
from ._types import VerifyResult

__all__ = ["Verdict", "check_base", "decide"]


@dataclass(frozen=True)
class Verdict:
    accepted: int  # draft tokens accepted
    next_token: int | None  # the correction or bonus token; None: the accepted block ended the text
    bonus: bool  # the whole block was accepted and the next token came after it
    committed: tuple[int, ...]  # what the round commits: the accepted prefix and the next token
    committed_length: int
    context_full: bool  # no room for another round (base + a block of 1 + its next token)

    def answer(self, **figures: Any) -> VerifyResult:
        """The verdict as the answer both ends read, with the figures that come with it (timings,
        hidden rows, budget, semantic counts: `VerifyResult`'s other fields)."""
        return VerifyResult(
            accepted=self.accepted,
            next_token=self.next_token,
            bonus=self.bonus,
            committed_length=self.committed_length,
            context_full=self.context_full,
            **figures,
        )


def decide(
    draft_tokens: Sequence[int],
    accepted: int,
    next_token: int | None,
    *,
    base: int,
    max_context: int,
    is_end: Callable[[int], bool],
    continue_after_eog: bool = False,
) -> Verdict:
    """The verdict of a block drafted on `base` committed tokens, from what the
    acceptance rule gave (`accepted` tokens, then `next_token`)."""
    if not continue_after_eog:
        for i in range(accepted):
            if is_end(int(draft_tokens[i])):
                accepted, next_token = i + 1, None
                break
    committed = tuple(int(t) for t in draft_tokens[:accepted]) + ((next_token,) if next_token is not None else ())
    length = base + len(committed)
    return Verdict(
        accepted=accepted,
        next_token=next_token,
        bonus=next_token is not None and accepted == len(draft_tokens),
        committed=committed,
        committed_length=length,
        context_full=length + 2 > max_context,
    )


def check_base(base_position: int, committed_length: int, *, what: str = "round", address: str | None = None) -> None:
    """A round (or an extension) must be drafted on the session's committed sequence.
    `address` names the verifier where the client keeps the session for it (a stock server)."""
    if base_position != committed_length:
        raise StaleRoundError(
            f"stale {what}: base position {base_position} but the session has {committed_length} committed tokens",
            committed_length=committed_length,
            address=address,
        )
