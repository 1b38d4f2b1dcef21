"""Per-token features of a drafted token, from the draft model's logits (WISP sec. 3.3).

They are computed inside the drafting loop over vocabularies of 150k-262k
entries, from the step's `LogitStats` (`edgekit.runtime`): one call of the
compiled kernel that also gives the greedy token, so a step reads its logits
once whatever the predictor reads. `edgekit
profile` measures what they add to a draft step.

Features, in order (`FEATURE_NAMES`):
- confidence: top probability, softmax(z)[argmax]
- entropy: of softmax(z), in nats
- margin: top-1 minus top-2 probability
- logit_std: standard deviation of the raw logits
- position: 1-based index of the token in the current draft block
- recent_acceptance: the session's smoothed acceptance rate so far
"""

from __future__ import annotations

import numpy as np

from edgekit.runtime import ALL_COLUMNS, FEATURE_NAMES, TAIL_NATS, LogitStats

__all__ = ["FEATURE_NAMES", "TAIL_NATS", "LogitFeatures"]


class LogitFeatures:
    """`FEATURE_NAMES` of one drafted token, into a reused buffer."""

    def __init__(self) -> None:
        self._out = np.empty(len(FEATURE_NAMES), dtype=np.float32)

    def __call__(self, step: LogitStats | np.ndarray, position: int, recent_acceptance: float) -> np.ndarray:
        """The feature vector of a step's statistics (or of bare logits); a view
        into a reused buffer: copy to keep."""
        if isinstance(step, np.ndarray):
            step = LogitStats(step)
        step.features_into(self._out, ALL_COLUMNS, position, recent_acceptance)
        return self._out
