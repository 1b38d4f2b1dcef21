"""The target's own next-token distributions, decoded one token at a time in the test's process,
for the statistical tests of speculative sampling over a real verifier."""

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

    def probs(self, prefix: Sequence[int] = ()) -> np.ndarray:
        prefix = tuple(prefix)
        if prefix not in self._cache:
            self.ctx.remove(0)
            context = self.prompt + list(prefix)
            self.ctx.decode_sequence(context, 0)
            self._cache[prefix] = self.sampler.probs(self.ctx.logits(-1), context)
        return self._cache[prefix]

    def close(self) -> None:
        self.ctx.close()
        self.model.close()


def pit(p: np.ndarray, x: int, v: float) -> float:
    """Randomised probability integral transform: uniform on [0, 1] iff x ~ p."""
    order = np.argsort(-p, kind="stable")
    rank = int(np.flatnonzero(order == x)[0])
    return float(p[order[:rank]].sum() + v * p[x])
