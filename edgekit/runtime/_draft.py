"""The draft model seam and its llama.cpp implementation.

A draft model is a KV-cached language model the session loop drives: `eval`
appends tokens and returns the last position's logits (and its final-layer
hidden state when asked), `truncate` rolls the cache back to the committed
prefix after a verdict.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from ..errors import LimitExceededError
from ..protocol import Fingerprint
from ._device import ensure_fits
from ._llama import LlamaContext, LlamaModel
from ._logits import LogitStats

__all__ = ["DraftModel", "DraftOutput", "LlamaDraftModel", "Vocabulary"]


@dataclass(frozen=True)
class DraftOutput:
    """One draft step: the last position's logits (and hidden state)."""

    logits: np.ndarray  # [n_vocab] float32; a view valid until the next eval
    hidden: np.ndarray | None  # [n_embd] float32 view, when asked for
    # The step's softmax statistics, computed on first use, once for the greedy token
    # and the features. A plain attribute: a property costs a Python frame per use.
    stats: LogitStats = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "stats", LogitStats(self.logits))


class Vocabulary(Protocol):
    """A model's name, sizes and tokenizer."""

    name: str
    n_vocab: int
    n_embd: int

    def fingerprint(self) -> Fingerprint: ...

    def tokenize(self, text: str, *, add_special: bool = True) -> list[int]: ...

    def detokenize(self, tokens: Sequence[int]) -> str: ...

    def token_bytes(self, token: int, *, special: bool = False) -> bytes: ...

    def is_eog(self, token: int) -> bool: ...

    def chat_template(self) -> str | None: ...


class DraftModel(Vocabulary, Protocol):
    """The device's draft model as a session uses it: a tokenizer (`Vocabulary`), a KV cache of
    `n_past` tokens that `prefill` and `eval` extend (`eval` returns the next position's logits,
    and hidden states when asked) and `truncate` rolls back. `LlamaDraftModel` runs a GGUF on
    llama.cpp; a `DraftSlot` is one sequence of a `DraftPool`; tests use `edgekit.testing`'s fake."""

    n_ctx: int

    @property
    def n_past(self) -> int: ...

    def eval(self, tokens: Sequence[int], *, hidden: bool = False) -> DraftOutput: ...

    def prefill(self, tokens: Sequence[int]) -> None: ...

    def truncate(self, length: int) -> None: ...


class LlamaDraftModel:
    """A GGUF draft model on llama.cpp with one sequence.

    Prefill runs with embeddings off (2-3x faster); embeddings are switched on
    only for the short decodes of drafting, where hidden states are wanted.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        name: str | None = None,
        n_ctx: int = 4096,
        n_batch: int = 512,
        n_threads: int | None = None,
    ) -> None:
        ensure_fits(path, n_ctx, name or Path(path).stem)
        self._model = LlamaModel(path, name=name)
        self.name = self._model.name
        self.n_vocab = self._model.n_vocab
        self.n_embd = self._model.n_embd
        try:
            self._ctx = LlamaContext(self._model, n_ctx=n_ctx, n_batch=n_batch, n_seq=1, n_threads=n_threads)
        except BaseException:
            self._model.close()
            raise
        self.n_ctx = self._ctx.n_ctx
        self._n_past = 0
        self.decoded_tokens = 0  # every token ever run through the model: prefill cost shows here

    @property
    def n_past(self) -> int:
        return self._n_past

    def fingerprint(self) -> Fingerprint:
        return self._model.fingerprint()

    def tokenize(self, text: str, *, add_special: bool = True) -> list[int]:
        return self._model.tokenize(text, add_special=add_special)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self._model.detokenize(tokens)

    def token_bytes(self, token: int, *, special: bool = False) -> bytes:
        return self._model.token_bytes(token, special=special)

    def is_eog(self, token: int) -> bool:
        return self._model.is_eog(token)

    def chat_template(self) -> str | None:
        return self._model.chat_template()

    def sampling_defaults(self) -> dict[str, float]:
        """The sampler settings its GGUF recommends (`LlamaModel.sampling_defaults`)."""
        return self._model.sampling_defaults()

    def eval(self, tokens: Sequence[int], *, hidden: bool = False) -> DraftOutput:
        if not tokens:
            raise ValueError("eval needs at least one token")
        if self._n_past + len(tokens) > self.n_ctx:
            raise LimitExceededError(f"draft context full ({self.n_ctx} tokens)")
        self.decoded_tokens += len(tokens)
        head, last = tokens[:-1], tokens[-1:]
        if head:
            self._ctx.set_embeddings(False)
            self._ctx.decode_sequence(head, self._n_past, last_output=False)
            self._n_past += len(head)
        self._ctx.set_embeddings(hidden)
        self._ctx.decode(last, [self._n_past], [0], [True])
        self._n_past += 1
        return DraftOutput(self._ctx.logits(-1), self._ctx.hidden(-1) if hidden else None)

    def prefill(self, tokens: Sequence[int]) -> None:
        """Appends tokens without producing outputs (fast path)."""
        if tokens:
            self.decoded_tokens += len(tokens)
            self._ctx.set_embeddings(False)
            self._ctx.decode_sequence(tokens, self._n_past, last_output=False)
            self._n_past += len(tokens)

    def truncate(self, length: int) -> None:
        if length < self._n_past:
            self._ctx.truncate(0, length)
            self._n_past = length

    def close(self) -> None:
        self._ctx.close()
        self._model.close()
