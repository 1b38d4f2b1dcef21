"""The verifier against callers that misbehave, over real gRPC on a toy engine
(issue 16, item 0 and item 6): tenants kept apart, one client unable to take every
session, a close that no round outlives, unknown enum values, inputs never echoed
whole, huge turns refused before they are read, and bugs answered INTERNAL."""

from __future__ import annotations

import threading
import time

import grpc
import pytest
from _wait import until

from edgekit import ClientConfig, ServerConfig, VerifierUnavailableError
from edgekit.errors import (
    AuthenticationError,
    InternalError,
    LimitExceededError,
    SessionNotFoundError,
)
from edgekit.protocol import GREEDY, BlockRequest, OpenRequest, fingerprint_to_pb, pb
from edgekit.testing import FakeDraftModel, ManualClock, ToyLanguageModel, toy_server
from edgekit.transport import GrpcTransport
from edgekit.verifier import ToyEngine, VerifierServer, VerifierService
from edgekit.verifier._sessions import SessionTable

TOKENS = {"alice": "alice-token-0123456789", "bob": "bob-token-0123456789ab"}
DRAFT = FakeDraftModel(ToyLanguageModel(seed=1, noise=1.0))
FP = fingerprint_to_pb(DRAFT.fingerprint())


def _server(tmp_path, *, clock=time.monotonic, **config) -> VerifierServer:
    file = tmp_path / "tokens"
    file.write_text("".join(f"{name} {token}  # {name}'s devices\n" for name, token in TOKENS.items()))
    return toy_server(ToyLanguageModel(seed=1), clock=clock,
                      **({"max_sessions": 4, "max_context": 256, "tokens_file": str(file)} | config))



def _client(server: VerifierServer, tenant: str | None) -> GrpcTransport:
    t = GrpcTransport(server.address, ClientConfig(timeout=10, token=TOKENS.get(tenant or "")))
    return t


def _open(t: GrpcTransport, prompt=(1, 2, 3)):
    t.handshake(DRAFT.fingerprint(), draft_model="d", draft_hidden_size=0)
    return t.open_session(OpenRequest(list(prompt), mode="greedy", seed=0, draft=DRAFT.fingerprint()))


def _raw(server: VerifierServer, method: str, message, tenant="alice"):
    with grpc.insecure_channel(server.address) as channel:
        call = channel.unary_unary(f"/edgekit.verifier.v1.Verifier/{method}")
        return call(message.SerializeToString(), timeout=10, metadata=(("authorization", f"Bearer {TOKENS[tenant]}"),))


@pytest.fixture
def server(tmp_path):
    with _server(tmp_path) as s:
        yield s


def test_one_tenant_cannot_see_verify_extend_or_close_anothers_session(server):
    with _client(server, "alice") as alice, _client(server, "bob") as bob:
        opened = _open(alice)
        sid, base = opened.session_id, opened.committed_length
        assert len(sid.removeprefix("s-")) == 32  # 128 random bits
        with pytest.raises(SessionNotFoundError):
            bob.verify(BlockRequest(sid, base, [4, 5]))
        with pytest.raises(SessionNotFoundError):
            bob.extend_session(sid, base, [7])
        with pytest.raises(SessionNotFoundError):
            bob.close_session(sid)
        verdict = alice.verify(BlockRequest(sid, base, [4, 5]))  # untouched by bob's tries
        assert verdict.committed_length == base + verdict.accepted + 1
        alice.close_session(sid)
    with _client(server, None) as nobody, pytest.raises(AuthenticationError):
        _open(nobody)


def test_one_client_cannot_lock_the_others_out(server):
    with _client(server, "alice") as alice, _client(server, "bob") as bob:
        mine = [_open(alice) for _ in range(4)]  # every session the verifier has
        theirs = _open(bob)  # alice holds over half: bob takes her least recently used one
        with pytest.raises(SessionNotFoundError):
            alice.verify(BlockRequest(mine[0].session_id, mine[0].committed_length, [4]))
        verdict = alice.verify(BlockRequest(mine[1].session_id, mine[1].committed_length, [4]))
        assert verdict.committed_length > mine[1].committed_length  # her others go on
        with pytest.raises(LimitExceededError, match="maximum of 4 sessions") as info:
            _open(alice)  # she still holds three, over half: she is not owed one
        assert info.value.retry_after is not None and info.value.retry_after > 0
        bob.close_session(theirs.session_id)
        _open(alice)


def test_a_hard_limit_per_client(tmp_path):
    with _server(tmp_path, max_sessions_per_client=2) as server, _client(server, "alice") as alice:
        _open(alice), _open(alice)
        with pytest.raises(LimitExceededError, match="most one client may hold") as info:
            _open(alice)
        assert info.value.retry_after is not None
        with _client(server, "bob") as bob:
            _open(bob)


def test_a_round_waiting_on_a_session_that_closes_is_refused_never_run_on_its_sequence():
    got, go = threading.Event(), threading.Event()

    class Paused(SessionTable):
        def get(self, session_id, owner=""):
            sess = super().get(session_id, owner)
            if threading.current_thread().name == "round":
                got.set()
                go.wait(30)
            return sess

    table = Paused(2, 900.0)
    sess = table.create(mode="greedy", sampler=GREEDY, seed=0)
    outcome: list[object] = []

    def round_() -> None:
        try:
            with table.acquire(sess.id):
                outcome.append("ran")
        except SessionNotFoundError as exc:
            outcome.append(exc)

    worker = threading.Thread(target=round_, name="round")
    worker.start()
    assert got.wait(30)  # the round found the session ...
    assert table.close(sess.id)  # ... which closed before the round took its lock
    go.set()
    worker.join(30)
    assert not worker.is_alive()
    assert isinstance(outcome[0], SessionNotFoundError) and "closed" in str(outcome[0])
    assert len(table) == 0


def test_unknown_enum_values_are_invalid_arguments_not_unknown_errors(server):
    with _client(server, "alice") as alice:
        opened = _open(alice)
    sid, base = opened.session_id, opened.committed_length
    cases = [
        ("Verify", pb.VerifyRequest(session_id=sid, base_position=base, draft_tokens=[4], upload_protocol=77)),
        ("Verify", pb.VerifyRequest(session_id=sid, base_position=base, draft_tokens=[4],
                                    upload_protocol=pb.UPLOAD_PROTOCOL_FULL_HIDDEN,
                                    hidden=pb.HiddenStates(encoding=99, count=1, dim=8, data=bytes(16)))),
        ("OpenSession",
         pb.OpenSessionRequest(prompt_tokens=[1, 2], sampling=pb.SamplingParams(mode=42), draft_tokenizer=FP)),
    ]
    for method, message in cases:
        with pytest.raises(grpc.RpcError) as info:
            _raw(server, method, message)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (method, info.value.details())


def test_messages_never_echo_a_whole_input(server):
    huge_id = "x" * 100_000
    for method, message in [
        ("Verify", pb.VerifyRequest(session_id=huge_id, draft_tokens=[4])),
        ("CloseSession", pb.CloseSessionRequest(session_id=huge_id)),
        ("ExtendSession", pb.ExtendSessionRequest(session_id=huge_id, tokens=[1])),
        ("OpenSession", pb.OpenSessionRequest(prompt_tokens=[1, 2], slo_name="y" * 100_000, draft_tokenizer=FP,
                                              sampling=pb.SamplingParams(mode=pb.ACCEPTANCE_MODE_GREEDY))),
        ("OpenSession", pb.OpenSessionRequest(prompt_tokens=[1, 2], draft_tokenizer=pb.TokenizerFingerprint(
            model_name="z" * 100_000))),
    ]:
        with pytest.raises(grpc.RpcError) as info:
            _raw(server, method, message)
        assert len(info.value.details()) < 400, (method, len(info.value.details()))


def test_a_huge_turn_is_refused_by_its_length_before_its_tokens_are_read(server):
    with _client(server, "alice") as alice:
        opened = _open(alice)
        # A million ids, all outside the vocabulary: the refusal names the length, so no id was looked at.
        bad = [10**8] * 1_000_000
        with pytest.raises(LimitExceededError, match="context limit"):
            alice.extend_session(opened.session_id, opened.committed_length, bad)
        with pytest.raises(grpc.RpcError) as info:
            greedy = pb.SamplingParams(mode=pb.ACCEPTANCE_MODE_GREEDY)
            _raw(server, "OpenSession", pb.OpenSessionRequest(prompt_tokens=bad, draft_tokenizer=FP, sampling=greedy))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "context limit" in info.value.details()
        # Far past the message limit, gRPC itself refuses it before the service reads it.
        with pytest.raises(grpc.RpcError) as info:
            _raw(server, "ExtendSession", pb.ExtendSessionRequest(session_id="s", tokens=[10**8] * 5_000_000))
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        verdict = alice.verify(BlockRequest(opened.session_id, opened.committed_length, [4]))
        assert verdict.committed_length >= opened.committed_length + 1  # the session is as it was


def test_a_bug_is_answered_internal_with_a_message_and_the_verifier_goes_on(monkeypatch):
    config = ServerConfig(port=0, max_sessions=2, max_context=128)
    service = VerifierService(ToyEngine(ToyLanguageModel(seed=1), n_seq=2, max_context=128), config)
    request = pb.PingRequest(reply_bytes=4).SerializeToString()

    def broken(req, deadline=None, caller=None):
        raise KeyError("a bug")

    monkeypatch.setitem(service._unary, "Ping", (pb.PingRequest, broken))
    with pytest.raises(InternalError, match="Ping failed inside the verifier: KeyError"):
        service.call("Ping", request)
    monkeypatch.undo()
    assert service.call("Ping", request).payload == bytes(4)
    service.close()


def test_draining_refuses_new_sessions_serves_open_ones_and_stops_when_quiet(tmp_path):
    clock = ManualClock()  # quiet time is the test's to pass: the drain never outruns a slow machine's calls
    server = _server(tmp_path, clock=clock).start()
    with _client(server, "alice") as alice:
        opened = _open(alice)
        took: list[float] = []
        drainer = threading.Thread(target=lambda: took.append(server.drain(timeout=20.0, quiet=1.0)), daemon=True)
        drainer.start()
        until(lambda: server.service.draining is not None, "the drain began")
        assert alice.health() == "NOT_SERVING"
        with pytest.raises(VerifierUnavailableError, match="draining") as info:
            _open(alice)
        assert info.value.retry_after is not None and info.value.retry_after > 1
        base = opened.committed_length
        for _ in range(3):  # the open session is still served, and keeps the verifier up
            base = alice.verify(BlockRequest(opened.session_id, base, [4])).committed_length
            clock.now += 0.5
        assert drainer.is_alive()  # 1.5 s into the drain, a call every half second: still up
        clock.now += 0.5  # a second since the last call
        drainer.join(30)
        assert not drainer.is_alive()
        assert took == [pytest.approx(2.0)]  # stopped a second after the last call (1 s in), not at 20 s
        with pytest.raises(VerifierUnavailableError):
            alice.verify(BlockRequest(opened.session_id, base, [4]))


def test_draining_gives_a_quiet_session_its_quiet_time_and_stops_once_every_session_closed(tmp_path):
    clock = ManualClock()
    server = _server(tmp_path, clock=clock).start()
    with _client(server, "alice") as alice:
        opened = _open(alice)
        clock.now += 5.0  # the device last called 5 s before the drain (drafting on a busy core, say)
        took: list[float] = []
        drainer = threading.Thread(target=lambda: took.append(server.drain(timeout=20.0, quiet=1.0)), daemon=True)
        drainer.start()
        until(lambda: server.service.draining is not None, "the drain began")
        clock.now += 0.9
        assert drainer.is_alive()  # quiet is counted from the drain's start: its next round is still served
        base = alice.verify(BlockRequest(opened.session_id, opened.committed_length, [4])).committed_length
        assert base > opened.committed_length
        alice.close_session(opened.session_id)  # the answer is done: nothing is left to serve
        drainer.join(30)
        assert not drainer.is_alive() and took == [pytest.approx(0.9)]  # at once: no quiet time passed


def test_no_token_and_no_prompt_reach_the_logs_even_at_debug(tmp_path, caplog):
    import logging

    caplog.set_level(logging.DEBUG, logger="edgekit")
    prompt = [11, 42, 17, 33, 9, 51, 27]
    with _server(tmp_path) as server, _client(server, "alice") as alice:
        opened = _open(alice, prompt)
        after = alice.verify(BlockRequest(opened.session_id, opened.committed_length, [4, 5])).committed_length
        with pytest.raises(LimitExceededError):
            alice.extend_session(opened.session_id, after, [10**8] * 10_000)
        alice.close_session(opened.session_id)
        with GrpcTransport(server.address, ClientConfig(timeout=5, token="wrong-token-xyz")) as wrong:
            with pytest.raises(AuthenticationError):
                _open(wrong)
    text = "\n".join(r.getMessage() + (r.exc_text or "") for r in caplog.records)
    assert caplog.records  # the verifier did log (its batches, at debug)
    for secret in (*TOKENS.values(), "wrong-token-xyz", opened.session_id, str(prompt)[1:-1]):
        assert secret not in text


def _openssl(*args: str) -> None:
    import shutil
    import subprocess

    if shutil.which("openssl") is None:
        pytest.fail("openssl is needed to make the test certificates", pytrace=False)
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def _signed(tmp_path, name: str, ca_key, ca_cert, san: str | None = None):
    key, csr, cert = (tmp_path / f"{name}.{ext}" for ext in ("key", "csr", "pem"))
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={name}")
    ext = tmp_path / f"{name}.ext"
    ext.write_text(f"subjectAltName={san}\n" if san else "extendedKeyUsage=clientAuth\n")
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca_cert), "-CAkey", str(ca_key), "-CAcreateserial",
             "-out", str(cert), "-days", "1", "-extfile", str(ext))
    return key, cert


def test_mutual_tls_takes_a_client_certificate_from_the_ca_and_refuses_others(tmp_path):
    ca_key, ca_cert = tmp_path / "ca.key", tmp_path / "ca.pem"
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(ca_key), "-out", str(ca_cert),
             "-days", "1", "-subj", "/CN=edgekit test CA")
    server_key, server_cert = _signed(tmp_path, "verifier", ca_key, ca_cert, "DNS:localhost,IP:127.0.0.1")
    client_key, client_cert = _signed(tmp_path, "device", ca_key, ca_cert)
    rogue_key, rogue_cert = tmp_path / "rogue.key", tmp_path / "rogue.pem"  # self-signed: not from the CA
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(rogue_key), "-out", str(rogue_cert),
             "-days", "1", "-subj", "/CN=rogue")
    with toy_server(ToyLanguageModel(seed=1), max_sessions=2, max_context=128, tls_cert=str(server_cert),
                    tls_key=str(server_key), tls_client_ca=str(ca_cert)) as server:
        good = ClientConfig(tls=True, root_certificates=str(ca_cert), tls_cert=str(client_cert),
                            tls_key=str(client_key), timeout=5, connect_timeout=5)
        with GrpcTransport(server.address, good) as t:
            opened = _open(t)
            assert t.verify(BlockRequest(opened.session_id, opened.committed_length, [4])).committed_length > 3
        for who in (
            ClientConfig(tls=True, root_certificates=str(ca_cert), timeout=3, connect_timeout=3),  # no certificate
            ClientConfig(tls=True, root_certificates=str(ca_cert), tls_cert=str(rogue_cert), tls_key=str(rogue_key),
                         timeout=3, connect_timeout=3),
        ):
            with GrpcTransport(server.address, who) as t, pytest.raises(VerifierUnavailableError):
                _open(t)


def test_a_generate_stream_nobody_reads_ends_at_its_deadline_and_holds_nothing(tmp_path):
    """A client asks for a long target-only stream and never reads it: gRPC's flow control holds
    the server's sends, the call ends at its deadline, and meanwhile others are served."""
    with _server(tmp_path, max_context=4096, max_generate_tokens=4000) as server:
        channel = grpc.insecure_channel(server.address)
        auth = (("authorization", f"Bearer {TOKENS['bob']}"),)
        request = pb.GenerateRequest(prompt_tokens=[1, 2, 3], max_tokens=4000,
                                     sampling=pb.SamplingParams(mode=pb.ACCEPTANCE_MODE_GREEDY))
        unread = channel.unary_stream("/edgekit.verifier.v1.Verifier/Generate")(
            request.SerializeToString(), timeout=2.0, metadata=auth
        )  # never iterated
        with _client(server, "alice") as alice:  # served beside it
            sid = _open(alice).session_id
            target = ToyLanguageModel(seed=1).greedy([1, 2, 3], 3)
            assert alice.verify(BlockRequest(sid, 3, target[:2])).accepted == 2
        until(lambda: server.service.quiet_for() > 0.0, "the unread stream's handler ended")  # it is gone
        # What it left is in the client's buffers, bounded by max_generate_tokens: all of it (the toy is
        # fast and the messages small), or what came before the deadline.
        got = 0
        try:
            for _ in unread:
                got += 1
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert got <= 4000
        channel.close()
