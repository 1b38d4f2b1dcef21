"""One engine, several verifier processes: `EngineHost` holds the model in its process and runs, in
one call of the engine, every batch its clients sent while the previous call ran; `RemoteEngine` is
a client's `Engine`, through which a verifier process (its own gRPC server, sessions, scheduler and
acceptance) drives that one model.

Why (issue 50): a verifier's Python, gRPC's included, takes 650-850 us of one core per round, so one
process answers 1,200-1,700 rounds a second, and its engine thread waits for the GIL among the
handler threads after every step; a 7B target on a GPU verifies 6,000 rounds a second at 128
devices. Several front-end processes on one port (`ServerConfig.frontends`, `FrontEnds`: the kernel
spreads the devices' connections over them) each pay their own Python; the host's thread has no other Python to
wait for, and whatever the front ends sent while a step ran goes into the next one, one batch as the
GPU wants it.

Each client has sequences of its own: client i's sequence s is the engine's i x `seqs` + s, so the
engine holds clients x `seqs` sequences (a `LlamaEngine` parks what its context cannot hold), and a
client may touch no other's. A client's calls on a sequence reach the engine in the order it made
them: a call (a batch included) on a sequence that a batch waiting to run holds runs after that
batch; calls on other sequences may go first. `truncate`, `settle` and `release` are sent without
waiting for an answer (a later call on the sequence comes after them), so their errors are the
host's log's, not the caller's; `run_batch`, `cached` and `is_eog` wait for theirs. A client that
goes away has its sequences released and its place taken by the next one. Messages are pickled over
a Unix socket (`multiprocessing.connection`, with an authentication key), each client's answers
sent on a thread of their own: feeds and reduced rows are small; whole rows (logprobs, penalties,
top-p alone) are 1 MB each on a 262,144-token vocabulary, and go through shared memory instead
(`_shared_rows`: a memory file per client, one answer in it at a time).
"""

from __future__ import annotations

import itertools
import logging
import os
import pickle
import queue
import socket
import struct
import tempfile
import threading
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, replace
from multiprocessing import AuthenticationError
from multiprocessing.connection import (
    Connection,
    Listener,
    answer_challenge,
    deliver_challenge,
)
from pathlib import Path
from typing import Any

from ...errors import ConfigError, InferenceError, VerifierUnavailableError
from ...protocol import Fingerprint
from . import _shared_rows as shared_rows
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
    kind: str  # "run", "cached", "is_eog", one of _SENT, or "gone" (the client left)
    args: tuple[Any, ...]


class _Peer:
    """A client's connection. Its answers go out on a thread of its own, so that a client that stops
    reading (1 MB whole rows fill a socket's buffer) holds up no other client and not the engine."""

    def __init__(self, index: int, conn: Connection, rows: shared_rows.RowWriter) -> None:
        self.index, self.conn, self.rows = index, conn, rows
        self._out: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()
        self._sender = threading.Thread(target=self._send_all, name=f"edgekit-engine-send{index}", daemon=True)
        self._sender.start()

    def answer(self, rid: int, status: str, value: Any) -> None:
        self._out.put((rid, status, value))

    def _send_all(self) -> None:
        try:
            while (message := self._out.get()) is not None:
                try:
                    data = self.rows.dumps(message)
                except Exception as exc:  # an answer that does not pickle: the caller gets why, not silence
                    why = InferenceError(f"the engine's answer could not be sent: {type(exc).__name__}: {exc}")
                    data = pickle.dumps((message[0], "error", why))
                try:
                    shared_rows.send(self.conn, self.rows, data)
                except (OSError, ValueError):  # gone: its reader says so
                    return
        finally:
            self.rows.close()  # on this thread: no answer is being written into its file

    def hang_up(self) -> None:
        """Ends the connection both ways; its sender stops (its reader sees the end)."""
        self._out.put(None)
        _hang_up(self.conn)

    def close(self) -> None:
        self.hang_up()
        self._sender.join(5.0)
        self.conn.close()


class EngineHost:
    """Serves `engine` to up to `clients` processes at once, `seqs` sequences each (the engine holds
    clients x seqs), at `address` (a Unix socket path; None: a new one in a private directory).
    `authkey`: what clients must present (None: a random one; `authkey` says which).
    `shared_rows`: arrays of this many bytes or more (whole logit rows) reach a client through shared
    memory rather than the socket (`_shared_rows`); None: all through the socket."""

    def __init__(self, engine: Engine, *, clients: int, seqs: int, address: str | None = None,
                 authkey: bytes | None = None, shared_rows: int | None = 64 * 1024) -> None:
        if clients < 1 or seqs < 1:
            raise ConfigError(f"an engine host serves 1 client or more with 1 sequence or more, not {clients}, {seqs}")
        self.engine = engine
        self.clients, self.seqs = clients, seqs
        self.shared_rows = shared_rows
        self.authkey = authkey or os.urandom(32)
        self._dir = None
        if address is None:
            self._dir = tempfile.mkdtemp(prefix="edgekit-engine-")
            address = str(Path(self._dir) / "engine.sock")
        self.address = address
        # the key is checked on each connection's own thread: one that never answers holds up no other
        self._listener = Listener(address, family="AF_UNIX", backlog=max(8, 2 * clients))
        self._info = {
            "name": engine.name, "identity": engine.identity, "n_vocab": engine.n_vocab, "n_embd": engine.n_embd,
            "exact": engine.exact, "invariant_batch": engine.invariant_batch, "mixes_sessions": engine.mixes_sessions,
            "fingerprint": engine.fingerprint(), "chat_template": engine.chat_template(),
            "sampling_defaults": engine.sampling_defaults(), "seqs": seqs,
            # the sequences the engine holds at once, for all its clients (a parking engine's resident ones)
            "resident": min(getattr(getattr(engine, "slots", None), "resident", clients * seqs), clients * seqs),
        }
        self._cond = threading.Condition()
        self._queue: deque[_Request] = deque()
        self._peers: dict[int, _Peer] = {}
        self._closed = False
        self.calls = 0  # engine calls run (merged batches)
        self.batches = 0  # clients' batches run in them
        self.busy_s = 0.0  # seconds in the engine's calls
        self._accepting = threading.Thread(target=self._accept, name="edgekit-engine-accept", daemon=True)
        self._running = threading.Thread(target=self._loop, name="edgekit-engine-host", daemon=True)
        self._accepting.start()
        self._running.start()

    # -- connections ---------------------------------------------------------------------------

    def _accept(self) -> None:
        while True:
            try:
                conn = self._listener.accept()
            except OSError:
                return  # closed
            if self._closed:
                conn.close()
                return
            threading.Thread(target=self._serve, args=(conn,), name="edgekit-engine-client", daemon=True).start()

    def _serve(self, conn: Connection) -> None:
        """A connection: the key checked both ways (as `Listener` does), a place given, its calls read."""
        try:
            self._welcome(conn)
        except Exception:  # a bug here must not leave the client waiting for a hello
            log.exception("engine host: a client's connection failed")
            conn.close()

    def _welcome(self, conn: Connection) -> None:
        try:
            deliver_challenge(conn, self.authkey)
            answer_challenge(conn, self.authkey)
        except Exception:  # a wrong key, or a peer gone mid-handshake
            conn.close()
            return
        with self._cond:
            free = [i for i in range(self.clients) if i not in self._peers] if not self._closed else []
            peer = _Peer(free[0], conn, shared_rows.RowWriter(min_bytes=self.shared_rows)) if free else None
            if peer is not None:
                self._peers[peer.index] = peer
        if peer is None:
            _send(conn, (0, "error", ConfigError(f"the engine host serves {self.clients} clients at most")))
            conn.close()
            return
        peer.answer(0, "ok", {**self._info, "client": peer.index})
        self._read(peer)

    def _read(self, peer: _Peer) -> None:
        while True:
            try:
                rid, kind, args = peer.conn.recv()
            except (EOFError, OSError):
                break
            except Exception:  # a message that does not unpickle, or not a call: the client is broken
                log.exception("engine host: client %d sent what it cannot read; it is let go", peer.index)
                break
            if kind == "freed":  # the client copied an answer's arrays out of shared memory
                if not (isinstance(args, tuple) and len(args) == 1 and isinstance(args[0], int)):
                    log.error("engine host: client %d sent a malformed freed; it is let go", peer.index)
                    break
                peer.rows.freed(args[0])
                continue
            problem = self._problem(peer.index, kind, args)
            if problem:
                peer.answer(rid, "error", ConfigError(problem))
                continue
            with self._cond:
                self._queue.append(_Request(peer.index, rid, kind, args))
                self._cond.notify()
        with self._cond:  # gone: its sequences are emptied once what it sent has run
            self._queue.append(_Request(peer.index, 0, "gone", ()))
            self._cond.notify()

    def _problem(self, client: int, kind: str, args: Any) -> str:
        """What is wrong with a call (empty: nothing): only the engine's calls, on the client's own
        sequences."""
        if kind not in _CALLS:
            return f"the engine host answers {', '.join(_CALLS)}, not {kind!r}"
        mine = range(client * self.seqs, (client + 1) * self.seqs)
        if kind == "run":
            feeds = args[0] if isinstance(args, tuple) and len(args) == 1 and isinstance(args[0], list) else None
            if feeds is None or not all(isinstance(f, Feed) and f.seq in mine for f in feeds):
                return f"a run is a list of feeds on client {client}'s sequences {mine.start}-{mine.stop - 1}"
        elif kind != "is_eog" and not (isinstance(args, tuple) and args and args[0] in mine):
            return f"{kind} takes one of client {client}'s sequences {mine.start}-{mine.stop - 1}"
        return ""

    # -- the engine's thread -------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if self._closed:  # what is queued is dropped: its clients are hung up on
                    return
                requests = list(self._queue)
                self._queue.clear()
            try:
                self._take(requests)
            except Exception:  # a bug here must not leave every client waiting on a dead thread
                log.exception("engine host: a round of calls failed")
                for r in requests:
                    if r.kind not in (*_SENT, "gone"):
                        self._answer(r, "error", InferenceError("the engine host failed this call; see its log"))

    def _take(self, requests: list[_Request]) -> None:
        """Runs `requests` in their order, a sequence's calls after the batches that hold it: runs
        merged into one engine call until one touches a sequence a merged run holds."""
        runs: list[_Request] = []
        held: set[int] = set()  # sequences in `runs`
        for r in requests:
            seqs = self._seqs_of(r)
            if held & seqs:  # after the batches that hold its sequence, as the client made them
                self._run(runs)
                runs, held = [], set()
            if r.kind == "run":
                runs.append(r)
                held |= seqs
            else:
                self._apply(r)
        self._run(runs)

    def _seqs_of(self, r: _Request) -> set[int]:
        if r.kind == "gone":
            return set(range(r.client * self.seqs, (r.client + 1) * self.seqs))
        if r.kind == "run":
            return {f.seq for f in r.args[0]}
        return set() if r.kind == "is_eog" else {r.args[0]}

    def _apply(self, r: _Request) -> None:
        if r.kind == "gone":
            for seq in range(r.client * self.seqs, (r.client + 1) * self.seqs):
                try:
                    self.engine.release(seq)
                except Exception:  # one sequence's failure must not keep the place
                    log.exception("engine host: releasing sequence %d", seq)
            with self._cond:
                peer = self._peers.pop(r.client, None)
            if peer is not None:
                peer.close()
            return
        try:
            value = getattr(self.engine, r.kind)(*r.args)
        except Exception as exc:  # the client's to raise
            if r.kind in _SENT:  # sent without waiting: the host's log says it
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
            peer = self._peers.get(r.client)
        if peer is not None:
            peer.answer(r.rid, status, value)

    def close(self) -> None:
        """Stops taking clients and calls and hangs up on every client; returns once the engine's
        thread has left it (after the call under way, if one is: the engine may then be closed)."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            peers = list(self._peers.values())
            self._peers.clear()
            self._cond.notify()
        try:  # wakes the accept thread (closing the listener alone would not)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.connect(self.address)
        except OSError:
            pass
        self._accepting.join(5.0)
        self._listener.close()
        for peer in peers:
            peer.close()
        self._running.join()
        if self._dir is not None:  # the listener took its socket file with it
            Path(self.address).unlink(missing_ok=True)
            Path(self._dir).rmdir()


class RemoteEngine:
    """The `Engine` of an `EngineHost` at `address` (its `authkey`): this process's sequences are
    0 .. `seqs` - 1. `timeout`: seconds each step of connecting (the connection, each of the key
    check's reads, the host's hello) may wait; `call_timeout`: seconds a call waits for its answer (a
    batch, with the batches queued before it: a long prompt's prefill on a CPU takes minutes) before
    the host is taken for gone."""

    def __init__(self, address: str, authkey: bytes, *, timeout: float = 30.0, call_timeout: float = 600.0) -> None:
        self._conn = _connect(address, authkey, timeout)
        if not self._conn.poll(timeout):
            self._conn.close()
            raise VerifierUnavailableError(f"the engine host at {address} did not answer within {timeout:g} s")
        self._rows = shared_rows.RowReader()
        (_, status, info), generation = shared_rows.receive(self._conn, self._rows)
        if generation is not None:  # (a hello holds no large array; were it to, the file would stay busy)
            self._conn.send((0, "freed", (generation,)))
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
        # of this client's sequences, how many the engine can hold at once (its resident ones are shared by
        # every client: alone, one may use them all)
        self.resident: int = min(info["resident"], self.seqs)
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
        if not self._reader.is_alive():
            self._rows.close()

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
                (rid, status, value), generation = shared_rows.receive(self._conn, self._rows)
            except Exception as exc:  # closed, or a message it cannot read: either way the host is lost to it
                if not isinstance(exc, (EOFError, OSError)):
                    log.exception("the engine host at %s sent what this process cannot read", self.address)
                gone = VerifierUnavailableError(f"the engine host at {self.address} is gone: {exc or 'closed'}")
                with self._lock:
                    self._gone = gone
                    pending, self._pending = self._pending, {}
                for future in pending.values():
                    future.set_exception(gone)
                return
            with self._lock:
                waiting = self._pending.pop(rid, None)
                if generation is not None:  # its arrays are copied out: the host's file may take the next
                    try:
                        self._conn.send((0, "freed", (generation,)))
                    except (OSError, ValueError):  # gone: the next read says so
                        pass
            if waiting is None:  # a call whose caller no longer waits (its deadline passed)
                continue
            future = waiting
            if status == "ok":
                future.set_result(value)
            else:
                future.set_exception(value)


def _connect(address: str, authkey: bytes, timeout: float) -> Connection:
    """A connection to the host at `address` whose key check passed, each step within `timeout`
    seconds: a host that accepts and then says nothing (hung, or not an engine host) is an error at
    the deadline, not a wait forever (multiprocessing's `Client` has no deadline). The socket stays
    blocking throughout (a full listen queue is waited on, as `Client` waits), its waits bounded by
    SO_SNDTIMEO and SO_RCVTIMEO, both cleared once the key is checked."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.setblocking(True)  # (whatever socket.setdefaulttimeout says: `Connection` reads the descriptor)
        _deadlines(sock, timeout)
        sock.connect(address)
    except OSError as exc:
        sock.close()
        if isinstance(exc, BlockingIOError):
            raise VerifierUnavailableError(
                f"the engine host at {address} did not accept within {timeout:g} s") from None
        raise VerifierUnavailableError(f"cannot reach the engine host at {address}: {exc}") from exc
    conn = Connection(sock.detach())
    try:
        answer_challenge(conn, authkey)
        deliver_challenge(conn, authkey)
    except AuthenticationError as exc:
        conn.close()
        raise ConfigError(f"the engine host at {address} refused this process's key: {exc}") from exc
    except BlockingIOError:  # a deadline passed
        conn.close()
        raise VerifierUnavailableError(
            f"the engine host at {address} did not check this process's key within {timeout:g} s") from None
    except (OSError, EOFError) as exc:
        conn.close()
        raise VerifierUnavailableError(f"cannot reach the engine host at {address}: {exc}") from exc
    with shared_rows.socket_of(conn) as s:  # no deadline from here: calls have their own
        _deadlines(s, 0.0)
    return conn


def _deadlines(sock: socket.socket, seconds: float) -> None:
    """SO_SNDTIMEO and SO_RCVTIMEO on a blocking socket: a connect, send or read that waits longer fails
    with EAGAIN (0: never; a positive time is at least a microsecond)."""
    whole = int(seconds)
    micros = int((seconds - whole) * 1e6) or (1 if seconds > 0 and not whole else 0)
    value = struct.pack("ll", whole, micros)
    for option in (socket.SO_SNDTIMEO, socket.SO_RCVTIMEO):
        sock.setsockopt(socket.SOL_SOCKET, option, value)


def _hang_up(conn: Connection) -> None:
    """Shuts `conn`'s socket both ways, so that both ends see it end and a thread blocked reading it
    wakes (closing the descriptor would not wake it, and would race that thread's use of it)."""
    try:
        with shared_rows.socket_of(conn) as s:
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
    try:
        back = pickle.loads(pickle.dumps(exc))
        if type(back) is type(exc) and str(back) == str(exc):
            return exc
    except Exception:  # any failure to round-trip: the fallback below
        pass
    return InferenceError(f"{type(exc).__name__}: {exc}")
