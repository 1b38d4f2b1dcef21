"""What a forward pass costs: FLOPs from a model's shape (paper 003, sec. II-C, eqs. 9-14)
and run time from FLOPs and batch size (eq. 17, T = c1 F b + c2, fitted per machine)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["ModelShape", "Runtime"]


@dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer's size: J blocks of hidden size h1 and FFN size h2."""

    layers: int  # J
    hidden: int  # h1
    ffn: int  # h2

    @classmethod
    def from_gguf(cls, meta: Callable[[str], str | None]) -> ModelShape:
        """From a GGUF's metadata (`meta(key) -> str | None`, as `LlamaModel.meta`)."""
        arch = meta("general.architecture")
        if not arch:
            raise ValueError("the model file names no architecture")

        def num(key: str) -> int:
            value = meta(f"{arch}.{key}")
            if value is None:
                raise ValueError(f"the model file has no {arch}.{key}")
            return int(float(value))

        return cls(num("block_count"), num("embedding_length"), num("feed_forward_length"))

    def _k(self) -> float:
        return 4.0 * self.layers * self.hidden

    def prefill_flops(self, tokens: int) -> float:
        """A pass over `tokens` input tokens with nothing cached (eq. 11)."""
        h1, h2 = self.hidden, self.ffn
        return self._k() * tokens * (2 * h1 + tokens + h2)

    def decode_flops(self, cached: int) -> float:
        """A one-token pass with `cached` tokens in the KV cache (eq. 12)."""
        return self._k() * (2 * self.hidden + cached + 1 + self.ffn)

    def verify_flops(self, tokens: int, cached: int) -> float:
        """A pass over `tokens` new tokens (a block and the token before it) on `cached` (eq. 14)."""
        return self._k() * tokens * (2 * self.hidden + cached + tokens + self.ffn)

    @property
    def kv_bytes_per_token(self) -> float:
        """fp16 keys and values of one token in every block (eq. 10)."""
        return 4.0 * self.layers * self.hidden

    @property
    def param_bytes(self) -> float:
        """fp16 weights (eq. 9)."""
        return self.layers * (8.0 * self.hidden**2 + 4.0 * self.hidden * self.ffn)


@dataclass(frozen=True)
class Runtime:
    """Eq. 17: a pass over a batch of b sequences of F FLOPs each takes c1 F b + c2 seconds."""

    c1: float  # seconds per FLOP per sequence
    c2: float  # seconds per pass

    def seconds(self, batch: int, flops: float) -> float:
        return self.c1 * flops * batch + self.c2

    @classmethod
    def fit(cls, samples: Sequence[tuple[int, float, float]]) -> Runtime:
        """Least squares over (batch, flops, seconds) samples, both coefficients kept >= 0."""
        if not samples:
            raise ValueError("no samples to fit a runtime to")
        x = np.array([b * f for b, f, _ in samples], dtype=np.float64)
        y = np.array([s for *_, s in samples], dtype=np.float64)
        if len(samples) == 1 or np.ptp(x) <= 1e-12 * max(float(np.max(np.abs(x))), 1.0):
            return cls(max(float(np.mean(y) / np.mean(x)), 0.0) if np.mean(x) > 0 else 0.0, 0.0)
        c1, c2 = np.polyfit(x, y, 1)
        if c2 < 0:  # through the origin
            return cls(max(float(x @ y / (x @ x)), 0.0), 0.0)
        if c1 < 0:
            return cls(0.0, float(np.mean(y)))
        return cls(float(c1), float(c2))

    def error(self, samples: Sequence[tuple[int, float, float]]) -> float:
        """Mean absolute percentage error over samples."""
        errs = [abs(self.seconds(b, f) - s) / s for b, f, s in samples if s > 0]
        return float(np.mean(errs)) if errs else math.nan
