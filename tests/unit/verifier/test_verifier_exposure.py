"""The verifier on an open network (issue 66): calls without a token refused from their headers,
streams bounded and ended when idle, whoever is behind a proxy counted as themselves, a token
never sent in plaintext off the machine without a word, and the smaller holes closed. Over real
gRPC on a toy engine; the attack at scale, on the gemma target, is benchmarks/exposure.py."""

from __future__ import annotations

import threading

import grpc
import pytest
from _wait import until
from grpc_health.v1 import health_pb2, health_pb2_grpc

from edgekit import ClientConfig, ServerConfig
from edgekit.errors import ConfigError, LimitExceededError, ProtocolError
from edgekit.link import host_of, is_local, probe
from edgekit.protocol import SERVICE_NAME, BlockRequest, OpenRequest
from edgekit.testing import FakeDraftModel, ToyLanguageModel, toy_server
from edgekit.transport import GrpcTransport, connect
from edgekit.verifier import VerifierServer
from edgekit.verifier._peers import Peers
from edgekit.verifier._streams import StreamLimits

TOKEN = "a-token-of-the-verifier-0123"
DRAFT = FakeDraftModel(ToyLanguageModel(seed=1, noise=1.0))
VERIFY = f"/{SERVICE_NAME}/Verify"
ROUNDS = f"/{SERVICE_NAME}/Rounds"


def _server(**config) -> VerifierServer:
    return toy_server(ToyLanguageModel(seed=1),
                      **({"max_sessions": 4, "max_context": 256, "token": TOKEN, "workers": 4} | config))


def _serving(address: str) -> bool:
    """The health check answers SERVING within its deadline (a verifier whose threads an attack holds
    answers none: DEADLINE_EXCEEDED). How fast it answers is benchmarks/exposure.py's to measure: this
    machine is shared."""
    with grpc.insecure_channel(address) as channel:
        r = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=5)
        return r.status == health_pb2.HealthCheckResponse.SERVING


def _honest_rounds(address: str, rounds: int = 5) -> list[int]:
    """A device's session: open, `rounds` rounds, close; the committed lengths."""
    with GrpcTransport(address, ClientConfig(timeout=10, token=TOKEN)) as t:
        t.handshake(DRAFT.fingerprint(), draft_model="d", draft_hidden_size=0)
        opened = t.open_session(OpenRequest([1, 2, 3], mode="greedy", seed=0, draft=DRAFT.fingerprint()))
        base, out = opened.committed_length, []
        for _ in range(rounds):
            base = t.verify(BlockRequest(opened.session_id, base, [4, 5])).committed_length
            out.append(base)
        t.close_session(opened.session_id)
        return out


class _Silent:
    """Calls that send their headers and then nothing: a request iterator that blocks until released."""

    def __init__(self, channel: grpc.Channel, method: str, n: int, metadata=()) -> None:
        self._release = threading.Event()
        calls = [channel.stream_stream(method) for _ in range(n)]
        self.calls = [c(self._nothing(), metadata=metadata, timeout=60) for c in calls]
        self.codes: list[grpc.StatusCode | None] = [None] * n
        for i, call in enumerate(self.calls):
            call.add_done_callback(lambda c, i=i: self.codes.__setitem__(i, c.code()))

    def _nothing(self):
        self._release.wait()
        return
        yield

    def ended(self) -> int:
        return sum(code is not None for code in self.codes)

    def close(self) -> None:
        self._release.set()
        for call in self.calls:
            call.cancel()


def test_calls_without_a_token_that_never_send_a_message_hold_no_thread():
    """200 unauthenticated calls that send headers and no message: each refused from its headers
    (a unary refusal would wait on a worker for the message: 4 workers, 4 such calls, and the
    verifier answered no one), while an honest device's rounds and the health check go on."""
    with _server() as server, grpc.insecure_channel(server.address) as channel:
        expected = _honest_rounds(server.address)
        silent = _Silent(channel, VERIFY, 200)
        try:
            until(lambda: silent.ended() == 200, "every call without a token refused")
            assert set(silent.codes) == {grpc.StatusCode.UNAUTHENTICATED}
            assert server.refused_unauthenticated >= 200
            assert _honest_rounds(server.address) == expected
            assert _serving(server.address)
        finally:
            silent.close()


def test_idle_streams_are_bounded_refused_past_the_bound_and_ended_when_idle():
    """200 authenticated Rounds streams that send nothing: max_streams of them are admitted (a
    thread each, beside the workers), the others refused at once; an honest device's Verify calls
    and the health check go on; the admitted ones are ended once idle past the timeout."""
    with _server(max_streams=8, stream_idle_timeout=3.0) as server, grpc.insecure_channel(server.address) as channel:
        expected = _honest_rounds(server.address)
        silent = _Silent(channel, ROUNDS, 200, metadata=(("authorization", f"Bearer {TOKEN}"),))
        try:
            refused = grpc.StatusCode.RESOURCE_EXHAUSTED
            until(lambda: silent.codes.count(refused) == 192, "the streams past the bound refused")
            assert len(server.service.streams) <= 8  # (ended already, on a machine slow to open 200 calls)
            assert _honest_rounds(server.address) == expected
            assert _serving(server.address)
            until(lambda: silent.ended() == 200, "the idle streams ended", timeout=30)
            assert silent.codes.count(grpc.StatusCode.CANCELLED) == 8
            assert server.service.streams.reaped == 8
            until(lambda: len(server.service.streams) == 0, "the ended streams' places given back")
        finally:
            silent.close()


def test_an_honest_round_stream_ended_for_idling_is_opened_again_at_the_next_round():
    with _server(stream_idle_timeout=0.3) as server:
        config = ClientConfig(timeout=10, token=TOKEN, round_streams=True)
        with GrpcTransport(server.address, config) as t:
            t.handshake(DRAFT.fingerprint(), draft_model="d", draft_hidden_size=0)
            opened = t.open_session(OpenRequest([1, 2, 3], mode="greedy", seed=0, draft=DRAFT.fingerprint()))
            base = t.verify(BlockRequest(opened.session_id, opened.committed_length, [4, 5])).committed_length
            until(lambda: server.service.streams.reaped == 1, "the idle stream ended")
            # the next round finds its stream over and opens another
            after = t.verify(BlockRequest(opened.session_id, base, [4, 5])).committed_length
            assert after > base


def test_stream_limits_per_client_and_idle_on_a_clock_of_the_test():
    now = [0.0]
    limits = StreamLimits(3, max_per_client=2, idle_s=10.0, clock=lambda: now[0])
    cancelled: list[str] = []
    with limits.admit("a", lambda: cancelled.append("a1")), limits.admit("a", lambda: cancelled.append("a2")) as a2:
        with pytest.raises(LimitExceededError, match="this client"):
            with limits.admit("a", lambda: None):
                pass
        with limits.admit("b", lambda: cancelled.append("b1")) as b1:
            with pytest.raises(LimitExceededError, match="3 streams open"):
                with limits.admit("c", lambda: None):
                    pass
            now[0] = 5.0
            a2.moved()
            with b1.working():  # the verifier working on b1's round: not the client idling
                now[0] = 12.0
                assert limits.reap() == 1 and cancelled == ["a1"]
            now[0] = 16.0
            assert limits.reap() == 1 and cancelled == ["a1", "a2"]  # each once, while its call unwinds
            now[0] = 23.0
            assert limits.reap() == 1 and cancelled == ["a1", "a2", "b1"]
    assert len(limits) == 0 and limits.refused == 2


def test_reflection_needs_the_token_where_tokens_are_required_and_health_does_not():
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    with _server() as server, grpc.insecure_channel(server.address) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        ask = reflection_pb2.ServerReflectionRequest(list_services="")
        with pytest.raises(grpc.RpcError) as refused:
            list(stub.ServerReflectionInfo(iter([ask]), timeout=5))
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        answers = list(stub.ServerReflectionInfo(iter([ask]), timeout=5,
                                                 metadata=(("authorization", f"Bearer {TOKEN}"),)))
        assert SERVICE_NAME in {s.name for s in answers[0].list_services_response.service}
        assert _serving(server.address)


def test_a_ping_may_not_ask_for_more_than_the_limit_and_the_probe_stops_below_it():
    with _server(max_ping_reply_bytes=64 * 1024) as server:
        with GrpcTransport(server.address, ClientConfig(timeout=10, token=TOKEN)) as t:
            t.ping(reply_bytes=64 * 1024)
            with pytest.raises(ProtocolError, match="exceeds 65536"):
                t.ping(reply_bytes=64 * 1024 + 1)
            # growing past the limit (loopback is too fast to time 1 to 64 KiB above its noise), the probe
            # is refused 256 KiB and keeps the last size the verifier answered, where it failed before
            asked: list[int] = []
            ping = t.ping
            t.ping = lambda payload_bytes=0, reply_bytes=0: asked.append(reply_bytes) or ping(  # type: ignore[method-assign]
                payload_bytes, reply_bytes)
            result = probe(t, payload_bytes=1024, max_payload_bytes=1024 * 1024)
            assert max(asked) == 256 * 1024 and result.pings > 0


def test_metrics_listen_on_loopback_unless_told(tmp_path):
    pytest.importorskip("prometheus_client")
    with _server(host="127.0.0.1", metrics_port=0) as server:
        assert server.metrics_address is not None and server.metrics_address.startswith("127.0.0.1:")
    assert ServerConfig().metrics_host == "127.0.0.1"


def test_a_token_is_never_sent_in_plaintext_off_this_machine_without_insecure():
    # constructing a transport sends nothing: no connection is made to these names
    with pytest.raises(ConfigError, match="plaintext to verifier.example"):
        connect("verifier.example:50051", ClientConfig(token=TOKEN))
    with pytest.raises(ConfigError, match="plaintext to 2001:db8::1"):
        connect("grpc://[2001:db8::1]:50051", ClientConfig(token=TOKEN))
    with pytest.raises(ConfigError, match="plaintext to verifier.example"):
        connect("openai+http://verifier.example:8000/v1", ClientConfig(token=TOKEN), DRAFT)
    for fine in ("grpcs://verifier.example:50051", "127.0.0.1:50051", "localhost:50051", "[::1]:50051",
                 "unix:/tmp/verifier.sock"):
        connect(fine, ClientConfig(token=TOKEN)).close()
    connect("verifier.example:50051", ClientConfig(token=TOKEN, insecure=True)).close()
    connect("verifier.example:50051", ClientConfig(token=TOKEN, tls=True)).close()
    connect("verifier.example:50051", ClientConfig()).close()  # no token, nothing to leak


def test_hosts_of_addresses():
    assert host_of("a.example:1") == "a.example" and host_of("[::1]:5") == "::1"
    assert host_of("10.0.0.5:8000/v1?x=1") == "10.0.0.5" and host_of("unix:/s") == "unix"
    assert is_local("127.0.0.2") and is_local("::1") and is_local("localhost") and not is_local("10.0.0.5")
    assert not is_local("localhost.example.com")


def test_a_plaintext_verifier_requiring_tokens_on_an_open_address_warns(caplog):
    with caplog.at_level("WARNING", logger="edgekit.verifier"), _server(host="0.0.0.0"):
        pass
    assert "tokens are required but 0.0.0.0" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="edgekit.verifier"), _server(host="127.0.0.1"):
        pass
    assert "tokens are required" not in caplog.text


def test_a_trusted_proxys_forwarded_address_names_the_client_and_no_one_elses_does():
    peers = Peers("10.0.0.0/8, 192.168.1.7")
    forwarded = (("x-forwarded-for", "6.6.6.6, 203.0.113.9"),)
    assert peers.host("ipv4:10.1.2.3:5555", forwarded) == "203.0.113.9"  # the proxy appended the last
    assert peers.host("ipv4:192.168.1.7:5555", (("x-forwarded-for", b"198.51.100.4"),)) == "198.51.100.4"
    assert peers.host("ipv4:203.0.113.50:5555", forwarded) == "203.0.113.50"  # a client's own header: ignored
    assert peers.host("ipv4:10.1.2.3:5555", ()) == "10.1.2.3"
    assert peers.host("ipv4:10.1.2.3:5555", (("x-forwarded-for", "not-an-address"),)) == "10.1.2.3"
    assert Peers().host("ipv6:[::1]:5", forwarded) == "::1"
    with pytest.raises(ConfigError, match="trusted_proxies"):
        Peers("10.0.0.0/33")


def test_devices_behind_a_trusted_proxy_are_counted_per_device(tmp_path):
    """max_sessions_per_client=1 without tokens: two devices behind one proxy (loopback here) each
    open a session when the proxy is trusted; the proxy's own calls count as one client when not."""
    def open_as(server: VerifierServer, address: str):
        with grpc.insecure_channel(server.address) as channel:
            from edgekit.protocol import open_request_to_pb

            req = open_request_to_pb(OpenRequest([1, 2, 3], mode="greedy", seed=0, draft=DRAFT.fingerprint()))
            call = channel.unary_unary(f"/{SERVICE_NAME}/OpenSession")
            return call(req.SerializeToString(), timeout=10, metadata=(("x-forwarded-for", address),))

    with _server(token=None, max_sessions_per_client=1, trusted_proxies="127.0.0.1") as server:
        open_as(server, "203.0.113.1")
        open_as(server, "203.0.113.2")
    with _server(token=None, max_sessions_per_client=1) as server:
        open_as(server, "203.0.113.1")
        with pytest.raises(grpc.RpcError) as refused:
            open_as(server, "203.0.113.2")
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED




def test_the_verifier_permits_the_devices_keepalive_pings():
    """gRPC's default policy takes a ping a client sends without data once per 5 minutes and hangs up
    on the third too early; the devices ping every KEEPALIVE_MS during a call."""
    from edgekit.transport._grpc import KEEPALIVE_MS  # private: the client's keepalive, against what the server permits
    from edgekit.verifier._server import PINGS_PERMITTED_EVERY_MS

    assert PINGS_PERMITTED_EVERY_MS <= KEEPALIVE_MS


def test_a_device_refused_a_stream_for_room_sends_its_round_as_a_verify_call():
    """The streams' bound full (an attacker with the same token holding them): an honest device on
    round streams is refused a new one, and sends that round as a Verify call, answered."""
    with _server(max_streams=2, stream_idle_timeout=30) as server, grpc.insecure_channel(server.address) as channel:
        silent = _Silent(channel, ROUNDS, 2, metadata=(("authorization", f"Bearer {TOKEN}"),))
        try:
            until(lambda: len(server.service.streams) == 2, "the bound held by the silent streams")
            config = ClientConfig(timeout=10, token=TOKEN, round_streams=True, retry_for=0)
            with GrpcTransport(server.address, config) as t:
                t.handshake(DRAFT.fingerprint(), draft_model="d", draft_hidden_size=0)
                opened = t.open_session(OpenRequest([1, 2, 3], mode="greedy", seed=0, draft=DRAFT.fingerprint()))
                verdict = t.verify(BlockRequest(opened.session_id, opened.committed_length, [4, 5]))
                assert verdict.committed_length > opened.committed_length
            assert server.service.streams.refused >= 1
        finally:
            silent.close()
