"""Per-token features of a drafted token, from the draft model's logits (WISP sec. 3.3).

They are computed inside the drafting loop over vocabularies of 150k-262k
entries, so the softmax statistics are taken only over the logits within
`TAIL_NATS` of the maximum (about 10% of the vocabulary on real logits):
each logit further down carries a probability under exp(-20) = 2e-9 of the
top one's, so the rest of the vocabulary changes the softmax sum by at most
V x 2e-9 (5e-4 relative for 262k entries; on 40 real gemma steps confidence
and margin were within 3e-5 relative of the full softmax, entropy 3e-3). Full
passes: a max, a comparison and compress, two BLAS dot products for the
standard deviation. No sort: np.partition alone would cost more than all of it.

Features, in order (`FEATURE_NAMES`):
- confidence: top probability, softmax(z)[argmax]
- entropy: of softmax(z), in nats
- margin: top-1 minus top-2 probability
- logit_std: standard deviation of the raw logits
- position: 1-based index of the token in the current draft block
- recent_acceptance: the session's smoothed acceptance rate so far
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["FEATURE_NAMES", "TAIL_NATS", "AcceptanceTracker", "LogitFeatures"]

TAIL_NATS = 20.0

FEATURE_NAMES = ("confidence", "entropy", "margin", "logit_std", "position", "recent_acceptance")


class LogitFeatures:
    """Computes `FEATURE_NAMES` for one vocabulary size, reusing its buffers.

    `names` limits the work to the features a predictor reads (the others come
    out NaN): logit_std alone costs two more passes over the vocabulary.
    Every numpy call counts here: inside the drafting loop each one starts
    cache-cold after the llama.cpp decode, so the code keeps them few.
    """

    def __init__(self, n_vocab: int, names: tuple[str, ...] = FEATURE_NAMES) -> None:
        self.n_vocab = n_vocab
        self._std = "logit_std" in names
        self._mask = np.empty(n_vocab, dtype=bool)
        # Sums as BLAS dot products with ones: 3x faster than numpy's sum here.
        self._ones = np.ones(n_vocab, dtype=np.float32) if self._std else None
        self._out = np.full(len(FEATURE_NAMES), np.nan, dtype=np.float32)

    def __call__(self, logits: np.ndarray, position: int, recent_acceptance: float) -> np.ndarray:
        """The feature vector (a view into a reused buffer: copy to keep)."""
        z = logits
        m = float(z.max())
        np.greater(z, m - TAIL_NATS, out=self._mask)
        near = z[self._mask]
        near -= m  # <= 0, the top entry (or entries) exactly 0
        e = np.exp(near)
        s = float(e.sum(dtype=np.float64))
        # entropy = log s - sum(p * (z - m)) = log s - sum(e * near) / s
        en = float(np.dot(e, near))
        # the second largest: mask one top entry; a tie leaves another 0 (margin 0)
        near[near.argmax()] = -np.inf
        second = float(near.max()) if near.size > 1 else -math.inf
        out = self._out
        out[0] = 1.0 / s
        out[1] = max(math.log(s) - en / s, 0.0)
        out[2] = (1.0 - math.exp(second)) / s  # exp(-inf) = 0: nothing else near the top
        if self._std:
            n = z.shape[0]
            mean = float(np.dot(z, self._ones)) / n
            out[3] = math.sqrt(max(float(np.dot(z, z)) / n - mean * mean, 0.0))
        out[4] = position
        out[5] = recent_acceptance
        return out


class AcceptanceTracker:
    """The `recent_acceptance` feature: an exponential moving average over the
    session's labelled positions (each accepted token 1, a round's first
    rejection 0; positions after it carry no outcome), starting at `initial`."""

    def __init__(self, alpha: float = 0.1, initial: float = 0.5) -> None:
        self.alpha = alpha
        self.value = initial

    def update(self, drafted: int, accepted: int) -> None:
        a = self.alpha
        for _ in range(accepted):
            self.value += a * (1.0 - self.value)
        if accepted < drafted:
            self.value -= a * self.value
