"""The target's own next-token distributions, decoded in the test's process as target-only decoding
does (the prompt but its last token in one batch, then one token at a time), for the statistical
tests of speculative sampling over a real verifier. The verifier's exact numerics reproduce those
single rows bit for bit, so a distribution here is the verifier's; decoding the whole prefix in one
batch instead takes other llama.cpp kernels, whose logits differ by enough (~0.01) to move a
truncation's boundary (a top-p cut measured 0.907 here against below 0.9 there)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edgekit import Sampler
from edgekit.runtime import LlamaContext, LlamaModel


class ExactTarget:
    """The target's distribution after the prompt and a prefix, by `sampler` (its penalties read
    the prompt and the prefix, as the verifier's do)."""

    def __init__(self, path: str, prompt_tokens: Sequence[int], sampler: Sampler) -> None:
        self.model = LlamaModel(path, repack=False)
        self.ctx = LlamaContext(self.model, n_ctx=256, flash_attn=True)
        self.prompt = list(prompt_tokens)
        self.sampler = sampler
        self._cache: dict[tuple[int, ...], np.ndarray] = {}
        self.ctx.decode_sequence(self.prompt[:-1], 0, last_output=False)

    def probs(self, prefix: Sequence[int] = ()) -> np.ndarray:
        prefix = tuple(prefix)
        if prefix not in self._cache:
            self.ctx.truncate(0, len(self.prompt) - 1)
            context = self.prompt + list(prefix)
            for pos in range(len(self.prompt) - 1, len(context)):
                self.ctx.decode_sequence(context[pos : pos + 1], pos)
            self._cache[prefix] = self.sampler.probs(self.ctx.logits(-1), context)
        return self._cache[prefix]

    def close(self) -> None:
        self.ctx.close()
        self.model.close()


def pit(p: np.ndarray, x: int, v: float) -> float:
    """Randomised probability integral transform: uniform on [0, 1] iff x ~ p. The tokens are taken
    most probable first, ties by id (the mass before x: every more probable token, and the equally
    probable ones of lower id), in two passes over p rather than a sort of the whole vocabulary."""
    before = p > p[x]
    before[:x] |= p[:x] == p[x]
    return float(p[before].sum() + v * p[x])


def pair_pvalue(counts: dict[tuple[int, int], int], exact: dict[tuple[int, int], float]) -> float:
    """Chi-square p-value of the committed first-two-token pairs `counts` against their exact joint
    probabilities: cells expected fewer than 5 times pooled into one. A pair `exact` gives no
    probability fails the test outright (p = 0)."""
    from scipy.stats import chisquare

    runs = sum(counts.values())
    if not set(counts) <= set(exact):
        return 0.0
    cells = [c for c in exact if exact[c] * runs >= 5]
    observed = [counts.get(c, 0) for c in cells]
    expected = [exact[c] * runs for c in cells]
    if runs - sum(expected) > 1e-6:  # the pairs expected fewer than 5 times, pooled
        observed.append(runs - sum(observed))
        expected.append(runs - sum(expected))
    return float(chisquare(observed, np.asarray(expected) * sum(observed) / sum(expected)).pvalue)
