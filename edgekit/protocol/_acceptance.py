"""Token choice and the acceptance rules of speculative decoding, in numpy.

Greedy: accept draft tokens while each equals the target's argmax; the first
mismatch is replaced by the target argmax. The output is exactly target-only
greedy decoding.

Lossless speculative sampling (Leviathan et al.; Chen et al.): draft token x
drawn from q is accepted with probability min(1, p(x)/q(x)); at the first
rejection the verifier draws from the residual max(0, p - q) normalised; if all
are accepted, a bonus token is drawn from p at the next position. Each output
token is then distributed exactly as p. p is the session's sampler (`Sampler`:
temperature, truncations, penalties, bias) applied to the target's row; q is the
same sampler applied to the draft's, cut to its most likely few and renormalised,
which the device samples from and uploads exactly, so the verifier knows q where it
matters (see proto/verifier.proto). Greedy takes the sampler's argmax (its
penalties and bias applied), so greedy with penalties is still exactly the target's.

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
from dataclasses import dataclass, replace

import numpy as np

from ._sampler import Sampler

__all__ = [
    "SparseDistribution",
    "accept_greedy",
    "accept_sampling",
    "accept_semantic",
    "accept_top1",
    "acceptance_ratios",
    "draft_distribution",
    "mismatch_positions",
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


def draft_distribution(
    logits: np.ndarray, sampler: Sampler, support: int, context: Sequence[int] = ()
) -> SparseDistribution:
    """The sampler's distribution of a draft row (`Sampler.probs`), cut to its `support` most
    likely tokens and renormalised in float32, so what is uploaded is exactly what is sampled
    from. Greedy settings are sampled at temperature 1 after their adjustments (a draft is only
    asked for a distribution when the session samples)."""
    if sampler.greedy:
        sampler = replace(sampler, temperature=1.0)
    if not sampler.top_k or sampler.top_k > support:
        sampler = replace(sampler, top_k=support)  # the same cut before the nucleus: q stays the sampler's
    ids, p = sampler.support(logits, context)
    if ids.size > support:  # equals of the k-th kept by the sampler: the cut here is by index
        at = np.argpartition(-p, support - 1)[:support]
        ids, p = ids[at], p[at]
    probs = p.astype(np.float32)
    keep = probs > 0
    ids, probs = ids[keep], probs[keep]
    probs = probs / probs.sum(dtype=np.float32)
    return SparseDistribution(ids.astype(np.int32), probs.astype(np.float32))


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
    sampler: Sampler = Sampler(),
    context: Sequence[int] = (),
) -> np.ndarray:
    """min(1, p_j(s_j) / q_j(s_j)) for every token of a block, past the first rejection too
    (GOODSPEED eq. 3's terms): with distributions, the sampling rule's acceptance
    probabilities, p within 2e-5 of its value on whole rows (the middle of `Sampler.bounds`: what
    the budgets learn from needs no more); without (greedy), whether each draft token is the
    sampler's greedy choice."""
    k = len(draft_tokens)
    if not k:
        return np.zeros(0)
    tokens = np.asarray(draft_tokens, dtype=np.int64)
    if not draft_dists:
        best = sampler.best_of_rows(target_logits[:k], context, draft_tokens)
        return (np.asarray(best) == tokens).astype(np.float64)
    out = np.empty(k)
    window = sampler.window(context)
    for j in range(k):
        low, high = sampler.bounds(target_logits[j], int(tokens[j]), sampler.row_context(window, draft_tokens, j))
        p = (low + high) / 2
        q = draft_dists[j].prob_of(int(tokens[j]))
        out[j] = 1.0 if q <= p else p / q
    return out


def in_columns(
    ids: np.ndarray, tokens: Sequence[int], dists: Sequence[SparseDistribution] = ()
) -> tuple[list[int], list[SparseDistribution]]:
    """A block's tokens and draft distributions in the columns of rows that hold only the logits
    at vocabulary `ids` (sorted): a top-k sampler's rows, kept where they were made. An id not
    among them goes past the columns, where the rules read p = 0, as the whole row's top-k
    distribution has it; a draw over the columns is `ids[column]`."""

    def columns(ts: Sequence[int] | np.ndarray) -> np.ndarray:
        t = np.asarray(ts, dtype=np.int64)
        at = np.searchsorted(ids, t)
        inside = at < ids.size
        hit = np.zeros(t.size, dtype=bool)
        hit[inside] = ids[at[inside]] == t[inside]
        return np.where(hit, at, ids.size + np.arange(t.size))

    return columns(tokens).tolist(), [SparseDistribution(columns(d.ids), d.probs) for d in dists]


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
    sampler: Sampler,
    rng: np.random.Generator,
    context: Sequence[int] = (),
) -> tuple[int, int]:
    """(accepted count, next token) by the min(1, p/q) rule and residual resampling, p being the
    sampler's distribution of the target's row after the context and the block's tokens before it."""
    k = len(draft_tokens)
    window = sampler.window(context)
    for i in range(k):
        row, row_context = target_logits[i], sampler.row_context(window, draft_tokens, i)
        x = int(draft_tokens[i])
        q_x = draft_dists[i].prob_of(x)
        if sampler.accepts(row, x, rng.random() * q_x, row_context):  # u < p/q without dividing by a tiny q
            continue
        p = sampler.probs(row, row_context)  # the whole distribution only where the block stops
        residual = p.copy()
        ids, probs = draft_dists[i].ids, draft_dists[i].probs
        inside = ids < p.size  # q's mass past the target's logits meets p = 0 there: nothing to take off
        residual[ids[inside]] -= probs[inside]
        np.maximum(residual, 0.0, out=residual)
        if residual.sum() <= 0.0:
            # p <= q everywhere means p == q (both sum to 1): rejection had
            # probability zero; only float rounding gets here. Draw from p.
            residual = p
        return i, _draw(residual, rng)
    return k, _draw(sampler.probs(target_logits[k], sampler.row_context(window, draft_tokens, k)), rng)
