"""The drafting controller seam: how long a block to draft this round.

`FixedWindow` is the SLED-style baseline: always draft K tokens (less only
where the output or context limit leaves less room, or the draft ends the
text). Predictor-guided controllers implement the same protocol.
"""

from __future__ import annotations

from typing import Protocol

from ._draft import DraftOutput

__all__ = ["Controller", "FixedWindow"]


class Controller(Protocol):
    def window(self, limit: int) -> int:
        """The most tokens to draft this round, given at most `limit` fit."""

    def keep_drafting(self, drafted: int, output: DraftOutput, token: int) -> bool:
        """Called after each drafted token (drafted counts it); False stops the block."""

    def observe(self, drafted: int, accepted: int) -> None:
        """The verdict of the round."""


class FixedWindow:
    def __init__(self, k: int) -> None:
        self.k = k

    def window(self, limit: int) -> int:
        return min(self.k, limit)

    def keep_drafting(self, drafted: int, output: DraftOutput, token: int) -> bool:
        return True

    def observe(self, drafted: int, accepted: int) -> None:
        pass
