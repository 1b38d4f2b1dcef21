"""Verifier sessions: their state, limits and eviction.

A session owns one KV sequence (its own stream of max_context cells) while it
lives. Sessions idle longer than the idle timeout are evicted by a reaper, or
earlier when the table is full and a new session needs a sequence (least
recently used first). A session in the middle of a call is never evicted.
"""

from __future__ import annotations

import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ..errors import LimitExceededError, SessionNotFoundError

if TYPE_CHECKING:  # the rounds keep their requests and answers here
    from ._rounds import RoundAnswer, RoundRequest

__all__ = ["PendingRound", "Session", "SessionTable"]


@dataclass(eq=False)
class Session:
    """A session's state. Its KV sequence holds `tokens` but the last (not yet
    decoded), and, while an SH round is pending, that round's block after them."""

    id: str
    seq: int
    tokens: list[int]  # committed sequence
    mode: str  # "greedy" | "sample"
    temperature: float
    rng: np.random.Generator
    slo_class: str  # its SLO class's name ("best-effort" without one), as metrics group it
    speed: float | None = None  # target tokens/s (WISP sec. 3.1); None: best effort
    # Smoothed fraction of drafted tokens accepted: the alpha of WISP eq. 5, for the
    # round's expected committed tokens and so its budget (eq. 6).
    acceptance: float = 0.5
    # The response under way (since the session opened or its last turn): when it
    # began and the tokens committed since, for response budgets.
    began: float = 0.0
    done: int = 0
    last_used: float = field(default_factory=time.monotonic)
    lock: threading.Lock = field(default_factory=threading.Lock)
    # (request key, answer) of the last applied round, for idempotent retries.
    last_round: tuple[bytes, RoundAnswer] | None = None
    decoded: int = 0  # tokens run through the target for this session: prefix reuse shows here
    hidden_size: int = 0  # width of the draft hidden states the session may upload; 0: none
    # SH: a block run and waiting for its hidden states (its KV cells are still in place).
    pending: PendingRound | None = None
    # The draft hidden states of the last round, as decoded: (block offsets, [n, d] rows).
    # What a decision head reads; the lossless modes only check and count them.
    last_hidden: tuple[tuple[int, ...], np.ndarray] | None = None
    hidden_rows: int = 0  # hidden rows received over the session's life


@dataclass(frozen=True)
class PendingRound:
    key: bytes  # hash of the first half's request (a retry of it gets `answer` again)
    request: RoundRequest  # the first half: block, distributions, flags
    answer: RoundAnswer  # the request for hidden states, for a retried first half
    logits: np.ndarray
    positions: tuple[int, ...]


class SessionTable:
    def __init__(self, max_sessions: int, idle_timeout: float) -> None:
        self._max = max_sessions
        self._idle_timeout = idle_timeout
        self._sessions: dict[str, Session] = {}
        self._free_seqs = list(range(max_sessions - 1, -1, -1))
        self._lock = threading.Lock()
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._sessions)

    def create(
        self,
        *,
        mode: str,
        temperature: float,
        seed: int,
        slo_class: str = "best-effort",
        speed: float | None = None,
        prefix: str = "s-",
    ) -> Session:
        # A sequence id comes back with its old cells: the new session's first feed starts at 0 and cuts them.
        with self._lock:
            seq = self._free_seqs.pop() if self._free_seqs else self._evict_lru_locked()
        if seq is None:
            wait = self._until_evictable()
            raise LimitExceededError(
                f"the verifier is serving its maximum of {self._max} sessions; try again in {wait:.0f} s, "
                "when the least recently used one may be evicted, or sooner if one closes",
                retry_after=wait,
            )
        sess = Session(
            id=prefix + secrets.token_hex(8),
            seq=seq,
            tokens=[],
            mode=mode,
            temperature=temperature,
            rng=np.random.default_rng(seed),
            slo_class=slo_class,
            speed=speed,
        )
        with self._lock:
            self._sessions[sess.id] = sess
        return sess

    def get(self, session_id: str) -> Session:
        with self._lock:
            sess = self._sessions.get(session_id)
        if sess is None:
            raise SessionNotFoundError(f"session {session_id!r} is unknown or was evicted; open a new session")
        sess.last_used = time.monotonic()
        return sess

    def close(self, session_id: str) -> bool:
        with self._lock:
            sess = self._sessions.pop(session_id, None)
        if sess is None:
            return False
        with sess.lock:  # a call in flight finishes on its sequence before another session may take it
            self._recycle(sess.seq)
        return True

    def reap(self) -> int:
        """Evicts sessions idle longer than the idle timeout; returns how many."""
        now = time.monotonic()
        freed = []
        with self._lock:
            for sess in sorted(self._sessions.values(), key=lambda s: s.last_used):
                if now - sess.last_used < self._idle_timeout:
                    break
                if self._evict_locked(sess):
                    freed.append(sess.seq)
        for seq in freed:
            self._recycle(seq)
        return len(freed)

    def _until_evictable(self) -> float:
        """Seconds until the least recently used session passes the idle timeout (at least 1)."""
        with self._lock:
            oldest = min((s.last_used for s in self._sessions.values()), default=time.monotonic())
        return max(1.0, self._idle_timeout - (time.monotonic() - oldest))

    def _recycle(self, seq: int) -> None:
        with self._lock:
            self._free_seqs.append(seq)

    def _evict_lru_locked(self) -> int | None:
        now = time.monotonic()
        for sess in sorted(self._sessions.values(), key=lambda s: s.last_used):
            if now - sess.last_used < self._idle_timeout:
                return None
            if self._evict_locked(sess):
                return sess.seq
        return None

    def _evict_locked(self, sess: Session) -> bool:
        # A session inside a call holds its lock; never pull its KV from under it.
        if not sess.lock.acquire(blocking=False):
            return False
        try:
            del self._sessions[sess.id]
            self.evictions += 1
            return True
        finally:
            sess.lock.release()
