"""A sampler: how a row of logits and the context before it become the distribution a token is
drawn from. The verifier applies it to the target's logits, the device to the draft's, both
through this one function, so speculative sampling stays exactly distributed as the target's
own sampler with the same settings (the acceptance rule only needs p and q; any deterministic
transformation of each side's logits given the context keeps it lossless).

The order of operations is that of vLLM (and of Hugging Face's generation):

1. `logit_bias`: added to the named tokens' logits (OpenAI's `logit_bias`).
2. Penalties over the last `penalty_last_n` tokens of the context, prompt included, as
   llama.cpp and Ollama count them (`repeat_last_n`; -1: the whole context, 0: none). For a token
   seen c > 0 times there: the repetition penalty r divides a positive logit by r and multiplies
   a negative one by r (CTRL's rule, as llama.cpp, vLLM and transformers apply it); then
   `frequency_penalty * c + presence_penalty` is subtracted (OpenAI's rule; OpenAI counts the
   generated tokens only, llama.cpp's server the window, as here).
3. Temperature: the logits divided by it. Temperature 0 is greedy: the argmax of the logits
   after steps 1-2 (ties to the lowest id), and the truncations below do not apply.
4. Truncations, each keeping a set of tokens: `top_k` (the k highest; 0: all), `min_p` (those
   whose probability is at least min_p times the highest's), then `top_p` (the fewest of what
   is left, highest first, whose renormalised probabilities sum to at least top_p; ties in
   order broken by the lower id). top_k and min_p commute (both cut by rank); top_p comes
   last, over what they kept, as in vLLM.
5. The softmax over the kept tokens.

Every step is in float64 from the float32 logits, so the same logits and context give the same
distribution on any machine that rounds IEEE doubles the same way (all of them). `Sampler.accepts`,
the test speculative sampling makes at each drafted token (is u q < p?), gives the answer that
comparison with this distribution gives, bit for bit, mostly from a bound on the softmax's
normaliser instead of the float64 pass over the whole vocabulary.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = ["FEATURES", "GREEDY", "Sampler"]

# What a verifier may apply past the temperature (its handshake lists those it does).
FEATURES = ("top_k", "top_p", "min_p", "penalties", "logit_bias")


@dataclass(frozen=True)
class Sampler:
    """The sampling settings of a session. The defaults change nothing: plain softmax at
    temperature 1. `logit_bias` is kept as sorted (token id, bias) pairs, so a sampler hashes."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    penalty_last_n: int = 64
    logit_bias: tuple[tuple[int, float], ...] = field(default=())

    def __post_init__(self) -> None:
        bias = self.logit_bias.items() if isinstance(self.logit_bias, Mapping) else self.logit_bias
        object.__setattr__(self, "logit_bias", tuple(sorted((int(t), float(b)) for t, b in bias)))
        problem = self.problem()
        if problem:
            raise ValueError(problem)
        if self.repetition_penalty == 1 and self.frequency_penalty == 0 and self.presence_penalty == 0:
            object.__setattr__(self, "penalty_last_n", 64)  # no penalty, no window: equal samplers compare equal

    def problem(self) -> str:
        """What is wrong with these settings, in words; empty: nothing."""
        finite = all(math.isfinite(x) for x in (self.temperature, self.top_p, self.min_p, self.repetition_penalty,
                                                 self.frequency_penalty, self.presence_penalty))
        if not finite:
            return "sampler settings must be finite numbers"
        if self.temperature < 0:
            return f"temperature must be >= 0 (0: greedy), got {self.temperature}"
        if self.top_k < 0:
            return f"top_k must be >= 0 (0: off), got {self.top_k}"
        if not 0 < self.top_p <= 1:
            return f"top_p must be in (0, 1] (1: off), got {self.top_p}"
        if not 0 <= self.min_p < 1:
            return f"min_p must be in [0, 1) (0: off), got {self.min_p}"
        if not self.repetition_penalty > 0:
            return f"repetition_penalty must be > 0 (1: off), got {self.repetition_penalty}"
        if not -2 <= self.frequency_penalty <= 2 or not -2 <= self.presence_penalty <= 2:
            return "frequency_penalty and presence_penalty must be between -2 and 2"
        if self.penalty_last_n < -1:
            return f"penalty_last_n must be >= -1 (-1: the whole context, 0: no penalties), got {self.penalty_last_n}"
        bad = [t for t, b in self.logit_bias if t < 0 or not math.isfinite(b) or abs(b) > 100]
        if bad:
            return f"logit_bias takes token ids >= 0 with biases from -100 to 100; not token {bad[0]}"
        return ""

    # -- what the settings amount to --------------------------------------------------------------

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def penalized(self) -> bool:
        """Whether the context changes the logits (a penalty in effect over a window)."""
        neutral = self.repetition_penalty == 1 and self.frequency_penalty == 0 and self.presence_penalty == 0
        return not neutral and self.penalty_last_n != 0

    @property
    def adjusts(self) -> bool:
        """Whether steps 1-2 change any logit."""
        return self.penalized or bool(self.logit_bias)

    def support_cut(self) -> tuple[int, float]:
        """The cut by value that a row's support (its tokens of p > 0) lies within, where steps 1-2
        change nothing (plain logits, in their own units, before the temperature): the `top_k`
        highest (0: no such cut), and those within `spread` of the largest (inf: no such cut). Min-p's
        p_i >= min_p p_max is z_i >= z_max + T ln(min_p): spread is -T ln(min_p), widened by 1e-5
        of itself and 1e-5 besides, far past the float64 rounding of the sampler's own test, so a
        token that test keeps is never cut. Top-p has no such cut: its edge depends on the whole
        row's mass. Greedy: none (its rows want their argmax)."""
        if self.greedy:
            return 0, math.inf
        spread = math.inf
        if self.min_p > 0:
            exact = -self.temperature * math.log(self.min_p)
            spread = exact + 1e-5 * (1.0 + exact)
        return self.top_k, spread

    def features(self) -> tuple[str, ...]:
        """The capabilities a verifier needs for these settings (its handshake's sampler features)."""
        used = (self.top_k > 0, self.top_p < 1, self.min_p > 0, self.penalized, bool(self.logit_bias))
        return tuple(name for name, on in zip(FEATURES, used) if on)

    def describe(self) -> dict[str, object]:
        """The settings that differ from no-op ones, by name (what --json outputs print)."""
        if self.greedy:
            out: dict[str, object] = {"temperature": 0.0}
        else:
            out = {"temperature": self.temperature}
            out.update({k: v for k, v in (("top_k", self.top_k), ("top_p", self.top_p), ("min_p", self.min_p))
                        if v != {"top_k": 0, "top_p": 1.0, "min_p": 0.0}[k]})
        if self.penalized:
            out.update(repetition_penalty=self.repetition_penalty, frequency_penalty=self.frequency_penalty,
                       presence_penalty=self.presence_penalty, penalty_last_n=self.penalty_last_n)
        if self.logit_bias:
            out["logit_bias"] = dict(self.logit_bias)
        return out

    # -- the transformation -----------------------------------------------------------------------

    def adjusted(self, logits: np.ndarray, context: Sequence[int]) -> np.ndarray:
        """Steps 1-2: the logits with the bias and the penalties (float64; the row itself, as it
        is, when neither applies). `context`: the tokens before this position, oldest first."""
        if not self.adjusts:
            return logits
        z = logits.astype(np.float64)
        n = z.shape[0]
        if self.logit_bias:
            ids = np.fromiter((t for t, _ in self.logit_bias), np.int64)
            bias = np.fromiter((b for _, b in self.logit_bias), np.float64)
            inside = ids < n
            z[ids[inside]] += bias[inside]
        if self.penalized:
            window = context if self.penalty_last_n < 0 else context[max(0, len(context) - self.penalty_last_n):]
            if len(window):
                ids, counts = np.unique(np.asarray(window, dtype=np.int64), return_counts=True)
                keep = (ids >= 0) & (ids < n)
                ids, counts = ids[keep], counts[keep]
                seen = z[ids]
                r = self.repetition_penalty
                if r != 1:
                    seen = np.where(seen > 0, seen / r, seen * r)
                seen = seen - (self.frequency_penalty * counts + self.presence_penalty)
                z[ids] = seen
        return z

    def best(self, logits: np.ndarray, context: Sequence[int] = ()) -> int:
        """The greedy choice: the argmax after steps 1-2 (the lowest id among equals)."""
        return int(np.argmax(self.adjusted(logits, context)))

    def probs(self, logits: np.ndarray, context: Sequence[int] = ()) -> np.ndarray:
        """The distribution over the whole row (float64, zeros where truncated). Greedy: all its
        mass on `best`."""
        kept, w = self._softmax(logits, context)
        if kept is None:
            return w
        p = np.zeros(logits.shape[0])
        p[kept] = w
        return p

    def support(self, logits: np.ndarray, context: Sequence[int] = ()) -> tuple[np.ndarray, np.ndarray]:
        """The distribution where it is not zero: the ids (ascending) and their probabilities, the
        values `probs` has there, without a whole row's worth of zeros where top-k or min-p cut."""
        kept, w = self._softmax(logits, context)
        nonzero = np.flatnonzero(w)
        return (nonzero if kept is None else kept[nonzero]), w[nonzero]

    def _softmax(self, logits: np.ndarray, context: Sequence[int]) -> tuple[np.ndarray | None, np.ndarray]:
        """Steps 1-5: the ids top-k and min-p keep (ascending; None: the whole row) and the
        distribution over them."""
        z = self.adjusted(logits, context)
        if self.greedy:
            return np.array([int(np.argmax(z))]), np.ones(1)
        z = z.astype(np.float64) / self.temperature  # a copy: the caller's row stays as it was
        z -= float(z.max())
        cut = self._cut(z)
        kept = np.flatnonzero(z >= cut) if cut > -np.inf else None
        w = z if kept is None else z[kept]  # the rest is 0: the softmax over the kept ones only
        np.exp(w, out=w)
        w /= w.sum()
        if self.top_p < 1:
            _nucleus(w, self.top_p)  # `kept` ascends: ties still go by id
        return kept, w

    def _cut(self, d: np.ndarray) -> float:
        """The least logit (over the temperature, less the largest) that top-k and min-p keep;
        -inf where neither cuts. Equals of the k-th stay: the cut is by value."""
        cut = -np.inf
        if self.top_k and self.top_k < d.shape[0]:
            cut = _kth_largest(d, self.top_k)
        if self.min_p > 0:
            cut = max(cut, math.log(self.min_p))  # p_i >= min_p * p_max, as logits relative to the max
        return cut

    def accepts(self, logits: np.ndarray, token: int, threshold: float, context: Sequence[int] = ()) -> bool:
        """Whether `threshold` < `probs(logits, context)[token]` (speculative sampling's u q < p; a token
        past the row has p = 0), decided as that comparison decides it, bit for bit, but mostly
        without the whole distribution (`bounds`): a threshold outside the bounds is decided by
        them, one inside (rarely: one of 224 tests in `benchmarks/sampling_rows.py`) by `probs`."""
        low, high = self.bounds(logits, token, context)
        if threshold < low:
            return True
        if threshold >= high:
            return False
        return threshold < float(self.probs(logits, context)[token])

    def bounds(self, logits: np.ndarray, token: int, context: Sequence[int] = ()) -> tuple[float, float]:
        """low <= `probs(logits, context)[token]` <= high (equal where it is known exactly), mostly
        without the whole distribution: the float64 exponential of a whole vocabulary is most of
        what a sampling row costs the host. Where the sampler keeps the whole row (no truncation)
        or cuts it by value (top-k, min-p), the softmax's normaliser is bounded instead, by a
        float32 exponential over the kept logits (each term within 6e-6 of its float64 value for
        logits within 87 of the largest, the rest under 1e-37 each: high / low is 1 + 4e-5) or a
        float64 one over a few thousand. With top-p, the nucleus is found among the likeliest kept
        tokens whose mass surely reaches top-p (`_nucleus_share`); where the bound leaves its edge
        or the order of near-equal tokens in doubt, `probs` gives the value. Greedy and short rows
        (top-k columns, small vocabularies) take `probs` directly."""
        n = logits.shape[0]
        if not 0 <= token < n:
            return 0.0, 0.0
        if self.greedy or n < _BOUNDED_FROM:
            return self._exactly(logits, token, context)
        d = self.adjusted(logits, context).astype(np.float64) / self.temperature  # as `probs` computes it
        d -= float(d.max())
        cut = self._cut(d)
        keep = d >= cut if cut > -np.inf else None
        if keep is not None and not keep[token]:
            return 0.0, 0.0
        terms = d if keep is None else d[keep]
        small = terms.size < _BOUNDED_FROM
        exps = np.exp(terms) if small else np.exp(terms.astype(np.float32))
        total = float(exps.sum(dtype=np.float64))
        if self.top_p < 1:
            ids_of = None if keep is None else np.flatnonzero(keep)
            share = self._nucleus_share(terms, ids_of, token, total, None if small else exps)
            if share is None:
                return self._exactly(logits, token, context)
            return share * (1.0 - 1e-9), share * (1.0 + 1e-9)  # the spec's sums in another order
        slack = 1e-12 if small else _FLOAT32_SLACK  # float64 sums in another order are ulps apart
        numerator = math.exp(float(d[token]))
        return numerator / (total * (1.0 + slack)), numerator / (total * (1.0 - slack))

    def _exactly(self, logits: np.ndarray, token: int, context: Sequence[int]) -> tuple[float, float]:
        p = float(self.probs(logits, context)[token])
        return p, p

    def _nucleus_share(self, terms: np.ndarray, ids_of: np.ndarray | None, token: int, total: float,
                       exps32: np.ndarray | None) -> float | None:
        """p(token) under top-p, for `bounds`. `terms`: the logits top-k and min-p keep, over the
        temperature, less the largest; `ids_of`: their ids (None: the whole row); `total`: the
        float64 sum of their exponentials, float32 ones `exps32` (None: float64's own).

        The likeliest terms are taken, widened until their mass surely reaches top_p of the
        normaliser: that is their float64 sum plus the float32 sum of the rest, whose error is
        all the bound's (so a nucleus of thousands of tokens still has a sharp edge), and 1e-9
        of it besides for sums in another order. Ordered as `_nucleus` orders them, by probability
        then id, the nucleus ends where the running mass first reaches top_p, and p(token) is its
        share of the nucleus (0 outside it). None where the bound cannot say where the nucleus
        ends, two of its tokens are so near that rounding could order them otherwise, or the
        candidates grow past _BOUNDED_MOST: there `probs` decides."""
        floor = -2.0
        while True:
            near = terms >= floor
            count = int(np.count_nonzero(near))
            if count > _BOUNDED_MOST:
                return None
            at = np.flatnonzero(near)
            e = np.exp(terms[at])
            mass_near = float(e.sum())
            rest = 0.0 if exps32 is None else max(total - float(exps32[at].sum(dtype=np.float64)), 0.0)
            normaliser = total if exps32 is None else mass_near + rest
            doubt = rest * _FLOAT32_SLACK + normaliser * 1e-9
            if mass_near >= self.top_p * (normaliser + doubt):
                break
            if count >= terms.size:
                return None
            floor -= 2.0  # e^-2 at a time: a nucleus's mass is reached before its candidates grow far past it
        ids = at if ids_of is None else ids_of[at]
        order = np.lexsort((ids, -e))
        ids, e = ids[order], e[order]
        gaps = e[:-1] - e[1:]
        if np.any((gaps > 0) & (gaps <= e[:-1] * 1e-12)):
            return None
        mass = np.cumsum(e)
        first = int(np.searchsorted(mass, self.top_p * (normaliser - doubt), side="left"))
        if first != int(np.searchsorted(mass, self.top_p * (normaliser + doubt), side="left")) or first >= e.size:
            return None
        hit = np.flatnonzero(ids[: first + 1] == token)
        return float(e[hit[0]] / mass[first]) if hit.size else 0.0

    def window(self, context: Sequence[int]) -> list[int]:
        """The part of the context the penalties read (empty: none do)."""
        if not self.penalized:
            return []
        n = self.penalty_last_n
        return list(context if n < 0 else context[max(0, len(context) - n):])

    def row_context(self, window: Sequence[int], block: Sequence[int], j: int) -> Sequence[int]:
        """The context of a block's row j: the window before the block, then block[:j]."""
        return [*window, *block[:j]] if self.penalized else ()

    def best_of_rows(self, logits: np.ndarray, context: Sequence[int], block: Sequence[int]) -> list[int]:
        """`best` of each row of a block's logits (row j follows the context and block[:j])."""
        if not self.adjusts:
            return np.argmax(logits, axis=1).tolist()
        window = self.window(context)
        return [self.best(logits[j], self.row_context(window, block, j)) for j in range(logits.shape[0])]


GREEDY = Sampler(temperature=0.0)  # the argmax of the plain logits
# `Sampler.bounds`: rows (and kept sets) at least this long bound the normaliser with a float32 sum
_BOUNDED_FROM = 4096
# and the relative error allowed the float32 sum: each term's is under 87 x 2^-24 (the rounding of its
# argument) plus numpy's float32 exp (a few ulps), about 6e-6 at most; a margin of 3x over that
_FLOAT32_SLACK = 2e-5
# and the most candidates a top-p nucleus is looked for among before `probs` decides
_BOUNDED_MOST = 1 << 15


def _kth_largest(z: np.ndarray, k: int) -> float:
    """The k-th largest value of z (whose maximum is 0). Partitions only the values near the
    top, widening the band until it holds k: a vocabulary's few likely tokens sit close to it."""
    gap = 1.0
    for _ in range(24):
        near = z[z >= -gap]
        if near.size >= k:
            return float(np.partition(near, near.size - k)[near.size - k])
        gap *= 4.0
    return float(np.partition(z, z.shape[0] - k)[z.shape[0] - k])


def _nucleus(p: np.ndarray, top_p: float) -> None:
    """Keeps, in place, the fewest most likely tokens of `p` (which sums to 1) whose mass reaches
    top_p, ordered by probability, then by id; renormalised. Sorts only the tokens above a
    falling threshold, which soon holds the nucleus: it is rarely wide."""
    floor = float(p.max())
    while True:
        floor /= 16.0
        part = np.flatnonzero(p >= floor)  # every equal of a kept value is in: the set is by value
        order = part[np.lexsort((part, -p[part]))]  # by probability, then by id
        mass = np.cumsum(p[order])  # summed in order: the same partial sums as over the whole
        if mass[-1] >= top_p or floor < 1e-300:
            break
    kept = order[: min(int(np.searchsorted(mass, top_p, side="left")) + 1, order.size)]
    keep = np.zeros(p.shape[0], dtype=bool)
    keep[kept] = True
    p[~keep] = 0.0
    p /= p.sum()
