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
decodes every block in sub-batches no larger than what was measured at start-up
to reproduce single-token logits bit for bit at that depth of the sequence
(`invariant_batches`: past ~256 cached tokens the CPU attention takes another
path for one row than for several, and only single rows stay exact). Greedy
speculative output is then token-identical to target-only decoding (see
`calibrate_invariant_batches`). Sub-batches may mix the rows of
several sessions where that was measured exact too (`mixes_sessions_exactly`,
also at start-up); prompts and turns (feeds without outputs) are decoded in
calls of their own, so the KV they leave does not depend on what else ran.
Fast mode decodes up to n_batch rows of any feeds in one call, prompts and
turns with the rounds' rows (a GPU pays a step per call, not per row), with
every kernel llama.cpp has.

Greedy rows reduced where they are made. An `argmax` feed wants one id per row. With
`reduce_rows` "llama", llama.cpp's backend
sampling takes each of its rows' argmax on the device and only the id comes back, not a
vocabulary-wide row. A tie at the top then goes as llama.cpp's argmax kernel takes it (the
CPU's: the highest id; the host's rule is the lowest), for rounds and target-only streams
alike. An id past the feed's `argmax` (a padding entry won: llama.cpp's reduction cannot leave
them out) has the feed decoded again with whole rows. Elsewhere the host reduces the rows in
llama.cpp's output buffer (one argmax per decode call).
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ...errors import InferenceError, KVCacheFullError
from ...protocol import Fingerprint
from ...runtime import LlamaContext, LlamaModel, default_threads, gpu_offload, kept_rows, physical_cores
from ._base import Feed, FeedOutput, KeptRows
from ._cache import load_cached, machine_key, store_cached
from ._parking import SequenceSlots

log = logging.getLogger("edgekit.verifier")

# The most sequences a llama.cpp context holds (LLAMA_MAX_SEQ in the vendored version: a larger
# n_seq_max fails to create the context); an engine with more parks the rest (`SequenceSlots`).
MAX_RESIDENT = 256

ReduceRows = Literal["host", "llama"]

# A decode call's reductions (greedy rows' argmaxes, top-k rows' kept logits) run on several threads
# from this many logits on (a GPU step's batch: 640 greedy rows of 152,064 logits took 26-27 ms on one
# thread of a 2-core CPU, 17-20 on two; the next call waits for them, the rows living in llama.cpp's
# buffer until then).
SPLIT_REDUCTION_FROM = 16_000_000

__all__ = [
    "MAX_RESIDENT", "LlamaEngine", "ReduceRows", "bands_between", "calibrate_invariant_batches", "calibration_depths",
    "call_rows", "mixes_sessions_exactly", "rows_exact_between",
]

_CALIBRATION_TEXT = (
    "Speculative decoding drafts several tokens with a small model and checks them with a large one; "
    "def add(a, b):\n    return a + b\n"
)


def calibration_depths(max_context: int, limit: int) -> tuple[int, ...]:
    """Where `calibrate_invariant_batches` may measure: 4, 128, 192, 224, 256, 320, 384,
    512, then 768, 1024, 1536, 2048, ... (each next one at most half again as deep), as
    deep as a block of `limit` rows fits in `max_context`."""
    depths = [4, 128, 192, 224, 256, 320, 384, 512]
    while depths[-1] < max_context:  # 768, 1024, 1536, 2048, 3072, 4096, ...
        d = depths[-1]
        depths.append(d * 3 // 2 if d & (d - 1) == 0 else d * 4 // 3)
    return tuple(d for d in depths if d + limit < max_context) or (0,)


def calibrate_invariant_batches(
    model: LlamaModel, limit: int, depths: Sequence[int], threads: int | None = None
) -> tuple[tuple[int, int], ...]:
    """For each depth d, shallowest first: the largest n such that every batch of 2..n rows
    at positions d.. gives the same logits, bit for bit, as decoding the rows one at a time,
    never more than `limit` nor than a shallower depth allowed (the table only falls with
    depth). Measuring stops at the first depth where only single rows are exact: deeper ones use
    single rows too, which is exact whatever the kernels do there.

    The answer depends on the depth: past 256 cached tokens llama.cpp's CPU attention
    takes a different path for one row than for several (measured on both shipped pairs:
    7 rows exact near the start, only 1 past ~256), so a depth-blind calibration would let
    long prompts drift from target-only decoding. One context of its own (same model,
    threads and attention kernels as the engine's) holds two copies of a long text's
    head, extended depth by depth: one decodes the reference one token at a time, the
    other takes each trial batch; both roll back after each depth.
    """
    need = max(depths) + limit + 1
    reps = 1
    tokens = model.tokenize(_CALIBRATION_TEXT)
    while len(tokens) < need:  # repeated text merges at the seams: grow until long enough
        reps *= 2
        tokens = model.tokenize(_CALIBRATION_TEXT * reps)
    ctx: LlamaContext | None = None
    ref, trial = 0, 1
    out: list[tuple[int, int]] = []
    held, allowed = 0, limit
    try:
        for depth in sorted(depths):
            if ctx is None:
                n_ctx = 2 * (-(-need // 256) * 256)
                ctx = LlamaContext(model, n_ctx=n_ctx, n_batch=512, n_seq=2, n_threads=threads, flash_attn=True)
            for seq in (ref, trial):  # both sequences hold the same head, decoded the same way
                ctx.decode_sequence(tokens[held:depth], held, seq, last_output=False)
            held = depth
            reference: list[np.ndarray] = []
            best = 1
            for n in range(2, allowed + 1):
                while len(reference) < n:
                    i = depth + len(reference)
                    ctx.decode([tokens[i]], [i], [ref], [True])
                    reference.append(ctx.logits(0).copy())
                ctx.decode(tokens[depth : depth + n], range(depth, depth + n), [trial] * n, [True] * n)
                same = all(np.array_equal(ctx.logits(i), reference[i]) for i in range(n))
                ctx.truncate(trial, depth)
                if not same:
                    break
                best = n
            ctx.truncate(ref, depth)
            out.append((depth, best))
            allowed = best
            if best == 1:
                break  # nothing deeper can be taken fewer rows at a time: the rest is single rows
        return tuple(out)
    finally:
        if ctx is not None:
            ctx.close()


def bands_between(table: Sequence[tuple[int, int]], lo: int, hi: int) -> list[int]:
    """The calibrated bands rows at positions lo..hi-1 touch: band j is [d_j, d_j+1), the
    first from 0, the last without end."""
    out = []
    for j, (depth, _) in enumerate(table):
        band_lo = 0 if j == 0 else depth
        band_hi = table[j + 1][0] if j + 1 < len(table) else None
        if (band_hi is None or lo < band_hi) and hi > band_lo:
            out.append(j)
    return out


def call_rows(max_block: int, max_batch_rows: int, offloaded: bool) -> int:
    """Rows one llama.cpp call decodes (the context's n_batch and n_ubatch). On a CPU, 512: a
    call's cost grows with its rows, so splitting a batch costs nothing, and a larger call's
    buffers do (a logits row per output, a vocabulary wide). On a GPU a call costs a step whatever
    its rows until the GPU is compute-bound (the roofline), so a batch the scheduler formed of up
    to `max_batch_rows` rows is one call, not one per 512."""
    rows = max(512, max_block + 1)
    return max(rows, max_batch_rows) if offloaded else rows


def rows_exact_between(table: Sequence[tuple[int, int]], lo: int, hi: int) -> int:
    """Rows per sub-batch that stay exact for rows at positions lo..hi-1: the fewest over the
    bands they touch, each allowing the smaller of what its two ends measured (the last, its own)."""
    rows = [min(table[j][1], table[j + 1][1]) if j + 1 < len(table) else table[j][1]
            for j in bands_between(table, lo, hi)]
    return min(rows, default=1)


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
    """The `Engine` over a GGUF target: `max_context` cells per sequence, `n_seq` sequences, of
    which `resident` (at most `MAX_RESIDENT`) are held in the llama.cpp context at once, the
    others parked (`SequenceSlots`: their KV copied aside, loaded back when named)."""

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
        cache_dir: Path | None = None,
        recalibrate: bool = False,
        gpu_layers: int | None = None,
        resident: int | None = None,
        max_batch_rows: int = 0,
        reduce_rows: ReduceRows = "host",
    ) -> None:
        """`cache_dir`: where the exact mode's calibration is kept between starts (None: measured
        every time); `recalibrate` measures again whatever is kept. `gpu_layers`: see `LlamaModel`.
        `resident`: sequences the context holds (None: all `n_seq`, up to `MAX_RESIDENT`); KV
        memory in the context is `max_context` x `resident`. `max_batch_rows`: the most rows the
        scheduler puts in one batch; on a GPU a call takes them all (`call_rows`). `reduce_rows`:
        where greedy rows become their best ids, "host" (whole rows out, one argmax per call) or
        "llama" (llama.cpp's backend sampling, only the ids leaving the device)."""
        resident = min(n_seq, MAX_RESIDENT) if resident is None else resident
        if not 1 <= resident <= MAX_RESIDENT:
            raise ValueError(f"a llama.cpp context holds 1 to {MAX_RESIDENT} sequences, not {resident}")
        self.model = LlamaModel(model_path, name=name, repack=not exact, gpu_layers=gpu_layers)
        self.name = self.model.name
        stat = os.stat(model_path)
        self.identity = f"{os.path.basename(model_path)}:{stat.st_size}:{int(stat.st_mtime)}"
        if gpu_offload():  # the kernels, and with them calibrations, differ with the layers offloaded
            self.identity += f":gpu-layers={-1 if self.model.gpu_layers is None else self.model.gpu_layers}"
        self.n_vocab = self.model.n_vocab
        self.n_embd = self.model.n_embd
        offloaded = gpu_offload() and self.model.gpu_layers != 0
        n_batch = call_rows(max_block, max_batch_rows, offloaded)
        resident = min(resident, n_seq)
        if reduce_rows not in ("host", "llama"):
            raise ValueError(f"reduce_rows must be host or llama, not {reduce_rows!r}")
        # whether llama.cpp reduces greedy rows (`_take_outputs`); off for good where it cannot
        self.reduces_in_llama = reduce_rows == "llama"
        self._redo: list[int] = []  # this batch's feeds to decode again with whole rows (`_take_outputs`)
        self._reduce_pool: ThreadPoolExecutor | None = None  # made at the first call that splits its reductions
        self._ctx = LlamaContext(
            self.model,
            n_ctx=max_context * resident,
            n_batch=n_batch,
            n_seq=resident,
            n_threads=threads,
            flash_attn=True if exact else None,
            outputs_per_seq=max_block + 1 if self.reduces_in_llama else 1,
        )
        ctx = self._ctx
        self.slots = SequenceSlots(
            n_seq, resident, save=ctx.save_sequence, load=ctx.load_sequence, remove=ctx.remove,
            truncate=ctx.truncate, length=ctx.seq_length,
        )
        self.exact = exact
        # Exact mode: rows per sub-batch that keep logits bit-exact, by depth (see calibrate_invariant_batches).
        self.invariant_batches = (
            self._invariant_batches(model_path, max_block + 1, max_context, threads, cache_dir, recalibrate)
            if exact else ()
        )
        # what the start of a sequence allows (deeper bands may allow fewer; `invariant_batches` has them all)
        self.invariant_batch = self.invariant_batches[0][1] if exact else 0
        # Exact mode mixes sessions in a sub-batch only where that was measured exact here.
        self.mixes_sessions = not exact or mixes_sessions_exactly(self.model, self.invariant_batch, threads)

    def _invariant_batches(
        self, path: str, limit: int, max_context: int, threads: int | None, cache_dir: Path | None, again: bool
    ) -> tuple[tuple[int, int], ...]:
        depths = calibration_depths(max_context, limit)
        stat = os.stat(path)
        key = {"model": os.path.basename(path), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns,
               "threads": threads or default_threads(), "limit": limit, "depths": list(depths), **machine_key()}
        if gpu_offload():
            key["engine"] = self.identity  # the layers offloaded
        if cache_dir is not None and not again:
            kept = load_cached(cache_dir, "invariant-batches", key)
            if isinstance(kept, list) and all(isinstance(r, list) and len(r) == 2 for r in kept):
                return tuple((int(d), int(n)) for d, n in kept)
        table = calibrate_invariant_batches(self.model, limit, depths, threads)
        if cache_dir is not None:
            store_cached(cache_dir, "invariant-batches", key, [list(r) for r in table])
        return table

    def fingerprint(self) -> Fingerprint:
        return self.model.fingerprint()

    def is_eog(self, token: int) -> bool:
        return self.model.is_eog(token)

    def chat_template(self) -> str | None:
        return self.model.chat_template()

    def sampling_defaults(self) -> dict[str, float]:
        return self.model.sampling_defaults()

    def run_batch(self, feeds: Sequence[Feed]) -> list[FeedOutput]:
        if not self.slots.parking:
            return self._run_resident(feeds)
        # More sessions than the context holds: each run of the batch naming at most as many
        # sequences as it holds is placed (others parked) and run on the context's sequences.
        outputs: list[FeedOutput] = []
        for group in self.slots.groups([f.seq for f in feeds]):
            placed = self.slots.place({feeds[i].seq for i in group})
            for i in group:
                f = feeds[i]
                self.slots.ran(f.seq, f.start + len(f.tokens) if f.n_out == 0 else None)
            outputs += self._run_resident([replace(feeds[i], seq=placed[feeds[i].seq]) for i in group])
        return outputs

    def _run_resident(self, feeds: Sequence[Feed]) -> list[FeedOutput]:
        """Runs feeds whose sequences are the context's own."""
        outs: list[Any] = [  # each feed's: logits, best ids, or (a cut) its rows' kept (ids, logits)
            np.empty(f.n_out, dtype=np.int64) if f.argmax else [None] * f.n_out if f.cuts
            else np.empty((f.n_out, self.n_vocab), dtype=np.float32)
            for f in feeds
        ]
        hidden = [np.empty((f.n_out, self.n_embd), dtype=np.float32) if f.hidden else None for f in feeds]
        for f in feeds:
            held = self._ctx.seq_length(f.seq)
            if f.start > held:
                raise InferenceError(f"sequence {f.seq} holds {held} tokens; a feed at {f.start} would leave a gap")
            self._ctx.truncate(f.seq, f.start)  # a rolled-back round's cells go first
        self._redo = []
        try:
            rows = []  # the feeds decoded in the batch's shared calls
            for i, f in enumerate(feeds):
                if f.n_out == 0 and self.exact and f.generated:
                    self._rebuild(f)
                elif f.n_out == 0 and self.exact:
                    # a prompt or a turn: calls of its own, in n_batch chunks (as target-only prefills),
                    # so that the KV it leaves does not depend on what else ran
                    self._ctx.decode_sequence(f.tokens, f.start, f.seq, last_output=False)
                elif not f.hidden:  # fast numerics: a prompt's rows go in the same calls as the rounds'
                    rows.append(i)
            self._decode_rows(rows, feeds, outs, hidden)
            wanting = [i for i, f in enumerate(feeds) if f.n_out and f.hidden]
            if wanting:  # only the semantic mode's rounds pay for the hidden rows, in calls of their own
                self._ctx.set_embeddings(True)
                try:
                    self._decode_rows(wanting, feeds, outs, hidden)
                finally:
                    self._ctx.set_embeddings(False)
            for i in self._redo:  # with whole rows this time: their cells are written again, the same
                self._ctx.reduce_rows(feeds[i].seq, False)
                self._ctx.truncate(feeds[i].seq, feeds[i].start)
                self._decode_rows([i], feeds, outs, hidden)
        except KVCacheFullError:
            for f in feeds:
                self._ctx.truncate(f.seq, f.start)  # leave every session as it was
            raise
        # a cutting feed's rows, reduced (it wants no hidden rows: only the semantic mode's rounds do)
        return [KeptRows.of(o) if isinstance(o, list) else o if h is None else (o, h) for o, h in zip(outs, hidden)]

    def _rebuild(self, feed: Feed) -> None:
        """A `generated` feed's rows as rounds decoded them: band by band of the calibrated depths,
        each in that band's exact sub-batches (one row at a time past the depth where only single
        rows are exact), in position order, no logits out (the cells do not depend on which rows
        output: only the last layer's output rows are cut)."""
        end = feed.start + len(feed.tokens)
        cuts = [d for d, _ in self.invariant_batches[1:] if feed.start < d < end]
        bounds = [feed.start, *cuts, end]
        none: list[Any] = [np.empty((0, self.n_vocab), dtype=np.float32)]
        for lo, hi in itertools.pairwise(bounds):
            piece = replace(feed, start=lo, tokens=feed.tokens[lo - feed.start : hi - feed.start])
            self._decode_rows([0], [piece], none, [None])

    def _decode_rows(
        self, which: list[int], feeds: Sequence[Feed], outs: list[Any], hidden: list[np.ndarray | None]
    ) -> None:
        """The feeds that want logits: their rows in calls of at most `step` rows, several
        feeds to a call where that is exact (or numerics are fast)."""
        if not self.exact:
            groups = [(which, self._ctx.n_batch)]
        else:  # the depth decides the kernels: feeds share calls only where they allow as many rows
            steps = {i: rows_exact_between(self.invariant_batches, feeds[i].start,
                                           feeds[i].start + len(feeds[i].tokens)) for i in which}
            # mixing was measured near the start: only feeds in the same bands, allowing as many rows, mix
            by_band: dict[tuple[int, ...], list[int]] = {}
            for i in which:
                key = (steps[i], *bands_between(self.invariant_batches, feeds[i].start,
                                                feeds[i].start + len(feeds[i].tokens)))
                by_band.setdefault(key, []).append(i)
            groups = ([(g, k[0]) for k, g in by_band.items()] if self.mixes_sessions
                      else [([i], steps[i]) for i in which])
        for group, step in groups:
            rows = [(i, r) for i in group for r in range(len(feeds[i].tokens))]
            for lo in range(0, len(rows), step):
                chunk = rows[lo : lo + step]
                wanted = [r >= len(feeds[i].tokens) - feeds[i].n_out for i, r in chunk]
                if self.reduces_in_llama:
                    self._set_reductions({i for (i, _), want in zip(chunk, wanted) if want}, feeds)
                self._ctx.decode(
                    [feeds[i].tokens[r] for i, r in chunk],
                    [feeds[i].start + r for i, r in chunk],
                    [feeds[i].seq for i, _ in chunk],
                    wanted,
                )
                self._take_outputs(chunk, wanted, feeds, outs, hidden)

    def _set_reductions(self, outputting: set[int], feeds: Sequence[Feed]) -> None:
        """Has llama.cpp reduce the rows of the `outputting` feeds that want only best ids, and give
        the others' rows whole (a sequence keeps its setting until a feed wants otherwise)."""
        for i in outputting:
            f = feeds[i]
            if not self._ctx.reduce_rows(f.seq, bool(f.argmax) and i not in self._redo):
                # llama.cpp cannot run it on this backend: the host reduces every row from now on
                self.reduces_in_llama = False
                for seq in range(self._ctx.n_seq):
                    self._ctx.reduce_rows(seq, False)
                log.warning("llama.cpp cannot reduce rows on this backend; the host reduces them")
                return

    def _take_outputs(self, chunk: list[tuple[int, int]], wanted: list[bool], feeds: Sequence[Feed],
                      outs: list[Any], hidden: list[np.ndarray | None]) -> None:
        """A decode's outputs to their feeds: each feed's rows in one slice of llama.cpp's output
        buffer (in batch order), reduced there for an `argmax` feed, else copied whole; an `argmax`
        feed whose rows llama.cpp reduced reads its best ids from llama.cpp's reduction."""
        view = self._ctx.output_logits(sum(wanted))
        jobs: list[tuple[int, Callable[[], object]]] = []  # (logits read, a reduction): run below
        taken = 0
        for i, run in itertools.groupby(zip(range(len(chunk)), chunk, wanted), key=lambda x: x[1][0]):
            rows = [(row, r) for row, (_, r), want in run if want]  # a suffix of the feed's rows in this chunk
            if not rows:
                continue
            f = feeds[i]
            first, m = rows[0][1] - (len(f.tokens) - f.n_out), len(rows)
            block = view[taken : taken + m]
            if f.argmax and self._ctx.reduces(f.seq):
                best = [self._ctx.best(row) for row, _ in rows]
                if all(0 <= b < f.argmax for b in best):
                    outs[i][first : first + m] = best
                elif i not in self._redo:  # a padding entry won (or no id came back): whole rows (`_run_resident`)
                    self._redo.append(i)
            elif f.argmax:
                best_of = functools.partial(np.argmax, block[:, : f.argmax], 1, outs[i][first : first + m])
                jobs.append((m * f.argmax, best_of))
            elif f.cuts:
                kept = functools.partial(_keep_into, outs[i], first, block, f)
                jobs.append((block.size, kept))
            else:
                outs[i][first : first + m] = block
            rows_out = hidden[i]
            if rows_out is not None:
                for k, (row, _) in enumerate(rows):
                    rows_out[first + k] = self._ctx.hidden(row)
            taken += m
        self._reduce(jobs)

    def _reduce(self, jobs: list[tuple[int, Callable[[], object]]]) -> None:
        """Runs each feed's reduction of its rows (argmaxes, or a top-k sampler's kept logits), which
        write into its output: on several threads where the call's rows are many (numpy's argmax and
        the kernel's `kept_rows` let go of the GIL), else here."""
        if sum(size for size, _ in jobs) < SPLIT_REDUCTION_FROM or len(jobs) < 2 or physical_cores() < 2:
            for _, job in jobs:
                job()
            return
        if self._reduce_pool is None:
            self._reduce_pool = ThreadPoolExecutor(min(8, physical_cores()), thread_name_prefix="edgekit-reduce")
        for done in [self._reduce_pool.submit(job) for _, job in jobs]:
            done.result()

    def truncate(self, seq: int, length: int) -> None:
        self.slots.truncate(seq, length)

    def settle(self, seq: int, length: int) -> None:
        self.slots.settle(seq, length)

    def release(self, seq: int) -> None:
        self.slots.release(seq)

    def cached(self, seq: int) -> int:
        return self.slots.length(seq)

    def close(self) -> None:
        if self._reduce_pool is not None:
            self._reduce_pool.shutdown()
        self._ctx.close()
        self.model.close()


def _keep_into(out: list[Any], first: int, rows: np.ndarray, feed: Feed) -> None:
    """The logits of `rows` that `feed`'s cut keeps, into `out` from `first` on."""
    out[first : first + rows.shape[0]] = kept_rows(rows, feed.keep, feed.within or rows.shape[1], feed.spread)
