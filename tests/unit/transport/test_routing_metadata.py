"""Every call carries metadata a proxy in front of several verifiers can hash on (issue 38,
item 1): the client's id on every call, the session's on a session's calls. A recording
gRPC forwarder stands where HAProxy or nginx would, between a client and a verifier. It
passes no deadline on, as grpcurl by default does not: a call without one once failed
OpenSession with INTERNAL (an OverflowError waiting "forever")."""

from __future__ import annotations

from concurrent import futures

import grpc
import pytest
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.descriptor_pool import DescriptorPool
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from edgekit import ClientConfig, EdgeClient, GenerationConfig
from edgekit.protocol import SERVICE_NAME
from edgekit.testing import FakeDraftModel, ToyLanguageModel, toy_server
from edgekit.transport import CLIENT_HEADER, SESSION_HEADER, GrpcTransport

TARGET = ToyLanguageModel(seed=11, eos_bias=-8.0)


class Recorder(grpc.GenericRpcHandler):
    """Forwards every call as bytes to `upstream`, keeping (method, metadata) of each. A Rounds
    stream is forwarded as one (`rounds="stream"`), as a unary call (`"unary"`, as a proxy set up
    for unary methods only would: one request, one answer, then the end of the stream), or not
    at all (`"none"`: UNIMPLEMENTED, as a verifier older than the method)."""

    def __init__(self, upstream: str, *, rounds: str = "stream") -> None:
        self.channel = grpc.insecure_channel(upstream)
        self.calls: list[tuple[str, dict[str, str]]] = []
        self.rounds = rounds

    def service(self, details: grpc.HandlerCallDetails):
        method = details.method
        meta = {k: v for k, v in details.invocation_metadata}
        self.calls.append((method.rsplit("/", 1)[-1], meta))
        if method.endswith("/Generate"):
            stream = self.channel.unary_stream(method)
            return grpc.unary_stream_rpc_method_handler(lambda req, ctx: stream(req, metadata=tuple(meta.items())))
        if method.endswith("/Rounds") and self.rounds == "none":
            return None
        if method.endswith("/Rounds") and self.rounds == "stream":
            rounds = self.channel.stream_stream(method)
            return grpc.stream_stream_rpc_method_handler(lambda reqs, ctx: rounds(reqs, metadata=tuple(meta.items())))
        unary = self.channel.unary_unary(method)
        return grpc.unary_unary_rpc_method_handler(lambda req, ctx: unary(req, metadata=tuple(meta.items())))


def test_every_call_names_the_client_and_a_sessions_calls_name_the_session(toy_target, toy_grpc):
    recorder = Recorder(toy_grpc.address)
    proxy = grpc.server(futures.ThreadPoolExecutor(4), handlers=(recorder,))
    port = proxy.add_insecure_port("127.0.0.1:0")
    proxy.start()
    try:
        gen = GenerationConfig(max_tokens=12, draft_k=3, drafting="fixed", stop_at_eos=False)
        config = ClientConfig(client_id="device-7", timeout=10, round_streams=True, first_route="speculative")
        with EdgeClient(f"127.0.0.1:{port}", draft=FakeDraftModel(toy_target), config=config,
                        generation=gen) as client:
            out = client.generate([1, 2, 3]).until_done()
        assert list(out.token_ids) == toy_target.greedy([1, 2, 3], 12)
        with GrpcTransport(f"127.0.0.1:{port}") as bare:  # built on its own: an id of its own
            bare.ping()
    finally:
        proxy.stop(0)
    methods = [m for m, _ in recorder.calls]
    # the session's rounds on one stream: the verifier offers it
    assert {"Handshake", "OpenSession", "CloseSession"} <= set(methods) and methods.count("Rounds") == 1, methods
    assert "Verify" not in methods
    ours = recorder.calls[:-1]
    assert all(meta.get(CLIENT_HEADER) == "device-7" for _, meta in ours)
    opened = methods.index("OpenSession")
    assert SESSION_HEADER not in recorder.calls[opened][1]  # the verifier gives the id in its answer
    sessions = {meta.get(SESSION_HEADER) for m, meta in ours if m in ("Rounds", "CloseSession", "ExtendSession")}
    assert len(sessions) == 1 and None not in sessions and "" not in sessions
    bare_id = recorder.calls[-1][1].get(CLIENT_HEADER)
    assert bare_id and bare_id != "device-7"


@pytest.mark.parametrize("rounds", ["unary", "none"])
def test_a_proxy_that_carries_no_round_stream_gets_verify_calls(toy_target, toy_grpc, rounds):
    """The verifier offers Rounds, but the way there does not carry it: the client goes back to
    Verify calls at the first sign (its round answered again by key), and the answer is the same."""
    recorder = Recorder(toy_grpc.address, rounds=rounds)
    proxy = grpc.server(futures.ThreadPoolExecutor(4), handlers=(recorder,))
    port = proxy.add_insecure_port("127.0.0.1:0")
    proxy.start()
    try:
        gen = GenerationConfig(max_tokens=12, draft_k=3, drafting="fixed", stop_at_eos=False)
        # a failure would end the answer; the route pinned: the rounds are what is counted
        config = ClientConfig(timeout=10, retry_for=0, round_streams=True, first_route="speculative")
        with EdgeClient(f"127.0.0.1:{port}", draft=FakeDraftModel(toy_target), config=config,
                        generation=gen) as client:
            out = client.generate([1, 2, 3]).until_done()
            again = client.generate([1, 2, 3]).until_done()  # a new session: no stream tried again
    finally:
        proxy.stop(0)
    assert list(out.token_ids) == list(again.token_ids) == toy_target.greedy([1, 2, 3], 12)
    methods = [m for m, _ in recorder.calls]
    assert methods.count("Rounds") == 1 and methods.count("Verify") >= 4, methods
    assert methods.index("Rounds") < methods.index("Verify")


class _Token(grpc.StreamStreamClientInterceptor):
    """A channel's calls carrying the token (grpcurl's -H 'authorization: Bearer ...')."""

    def intercept_stream_stream(self, continuation, details, requests):  # type: ignore[no-untyped-def]
        metadata = (*(details.metadata or ()), ("authorization", "Bearer secret"))
        return continuation(details._replace(metadata=metadata), requests)


def test_reflection_lists_the_verifier_and_health_services_and_describes_verify_with_the_token():
    """grpcurl's `list` and `describe`, through grpc's own reflection client (issue 38, item 4);
    where tokens are required, reflection needs one as every call but health checks (issue 66)."""
    with toy_server(TARGET, max_sessions=2, max_context=256, token="secret") as verifier:
        with grpc.insecure_channel(verifier.address) as channel:
            with pytest.raises(grpc.RpcError) as refused:
                ProtoReflectionDescriptorDatabase(channel).get_services()
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            db = ProtoReflectionDescriptorDatabase(grpc.intercept_channel(channel, _Token()))
            services = set(db.get_services())
            assert {SERVICE_NAME, "grpc.health.v1.Health"} <= services, services
            verify = DescriptorPool(db).FindServiceByName(SERVICE_NAME).methods_by_name["Verify"]
            session_id = verify.input_type.fields_by_name["session_id"]
            assert session_id.type == FieldDescriptor.TYPE_STRING
