"""One engine, several verifier processes (issue 50): `EngineHost` runs its clients' batches, those
that arrived while the engine was busy in one call, and `RemoteEngine` is each client's `Engine`.

What the tests may expect: the toy engine is deterministic and batch-invariant, so every output
through the host is the one the same feeds give a local engine; the merging of batches is observed
with the engine held at a gate, and what a test waits for (calls queued at the host) it waits for,
by polling the host's queue, never by sleeping."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from edgekit import ServerConfig
from edgekit.errors import ConfigError, InferenceError, KVCacheFullError, VerifierUnavailableError
from edgekit.runtime import ToyLanguageModel
from edgekit.testing import InProcessTransport, toy_client, toy_verifier
from edgekit.verifier import Feed, ToyEngine, VerifierService
from edgekit.verifier.engine import EngineHost, KeptRows, RemoteEngine

LM = ToyLanguageModel(vocab_size=300, seed=4)


class GatedEngine(ToyEngine):
    """A toy engine whose calls wait at a gate while it is shut, and that records each call's feeds."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.calls: list[list[Feed]] = []

    def shut(self) -> None:
        """Calls from now on wait at the gate; `entered` is set by the first of them."""
        self.entered.clear()
        self.gate.clear()

    def run_batch(self, feeds):
        self.entered.set()
        self.gate.wait(30)
        self.calls.append(list(feeds))
        return super().run_batch(feeds)


def _client(host: EngineHost) -> RemoteEngine:
    """A client whose calls fail after 30 s unanswered, rather than hang the test."""
    return RemoteEngine(host.address, host.authkey, call_timeout=30)


def _queued(host: EngineHost, n: int) -> None:
    """Waits until `n` calls wait at the host."""
    deadline = time.monotonic() + 30
    while True:
        with host._cond:
            if len(host._queue) >= n:
                return
        assert time.monotonic() < deadline, "the calls never reached the host"
        time.sleep(0.001)


@pytest.fixture
def host():
    engine = GatedEngine(LM, n_seq=3 * 4, max_context=64)
    h = EngineHost(engine, clients=3, seqs=4, shared_rows=1)  # every array through shared memory
    yield h
    h.close()


@pytest.fixture
def pair(host):
    """Two clients of `host` (its clients 0 and 1); after the test, the engine's gate open and both closed."""
    clients = _client(host), _client(host)
    yield clients
    host.engine.gate.set()
    for c in clients:
        c.close()


def test_every_output_through_the_host_is_a_local_engines_and_clients_have_their_own_sequences(host, pair):
    local = ToyEngine(LM, n_seq=4, max_context=64)
    a, b = pair
    assert (a.client, b.client, a.seqs) == (0, 1, 4)
    assert (a.name, a.n_vocab, a.exact, a.fingerprint()) == (local.name, local.n_vocab, True, local.fingerprint())
    prompt = (5, 6, 7, 8, 9)
    feeds = [Feed(0, 0, prompt, 3), Feed(2, 0, prompt[:3], 1, argmax=300),
             Feed(3, 0, prompt, 5, keep=4, within=300), Feed(1, 0, prompt, 2, hidden=True)]
    want = local.run_batch(feeds)
    for remote in (a, b):
        got = remote.run_batch(feeds)
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
        assert isinstance(got[2], KeptRows) and np.array_equal(got[2].logits, want[2].logits)
        assert all(np.array_equal(x, y) for x, y in zip(got[3], want[3], strict=True))
    # the rows came through shared memory; a's next answer too (it freed the file when it copied them out)
    assert [(host._peers[c].rows.shared, host._peers[c].rows.inline) for c in (0, 1)] == [(1, 0), (1, 0)]
    assert np.array_equal(a.run_batch(feeds[:1])[0], want[0])
    assert (host._peers[0].rows.shared, host._peers[0].rows.inline) == (2, 0)
    # a's sequence 0 is the engine's 0, b's the engine's 4; both hold the prompt, nothing else does
    assert [host.engine.cached(s) for s in range(12)] == [5, 5, 3, 5, 5, 5, 3, 5, 0, 0, 0, 0]
    assert a.is_eog(LM.eos) and not a.is_eog(5)
    a.truncate(0, 2)
    assert a.cached(0) == 2 and b.cached(0) == 5
    with pytest.raises(InferenceError, match="sequence 4 is not one of this process's 4"):
        a.run_batch([Feed(4, 0, prompt, 1)])


def test_batches_sent_while_the_engine_runs_go_into_its_next_call_together(host):
    clients = [_client(host) for _ in range(3)]
    engine = host.engine
    try:
        engine.shut()
        with ThreadPoolExecutor(3) as pool:
            first = pool.submit(clients[0].run_batch, [Feed(0, 0, (5, 6, 7), 1)])
            assert engine.entered.wait(30)  # the first call holds the engine
            rest = [pool.submit(c.run_batch, [Feed(1, 0, (5, 6, 7 + i), 1), Feed(2, 0, (8,), 1)])
                    for i, c in enumerate(clients[1:])]
            _queued(host, 2)
            engine.gate.set()
            outputs = [first.result(30), *[r.result(30) for r in rest]]
        assert [len(c) for c in engine.calls] == [1, 4]  # the two batches that waited: one call
        assert host.calls == 2 and host.batches == 3
        assert {f.seq for f in engine.calls[1]} == {5, 6, 9, 10}
        local = ToyEngine(LM, n_seq=4, max_context=64)
        for i, out in enumerate(outputs[1:]):
            want = local.run_batch([Feed(1, 0, (5, 6, 7 + i), 1), Feed(2, 0, (8,), 1)])
            assert all(np.array_equal(x, y) for x, y in zip(out, want, strict=True))
    finally:
        engine.gate.set()
        for c in clients:
            c.close()


def test_a_call_on_a_sequence_a_waiting_batch_holds_comes_after_that_batch(host, pair):
    a, b = pair
    engine = host.engine
    a.run_batch([Feed(0, 0, (5, 6, 7, 8), 0)])
    engine.shut()
    with ThreadPoolExecutor(2) as pool:
        holding = pool.submit(b.run_batch, [Feed(0, 0, (9,), 1)])
        assert engine.entered.wait(30)
        grown = pool.submit(a.run_batch, [Feed(0, 4, (9, 10), 2)])
        _queued(host, 1)
        a.truncate(0, 3)  # sent after the batch that grows the sequence to 6: it cuts what that left
        _queued(host, 2)
        engine.gate.set()
        holding.result(30)
        rows = grown.result(30)
    assert a.cached(0) == 3
    want = ToyEngine(LM, n_seq=1, max_context=64).run_batch([Feed(0, 0, (5, 6, 7, 8, 9, 10), 2)])
    assert np.array_equal(rows[0], want[0])


def test_two_batches_on_one_sequence_never_share_an_engine_call(host, pair):
    """A client's second batch on a sequence (sent before the first ran: a front end whose call
    timed out goes on) runs after the first, in a call of its own: one call holding both would
    decode them into one sequence at once."""
    a, b = pair
    engine = host.engine
    engine.shut()
    with ThreadPoolExecutor(3) as pool:
        holding = pool.submit(b.run_batch, [Feed(0, 0, (9,), 1)])
        assert engine.entered.wait(30)
        first = pool.submit(a.run_batch, [Feed(0, 0, (5, 6, 7), 1), Feed(1, 0, (5,), 1)])
        _queued(host, 1)
        second = pool.submit(a.run_batch, [Feed(0, 3, (8,), 1)])
        _queued(host, 2)
        engine.gate.set()
        holding.result(30)
        first.result(30)
        rows = second.result(30)
    assert [sorted(f.seq for f in call) for call in engine.calls] == [[4], [0, 1], [0]]
    want = ToyEngine(LM, n_seq=1, max_context=64).run_batch([Feed(0, 0, (5, 6, 7, 8), 1)])
    assert np.array_equal(rows[0], want[0])


def test_a_client_may_touch_only_its_own_sequences_and_the_engines_calls(host):
    from multiprocessing.connection import Client

    from edgekit.verifier.engine._shared_rows import RowReader, receive

    conn = Client(host.address, family="AF_UNIX", authkey=host.authkey)
    try:
        _, status, info = conn.recv()
        assert status == "ok" and info["client"] == 0 and info["seqs"] == 4
        for rid, call in enumerate([("run", ([Feed(4, 0, (5,), 1)],)), ("run", (["not a feed"],)),
                                    ("cached", (7,)), ("close", ()), ("truncate", ("0", 1))], 1):
            conn.send((rid, *call))
            got, status, error = conn.recv()
            assert (got, status) == (rid, "error") and isinstance(error, ConfigError), call
        conn.send((9, "run", ([Feed(3, 0, (5,), 1)],)))  # its own last sequence: answered
        (got, status, rows), _ = receive(conn, RowReader())  # its rows in the host's shared memory
        assert (got, status) == (9, "ok") and rows[0].shape == (1, 300)
    finally:
        conn.close()


def test_closing_the_host_waits_for_the_engines_call_under_way(host, pair):
    """Closing returns only once the engine's thread has left the engine (which may then be closed),
    and hangs up on every client: what was queued behind the call is not run."""
    a, b = pair
    engine = host.engine
    engine.shut()
    with ThreadPoolExecutor(3) as pool:
        busy = pool.submit(a.run_batch, [Feed(0, 0, (5,), 1)])
        assert engine.entered.wait(30)
        queued = pool.submit(b.run_batch, [Feed(0, 0, (6,), 1)])
        _queued(host, 1)
        closing = pool.submit(host.close)
        with pytest.raises(TimeoutError):
            closing.result(timeout=0.3)  # held by the call under way (a negative: it cannot pass by luck)
        engine.gate.set()
        closing.result(30)
        assert len(engine.calls) == 1  # the queued batch never ran
        with pytest.raises(VerifierUnavailableError):
            queued.result(30)
        with pytest.raises(VerifierUnavailableError):
            busy.result(30)  # its answer was not sent: the host had hung up
    assert not any(t.name.startswith("edgekit-engine-accept") for t in threading.enumerate())


def test_a_full_kv_cache_fails_only_the_batch_that_overflows_it(host, pair):
    a, b = pair
    engine = host.engine
    engine.shut()
    with ThreadPoolExecutor(3) as pool:
        first = pool.submit(a.run_batch, [Feed(1, 0, (5,), 1)])
        assert engine.entered.wait(30)
        over = pool.submit(a.run_batch, [Feed(0, 0, tuple(range(5, 75)), 1)])  # 70 tokens: past 64
        fits = pool.submit(b.run_batch, [Feed(0, 0, (5, 6), 1)])
        _queued(host, 2)
        engine.gate.set()
        first.result(30)
        with pytest.raises(KVCacheFullError):
            over.result(30)
        assert fits.result(30)[0].shape == (1, 300)
    assert a.cached(0) == 0 and b.cached(0) == 2


def test_a_client_that_goes_leaves_its_place_and_its_sequences_empty_for_the_next(host):
    clients = [_client(host) for _ in range(3)]
    with pytest.raises(ConfigError, match="3 clients at most"):
        _client(host)
    clients[1].run_batch([Feed(2, 0, (5, 6, 7), 1)])  # its row through a file in shared memory
    assert host.engine.cached(6) == 3
    rows = host._peers[1].rows
    assert rows.shared == 1 and rows._fd >= 0
    clients[1].close()
    deadline = time.monotonic() + 30
    while True:  # its place is free once the host has seen it go
        try:
            again = RemoteEngine(host.address, host.authkey, timeout=5)
            break
        except ConfigError:
            assert time.monotonic() < deadline
            time.sleep(0.01)
    try:
        assert again.client == 1 and again.cached(2) == 0
        assert rows._fd == -1 and rows._map is None  # the file went with the client that left
    finally:
        again.close()
        clients[0].close()
        clients[2].close()


def test_a_call_the_host_never_answers_fails_at_its_deadline(host):
    a = RemoteEngine(host.address, host.authkey, call_timeout=0.2)
    host.engine.shut()  # the engine never finishes the call (until the gate opens)
    try:
        with pytest.raises(VerifierUnavailableError, match="did not answer a run call within 0.2 s"):
            a.run_batch([Feed(0, 0, (5,), 1)])
    finally:
        host.engine.gate.set()
        a.close()


def test_a_wrong_key_or_a_host_gone_is_a_clear_error(host):
    with pytest.raises(ConfigError, match="refused this process's key"):
        RemoteEngine(host.address, b"not the key")
    with pytest.raises(VerifierUnavailableError, match="cannot reach the engine host"):
        RemoteEngine(host.address + ".none", host.authkey)
    a = _client(host)
    host.close()
    with pytest.raises(VerifierUnavailableError, match="is gone"):
        for _ in range(100):  # the first call may still be sent before the host's close reaches this side
            a.run_batch([Feed(0, 0, (5,), 1)])
    a.close()


def test_a_host_whose_listen_queue_stays_full_is_an_error_at_the_deadline(tmp_path):
    """A connect waits while the host's queue of connections to accept is full (as multiprocessing's
    Client waits), up to the deadline: not an error at once, not a wait forever."""
    import socket

    address = str(tmp_path / "busy.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address)
    listener.listen(0)
    queued = []
    try:
        while True:  # fill the queue: a non-blocking connect is refused once it is full
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.setblocking(False)
            queued.append(s)
            try:
                s.connect(address)
            except BlockingIOError:
                break
            assert len(queued) < 1000, "the listen queue never filled"
        with pytest.raises(VerifierUnavailableError, match="did not accept within 0.3 s"):
            RemoteEngine(address, b"key", timeout=0.3)
    finally:
        for s in queued:
            s.close()
        listener.close()


def test_a_client_made_under_a_process_wide_socket_timeout_stays_blocking(host):
    """socket.setdefaulttimeout (some libraries set it) must not leave the client's connection
    non-blocking: its first read would fail at once and the host be taken for gone."""
    import socket

    old = socket.getdefaulttimeout()
    socket.setdefaulttimeout(5.0)
    try:
        a = _client(host)
    finally:
        socket.setdefaulttimeout(old)
    try:
        assert os.get_blocking(a._conn.fileno())
        assert a.run_batch([Feed(0, 0, (5, 6), 1)])[0].shape == (1, LM.vocab_size)  # its row through shared memory
    finally:
        a.close()


def test_a_host_that_accepts_and_never_checks_the_key_is_an_error_at_the_deadline(tmp_path):
    """A socket that takes the connection and says nothing (a hung host, or not an engine host at
    all): multiprocessing's own Client would wait on it forever."""
    import socket

    address = str(tmp_path / "silent.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address)
    listener.listen(1)
    try:
        with pytest.raises(VerifierUnavailableError, match="did not check this process's key within 0.3 s"):
            RemoteEngine(address, b"key", timeout=0.3)
        held, _ = listener.accept()  # it did connect: the deadline was the key check's
        held.close()
    finally:
        listener.close()


def test_a_client_knows_how_many_of_its_sequences_the_engine_holds_at_once(tmp_path, caplog):
    """A parking engine's resident sequences bound a front end's calibration (which times batches on
    sequences held at once), not the front end's own max_sessions."""
    from types import SimpleNamespace

    from edgekit.verifier import VerifierServer

    engine = GatedEngine(LM, n_seq=2 * 4, max_context=64)
    engine.slots = SimpleNamespace(resident=2)  # as LlamaEngine's SequenceSlots says it
    host = EngineHost(engine, clients=2, seqs=4)
    try:
        a = _client(host)
        assert (a.seqs, a.resident) == (4, 2)
        config = ServerConfig(port=0, frontends=2, max_sessions=4, max_context=64, policy="wisp", calibrate="force",
                              calibration_dir=str(tmp_path))
        with caplog.at_level("WARNING", logger="edgekit.verifier"):
            server = VerifierServer(a, config)  # never started: its estimator is made here
        assert "2 sequences are too few to calibrate" in caplog.text
        assert not list(tmp_path.iterdir())  # nothing calibrated on sequences the engine would park
        server.service.close()
        a.close()
    finally:
        host.close()
    roomy = EngineHost(GatedEngine(LM, n_seq=2 * 4, max_context=64), clients=2, seqs=4)  # no parking: all held
    try:
        b = _client(roomy)
        assert b.resident == 4
        b.close()
    finally:
        roomy.close()


def test_a_client_in_another_process_gets_the_same_rows(host):
    """Through pickling across processes: a front end's feeds and the reduced and whole rows back."""
    script = (
        "import json, os, sys\n"
        "from edgekit.verifier import Feed\n"
        "from edgekit.verifier.engine import RemoteEngine\n"
        "e = RemoteEngine(sys.argv[1], bytes.fromhex(os.environ['KEY']))\n"
        "rows, best = e.run_batch([Feed(0, 0, (5, 6, 7), 2), Feed(1, 0, (5, 6, 7), 2, argmax=300)])\n"
        "print(json.dumps({'rows': rows.tolist(), 'best': best.tolist(), 'client': e.client}))\n"
        "e.close()\n"
    )
    done = subprocess.run([sys.executable, "-c", script, host.address], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "KEY": host.authkey.hex()})
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout)
    want = ToyEngine(LM, n_seq=2, max_context=64).run_batch([Feed(0, 0, (5, 6, 7), 2)])[0]
    assert got["client"] == 0 and np.array_equal(np.array(got["rows"], dtype=np.float32), want)
    assert got["best"] == np.argmax(want, axis=1).tolist()


def test_two_verifiers_over_one_host_answer_greedy_as_the_target_decodes_alone():
    """Two verifier front ends (each its own service, sessions and scheduler) over one engine: every
    answer token-identical to a local verifier's (greedy is the target's own decoding), their
    rounds verified together where they waited together."""
    target = ToyLanguageModel(vocab_size=300, seed=7)
    engine = ToyEngine(target, n_seq=2 * 8, max_context=512)
    host = EngineHost(engine, clients=2, seqs=8)
    remotes = [_client(host) for _ in range(2)]
    config = ServerConfig(port=0, max_sessions=8, max_context=512, max_block=8)
    try:
        services = [VerifierService(r, config) for r in remotes]

        def answers(transport, prompts):
            return [list(toy_client(target, noise=1.0, verifier=transport, mode="greedy", max_tokens=40,
                                    draft_k=4, stop_at_eos=False).generate(p).until_done().token_ids)
                    for p in prompts]

        prompts = [[[5, 6, 7 + i], [9, 8 + i]] for i in range(4)]
        with ThreadPoolExecutor(4) as pool:
            got = list(pool.map(lambda i: answers(InProcessTransport(services[i % 2]), prompts[i]), range(4)))
        alone = [answers(toy_verifier(target, max_context=512), p) for p in prompts]
        assert got == alone
        assert host.calls > 0  # (that waiting batches merge: the gated test above)
    finally:
        for r in remotes:
            r.close()
        host.close()
