"""Per-token features of a drafted token, from the draft model's logits (WISP sec. 3.3).

They are computed inside the drafting loop over vocabularies of 150k-262k
entries, so each is taken from a handful of O(V) numpy passes that write into
a preallocated buffer: argmax, a second max with the top entry masked, one
exp and four dot products (two of them sums). No sort or partition
(np.partition alone costs as much as all of this on 262k logits). Entropy
near zero carries up to about 5e-6 nats of float32 rounding.

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

__all__ = ["FEATURE_NAMES", "LogitFeatures"]

FEATURE_NAMES = ("confidence", "entropy", "margin", "logit_std", "position", "recent_acceptance")


class LogitFeatures:
    """Computes `FEATURE_NAMES` for one vocabulary size, reusing its buffers."""

    def __init__(self, n_vocab: int) -> None:
        self.n_vocab = n_vocab
        self._buf = np.empty(n_vocab, dtype=np.float32)
        # Sums as BLAS dot products with ones: 3x faster than numpy's float64 sum here.
        self._ones = np.ones(n_vocab, dtype=np.float32)
        self._out = np.empty(len(FEATURE_NAMES), dtype=np.float32)

    def __call__(self, logits: np.ndarray, position: int, recent_acceptance: float) -> np.ndarray:
        """The feature vector (a view into a reused buffer: copy to keep).

        `logits` is left as it was (it is briefly written to mask the top entry).
        """
        z = logits
        top = int(np.argmax(z))
        m = float(z[top])
        saved = z[top]
        z[top] = -np.inf
        m2 = float(z.max())
        z[top] = saved
        buf = self._buf
        np.subtract(z, m, out=buf)
        np.exp(buf, out=buf)  # exp(z - max): every entry in (0, 1], the top one 1
        s = float(np.dot(buf, self._ones))
        # entropy = log s - sum(p * (z - m)) = log s - (sum(e * z) / s - m)
        ez = float(np.dot(buf, z))
        n = z.shape[0]
        mean = float(np.dot(z, self._ones)) / n
        var = max(float(np.dot(z, z)) / n - mean * mean, 0.0)
        out = self._out
        out[0] = 1.0 / s
        out[1] = max(np.log(s) - (ez / s - m), 0.0)
        out[2] = (1.0 - np.exp(m2 - m)) / s
        out[3] = np.sqrt(var)
        out[4] = position
        out[5] = recent_acceptance
        return out
