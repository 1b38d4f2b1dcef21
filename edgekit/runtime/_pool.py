"""One draft model, several tasks: a KV sequence per task, their steps batched.

A `DraftPool` hands out `DraftSlot`s, each a `DraftModel` on a sequence of its own, so
a session drafting in a slot keeps its KV cache whatever the others do (no re-prefill
when tasks take turns). Steps that several slots ask for at about the same time run as
one decode with a row per task: llama.cpp batches across sequence ids, and a decode of
four one-token rows costs little more than one on a CPU (the weights are read once).

Every decode runs on one thread of the pool's own, which takes everything asked for so
far; whoever asks while it runs waits, and the next decode takes all of those at once.
Nothing waits on a timer, so a task drafting alone pays only the hand-over. One thread:
llama.cpp's CPU backend here is built with OpenMP, which keeps a team of threads per
calling thread, and decodes called from several threads ran at about half the speed of
the same decodes from one (measured: benchmarks/draft_pool.py). Everything that touches
the context (decodes, rollbacks) runs there, one at a time.

The backend seam (`PoolBackend`) runs one batch: `LlamaPoolBackend` on llama.cpp here,
a toy one in `edgekit.testing` for tests.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

import numpy as np

from ..errors import EdgekitError, LimitExceededError
from ..protocol import Fingerprint
from ._device import ensure_fits
from ._draft import DraftOutput, Vocabulary
from ._llama import LlamaContext, LlamaModel

__all__ = ["DraftPool", "DraftSlot", "LlamaPoolBackend", "PoolBackend", "Step"]

T = TypeVar("T")


@dataclass
class Step:
    """Tokens appended to one sequence; with `output`, the last one's logits (and hidden state)."""

    seq: int
    start: int  # the position of the first token
    tokens: Sequence[int]
    output: bool = True
    hidden: bool = False


class PoolBackend(Protocol):
    """What runs a pool's batches: `max_rows` rows per decode, `n_ctx_seq` positions per sequence."""

    @property
    def vocab(self) -> Vocabulary: ...

    n_seq: int
    n_ctx_seq: int
    max_rows: int

    def run(self, steps: Sequence[Step]) -> list[DraftOutput | None]:
        """One decode of all the steps (their rows together fit `max_rows`, and all have the same
        `hidden`); each step's output, copied (it must outlive the next decode), or None."""
        ...

    def truncate(self, seq: int, length: int) -> None: ...

    def close(self) -> None: ...


@dataclass(eq=False)
class _Ask:
    step: Step | None
    op: Callable[[], object] | None = None  # something else that needs the context to itself
    result: object = None
    error: BaseException | None = None
    done: bool = False


class DraftPool:
    """Slots on one draft model; their steps batched by group commit (see the module)."""

    def __init__(self, backend: PoolBackend, *, coalesce: bool = True) -> None:
        """coalesce=False runs every step in a decode of its own (the slots still keep their
        sequences): for measuring what batching adds."""
        self.backend = backend
        self.coalesce = coalesce
        self.vocab = backend.vocab
        self._cond = threading.Condition()
        self._queue: list[_Ask] = []
        self._busy = False
        self._free = list(range(backend.n_seq))
        self._closed = False
        self._runner: threading.Thread | None = None
        # What batching did: decodes run, and rows (steps) in them, for the stats and benchmarks.
        self.decodes = 0
        self.steps = 0

    @property
    def slots(self) -> int:
        return self.backend.n_seq

    def free_slots(self) -> int:
        with self._cond:
            return len(self._free)

    def acquire(self) -> DraftSlot | None:
        """A free slot (its sequence empty), or None when all are taken."""
        with self._cond:
            if self._closed:
                raise EdgekitError("the draft pool is closed")
            if not self._free:
                return None
            seq = self._free.pop(0)
        return DraftSlot(self, seq)

    def release(self, slot: DraftSlot) -> None:
        """Gives the slot back, its sequence emptied (nothing to do once the pool is closed)."""
        if slot._released:
            return
        slot._released = True
        slot._n_past = 0
        with self._cond:
            if self._closed:
                return
        try:
            self.exclusive(lambda: self.backend.truncate(slot.seq, 0))
        except EdgekitError:
            return  # closed meanwhile: the sequence goes with the context
        with self._cond:
            self._free.append(slot.seq)

    def close(self) -> None:
        """Frees the model; steps still waiting fail (EdgekitError), the one running finishes first."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            for a in self._queue:
                a.error, a.done = EdgekitError("the draft pool is closed"), True
            self._queue.clear()
            self._cond.notify_all()
            while self._busy:
                self._cond.wait()
            self._busy = True
            runner = self._runner
        if runner is not None and runner is not threading.current_thread():
            runner.join()
        self.backend.close()

    # -- running -------------------------------------------------------------------------

    def step(self, step: Step) -> DraftOutput | None:
        """Runs the step, in one decode with whatever else is asked for meanwhile."""
        limit = self.backend.max_rows
        while len(step.tokens) > limit:  # a long prefill: in chunks, the last with the output
            self._submit(_Ask(Step(step.seq, step.start, step.tokens[:limit], output=False)))
            step = Step(step.seq, step.start + limit, step.tokens[limit:], step.output, step.hidden)
        out = self._submit(_Ask(step))
        assert out is None or isinstance(out, DraftOutput)
        return out

    def exclusive(self, op: Callable[[], T]) -> T:
        """Runs `op` with the context to itself (between decodes)."""
        return self._submit(_Ask(None, op))  # type: ignore[return-value]

    def _submit(self, ask: _Ask) -> object:
        with self._cond:
            if self._closed:
                raise EdgekitError("the draft pool is closed")
            if self._runner is None:
                self._runner = threading.Thread(target=self._loop, name="edgekit-draft-pool", daemon=True)
                self._runner.start()
            self._queue.append(ask)
            self._cond.notify_all()
            while not ask.done:
                self._cond.wait()
        if ask.error is not None:
            raise ask.error
        return ask.result

    def _loop(self) -> None:
        """The pool's thread: batches, one at a time, until the pool closes."""
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                batch = self._take()
                self._busy = True
            try:
                self._run(batch)
            except BaseException as exc:  # nothing may end this thread but close()
                for a in batch:
                    a.error = a.error or exc
            finally:
                with self._cond:
                    self._busy = False
                    for a in batch:
                        a.done = True
                    self._cond.notify_all()

    def _take(self) -> list[_Ask]:
        """The next batch: an op alone, or steps of one kind (hidden or not) that fit a decode, in order."""
        first = self._queue[0]
        if first.step is None or not self.coalesce:
            return [self._queue.pop(0)]
        batch, rows, rest = [], 0, []
        for a in self._queue:
            s = a.step
            if s is not None and s.hidden == first.step.hidden and rows + len(s.tokens) <= self.backend.max_rows:
                batch.append(a)
                rows += len(s.tokens)
            else:
                rest.append(a)
        self._queue = rest
        return batch

    def _run(self, batch: list[_Ask]) -> None:
        if batch[0].step is None:
            op = batch[0].op
            assert op is not None
            try:
                batch[0].result = op()
            except BaseException as exc:  # raised in the caller's thread, not the runner's
                batch[0].error = exc
            return
        steps = [a.step for a in batch if a.step is not None]
        try:
            outputs = self.backend.run(steps)
        except Exception as exc:
            for s in steps:  # a failed decode may have stored some rows (llama.cpp splits batches)
                self._rollback(s)
            if len(batch) == 1:
                batch[0].error = exc
                return
            for a in batch:  # whose step it was: each again on its own
                self._run([a])
            return
        except BaseException as exc:  # anything else: every step fails with it
            for s in steps:
                self._rollback(s)
            for a in batch:
                a.error = exc
        self.decodes += 1
        self.steps += len(steps)
        for a, out in zip(batch, outputs, strict=True):
            a.result = out

    def _rollback(self, step: Step) -> None:
        """Drops whatever a failed decode may have stored of the step (from its start on)."""
        try:
            self.backend.truncate(step.seq, step.start)
        except Exception:  # nothing stored, or nothing more to undo
            pass


class DraftSlot:
    """A `DraftModel` on one sequence of a `DraftPool`: evals, prefills and rollbacks of its own."""

    def __init__(self, pool: DraftPool, seq: int) -> None:
        self.pool = pool
        self.seq = seq
        vocab = pool.vocab
        self.name = vocab.name
        self.n_vocab = vocab.n_vocab
        self.n_embd = vocab.n_embd
        self.n_ctx = pool.backend.n_ctx_seq
        self._n_past = 0
        self._released = False
        self.decoded_tokens = 0

    @property
    def n_past(self) -> int:
        return self._n_past

    def fingerprint(self) -> Fingerprint:
        return self.pool.vocab.fingerprint()

    def tokenize(self, text: str, *, add_special: bool = True) -> list[int]:
        return self.pool.vocab.tokenize(text, add_special=add_special)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self.pool.vocab.detokenize(tokens)

    def token_bytes(self, token: int, *, special: bool = False) -> bytes:
        return self.pool.vocab.token_bytes(token, special=special)

    def is_eog(self, token: int) -> bool:
        return self.pool.vocab.is_eog(token)

    def chat_template(self) -> str | None:
        return self.pool.vocab.chat_template()

    def _check(self, n: int) -> None:
        if self._released:
            raise EdgekitError("this draft slot was given back to its pool")
        if self._n_past + n > self.n_ctx:
            raise LimitExceededError(f"draft context full ({self.n_ctx} tokens)")

    def eval(self, tokens: Sequence[int], *, hidden: bool = False) -> DraftOutput:
        if not tokens:
            raise ValueError("eval needs at least one token")
        self._check(len(tokens))
        if hidden and len(tokens) > 1:  # hidden states only for the one row that outputs (as LlamaDraftModel)
            self.prefill(tokens[:-1])
            tokens = tokens[-1:]
        out = self._step(Step(self.seq, self._n_past, list(tokens), output=True, hidden=hidden))
        assert out is not None
        return out

    def prefill(self, tokens: Sequence[int]) -> None:
        if tokens:
            self._check(len(tokens))
            self._step(Step(self.seq, self._n_past, list(tokens), output=False))

    def _step(self, step: Step) -> DraftOutput | None:
        try:
            out = self.pool.step(step)
        except BaseException:
            # Part of a chunked prefill may have run: the sequence goes back to what this slot holds.
            if not self._released:
                try:
                    self.pool.exclusive(lambda: self.pool._rollback(step))
                except EdgekitError:
                    pass  # the pool is closed
            raise
        self._n_past += len(step.tokens)
        self.decoded_tokens += len(step.tokens)
        return out

    def truncate(self, length: int) -> None:
        if self._released:
            return  # it holds nothing; its sequence may be another slot's by now
        if length < self._n_past:
            self.pool.exclusive(lambda: self.pool.backend.truncate(self.seq, length))
            self._n_past = length

    def close(self) -> None:
        """Gives the slot back (the pool's model stays loaded)."""
        self.pool.release(self)


class LlamaPoolBackend:
    """A pool's batches on llama.cpp: one context with a KV stream per sequence."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        slots: int,
        n_ctx_seq: int = 4096,
        n_batch: int = 512,
        n_threads: int | None = None,
        name: str | None = None,
    ) -> None:
        if slots < 1:
            raise ValueError("a draft pool needs at least one slot")
        ensure_fits(path, n_ctx_seq * slots, name or Path(path).stem, sequences=slots)
        self.vocab = self._model = LlamaModel(path, name=name)
        try:
            self._ctx = LlamaContext(self._model, n_ctx=n_ctx_seq * slots, n_batch=n_batch, n_seq=slots,
                                     n_threads=n_threads)
        except BaseException:
            self._model.close()
            raise
        self.n_seq = slots
        self.n_ctx_seq = self._ctx.n_ctx_seq
        self.max_rows = n_batch

    def run(self, steps: Sequence[Step]) -> list[DraftOutput | None]:
        tokens: list[int] = []
        positions: list[int] = []
        seqs: list[int] = []
        outputs: list[bool] = []
        last_rows: list[int] = []
        for s in steps:
            n = len(s.tokens)
            tokens.extend(s.tokens)
            positions.extend(range(s.start, s.start + n))
            seqs.extend([s.seq] * n)
            outputs.extend([False] * (n - 1) + [s.output])
            last_rows.append(len(tokens) - 1)
        self._ctx.set_embeddings(any(s.hidden for s in steps))
        self._ctx.decode(tokens, positions, seqs, outputs)
        # Copies: the next decode, anyone's, overwrites the context's output buffers.
        return [
            DraftOutput(
                np.array(self._ctx.logits(row), dtype=np.float32),
                np.array(self._ctx.hidden(row), dtype=np.float32) if s.hidden else None,
            )
            if s.output
            else None
            for s, row in zip(steps, last_rows, strict=True)
        ]

    def truncate(self, seq: int, length: int) -> None:
        self._ctx.truncate(seq, length)

    def close(self) -> None:
        self._ctx.close()
        self._model.close()
