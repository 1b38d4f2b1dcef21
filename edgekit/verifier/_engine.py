"""The target model on llama.cpp: one context, one KV sequence per session.

Every llama.cpp call goes through `TargetEngine` under one lock (a llama
context is not thread-safe). Each session's KV holds its committed tokens but
the last, so a round decodes only that token and the draft block: verifying
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

import threading
import time
from typing import Sequence

import numpy as np

from .._llama import KVCacheFullError, LlamaContext, LlamaModel

__all__ = ["TargetEngine", "calibrate_invariant_batch"]

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


class TargetEngine:
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
        n_batch = max(512, max_block + 1)
        self._ctx = LlamaContext(
            self.model,
            n_ctx=max_context * n_seq,
            n_batch=n_batch,
            n_seq=n_seq,
            n_threads=threads,
            flash_attn=True if exact else None,
        )
        self._lock = threading.Lock()
        self.exact = exact
        self.invariant_batch = calibrate_invariant_batch(self.model, max_block + 1, threads) if exact else 0

    def run(self, seq: int, tokens: Sequence[int], start: int, n_out: int) -> tuple[np.ndarray, float, float]:
        """Appends tokens to a sequence; returns the last n_out rows' logits (a copy),
        the time spent waiting for the engine and the time spent decoding, in ms."""
        t_wait = time.perf_counter()
        with self._lock:
            t0 = time.perf_counter()
            try:
                logits = self._run_locked(seq, tokens, start, n_out)
            except KVCacheFullError:
                self._ctx.truncate(seq, start)  # leave the session as it was
                raise
            t1 = time.perf_counter()
        return logits, (t0 - t_wait) * 1e3, (t1 - t0) * 1e3

    def _run_locked(self, seq: int, tokens: Sequence[int], start: int, n_out: int) -> np.ndarray:
        n = len(tokens)
        head = n - n_out
        outs = np.empty((n_out, self.model.n_vocab), dtype=np.float32)
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
        with self._lock:
            self._ctx.truncate(seq, length)

    def drop(self, seq: int) -> None:
        with self._lock:
            self._ctx.remove(seq)
