"""Verifier sessions: their state, owners, limits and eviction.

A session owns one KV sequence (its own stream of max_context cells) while it
lives. Sessions idle longer than the idle timeout are evicted by a reaper; when
the table is full, a session idle longer than `reclaim_after` makes room for a
new one (least recently used first). A session in the middle of a call is
never evicted.

No client locks the others out: with every sequence taken and nothing idle
long enough to reclaim, a client that holds less than half of the table takes
the least recently used session (not in a call) of a client that holds more;
that session's owner finds it gone (NOT_FOUND) and reopens it from its
committed tokens when it next calls, as after a restart.

A session belongs to the tenant whose token opened it: to any other caller it
does not exist (NOT_FOUND, as an unknown id), so one tenant cannot read, extend
or close another's. Its id holds 128 random bits. With `max_per_client` set, no
one client (a tenant, or without tokens a peer host) holds more than that many
sessions at all.

Calls reach a session through `acquire`, which holds its lock and refuses a
session closed or evicted meanwhile: once `close` returns, no call runs on the
session's sequence, which the next session may take.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ..errors import LimitExceededError, SessionNotFoundError
from ._validation import clip

if TYPE_CHECKING:  # the rounds keep their requests and answers here
    from ..protocol import HiddenRequest, ReceivedBlock, Sampler, VerifyResult

__all__ = ["Caller", "PendingRound", "Session", "SessionTable"]


@dataclass(frozen=True)
class Caller:
    """Who makes a call: the tenant its token names ("" where the verifier takes no
    tokens), owner of the sessions it opens, and the client it counts as for the
    per-client session limit (the tenant, or without tokens the peer's host)."""

    tenant: str = ""
    client: str = ""


@dataclass(eq=False)
class Session:
    """A session's state. Its KV sequence holds `tokens` but the last (not yet
    decoded), and, while an SH round is pending, that round's block after them."""

    id: str
    seq: int
    tokens: list[int]  # committed sequence
    mode: str  # "greedy" | "sample" | "semantic"
    sampler: Sampler  # temperature 0 unless the mode samples
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
    last_used: float = field(default_factory=time.monotonic)  # on the table's clock
    lock: threading.Lock = field(default_factory=threading.Lock)
    # (request keys, answer) of the last applied round, for idempotent retries: the keys of its
    # request and, under SH, of its second half.
    last_round: tuple[tuple[bytes, ...], VerifyResult] | None = None
    decoded: int = 0  # tokens run through the target for this session: prefix reuse shows here
    hidden_size: int = 0  # width of the draft hidden states the session may upload; 0: none
    draft_vocab: int = 0  # the draft's vocabulary, padding included (its fingerprint's); 0: the target's
    semantic_threshold: float = 0.0  # semantic mode: a mismatch is rejected when the head's P(reject) exceeds it
    logprobs: int = -1  # the target's log-probabilities of committed tokens, with this many alternatives; -1: none
    # SH: a block run and waiting for its hidden states (its KV cells are still in place).
    pending: PendingRound | None = None
    # The draft hidden states of the last round, as decoded: (block offsets, [n, d] rows).
    # What a decision head reads; the lossless modes only check and count them.
    last_hidden: tuple[tuple[int, ...], np.ndarray] | None = None
    hidden_rows: int = 0  # hidden rows received over the session's life
    owner: str = ""  # the tenant whose token opened it ("": no tokens configured)
    client: str = ""  # who it counts against for the per-client limit
    closed: bool = False  # closed or evicted: calls that were waiting for its lock are refused


@dataclass(frozen=True)
class PendingRound:
    key: bytes  # hash of the first half's request (a retry of it gets `answer` again)
    request: ReceivedBlock  # the first half: block, distributions, flags
    answer: HiddenRequest  # the request for hidden states, for a retried first half
    logits: np.ndarray
    positions: tuple[int, ...]
    target_hidden: np.ndarray | None = None  # semantic mode: the target's hidden rows of the block


class SessionTable:
    def __init__(
        self,
        max_sessions: int,
        idle_timeout: float,
        *,
        reclaim_after: float | None = None,
        max_per_client: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`clock`: seconds, what idleness is measured on (tests pass a virtual one)."""
        self.clock = clock
        self._max = max_sessions
        self._idle_timeout = idle_timeout
        self._reclaim_after = idle_timeout if reclaim_after is None else min(reclaim_after, idle_timeout)
        self._max_per_client = max_per_client
        self._sessions: dict[str, Session] = {}
        self._free_seqs = list(range(max_sessions - 1, -1, -1))
        self._lock = threading.Lock()
        self.evictions = 0

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._sessions

    def __len__(self) -> int:
        return len(self._sessions)

    def create(
        self,
        *,
        mode: str,
        sampler: Sampler,
        seed: int,
        slo_class: str = "best-effort",
        speed: float | None = None,
        prefix: str = "s-",
        caller: Caller = Caller(),
    ) -> Session:
        # A sequence id comes back with its old cells: the new session's first feed starts at 0 and cuts them.
        client = caller.client
        with self._lock:
            if self._max_per_client and client:
                held = [x for x in self._sessions.values() if x.client == client]
                if len(held) >= self._max_per_client:
                    raise LimitExceededError(
                        f"this client already holds {len(held)} sessions, the most one client may hold on this "
                        f"verifier (of {self._max} in all); close one, or try again in {self._reclaim_after:.0f} s, "
                        "when its least recently used one may be reclaimed",
                        retry_after=self._reclaim_after,
                    )
            seq = self._free_seqs.pop() if self._free_seqs else self._evict_lru_locked()
            if seq is None and client:
                seq = self._take_from_the_largest_locked(client)
        if seq is None:
            wait = self._until_evictable()
            raise LimitExceededError(
                f"the verifier is serving its maximum of {self._max} sessions; try again in {wait:.0f} s, "
                "when the least recently used one may be reclaimed, or sooner if one closes",
                retry_after=wait,
            )
        sess = Session(
            id=prefix + secrets.token_hex(16),
            seq=seq,
            tokens=[],
            mode=mode,
            sampler=sampler,
            rng=np.random.default_rng(seed),
            slo_class=slo_class,
            speed=speed,
            owner=caller.tenant,
            client=client,
            last_used=self.clock(),
        )
        with self._lock:
            self._sessions[sess.id] = sess
        return sess

    def get(self, session_id: str, owner: str = "") -> Session:
        """The session `session_id` of `owner`; another owner's is as unknown as a made-up id."""
        with self._lock:
            sess = self._sessions.get(session_id)
        if sess is None or sess.owner != owner:
            raise SessionNotFoundError(f"session {clip(session_id)} is unknown or was evicted; open a new session")
        sess.last_used = self.clock()
        return sess

    @contextmanager
    def acquire(self, session_id: str, owner: str = "") -> Iterator[Session]:
        """The session, locked for one call; refused if it closed while the call waited for it."""
        sess = self.get(session_id, owner)
        with sess.lock:
            if sess.closed:
                raise SessionNotFoundError(f"session {clip(session_id)} was closed or evicted; open a new session")
            yield sess
            sess.last_used = self.clock()

    def close(self, session_id: str, owner: str = "") -> bool:
        with self._lock:
            sess = self._sessions.get(session_id)
            if sess is None or sess.owner != owner:
                return False
            del self._sessions[session_id]
        with sess.lock:  # a call in flight finishes on its sequence before another session may take it
            sess.closed = True
            self._recycle(sess.seq)
        return True

    def reap(self) -> int:
        """Evicts sessions idle longer than the idle timeout; returns how many."""
        now = self.clock()
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
        """Seconds until the least recently used session may be reclaimed (at least 1)."""
        with self._lock:
            oldest = min((s.last_used for s in self._sessions.values()), default=self.clock())
        return max(1.0, self._reclaim_after - (self.clock() - oldest))

    def _recycle(self, seq: int) -> None:
        with self._lock:
            self._free_seqs.append(seq)

    def _evict_lru_locked(self) -> int | None:
        now = self.clock()
        for sess in sorted(self._sessions.values(), key=lambda s: s.last_used):
            if now - sess.last_used < self._reclaim_after:
                return None
            if self._evict_locked(sess):
                return sess.seq
        return None

    def _take_from_the_largest_locked(self, client: str) -> int | None:
        """The sequence of the least recently used session of a client holding over half the
        table, for `client`, which holds less (None if there is none, or `client` is not owed one)."""
        share = max(1, self._max // 2)
        held: dict[str, list[Session]] = {}
        for x in self._sessions.values():
            held.setdefault(x.client, []).append(x)
        if len(held.get(client, ())) >= share:
            return None
        over = [x for c, xs in held.items() if c and len(xs) > share for x in xs]
        for sess in sorted(over, key=lambda x: x.last_used):
            if self._evict_locked(sess):
                return sess.seq
        return None

    def _evict_locked(self, sess: Session) -> bool:
        # A session inside a call holds its lock; never pull its KV from under it.
        if not sess.lock.acquire(blocking=False):
            return False
        try:
            del self._sessions[sess.id]
            sess.closed = True
            self.evictions += 1
            return True
        finally:
            sess.lock.release()

