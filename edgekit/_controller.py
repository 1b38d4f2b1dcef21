"""The drafting controller seam: how long a block to draft this round.

Each round the session asks `window(limit)` for the most tokens to draft, then,
for each block position in turn, calls `draft_next(index, logits)` with the
draft's logits for that position *before* a token is taken from them, and gets
a `Decision`: DRAFT the token and go on; STOP, ending the block without it
(WISP's stop-at-first-predicted-rejection, eq. 25, and llama.cpp's draft p-min
both stop this way, which costs the draft step that produced the logits); or
LAST, drafting this token and then ending the block (the token's logits are
already paid for: sending it costs only its verification). A plain bool works
as DRAFT/STOP. The verdict comes back through `observe`.

- `FixedWindow`: the SLED-style baseline, always K tokens (less only where the
  output or context limit leaves less room, or the draft ends the text).
- `ConfidenceThreshold`: stop where the draft's top probability falls below
  p_min, as llama.cpp's `--draft-p-min` does.
- The predictor-guided controller lives in `edgekit.predictors`.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Literal, Protocol

import numpy as np

__all__ = ["ConfidenceThreshold", "Controller", "Decision", "FixedWindow", "StopRule"]

StopRule = Literal["before", "after"]  # end a block before the predicted rejection, or after it


class Decision(IntEnum):
    STOP = 0
    DRAFT = 1
    LAST = 2

    @classmethod
    def stop(cls, rule: StopRule) -> "Decision":
        """What a predicted rejection means under `rule`."""
        return cls.STOP if rule == "before" else cls.LAST


class Controller(Protocol):
    name: str

    def window(self, limit: int) -> int:
        """The most tokens to draft this round, given at most `limit` fit."""

    def draft_next(self, index: int, logits: np.ndarray) -> Decision | bool:
        """What to do at block position `index` (1-based), given its logits."""

    def observe(self, drafted: int, accepted: int) -> None:
        """The verdict of the round."""


class FixedWindow:
    def __init__(self, k: int) -> None:
        self.k = k
        self.name = f"fixed-{k}"

    def window(self, limit: int) -> int:
        return min(self.k, limit)

    def draft_next(self, index: int, logits: np.ndarray) -> Decision:
        return Decision.DRAFT

    def observe(self, drafted: int, accepted: int) -> None:
        pass


class ConfidenceThreshold:
    """Draft while the top token's probability is at least `p_min`, up to
    `max_window` tokens and never fewer than `min_window`. `stop="before"` drops
    the unsure token, as llama.cpp does; "after" sends it and ends the block."""

    def __init__(self, p_min: float, max_window: int, *, min_window: int = 1, stop: StopRule = "before") -> None:
        if not 0.0 <= p_min <= 1.0:
            raise ValueError(f"p_min must be in [0, 1], got {p_min}")
        if stop not in ("before", "after"):
            raise ValueError(f"stop must be 'before' or 'after', got {stop!r}")
        self.p_min = p_min
        self.max_window = max_window
        self.min_window = min_window
        self.stop = stop
        self.name = f"p-min-{p_min:g}" + ("-after" if stop == "after" else "")
        self._features = None  # LogitFeatures, sized on first use

    def window(self, limit: int) -> int:
        return min(self.max_window, limit)

    def draft_next(self, index: int, logits: np.ndarray) -> Decision:
        if index <= self.min_window:
            return Decision.DRAFT
        if self._features is None:
            from edgekit.predictors.features import LogitFeatures

            self._features = LogitFeatures(logits.shape[0])
        if float(self._features(logits, index, 0.0)[0]) >= self.p_min:  # [0]: confidence
            return Decision.DRAFT
        return Decision.stop(self.stop)

    def observe(self, drafted: int, accepted: int) -> None:
        pass
