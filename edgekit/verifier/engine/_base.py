"""The engine seam of the verifier: runs batches of sequence feeds, decides nothing."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ...protocol import Fingerprint

__all__ = ["Engine", "Feed"]


@dataclass(frozen=True)
class Feed:
    """Tokens to append to one KV sequence, and how many of the last ones want logits.

    `start` is the position of `tokens[0]`: the sequence's length before the feed.
    A prefill wants none (`n_out=0`); a verification round wants the block's K+1.
    """

    seq: int
    start: int
    tokens: tuple[int, ...]
    n_out: int


class Engine(Protocol):
    """A target model with a KV sequence per session slot.

    `run_batch` runs feeds of several sequences and returns, per feed, the
    logits of its last `n_out` positions ([n_out, n_vocab] float32, copies).
    A feed that does not fit raises `KVCacheFullError`, leaving its sequence
    as it was. `truncate` rolls a sequence back; `release` empties it; `cached`
    says how many tokens it holds.
    """

    name: str
    n_vocab: int
    n_embd: int  # the target's hidden size
    exact: bool  # greedy output token-identical to target-only decoding
    invariant_batch: int  # rows per sub-batch that keep logits bit-exact (0: not calibrated)

    def fingerprint(self) -> Fingerprint: ...

    def is_eog(self, token: int) -> bool: ...

    def chat_template(self) -> str | None: ...

    def run_batch(self, feeds: Sequence[Feed]) -> list[np.ndarray]: ...

    def truncate(self, seq: int, length: int) -> None: ...

    def release(self, seq: int) -> None: ...

    def cached(self, seq: int) -> int: ...
