"""One engine, several verifier processes: `EngineHost` holds the model in its process and runs, in
one call of the engine, every batch its clients sent while the previous call ran; `RemoteEngine` is
a client's `Engine`, through which a verifier process (its own gRPC server, sessions, scheduler and
acceptance) drives that one model.

Why (issue 50): a verifier's Python, gRPC's included, takes 650-850 us of one core per round, so one
process answers 1,200-1,700 rounds a second, and its engine thread waits for the GIL among the
handler threads after every step; a 7B target on a GPU verifies 6,000 rounds a second at 128
devices. Several front-end processes on one port (`ServerConfig.reuse_port`: the kernel spreads the
devices' connections over them) each pay their own Python; the host's thread has no other Python to
wait for, and whatever the front ends sent while a step ran goes into the next one, one batch as the
GPU wants it.

Each client has sequences of its own: client i's sequence s is the engine's i x `seqs` + s, so the
engine holds clients x `seqs` sequences (a `LlamaEngine` parks what its context cannot hold). A
client's calls reach the engine in the order it made them: the host applies a call on a sequence
that a batch waiting to run holds after that batch. `truncate`, `settle` and `release` are sent
without waiting for an answer (the next call on that client's connection comes after them);
`run_batch` and `cached` wait for theirs. A client that goes away has its sequences released and its
place taken by the next one. Messages are pickled over a Unix socket (`multiprocessing.connection`,
with an authentication key): feeds and reduced rows are small; whole rows (logprobs, penalties) are
1 MB each on a 262,144-token vocabulary.
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
import tempfile
import threading
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, replace
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client, Connection, Listener
from pathlib import Path
from typing import Any

from ...errors import ConfigError, InferenceError, VerifierUnavailableError
from ...protocol import Fingerprint
from ._base import Engine, Feed, FeedOutput

__all__ = ["EngineHost", "RemoteEngine"]

log = logging.getLogger("edgekit.verifier")

# calls a client makes without waiting for the answer (the engine's None)
_SENT = ("truncate", "settle", "release")
_CALLS = ("run", "cached", "is_eog", *_SENT)


@dataclass
class _Request:
    client: int
    rid: int
    kind: str  # "run", "cached", or one of _SENT
    args: tuple[Any, ...]


class EngineHost:
    """Serves `engine` to up to `clients` processes at once, `seqs` sequences each (the engine holds
    clients x seqs), at `address` (a Unix socket path; None: a new one in a private directory).
    `authkey`: what clients must present (None: a random one; `authkey` says which)."""

    def __init__(self, engine: Engine, *, clients: int, seqs: int, address: str | None = None,
                 authkey: bytes | None = None) -> None:
        if clients < 1 or seqs < 1:
            raise ConfigError(f"an engine host serves 1 client or more with 1 sequence or more, not {clients}, {seqs}")
        self.engine = engine
        self.clients, self.seqs = clients, seqs
        self.authkey = authkey or os.urandom(32)
        self._dir = None
        if address is None:
            self._dir = tempfile.mkdtemp(prefix="edgekit-engine-")
            address = str(Path(self._dir) / "engine.sock")
        self.address = address
        self._listener = Listener(address, family="AF_UNIX", authkey=self.authkey)
        self._info = {
            "name": engine.name, "identity": engine.identity, "n_vocab": engine.n_vocab, "n_embd": engine.n_embd,
            "exact": engine.exact, "invariant_batch": engine.invariant_batch, "mixes_sessions": engine.mixes_sessions,
            "fingerprint": engine.fingerprint(), "chat_template": engine.chat_template(),
            "sampling_defaults": engine.sampling_defaults(), "seqs": seqs,
        }
        self._cond = threading.Condition()
        self._queue: deque[_Request] = deque()
        self._conns: dict[int, Connection] = {}
        self._closed = False
        self.calls = 0  # engine calls run (merged batches)
        self.batches = 0  # clients' batches run in them
        self.busy_s = 0.0  # seconds in the engine's calls
        self._threads = [threading.Thread(target=self._accept, name="edgekit-engine-accept", daemon=True),
                         threading.Thread(target=self._loop, name="edgekit-engine-host", daemon=True)]
        for t in self._threads:
            t.start()

    # -- connections ---------------------------------------------------------------------------

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn = self._listener.accept()
            except Exception:  # closed, or a client that failed the handshake (a wrong key)
                if self._closed:
                    return
                continue
            with self._cond:
                free = [i for i in range(self.clients) if i not in self._conns]
                if free:
                    self._conns[free[0]] = conn
            if not free:
                _send(conn, (0, "error", ConfigError(f"the engine host serves {self.clients} clients at most")))
                conn.close()
                continue
            _send(conn, (0, "ok", {**self._info, "client": free[0]}))
            threading.Thread(target=self._read, args=(free[0], conn), name=f"edgekit-engine-client{free[0]}",
                             daemon=True).start()

    def _read(self, client: int, conn: Connection) -> None:
        while True:
            try:
                rid, kind, args = conn.recv()
            except (EOFError, OSError):
                break
            if kind not in _CALLS:
                _send(conn, (rid, "error", ConfigError(f"the engine host answers {', '.join(_CALLS)}, not {kind!r}")))
                continue
            with self._cond:
                self._queue.append(_Request(client, rid, kind, args))
                self._cond.notify()
        with self._cond:  # gone: its sequences are emptied once what it sent has run
            self._queue.append(_Request(client, 0, "gone", ()))
            self._cond.notify()

    # -- the engine's thread -------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if self._closed and not self._queue:
                    return
                requests = list(self._queue)
                self._queue.clear()
            runs: list[_Request] = []
            held: set[int] = set()  # sequences in `runs`
            for r in requests:
                if r.kind == "run":
                    runs.append(r)
                    held.update(f.seq for f in r.args[0])
                    continue
                seqs = self._seqs_of(r)
                if held & seqs:  # after the batches that hold its sequence, as the client made them
                    self._run(runs)
                    runs, held = [], set()
                self._apply(r)
            self._run(runs)

    def _seqs_of(self, r: _Request) -> set[int]:
        if r.kind == "gone":
            return set(range(r.client * self.seqs, (r.client + 1) * self.seqs))
        return set() if r.kind == "is_eog" else {r.args[0]}

    def _apply(self, r: _Request) -> None:
        if r.kind == "gone":
            for seq in range(r.client * self.seqs, (r.client + 1) * self.seqs):
                try:
                    self.engine.release(seq)
                except Exception:  # one sequence's failure must not keep the place
                    log.exception("engine host: releasing sequence %d", seq)
            with self._cond:
                conn = self._conns.pop(r.client, None)
            if conn is not None:  # this thread alone sends on it: closing it here races nothing
                _hang_up(conn)
                conn.close()
            return
        try:
            value = getattr(self.engine, r.kind)(*r.args)
        except Exception as exc:  # the client's to raise
            if r.kind in _SENT:
                log.warning("engine host: %s%s from client %d failed: %s", r.kind, r.args, r.client, exc)
            else:
                self._answer(r, "error", _portable(exc))
            return
        if r.kind not in _SENT:
            self._answer(r, "ok", value)

    def _run(self, runs: list[_Request]) -> None:
        """The clients' batches in one engine call; where it fails (a full KV cache), each batch
        alone, so that each client gets its own batch's answer."""
        if not runs:
            return
        feeds = [f for r in runs for f in r.args[0]]
        t0 = time.perf_counter()
        try:
            outputs = self.engine.run_batch(feeds)
        except Exception as exc:  # the clients' to raise
            self.busy_s += time.perf_counter() - t0
            if len(runs) > 1:  # the engine left every sequence at its feed's start: each alone
                for r in runs:
                    self._run([r])
                return
            self._answer(runs[0], "error", _portable(exc))
            return
        self.busy_s += time.perf_counter() - t0
        self.calls += 1
        self.batches += len(runs)
        at = 0
        for r in runs:
            n = len(r.args[0])
            self._answer(r, "ok", outputs[at : at + n])
            at += n

    def _answer(self, r: _Request, status: str, value: Any) -> None:
        with self._cond:
            conn = self._conns.get(r.client)
        if conn is not None:
            _send(conn, (r.rid, status, value))

    def close(self) -> None:
        """Stops taking clients and calls (what is queued runs first); the engine stays open."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            conns = list(self._conns.values())
            self._cond.notify()
        self._listener.close()
        for conn in conns:
            _hang_up(conn)
        self._threads[1].join(10.0)
        if self._dir is not None:  # the listener took its socket file with it
            Path(self.address).unlink(missing_ok=True)
            Path(self._dir).rmdir()


class RemoteEngine:
    """The `Engine` of an `EngineHost` at `address` (its `authkey`): this process's sequences are
    0 .. `seqs` - 1. `timeout`: seconds to connect and be answered the handshake; `call_timeout`:
    seconds a call waits for its answer (a batch, with the batches queued before it: a long
    prompt's prefill on a CPU takes minutes) before the host is taken for gone."""

    def __init__(self, address: str, authkey: bytes, *, timeout: float = 30.0, call_timeout: float = 600.0) -> None:
        try:
            self._conn = Client(address, family="AF_UNIX", authkey=authkey)
        except (OSError, EOFError) as exc:
            raise VerifierUnavailableError(f"cannot reach the engine host at {address}: {exc}") from exc
        except AuthenticationError as exc:
            raise ConfigError(f"the engine host at {address} refused this process's key: {exc}") from exc
        if not self._conn.poll(timeout):
            self._conn.close()
            raise VerifierUnavailableError(f"the engine host at {address} did not answer within {timeout:g} s")
        _, status, info = self._conn.recv()
        if status != "ok":
            self._conn.close()
            raise info
        self.address = address
        self.call_timeout = call_timeout
        self.name: str = info["name"]
        self.identity: str = info["identity"]
        self.n_vocab: int = info["n_vocab"]
        self.n_embd: int = info["n_embd"]
        self.exact: bool = info["exact"]
        self.invariant_batch: int = info["invariant_batch"]
        self.mixes_sessions: bool = info["mixes_sessions"]
        self.client: int = info["client"]
        self.seqs: int = info["seqs"]
        self._fingerprint: Fingerprint = info["fingerprint"]
        self._chat_template: str | None = info["chat_template"]
        self._sampling: dict[str, float] = info["sampling_defaults"]
        self._offset = self.client * self.seqs
        self._eog: dict[int, bool] = {}
        self._rids = itertools.count(1)
        self._pending: dict[int, Future[Any]] = {}
        self._lock = threading.Lock()  # the connection's sends, and `_pending`
        self._gone: BaseException | None = None
        self._reader = threading.Thread(target=self._read, name="edgekit-remote-engine", daemon=True)
        self._reader.start()

    def fingerprint(self) -> Fingerprint:
        return self._fingerprint

    def chat_template(self) -> str | None:
        return self._chat_template

    def sampling_defaults(self) -> dict[str, float]:
        return dict(self._sampling)

    def is_eog(self, token: int) -> bool:
        known = self._eog.get(token)
        if known is None:
            known = self._eog[token] = bool(self._call("is_eog", token, wait=True))
        return known

    def run_batch(self, feeds: Sequence[Feed]) -> list[FeedOutput]:
        out: list[FeedOutput] = self._call("run", [replace(f, seq=self._seq(f.seq)) for f in feeds], wait=True)
        return out

    def truncate(self, seq: int, length: int) -> None:
        self._call("truncate", self._seq(seq), length)

    def settle(self, seq: int, length: int) -> None:
        self._call("settle", self._seq(seq), length)

    def release(self, seq: int) -> None:
        self._call("release", self._seq(seq))

    def cached(self, seq: int) -> int:
        value: int = self._call("cached", self._seq(seq), wait=True)
        return value

    def close(self) -> None:
        """Lets go of the host (which releases this client's sequences); the engine stays there."""
        _hang_up(self._conn)
        self._reader.join(5.0)
        with self._lock:
            self._conn.close()

    # -- the connection ------------------------------------------------------------------------

    def _seq(self, seq: int) -> int:
        if not 0 <= seq < self.seqs:
            raise InferenceError(f"sequence {seq} is not one of this process's {self.seqs} on the engine host")
        return self._offset + seq

    def _call(self, kind: str, *args: Any, wait: bool = False) -> Any:
        """Sends the call; with `wait`, its answer (or its error, raised)."""
        future: Future[Any] | None = Future() if wait else None
        with self._lock:
            if self._gone is not None:
                raise VerifierUnavailableError(f"the engine host at {self.address} is gone: {self._gone}")
            rid = next(self._rids)
            if future is not None:
                self._pending[rid] = future
            try:
                self._conn.send((rid, kind, args))
            except (OSError, ValueError) as exc:
                self._pending.pop(rid, None)
                raise VerifierUnavailableError(f"the engine host at {self.address} is gone: {exc}") from exc
        if future is None:
            return None
        try:
            return future.result(self.call_timeout)
        except FutureTimeout:
            with self._lock:
                self._pending.pop(rid, None)
            raise VerifierUnavailableError(
                f"the engine host at {self.address} did not answer a {kind} call within {self.call_timeout:g} s"
            ) from None

    def _read(self) -> None:
        while True:
            try:
                rid, status, value = self._conn.recv()
            except (EOFError, OSError) as exc:
                gone = VerifierUnavailableError(f"the engine host at {self.address} is gone: {exc or 'closed'}")
                with self._lock:
                    self._gone = gone
                    pending, self._pending = self._pending, {}
                for future in pending.values():
                    future.set_exception(gone)
                return
            with self._lock:
                waiting = self._pending.pop(rid, None)
            if waiting is None:  # a call whose caller no longer waits (its deadline passed)
                continue
            future = waiting
            if status == "ok":
                future.set_result(value)
            else:
                future.set_exception(value)


def _hang_up(conn: Connection) -> None:
    """Shuts `conn`'s socket both ways, so that both ends see it end and a thread blocked reading it
    wakes (closing the descriptor would not wake it, and would race that thread's use of it)."""
    try:
        with socket.fromfd(conn.fileno(), socket.AF_UNIX, socket.SOCK_STREAM) as s:  # a duplicate: shuts both
            s.shutdown(socket.SHUT_RDWR)
    except OSError:  # closed already
        pass


def _send(conn: Connection, message: tuple[Any, ...]) -> None:
    try:
        conn.send(message)
    except (OSError, ValueError):  # the client went away: its reader thread says so
        pass


def _portable(exc: BaseException) -> BaseException:
    """`exc` as it can cross to the client: itself where it pickles and comes back as itself, else
    an `InferenceError` saying what it was."""
    import pickle

    try:
        back = pickle.loads(pickle.dumps(exc))
        if type(back) is type(exc) and str(back) == str(exc):
            return exc
    except Exception:  # any failure to round-trip: the fallback below
        pass
    return InferenceError(f"{type(exc).__name__}: {exc}")
