"""Bad input, each with a clear error and nothing lost: on the real gemma verifier."""

from __future__ import annotations

import socket
import time

import grpc
import pytest

from edgekit import (
    AuthenticationError,
    ClientConfig,
    EdgeClient,
    IncompatibleModelsError,
    LimitExceededError,
    LlamaDraftModel,
    ProtocolError,
    ServerConfig,
    SessionNotFoundError,
    StaleRoundError,
    VerifierUnavailableError,
)
from edgekit.protocol import BlockRequest, OpenRequest, pb
from edgekit.testing import ManualClock
from edgekit.transport import GrpcTransport
from edgekit.verifier import VerifierServer

pytestmark = pytest.mark.models

TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def small_server(gemma_paths):
    """Two sessions, a 1 s idle timeout, a 64 KiB message limit, a token."""
    config = ServerConfig(
        port=0, max_sessions=2, max_context=512, idle_timeout=1.0, max_message_bytes=64 * 1024, max_block=8, token=TOKEN
    )
    # idleness on a clock the tests move: whether a session is idle never depends on the machine's speed
    server = VerifierServer(gemma_paths[1], config, name="gemma-3-270m", clock=ManualClock()).start()
    yield server
    server.stop()


@pytest.fixture()
def small(small_server):
    t = GrpcTransport(small_server.address, ClientConfig(token=TOKEN, timeout=20))
    yield t
    t.close()


def _open(transport, draft, prompt="Hello there, general"):
    return transport.open_session(OpenRequest(
        draft.tokenize(prompt), mode="greedy", seed=0, draft=draft.fingerprint()
    ))


def _raw(address, method, payload: bytes, metadata=()):
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary(f"/edgekit.verifier.v1.Verifier/{method}")
        return call(payload, timeout=10, metadata=metadata)


def test_a_draft_with_another_tokenizer_is_refused_naming_both_models(gemma_server):
    from edgekit.models import model_path

    smol = LlamaDraftModel(model_path("smollm2-135m-instruct"), name="smollm2-135m-instruct", n_ctx=256)
    try:
        with EdgeClient(gemma_server.address, draft=smol) as client:
            with pytest.raises(IncompatibleModelsError) as info:
                client.generate("hi").text()
        msg = str(info.value)
        assert "smollm2-135m-instruct" in msg and "gemma-3-270m" in msg and "tokenizer" in msg
        # Sessions check it again: a client that skips the handshake is refused too.
        with GrpcTransport(gemma_server.address) as t, pytest.raises(IncompatibleModelsError):
            _open(t, smol)
    finally:
        smol.close()


def test_unknown_session_is_not_found(transport):
    with pytest.raises(SessionNotFoundError) as info:
        transport.verify(BlockRequest(session_id="s-doesnotexist", base_position=3, draft_tokens=[5]))
    assert info.value.code == "NOT_FOUND" and info.value.address == transport.address


def test_full_table_refuses_then_evicts_the_idle_session(small, small_server, gemma_draft):
    a = _open(small, gemma_draft)
    _open(small, gemma_draft)
    with pytest.raises(LimitExceededError, match="maximum of 2 sessions"):
        _open(small, gemma_draft)  # both sessions are fresh: nothing is idle yet
    small_server.service.clock.now += 1.2  # past the 1 s idle timeout
    c = _open(small, gemma_draft)  # evicts the least recently used idle session: a
    with pytest.raises(SessionNotFoundError):
        small.verify(BlockRequest(session_id=a.session_id, base_position=a.committed_length, draft_tokens=[5]))
    small.close_session(c.session_id)


def test_a_stale_round_is_detected_and_a_retry_is_applied_once(transport, gemma_draft, gemma_server):
    opened = _open(transport, gemma_draft)
    sid, base = opened.session_id, opened.committed_length
    block = BlockRequest(session_id=sid, base_position=base,
                         draft_tokens=gemma_draft.tokenize(" Kenobi", add_special=False))
    first = transport.verify(block)
    state = gemma_server.service.sessions.get(sid)
    assert len(state.tokens) == first.committed_length
    again = transport.verify(block)  # a retried round (say, after a lost reply): same verdict, not applied twice
    assert again == first and len(state.tokens) == first.committed_length
    other = BlockRequest(session_id=sid, base_position=base, draft_tokens=[100, 200])
    with pytest.raises(StaleRoundError) as info:
        transport.verify(other)
    assert info.value.committed_length == first.committed_length
    assert len(state.tokens) == first.committed_length
    transport.close_session(sid)


def test_malformed_and_oversize_requests_are_invalid_and_others_keep_working(small, small_server, gemma_draft):
    auth = (("authorization", f"Bearer {TOKEN}"),)
    survivor = _open(small, gemma_draft, "The quick brown fox")
    with pytest.raises(grpc.RpcError) as info:
        _raw(small_server.address, "Verify", b"\xff\xff\xff\xff not protobuf", auth)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "malformed" in info.value.details()
    big = pb.VerifyRequest(session_id=survivor.session_id, base_position=survivor.committed_length, draft_tokens=[5])
    big.hidden.data = bytes(100 * 1024)
    with pytest.raises(grpc.RpcError) as info:
        _raw(small_server.address, "Verify", big.SerializeToString(), auth)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "exceeds the limit" in info.value.details()
    base = survivor.committed_length
    with pytest.raises(ProtocolError, match="max_block"):
        small.verify(BlockRequest(session_id=survivor.session_id, base_position=base, draft_tokens=[5] * 9))
    with pytest.raises(ProtocolError, match="outside the vocabulary"):
        small.verify(BlockRequest(session_id=survivor.session_id, base_position=base, draft_tokens=[10**7]))
    # Nothing above touched the session: it verifies at the same base.
    verdict = small.verify(BlockRequest(session_id=survivor.session_id, base_position=base, draft_tokens=[5, 6]))
    assert verdict.committed_length == base + verdict.accepted + 1
    small.close_session(survivor.session_id)


def test_wrong_protocol_version_is_refused(gemma_server):
    req = pb.HandshakeRequest(protocol_version=0)
    with pytest.raises(grpc.RpcError) as info:
        _raw(gemma_server.address, "Handshake", req.SerializeToString())
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "protocol version 0" in info.value.details()


def test_token_is_required_when_configured(small_server, gemma_draft):
    with GrpcTransport(small_server.address, ClientConfig(token="wrong")) as t, pytest.raises(AuthenticationError):
        t.handshake(gemma_draft.fingerprint(), draft_model="d", draft_hidden_size=640)
    with GrpcTransport(small_server.address, ClientConfig(token=TOKEN)) as t:
        info = t.handshake(gemma_draft.fingerprint(), draft_model="d", draft_hidden_size=640)
        assert info.target_model == "gemma-3-270m" and t.health() == "SERVING"


def test_a_dead_verifier_fails_fast_naming_its_address(gemma_draft):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens here now
    address = f"127.0.0.1:{port}"
    t0 = time.monotonic()
    with EdgeClient(address, draft=gemma_draft, config=ClientConfig(timeout=5, connect_timeout=5)) as client:
        with pytest.raises(VerifierUnavailableError) as info:
            client.generate("hi").text()
    assert time.monotonic() - t0 < 5
    assert address in str(info.value) and "edgekit serve" in str(info.value)


def test_a_silent_verifier_fails_within_the_deadline(gemma_draft, silent_address):
    """A host that accepts TCP but never answers: the deadline, not a hang."""
    address = silent_address
    t0 = time.monotonic()
    with GrpcTransport(address, ClientConfig(timeout=1.0, connect_timeout=1.0)) as t:
        with pytest.raises(VerifierUnavailableError) as info:
            t.handshake(gemma_draft.fingerprint(), draft_model="d", draft_hidden_size=640)
    elapsed = time.monotonic() - t0
    assert elapsed < 3.0
    assert address in str(info.value) and "1 s" in str(info.value)


def test_tls_with_a_self_signed_certificate(gemma_paths, gemma_draft, tmp_path):
    import shutil
    import subprocess

    if shutil.which("openssl") is None:
        pytest.fail("openssl is needed to make the test certificate", pytrace=False)
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
        check=True, capture_output=True,
    )
    config = ServerConfig(port=0, max_sessions=1, max_context=256, tls_cert=str(cert), tls_key=str(key))
    with VerifierServer(gemma_paths[1], config, name="gemma-3-270m") as server:
        with GrpcTransport(server.address, ClientConfig(tls=True, root_certificates=str(cert))) as t:
            info = t.handshake(gemma_draft.fingerprint(), draft_model="d", draft_hidden_size=640)
            assert info.target_model == "gemma-3-270m"
        with GrpcTransport(server.address, ClientConfig(connect_timeout=3)) as plain:  # no TLS: refused, clearly
            with pytest.raises(VerifierUnavailableError):
                plain.handshake(gemma_draft.fingerprint(), draft_model="d", draft_hidden_size=640)
