"""The target model on llama.cpp: one context, one KV sequence per session slot.

A llama context is not thread-safe: `LlamaEngine` is driven by one caller at a
time (the verifier's engine core). Each session's KV holds its committed tokens
but the last, so a round decodes only that token and the draft block: verifying
costs the block, not the context.

Exact numerics. llama.cpp's CPU kernels depend on the batch size: weight
repacking switches to GEMM kernels at 4 rows, other quantized GEMMs at 8, so a
block verified in one batch gets logits that differ in the last bits from
decoding the same tokens one at a time, and greedy argmaxes near a tie flip.
In exact mode the target loads without repacking, uses flash attention, and
decodes every block in sub-batches no larger than `invariant_batch`: the
largest batch that was measured at start-up to reproduce single-token logits
bit for bit. Greedy speculative output is then token-identical to target-only
decoding (see `calibrate_invariant_batch`). Fast mode decodes a block in one
batch with every kernel llama.cpp has.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ...errors import KVCacheFullError
from ...protocol import Fingerprint
from ...runtime import LlamaContext, LlamaModel
from ._base import Feed

__all__ = ["LlamaEngine", "calibrate_invariant_batch"]

_CALIBRATION_TEXT = (
    "Speculative decoding drafts several tokens with a small model and checks them with a large one; "
    "def add(a, b):\n    return a + b\n"
)


def calibrate_invariant_batch(model: LlamaModel, limit: int, threads: int | None = None) -> int:
    """The largest n <= limit such that every batch of 2..n rows gives the same
    logits, bit for bit, as decoding the rows one at a time.

    Runs in a small context of its own (same model, threads and attention
    kernels as the engine's): one sequence decodes the reference one token at a
    time, as far as the search goes; the other holds the same head and takes
    each trial batch, rolled back after it. The search stops at the first size
    that differs.
    """
    tokens = model.tokenize(_CALIBRATION_TEXT)
    head, span = 4, min(limit, len(tokens) - 4)
    ctx = LlamaContext(model, n_ctx=512, n_batch=max(64, span + 1), n_seq=2, n_threads=threads, flash_attn=True)
    ref, trial = 0, 1
    try:
        for i, tok in enumerate(tokens[:head]):
            ctx.decode([tok], [i], [ref], [False])
            ctx.decode([tok], [i], [trial], [False])
        reference: list[np.ndarray] = []
        best = 1
        for n in range(2, span + 1):
            while len(reference) < n:
                i = head + len(reference)
                ctx.decode([tokens[i]], [i], [ref], [True])
                reference.append(ctx.logits(0).copy())
            ctx.decode(tokens[head : head + n], range(head, head + n), [trial] * n, [True] * n)
            same = all(np.array_equal(ctx.logits(i), reference[i]) for i in range(n))
            ctx.truncate(trial, head)
            if not same:
                break
            best = n
        return best
    finally:
        ctx.close()


class LlamaEngine:
    """The `Engine` over a GGUF target: `max_context` cells per sequence, `n_seq` sequences."""

    def __init__(
        self,
        model_path: str,
        *,
        name: str | None = None,
        max_context: int,
        n_seq: int,
        max_block: int,
        exact: bool = True,
        threads: int | None = None,
    ) -> None:
        self.model = LlamaModel(model_path, name=name, repack=not exact)
        self.name = self.model.name
        self.n_vocab = self.model.n_vocab
        self.n_embd = self.model.n_embd
        n_batch = max(512, max_block + 1)
        self._ctx = LlamaContext(
            self.model,
            n_ctx=max_context * n_seq,
            n_batch=n_batch,
            n_seq=n_seq,
            n_threads=threads,
            flash_attn=True if exact else None,
        )
        self.exact = exact
        self.invariant_batch = calibrate_invariant_batch(self.model, max_block + 1, threads) if exact else 0

    def fingerprint(self) -> Fingerprint:
        return self.model.fingerprint()

    def is_eog(self, token: int) -> bool:
        return self.model.is_eog(token)

    def chat_template(self) -> str | None:
        return self.model.chat_template()

    def run_batch(self, feeds: Sequence[Feed]) -> list[np.ndarray]:
        """One feed after another (sequences are not yet batched together)."""
        return [self._run(feed) for feed in feeds]

    def _run(self, feed: Feed) -> np.ndarray:
        try:
            return self._decode(feed.seq, feed.tokens, feed.start, feed.n_out)
        except KVCacheFullError:
            self._ctx.truncate(feed.seq, feed.start)  # leave the session as it was
            raise

    def _decode(self, seq: int, tokens: Sequence[int], start: int, n_out: int) -> np.ndarray:
        n = len(tokens)
        head = n - n_out
        outs = np.empty((n_out, self.n_vocab), dtype=np.float32)
        if n_out == 0:
            # Prompt prefill: the target-only baseline prefills the same way.
            self._ctx.decode_sequence(tokens, start, seq, last_output=False)
            return outs
        step = self.invariant_batch if self.exact else self._ctx.n_batch
        if head > 0 and not self.exact:
            self._ctx.decode_sequence(tokens[:head], start, seq, last_output=False)
            lo = head
        else:
            lo = 0
        while lo < n:
            hi = min(n, lo + step)
            flags = [i >= head for i in range(lo, hi)]
            self._ctx.decode(tokens[lo:hi], range(start + lo, start + hi), [seq] * (hi - lo), flags)
            for i in range(max(lo, head), hi):
                outs[i - head] = self._ctx.logits(i - lo)  # indexed by batch row
            lo = hi
        return outs

    def truncate(self, seq: int, length: int) -> None:
        self._ctx.truncate(seq, length)

    def release(self, seq: int) -> None:
        self._ctx.remove(seq)

    def cached(self, seq: int) -> int:
        return self._ctx.seq_length(seq)

    def close(self) -> None:
        self._ctx.close()
        self.model.close()
