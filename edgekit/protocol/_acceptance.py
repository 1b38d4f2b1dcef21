"""Token choice and the acceptance rules of speculative decoding, in numpy.

Greedy: accept draft tokens while each equals the target's argmax; the first
mismatch is replaced by the target argmax. The output is exactly target-only
greedy decoding.

Lossless speculative sampling (Leviathan et al.; Chen et al.): draft token x
drawn from q is accepted with probability min(1, p(x)/q(x)); at the first
rejection the verifier draws from the residual max(0, p - q) normalised; if all
are accepted, a bonus token is drawn from p at the next position. Each output
token is then distributed exactly as p. The draft's q is a top-k truncated,
renormalised softmax that the device samples from and uploads exactly, so the
verifier knows q where it matters (see proto/verifier.proto).

Semantic (WISV, lossy): as greedy, but at each mismatch, in order, a decision
head's P(reject) is compared with a threshold; a mismatch it does not reject
is accepted as if it matched, and the first one it rejects ends the block with
the target's token. The head runs on the verifier; this rule only applies its
probabilities.

The target's logits may be narrower than the draft's ids reach: a verifier judges
over its target's tokens alone (`Fingerprint.padding`), and a draft whose
vocabulary has more padding entries may propose one. A draft token past the
logits' width has p = 0: never the argmax, accepted with probability 0, and the
residual max(0, p - q) gives it nothing, so the rule stays lossless and never
draws an id the target has no logit for.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "SparseDistribution",
    "accept_greedy",
    "accept_sampling",
    "accept_semantic",
    "accept_top1",
    "acceptance_ratios",
    "draft_distribution",
    "mismatch_positions",
    "target_probs",
    "top1_mismatches",
]


@dataclass(frozen=True)
class SparseDistribution:
    """A distribution over a few token ids; every other id has probability 0."""

    ids: np.ndarray  # int32, unique
    probs: np.ndarray  # float32, positive, sums to 1

    def sample(self, rng: np.random.Generator) -> int:
        return int(self.ids[_draw(self.probs, rng)])

    def prob_of(self, token: int) -> float:
        hit = np.flatnonzero(self.ids == token)
        return float(self.probs[hit[0]]) if hit.size else 0.0


def _draw(probs: np.ndarray, rng: np.random.Generator) -> int:
    # Inverse-CDF draw in float64; clamp so rounding never indexes past the end.
    cdf = np.cumsum(probs, dtype=np.float64)
    i = int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))
    return min(i, len(probs) - 1)


def draft_distribution(logits: np.ndarray, temperature: float, top_k: int) -> SparseDistribution:
    """softmax(logits / T) restricted to the top-k logits and renormalised.

    argpartition keeps this O(V); the softmax runs over k values only.
    """
    k = min(top_k, logits.shape[0])
    ids = np.argpartition(logits, -k)[-k:]
    z = logits[ids].astype(np.float64) / temperature
    z -= z.max()
    w = np.exp(z)
    probs = (w / w.sum()).astype(np.float32)
    keep = probs > 0
    ids, probs = ids[keep], probs[keep]
    # Renormalise in float32 so what is uploaded is exactly what is sampled from.
    probs = probs / probs.sum(dtype=np.float32)
    return SparseDistribution(ids.astype(np.int32), probs.astype(np.float32))


def target_probs(logits: np.ndarray, temperature: float) -> np.ndarray:
    """softmax(logits / T) over the whole vocabulary, in float64."""
    z = logits.astype(np.float64) / temperature
    z -= z.max()
    np.exp(z, out=z)
    z /= z.sum()
    return z


def accept_greedy(target_logits: np.ndarray, draft_tokens: Sequence[int]) -> tuple[int, int]:
    """(accepted count, next token) for a block; target_logits has K+1 rows."""
    accepted, nxt = accept_top1(np.argmax(target_logits, axis=1).tolist(), draft_tokens)
    assert nxt is not None  # K+1 rows always reach the deciding position
    return accepted, nxt


def accept_top1(best: Sequence[int], draft_tokens: Sequence[int]) -> tuple[int, int | None]:
    """(accepted count, next token) from the target's top-1 token at each block
    position: accept while the draft token is the target's, then the target's
    token at the first mismatch (the correction) or after the block (the bonus).
    `best` may stop at the first mismatch; where it stops short of the deciding
    position, the next token is None (the target's answer was incomplete)."""
    k = len(draft_tokens)
    n = min(k, len(best))
    accepted = next((i for i in range(n) if int(best[i]) != int(draft_tokens[i])), n)
    return accepted, int(best[accepted]) if accepted < len(best) else None


def acceptance_ratios(
    target_logits: np.ndarray,
    draft_tokens: Sequence[int],
    draft_dists: Sequence[SparseDistribution] = (),
    temperature: float = 1.0,
) -> np.ndarray:
    """min(1, p_j(s_j) / q_j(s_j)) for every token of a block, past the first rejection too
    (GOODSPEED eq. 3's terms): with distributions, the sampling rule's acceptance
    probabilities; without (greedy), whether each draft token is the target's top-1."""
    k = len(draft_tokens)
    if not k:
        return np.zeros(0)
    tokens = np.asarray(draft_tokens, dtype=np.int64)
    if not draft_dists:
        return (np.argmax(target_logits[:k], axis=1) == tokens).astype(np.float64)
    out = np.empty(k)
    for j in range(k):
        p = _prob_of(target_probs(target_logits[j], temperature), int(tokens[j]))
        q = draft_dists[j].prob_of(int(tokens[j]))
        out[j] = 1.0 if q <= p else p / q
    return out


def _prob_of(p: np.ndarray, token: int) -> float:
    """p[token], or 0 for an id past the target's logits (a padding entry only the draft has)."""
    return float(p[token]) if token < p.size else 0.0


def mismatch_positions(target_logits: np.ndarray, draft_tokens: Sequence[int]) -> list[int]:
    """Block offsets whose draft token is not the target's top-1: the positions
    an SH verifier asks hidden states for (WISV's mismatch-first upload)."""
    k = len(draft_tokens)
    if not k:
        return []
    return top1_mismatches(np.argmax(target_logits[:k], axis=1), draft_tokens)


def top1_mismatches(best: Sequence[int], draft_tokens: Sequence[int]) -> list[int]:
    """`mismatch_positions` from the target's top-1 token at each block position."""
    return [i for i, tok in enumerate(draft_tokens) if int(best[i]) != int(tok)]


def accept_semantic(
    best: Sequence[int], draft_tokens: Sequence[int], p_reject: Sequence[float], threshold: float
) -> tuple[int, int, int]:
    """(accepted count, next token, mismatches accepted) for a block, from the target's top-1
    token at each of its K+1 positions (as `accept_top1`): `p_reject[i]` is the head's
    P(reject) of the i-th mismatch (`top1_mismatches` order); a mismatch is rejected when
    P(reject) > threshold (WISV eq. 27)."""
    k = len(draft_tokens)
    mismatches = top1_mismatches(best, draft_tokens)
    if len(p_reject) != len(mismatches):
        raise ValueError(f"{len(p_reject)} head outputs for {len(mismatches)} mismatches")
    for n, (i, p) in enumerate(zip(mismatches, p_reject)):
        if p > threshold:
            return i, int(best[i]), n
    return k, int(best[k]), len(mismatches)


def accept_sampling(
    target_logits: np.ndarray,
    draft_tokens: Sequence[int],
    draft_dists: Sequence[SparseDistribution],
    temperature: float,
    rng: np.random.Generator,
) -> tuple[int, int]:
    """(accepted count, next token) by the min(1, p/q) rule and residual resampling."""
    k = len(draft_tokens)
    for i in range(k):
        p = target_probs(target_logits[i], temperature)
        x = int(draft_tokens[i])
        q_x = draft_dists[i].prob_of(x)
        if rng.random() * q_x < _prob_of(p, x):  # u < p/q without dividing by a tiny q
            continue
        residual = p
        ids, probs = draft_dists[i].ids, draft_dists[i].probs
        inside = ids < p.size  # q's mass past the target's logits meets p = 0 there: nothing to take off
        residual[ids[inside]] -= probs[inside]
        np.maximum(residual, 0.0, out=residual)
        total = residual.sum()
        if total <= 0.0:
            # p <= q everywhere means p == q (both sum to 1): rejection had
            # probability zero; only float rounding gets here. Draw from p.
            residual = target_probs(target_logits[i], temperature)
        return i, _draw(residual, rng)
    return k, _draw(target_probs(target_logits[k], temperature), rng)

