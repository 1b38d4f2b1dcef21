"""The engine seam of the verifier: runs batches of sequence feeds, decides nothing."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ...protocol import Fingerprint

__all__ = ["Engine", "Feed", "FeedOutput", "KeptRows", "split_output"]


@dataclass(frozen=True)
class Feed:
    """Tokens for one KV sequence, from position `start` on, and how many of the
    last ones want logits.

    The sequence is cut to `start` tokens first: cells past it (a rejected block,
    an abandoned SH round) go when the session's next feed runs, so a round needs
    no separate rollback. `start` may not pass the sequence's end. A prompt or a
    turn wants no logits (`n_out=0`); a verification round wants the block's K+1.
    `hidden`: the round also wants the target's final-layer, post-norm hidden state
    at those positions (the semantic mode reads them; no other mode pays for them).
    `argmax`: the round wants only each of those rows' best id among the first `argmax` ids
    (greedy with plain logits: the engine reduces its rows where they are made, and no row of
    logits is copied out); 0, the default: their logits.
    `keep`, `spread`: sampling under a top-k or min-p sampler wants, of each of those rows, only
    the logits among the first `within` ids that reach both the row's `keep`-th largest (those tied
    with it kept too; 0: no such cut) and its largest less `spread` (inf: no such cut;
    `Sampler.support_cut` gives both): the engine reduces its rows where they are made, and the
    round gets them as `KeptRows` (the sampler's distribution is zero everywhere else, so nothing it
    needs is lost).
    `generated`: tokens that rounds decoded before, given again to rebuild a session's KV the way
    it was built (a reopened session's history): decoded as a round's rows are (in exact mode, the
    calibrated sub-batches, so that every cell is what the rounds left), not in a prompt's chunks;
    it wants no logits (`n_out=0`).
    """

    seq: int
    start: int
    tokens: tuple[int, ...]
    n_out: int
    hidden: bool = False
    argmax: int = 0
    keep: int = 0
    within: int = 0
    generated: bool = False
    spread: float = math.inf

    @property
    def cuts(self) -> bool:
        """Whether the feed wants its rows' kept logits (`keep` or `spread` cuts)."""
        return self.keep > 0 or self.spread < math.inf


@dataclass(frozen=True)
class KeptRows:
    """A cutting feed's rows, reduced (`Feed.cuts`): `logits` [n_out, len(ids)] at the vocabulary's `ids` (sorted,
    int64), each row's kept logits and -inf at the ids only another row kept."""

    logits: np.ndarray
    ids: np.ndarray

    @staticmethod
    def of(rows: Sequence[tuple[np.ndarray, np.ndarray]]) -> KeptRows:
        """From each row's kept (ids, logits), as `edgekit.runtime.kept_rows` gives them."""
        ids = np.unique(np.concatenate([i for i, _ in rows])) if rows else np.empty(0, dtype=np.int64)
        out = np.full((len(rows), ids.size), -np.inf, dtype=np.float32)
        for r, (i, v) in enumerate(rows):
            out[r, np.searchsorted(ids, i)] = v
        return KeptRows(out, ids.astype(np.int64))


# logits; (logits, hidden) for a `hidden` feed; the rows' best ids ([n_out] int64) for an `argmax` one;
# `KeptRows` for one that `cuts`
FeedOutput = np.ndarray | tuple[np.ndarray, np.ndarray] | KeptRows


def split_output(out: FeedOutput) -> tuple[np.ndarray | KeptRows, np.ndarray | None]:
    """A feed's logits (or kept rows) and its hidden rows (None unless the feed asked for them)."""
    if isinstance(out, tuple):
        return out
    return out, None


class Engine(Protocol):
    """A target model with a KV sequence per session slot.

    `run_batch` runs feeds of several sequences and returns, per feed, the
    logits of its last `n_out` positions ([n_out, n_vocab] float32, copies),
    or for a feed with `hidden` set the pair (logits, hidden [n_out, n_embd]), or for a feed
    with `argmax` set its rows' best ids ([n_out] int64; the first best where several tie), or
    for a feed that `cuts` (`keep`, `spread`) its rows' kept logits (`KeptRows`).
    A feed that does not fit raises `KVCacheFullError`, leaving the sequences
    at their feeds' starts. `truncate` cuts a sequence, `release` empties it (for
    callers outside the verifier: it needs neither); `cached` says how many
    tokens a sequence holds. `settle` tells it, once a round's verdict is applied, where the
    sequence's next feed will start (the cells past it are never read again): an engine that
    parks sequences (`LlamaEngine`) cuts them there first; any thread may call it.
    """

    name: str
    identity: str  # what a calibration of its speed holds for (the model file, or the toy's make)
    n_vocab: int
    n_embd: int  # the target's hidden size
    exact: bool  # greedy output token-identical to target-only decoding
    invariant_batch: int  # rows per sub-batch that keep logits bit-exact (0: not calibrated)
    mixes_sessions: bool  # whether a sub-batch may hold several sessions' rows (exact mode: where measured exact)

    def fingerprint(self) -> Fingerprint: ...

    def is_eog(self, token: int) -> bool: ...

    def chat_template(self) -> str | None: ...

    def sampling_defaults(self) -> dict[str, float]:
        """The sampler settings the target's model file recommends, by GenerationConfig name."""
        ...

    def run_batch(self, feeds: Sequence[Feed]) -> list[FeedOutput]: ...

    def truncate(self, seq: int, length: int) -> None: ...

    def settle(self, seq: int, length: int) -> None: ...

    def release(self, seq: int) -> None: ...

    def cached(self, seq: int) -> int: ...
