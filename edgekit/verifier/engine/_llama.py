"""The target model on llama.cpp: one context, one KV sequence per session slot.

A llama context is not thread-safe: `LlamaEngine` is driven by one thread (the
verifier's engine core). Each session's KV holds its committed tokens but the
last, so a round decodes only that token and the draft block: verifying costs
the block, not the context. A batch's feeds run together: llama.cpp decodes
rows of several sequences in one call.

Exact numerics. llama.cpp's CPU kernels depend on the batch size: weight
repacking switches to GEMM kernels at 4 rows, other quantized GEMMs at 8, so a
block verified in one batch gets logits that differ in the last bits from
decoding the same tokens one at a time, and greedy argmaxes near a tie flip.
In exact mode the target loads without repacking, uses flash attention, and
decodes every block in sub-batches no larger than `invariant_batch`: the
largest batch that was measured at start-up to reproduce single-token logits
bit for bit. Greedy speculative output is then token-identical to target-only
decoding (see `calibrate_invariant_batch`). Sub-batches may mix the rows of
several sessions where that was measured exact too (`mixes_sessions_exactly`,
also at start-up); prompts and turns (feeds without outputs) are decoded in
calls of their own, so the KV they leave does not depend on what else ran.
Fast mode decodes up to n_batch rows of any feeds in one call, with every
kernel llama.cpp has.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from ...errors import InferenceError, KVCacheFullError
from ...protocol import Fingerprint
from ...runtime import LlamaContext, LlamaModel
from ._base import Feed, FeedOutput

__all__ = ["LlamaEngine", "calibrate_invariant_batch", "mixes_sessions_exactly"]

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


def mixes_sessions_exactly(model: LlamaModel, n: int, threads: int | None = None) -> bool:
    """Whether a batch of n rows taken from two sequences at different positions
    gives each row the logits it gets decoded alone, bit for bit."""
    if n < 2:
        return True
    texts = (_CALIBRATION_TEXT, "Once upon a time " + _CALIBRATION_TEXT[::-1])
    seqs = [model.tokenize(t) for t in texts]
    heads = (3, 9)  # the two sequences' rows sit at different positions
    take = (n // 2, n - n // 2)
    ctx = LlamaContext(model, n_ctx=1024, n_batch=max(64, n), n_seq=4, n_threads=threads, flash_attn=True)
    try:
        reference: list[np.ndarray] = []
        for s, (toks, h, k) in enumerate(zip(seqs, heads, take)):
            ctx.decode_sequence(toks[:h], 0, s, last_output=False)
            ctx.decode_sequence(toks[:h], 0, 2 + s, last_output=False)
            for i in range(h, h + k):
                ctx.decode([toks[i]], [i], [s], [True])
                reference.append(ctx.logits(0).copy())
        rows = [(2 + s, toks[i], i) for s, (toks, h, k) in enumerate(zip(seqs, heads, take)) for i in range(h, h + k)]
        ctx.decode([t for _, t, _ in rows], [p for _, _, p in rows], [q for q, _, _ in rows], [True] * len(rows))
        return all(np.array_equal(ctx.logits(i), reference[i]) for i in range(len(rows)))
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
        stat = os.stat(model_path)
        self.identity = f"{os.path.basename(model_path)}:{stat.st_size}:{int(stat.st_mtime)}"
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
        # Exact mode mixes sessions in a sub-batch only where that was measured exact here.
        self.mixes_sessions = not exact or mixes_sessions_exactly(self.model, self.invariant_batch, threads)

    def fingerprint(self) -> Fingerprint:
        return self.model.fingerprint()

    def is_eog(self, token: int) -> bool:
        return self.model.is_eog(token)

    def chat_template(self) -> str | None:
        return self.model.chat_template()

    def run_batch(self, feeds: Sequence[Feed]) -> list[FeedOutput]:
        outs = [np.empty((f.n_out, self.n_vocab), dtype=np.float32) for f in feeds]
        hidden = [np.empty((f.n_out, self.n_embd), dtype=np.float32) if f.hidden else None for f in feeds]
        for f in feeds:
            held = self._ctx.seq_length(f.seq)
            if f.start > held:
                raise InferenceError(f"sequence {f.seq} holds {held} tokens; a feed at {f.start} would leave a gap")
            self._ctx.truncate(f.seq, f.start)  # a rolled-back round's cells go first
        try:
            for f in feeds:
                if f.n_out == 0:  # a prompt or a turn: calls of its own, in n_batch chunks (as target-only prefills)
                    self._ctx.decode_sequence(f.tokens, f.start, f.seq, last_output=False)
            self._decode_rows([i for i, f in enumerate(feeds) if f.n_out and not f.hidden], feeds, outs, hidden)
            wanting = [i for i, f in enumerate(feeds) if f.n_out and f.hidden]
            if wanting:  # only the semantic mode's rounds pay for the hidden rows, in calls of their own
                self._ctx.set_embeddings(True)
                try:
                    self._decode_rows(wanting, feeds, outs, hidden)
                finally:
                    self._ctx.set_embeddings(False)
        except KVCacheFullError:
            for f in feeds:
                self._ctx.truncate(f.seq, f.start)  # leave every session as it was
            raise
        return [o if h is None else (o, h) for o, h in zip(outs, hidden)]

    def _decode_rows(
        self, which: list[int], feeds: Sequence[Feed], outs: list[np.ndarray], hidden: list[np.ndarray | None]
    ) -> None:
        """The feeds that want logits: their rows in calls of at most `step` rows, several
        feeds to a call where that is exact (or numerics are fast)."""
        step = self.invariant_batch if self.exact else self._ctx.n_batch
        groups = [which] if self.mixes_sessions else [[i] for i in which]
        for group in groups:
            rows = [(i, r) for i in group for r in range(len(feeds[i].tokens))]
            for lo in range(0, len(rows), step):
                chunk = rows[lo : lo + step]
                self._ctx.decode(
                    [feeds[i].tokens[r] for i, r in chunk],
                    [feeds[i].start + r for i, r in chunk],
                    [feeds[i].seq for i, _ in chunk],
                    [r >= len(feeds[i].tokens) - feeds[i].n_out for i, r in chunk],
                )
                for row, (i, r) in enumerate(chunk):
                    head = len(feeds[i].tokens) - feeds[i].n_out
                    if r >= head:
                        outs[i][r - head] = self._ctx.logits(row)  # indexed by batch row
                        rows_out = hidden[i]
                        if rows_out is not None:
                            rows_out[r - head] = self._ctx.hidden(row)

    def truncate(self, seq: int, length: int) -> None:
        self._ctx.truncate(seq, length)

    def release(self, seq: int) -> None:
        self._ctx.remove(seq)

    def cached(self, seq: int) -> int:
        return self._ctx.seq_length(seq)

    def close(self) -> None:
        self._ctx.close()
        self.model.close()
