"""Fake draft models over a `ToyLanguageModel`: one sequence (`FakeDraftModel`), or a pool's
backend of several with batched steps (`ToyPoolBackend`)."""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from ..protocol import (
    Fingerprint,
)
from ..runtime import DraftOutput, Step, ToyLanguageModel


class FakeDraftModel:
    """A `DraftModel` over a toy LM; its "KV cache" is the list of tokens it has evaluated."""

    def __init__(self, lm: ToyLanguageModel, *, n_ctx: int = 4096, n_embd: int = 8) -> None:
        self.lm = lm
        self.n_embd = n_embd
        self.name = lm.name
        self.n_vocab = lm.vocab_size
        self.n_ctx = n_ctx
        self.evaluated: list[int] = []
        self.eval_calls = 0

    @property
    def n_past(self) -> int:
        return len(self.evaluated)

    def fingerprint(self) -> Fingerprint:
        return self.lm.fingerprint()

    def tokenize(self, text: str, *, add_special: bool = True) -> list[int]:
        ids = [2 + (b % (self.lm.real_vocab_size - 2)) for b in text.encode()]  # never a padding entry
        return ([0] if add_special else []) + ids

    def token_bytes(self, token: int, *, special: bool = False) -> bytes:
        if token < 2:
            return (b"<bos>", b"<eos>")[token] if special else b""
        if token >= self.lm.real_vocab_size:  # a padding entry: a placeholder, no text
            return f"[PAD{token}]".encode() if special else b""
        return bytes([ord("a") + token % 26])

    def detokenize(self, tokens: Sequence[int]) -> str:
        return b"".join(self.token_bytes(t) for t in tokens).decode()

    def is_eog(self, token: int) -> bool:
        return token == self.lm.eos

    def chat_template(self) -> str | None:
        return None

    def prefill(self, tokens: Sequence[int]) -> None:
        self.evaluated.extend(tokens)

    def eval(self, tokens: Sequence[int], *, hidden: bool = False) -> DraftOutput:
        if not tokens:
            raise ValueError("eval needs at least one token")
        self.eval_calls += 1
        self.evaluated.extend(tokens)
        logits = self.lm.logits(self.evaluated)
        h = np.resize(logits, self.n_embd) if hidden else None  # a stand-in that differs from step to step
        return DraftOutput(logits, h)

    def truncate(self, length: int) -> None:
        del self.evaluated[length:]

    def close(self) -> None:
        pass  # nothing held (LlamaDraftModel frees its model)


class ToyPoolBackend:
    """A `DraftPool`'s backend over a toy LM: each sequence a list of tokens; each batch's size
    is recorded in `batches`, and each takes `delay_s` (so that concurrent steps pile up)."""

    def __init__(self, lm: ToyLanguageModel, *, slots: int, n_ctx_seq: int = 4096, max_rows: int = 64,
                 delay_s: float = 0.0, n_embd: int = 8) -> None:
        self.vocab = FakeDraftModel(lm, n_ctx=n_ctx_seq, n_embd=n_embd)
        self.lm = lm
        self.n_seq = slots
        self.n_ctx_seq = n_ctx_seq
        self.max_rows = max_rows
        self.delay_s = delay_s
        self.sequences: list[list[int]] = [[] for _ in range(slots)]
        self.batches: list[int] = []

    def run(self, steps: Sequence[Step]) -> list[DraftOutput | None]:
        assert sum(len(s.tokens) for s in steps) <= self.max_rows and len({s.hidden for s in steps}) == 1
        if self.delay_s:
            time.sleep(self.delay_s)
        self.batches.append(len(steps))
        out: list[DraftOutput | None] = []
        for s in steps:
            seq = self.sequences[s.seq]
            assert s.start == len(seq), f"sequence {s.seq} holds {len(seq)} tokens, the step starts at {s.start}"
            seq.extend(s.tokens)
            logits = self.lm.logits(seq)
            out.append(DraftOutput(logits, np.resize(logits, self.vocab.n_embd) if s.hidden else None)
                       if s.output else None)
        return out

    def truncate(self, seq: int, length: int) -> None:
        del self.sequences[seq][length:]

    def close(self) -> None:
        pass
