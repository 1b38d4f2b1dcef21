"""The target's own confidence at a mismatch: optional head inputs beside WISV's eq. 23.

WISV's head reads [h_draft, h_target, CSI]. The verifier also holds the target's
distribution at every block offset (the logits it verifies with), and how sure the
target was where the draft disagreed is a direct signal of how much the choice can
matter (AutoJudge-style): a near-tie between the two tokens is often harmless, a
confident target overruled is often not. A head trained with them (`edgekit semantic
train --target-features`) names them in its metadata (`edgekit.target_features`), and
the verifier passes the logits rows of the mismatches to it.

`TARGET_FEATURES`, per mismatch, from the target's log-softmax row and the draft's token:
- `target_entropy`: the entropy of the target's distribution, in nats;
- `target_logp_top1`: log p of the target's own choice (its top-1);
- `target_logp_draft`: log p the target gives the draft's token (floored at -30);
- `target_margin`: their difference, >= 0.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["TARGET_FEATURES", "target_features"]

TARGET_FEATURES = ("target_entropy", "target_logp_top1", "target_logp_draft", "target_margin")
_LOGP_FLOOR = -30.0


def target_features(logits: np.ndarray, draft_tokens: Sequence[int] | np.ndarray) -> np.ndarray:
    """float32 [m, len(TARGET_FEATURES)] from the target's logits rows [m, vocab] at m mismatches
    and the draft's token at each."""
    z = np.asarray(logits, dtype=np.float64)
    if z.ndim != 2 or len(z) != len(draft_tokens):
        raise ValueError(f"{len(draft_tokens)} draft tokens against logits of shape {z.shape}")
    if not len(z):
        return np.zeros((0, len(TARGET_FEATURES)), dtype=np.float32)
    tokens = np.asarray(draft_tokens, dtype=np.int64)
    if tokens.min() < 0 or tokens.max() >= z.shape[1]:
        raise ValueError(f"a draft token outside the vocabulary of {z.shape[1]}")
    z = z - z.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    p = np.exp(logp)
    entropy = -(p * logp).sum(axis=1)
    top1 = logp.max(axis=1)
    draft = np.maximum(logp[np.arange(len(z)), tokens], _LOGP_FLOOR)
    return np.stack([entropy, top1, draft, top1 - draft], axis=1).astype(np.float32)
