"""`ToyEngine`: the `Engine` over a `ToyLanguageModel`, for tests without model files.

Its "KV cache" is each sequence's list of tokens, with the capacity and the
rules of the llama.cpp engine: a feed first cuts its sequence to `start` (it
may not start past the end), a feed that would pass `max_context` cells raises
`KVCacheFullError` and leaves the sequences as they were, and the logits of a
position are the toy model's for the sequence up to and including it.
Batch-invariant by construction. Given `cost` (a batch's milliseconds, say an
estimator's prediction), a batch also takes that long, so that schedulers can
be tested against an engine whose speed is known. Its hidden state at a
position (`hidden`) is a fixed function of the sequence up to it: rows that
depend on the context, as a real model's do, for the semantic mode's tests.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from ...errors import InferenceError, KVCacheFullError
from ...protocol import Fingerprint
from ...runtime import ToyLanguageModel, kept_rows
from ._base import Feed, FeedOutput, KeptRows

__all__ = ["ToyEngine"]


class ToyEngine:
    def __init__(
        self,
        lm: ToyLanguageModel,
        *,
        n_seq: int,
        max_context: int,
        hidden_size: int = 8,
        cost: Callable[[Sequence[Feed]], float] | None = None,
        sampling_defaults: Mapping[str, float] | None = None,
    ) -> None:
        self.lm = lm
        self.name = lm.name
        self.identity = f"toy:{lm.name}:{lm.vocab_size}"
        self.cost = cost
        self._sampling = dict(sampling_defaults or {})  # what its "model file" recommends
        self.n_vocab = lm.vocab_size
        self.n_embd = hidden_size
        self.exact = True
        self.invariant_batch = 0
        self.mixes_sessions = True
        self.max_context = max_context
        self._kv: list[list[int]] = [[] for _ in range(n_seq)]
        self.decoded = 0  # tokens run, over all sequences

    def fingerprint(self) -> Fingerprint:
        return self.lm.fingerprint()

    def is_eog(self, token: int) -> bool:
        return token == self.lm.eos

    def chat_template(self) -> str | None:
        return None

    def sampling_defaults(self) -> dict[str, float]:
        return dict(self._sampling)

    def run_batch(self, feeds: Sequence[Feed]) -> list[FeedOutput]:
        for feed in feeds:
            held = len(self._kv[feed.seq])
            if feed.start > held:
                raise InferenceError(
                    f"sequence {feed.seq} holds {held} tokens; a feed at {feed.start} would leave a gap"
                )
            if feed.start + len(feed.tokens) > self.max_context:
                raise KVCacheFullError("no free KV cells for this batch")
        t0 = time.perf_counter()
        out = [self._run(feed) for feed in feeds]
        if self.cost is not None:
            time.sleep(max(0.0, self.cost(feeds) / 1e3 - (time.perf_counter() - t0)))
        return out

    def _run(self, feed: Feed) -> FeedOutput:
        kv = self._kv[feed.seq]
        del kv[feed.start :]  # a rolled-back round's cells go first
        kv.extend(feed.tokens)
        self.decoded += len(feed.tokens)
        n = len(kv)
        rows = [self.lm.logits(kv[: n - feed.n_out + i + 1]) for i in range(feed.n_out)]
        logits = np.stack(rows) if rows else np.empty((0, self.n_vocab), dtype=np.float32)
        if feed.argmax:
            return np.argmax(logits[:, : feed.argmax], axis=1)
        if feed.cuts:
            return KeptRows.of(kept_rows(logits, feed.keep, feed.within or self.n_vocab, feed.spread))
        if not feed.hidden:
            return logits
        hidden = [self.hidden(kv[: n - feed.n_out + i + 1]) for i in range(feed.n_out)]
        return logits, np.stack(hidden) if hidden else np.empty((0, self.n_embd), dtype=np.float32)

    def hidden(self, context: Sequence[int]) -> np.ndarray:
        """The toy's hidden state after `context`: a seeded function of its last tokens."""
        seed = hash((len(context), tuple(context[-4:]))) & 0xFFFFFFFF
        return np.random.default_rng(seed).standard_normal(self.n_embd).astype(np.float32)

    def truncate(self, seq: int, length: int) -> None:
        del self._kv[seq][length:]

    def settle(self, seq: int, length: int) -> None:
        """Nothing to do: its sequences are never parked."""

    def release(self, seq: int) -> None:
        self._kv[seq].clear()

    def cached(self, seq: int) -> int:
        return len(self._kv[seq])

    def sequence(self, seq: int) -> tuple[int, ...]:
        """The tokens a sequence holds (tests read the KV back with it)."""
        return tuple(self._kv[seq])
