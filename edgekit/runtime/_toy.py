"""`ToyLanguageModel`: a deterministic stand-in for a language model.

The logits of a context are a seeded pseudo-random function of its last
`order` tokens, so a toy draft and a toy target agree as often as their noise
allows. The fake draft model of `edgekit.testing` and the verifier's toy engine
run on it: tests of the session loop and of the verifier need no model files.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

from ..protocol import Fingerprint

__all__ = ["ToyLanguageModel"]


class ToyLanguageModel:
    """Logits of a context: a seeded function of its last `order` tokens.

    `noise` perturbs the logits (a draft that disagrees with its target now and then).
    """

    def __init__(
        self,
        vocab_size: int = 64,
        *,
        seed: int = 0,
        order: int = 2,
        noise: float = 0.0,
        eos: int = 1,
        eos_bias: float = -4.0,
        name: str = "toy",
    ) -> None:
        self.eos_bias = eos_bias
        self.vocab_size = vocab_size
        self.seed = seed
        self.order = order
        self.noise = noise
        self.eos = eos
        self.name = name

    def _rng(self, context: Sequence[int], salt: str) -> np.random.Generator:
        key = f"{self.seed}:{salt}:{list(context[-self.order :])}".encode()
        return np.random.default_rng(int.from_bytes(hashlib.sha256(key).digest()[:8], "little"))

    def logits(self, context: Sequence[int]) -> np.ndarray:
        base = self._rng(context, "base").normal(0.0, 3.0, self.vocab_size)
        base[self.eos] += self.eos_bias
        if self.noise:
            base += self._rng(context, f"noise{self.noise}").normal(0.0, self.noise, self.vocab_size)
        return base.astype(np.float32)

    def greedy(self, context: Sequence[int], n: int) -> list[int]:
        """The model's own greedy decoding: the n tokens after `context` (what a lossless verifier must give)."""
        out, ctx = [], list(context)
        for _ in range(n):
            ctx.append(int(np.argmax(self.logits(ctx))))
            out.append(ctx[-1])
        return out

    def fingerprint(self) -> Fingerprint:
        return Fingerprint(self.vocab_size, hashlib.sha256(b"toy-vocab").digest(), 0, self.eos, self.name)
