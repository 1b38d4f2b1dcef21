"""`ToyLanguageModel`: a deterministic stand-in for a language model.

The logits of a context are a seeded pseudo-random function of its last
`order` tokens, so a toy draft and a toy target agree as often as their noise
allows. The fake draft model of `edgekit.testing` and the verifier's toy engine
run on it: tests of the session loop and of the verifier need no model files.

A toy may end its vocabulary with `padding` placeholder entries (as a converter pads a real
vocabulary to its embedding's rows): their logits are `padding_logit` (0.0, what zero rows of
a tied embedding give), they are no tokens of its tokenizer, and its fingerprint leaves them out,
so a padded toy and an unpadded one of the same tokens share a tokenizer.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

from ..protocol import Fingerprint

__all__ = ["ToyLanguageModel"]


class ToyLanguageModel:
    """Logits of a context: a seeded function of its last `order` tokens.

    `noise` perturbs the logits (a draft that disagrees with its target now and then). The last
    `padding` of its `vocab_size` entries are padding; the logits of the others do not depend on it.
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
        padding: int = 0,
        padding_logit: float = 0.0,
    ) -> None:
        if not 0 <= padding < vocab_size:
            raise ValueError(f"padding must be in [0, {vocab_size}), got {padding}")
        self.eos_bias = eos_bias
        self.vocab_size = vocab_size
        self.padding = padding
        self.padding_logit = padding_logit
        self.seed = seed
        self.order = order
        self.noise = noise
        self.eos = eos
        self.name = name

    def _rng(self, context: Sequence[int], salt: str) -> np.random.Generator:
        key = f"{self.seed}:{salt}:{list(context[-self.order :])}".encode()
        return np.random.default_rng(int.from_bytes(hashlib.sha256(key).digest()[:8], "little"))

    @property
    def real_vocab_size(self) -> int:
        """Its tokens: the entries before the padding."""
        return self.vocab_size - self.padding

    def logits(self, context: Sequence[int]) -> np.ndarray:
        real = self.real_vocab_size
        base = self._rng(context, "base").normal(0.0, 3.0, real)
        base[self.eos] += self.eos_bias
        if self.noise:
            base += self._rng(context, f"noise{self.noise}").normal(0.0, self.noise, real)
        if self.padding:
            base = np.concatenate([base, np.full(self.padding, self.padding_logit)])
        return base.astype(np.float32)

    def greedy(self, context: Sequence[int], n: int) -> list[int]:
        """The model's own greedy decoding, over its tokens (a padding entry is none): the n tokens
        after `context` (what a lossless verifier must give)."""
        out, ctx = [], list(context)
        for _ in range(n):
            ctx.append(int(np.argmax(self.logits(ctx)[: self.real_vocab_size])))
            out.append(ctx[-1])
        return out

    def fingerprint(self) -> Fingerprint:
        """Toys of the same tokens (the same size before padding) share a tokenizer."""
        tokens = hashlib.sha256(f"toy-vocab:{self.real_vocab_size}".encode()).digest()
        return Fingerprint(self.vocab_size, tokens, 0, self.eos, self.name, self.padding)
