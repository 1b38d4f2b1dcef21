"""Tokens drafted past the committed ones, and the blocks a session sends from them.

A round drafts a block on top of the committed tokens; while the verifier is silent
(`on_disconnect="draft"`), the device drafts further blocks on top of that one, each
on the assumption that the one before is accepted whole and that the verifier's next
token is the draft's own. The chain is flat: block, guess, block, guess, ... where a
guess is the draft's token at the position the verifier fills after a whole block.
Where blocks end (`ends`) only advises how to send them: the controller chose those
ends, as it would have, round by round.

A verdict consumes the chain's front: if it accepts the whole block and its next token
is the guess, the rest of the chain is still a valid draft of what follows (in
sampling mode too: those tokens were drawn from the draft given exactly the committed
prefix), and the next round sends its next block; otherwise the rest is void. Nothing
here is ever committed without a verdict: the output stays lossless.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..protocol import SparseDistribution

__all__ = ["DraftChain", "DraftedBlock"]


@dataclass
class DraftedBlock:
    """A block drafted in one go: its tokens, their draft distributions (sampling), the
    hidden state behind each token (uploads) and what drafting it cost."""

    tokens: list[int]
    dists: list[SparseDistribution] = field(default_factory=list)
    rows: list[np.ndarray] = field(default_factory=list)
    draft_ms: float = 0.0
    steps: int = 0


@dataclass
class DraftChain:
    """The tokens drafted past `base` committed tokens, where blocks end and what each cost."""

    base: int = 0
    tokens: list[int] = field(default_factory=list)
    dists: list[SparseDistribution] = field(default_factory=list)  # one per token when sampling, else empty
    rows: list[np.ndarray] = field(default_factory=list)  # one per token when uploading hidden states
    ends: list[int] = field(default_factory=list)  # where blocks end, as lengths from the front
    costs: list[tuple[float, int]] = field(default_factory=list)  # each block's drafting ms and steps
    shown: int = 0  # how many of the front tokens a Provisional event has shown

    def __len__(self) -> int:
        return len(self.tokens)

    def add(self, block: DraftedBlock) -> None:
        """Appends a block drafted on top of the chain."""
        self.tokens += block.tokens
        self.dists += block.dists
        self.rows += block.rows
        self.ends.append(len(self.tokens))
        self.costs.append((block.draft_ms, block.steps))

    def front(self, limit: int) -> DraftedBlock:
        """The next block to send: up to the first end, at most `limit` tokens (a cut block's
        next token becomes the guess, and the rest of it stays a block)."""
        if not self.ends:
            return DraftedBlock([])
        end, (ms, steps) = self.ends[0], self.costs[0]
        n = min(end, limit)
        share = n / end if end else 1.0
        return DraftedBlock(
            tokens=self.tokens[:n],
            dists=self.dists[:n],
            rows=self.rows[:n],
            draft_ms=ms * share,
            steps=steps if n == end else max(1, round(steps * share)),
        )

    def advance(self, sent: int, accepted: int, next_token: int | None) -> int:
        """Applies the verdict on the front `sent` tokens (`accepted` of them, then
        `next_token`); returns how many of the chain's tokens the output now holds. What is
        left still follows the committed tokens; otherwise the chain is emptied."""
        if accepted == sent and len(self.tokens) > sent and self.tokens[sent] == next_token:
            used = sent + 1
            del self.tokens[:used]
            del self.dists[: min(used, len(self.dists))]
            del self.rows[: min(used, len(self.rows))]
            # A block ending at the guess leaves nothing: its end goes (no empty round is sent for it).
            kept = [(e - used, c) for e, c in zip(self.ends, self.costs, strict=True) if e > used]
            if self.ends and self.ends[0] > used:  # a cut block: its remainder keeps the rest of its cost
                ms, steps = self.costs[0]
                share = 1 - sent / self.ends[0]
                kept[0] = (kept[0][0], (ms * share, max(1, round(steps * share))))
            self.ends, self.costs = [e for e, _ in kept], [c for _, c in kept]
            self.base += used
            self.shown = max(0, self.shown - used)
            return used
        held = min(accepted, len(self.tokens))
        self.clear(self.base + accepted + (next_token is not None))
        return held

    def clear(self, base: int) -> None:
        self.base = base
        self.tokens, self.dists, self.rows, self.ends, self.costs = [], [], [], [], []
        self.shown = 0
