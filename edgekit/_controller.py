"""The drafting controller seam: how long a block to draft this round.

Each round the session asks `window(limit)` for the most tokens to draft, then,
for each block position in turn, calls `draft_next(index, logits)` with the
draft's logits for that position *before* a token is taken from them: False
ends the block without it (WISP's stop-at-first-predicted-rejection, eq. 25,
and llama.cpp's draft p-min are both this rule). The verdict comes back
through `observe`.

- `FixedWindow`: the SLED-style baseline, always K tokens (less only where the
  output or context limit leaves less room, or the draft ends the text).
- `ConfidenceThreshold`: stop where the draft's top probability falls below
  p_min, as llama.cpp's `--draft-p-min` does.
- The predictor-guided controller lives in `edgekit.predictors`.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

__all__ = ["ConfidenceThreshold", "Controller", "FixedWindow"]


class Controller(Protocol):
    name: str

    def window(self, limit: int) -> int:
        """The most tokens to draft this round, given at most `limit` fit."""

    def draft_next(self, index: int, logits: np.ndarray) -> bool:
        """Whether to draft a token at block position `index` (1-based) from these logits."""

    def observe(self, drafted: int, accepted: int) -> None:
        """The verdict of the round."""


class FixedWindow:
    def __init__(self, k: int) -> None:
        self.k = k
        self.name = f"fixed-{k}"

    def window(self, limit: int) -> int:
        return min(self.k, limit)

    def draft_next(self, index: int, logits: np.ndarray) -> bool:
        return True

    def observe(self, drafted: int, accepted: int) -> None:
        pass


class ConfidenceThreshold:
    """Draft while the top token's probability is at least `p_min`, up to
    `max_window` tokens and never fewer than `min_window`."""

    def __init__(self, p_min: float, max_window: int, *, min_window: int = 1) -> None:
        if not 0.0 <= p_min <= 1.0:
            raise ValueError(f"p_min must be in [0, 1], got {p_min}")
        self.p_min = p_min
        self.max_window = max_window
        self.min_window = min_window
        self.name = f"p-min-{p_min:g}"
        self._features = None  # LogitFeatures, sized on first use

    def window(self, limit: int) -> int:
        return min(self.max_window, limit)

    def draft_next(self, index: int, logits: np.ndarray) -> bool:
        if index <= self.min_window:
            return True
        if self._features is None:
            from edgekit.predictors.features import LogitFeatures

            self._features = LogitFeatures(logits.shape[0])
        return float(self._features(logits, index, 0.0)[0]) >= self.p_min  # [0]: confidence

    def observe(self, drafted: int, accepted: int) -> None:
        pass
