"""The target's log-probabilities of the tokens it commits, returned when a session asks.

Raw, as vLLM returns them by default: the log-softmax of the target's logits over its own tokens
(before the sampler's penalties, temperature and truncations), for the committed token and the
`top` likeliest tokens at its position, most likely first (ties to the lower id)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["MAX_TOP_LOGPROBS", "TokenLogprobs", "token_logprobs"]

MAX_TOP_LOGPROBS = 20  # alternatives per token a verifier returns at most (OpenAI's and vLLM's default cap)


@dataclass(frozen=True)
class TokenLogprobs:
    """The target's log-probability of a committed token, and its likeliest alternatives there."""

    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # (token id, log-probability), most likely first


def token_logprobs(logits: np.ndarray, token: int, top: int) -> TokenLogprobs:
    """`TokenLogprobs` of `token` at a position whose logits (the target's tokens only) are given."""
    z = logits.astype(np.float64)
    z -= z.max()
    z -= np.log(np.exp(z).sum())
    chosen = float(z[token]) if 0 <= token < z.size else float("-inf")
    if top <= 0:
        return TokenLogprobs(chosen)
    k = min(top, z.size)
    ids = np.argpartition(-z, k - 1)[:k]
    ids = ids[np.lexsort((ids, -z[ids]))]
    return TokenLogprobs(chosen, tuple((int(i), float(z[i])) for i in ids))
