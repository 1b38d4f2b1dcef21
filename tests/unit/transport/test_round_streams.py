"""A session's rounds on one stream (issue 50, part 4): the Rounds RPC. A stream's verdicts are
those of Verify calls, a refusal ends the stream with Verify's status, the token is asked of a
stream too; a client whose round is not answered within its deadline gets Verify's timeout error
and a new stream for the next round, and a stream that ended between two rounds is replaced
without an error."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager

import grpc
import pytest
from _wait import until

from edgekit import ClientConfig, EdgeClient, GenerationConfig
from edgekit.errors import VerifierUnavailableError
from edgekit.protocol import SERVICE_NAME, BlockRequest, OpenRequest, pb
from edgekit.testing import FakeDraftModel, ToyLanguageModel, toy_server
from edgekit.transport import GrpcTransport

TARGET = ToyLanguageModel(seed=5)


def _open(channel: grpc.Channel, prompt: list[int], metadata=()) -> pb.OpenSessionResponse:
    from edgekit.protocol import fingerprint_to_pb

    stub = channel.unary_unary(f"/{SERVICE_NAME}/OpenSession",
                               request_serializer=pb.OpenSessionRequest.SerializeToString,
                               response_deserializer=pb.OpenSessionResponse.FromString)
    draft = FakeDraftModel(TARGET)
    return stub(pb.OpenSessionRequest(prompt_tokens=prompt, draft_tokenizer=fingerprint_to_pb(draft.fingerprint()),
                                      sampling=pb.SamplingParams(mode=pb.ACCEPTANCE_MODE_GREEDY)),
                timeout=30, metadata=metadata)


def _rounds(channel: grpc.Channel):
    return channel.stream_stream(f"/{SERVICE_NAME}/Rounds", request_serializer=pb.VerifyRequest.SerializeToString,
                                 response_deserializer=pb.VerifyResponse.FromString)


def _verify(channel: grpc.Channel):
    return channel.unary_unary(f"/{SERVICE_NAME}/Verify", request_serializer=pb.VerifyRequest.SerializeToString,
                               response_deserializer=pb.VerifyResponse.FromString)


def _blocks(prompt: list[int], n: int) -> list[tuple[int, list[int]]]:
    """Rounds of a session that drafts the target's own tokens but the last of every third block."""
    out, context = [], list(prompt)
    for i in range(n):
        block = TARGET.greedy(context, 3)
        if i % 3 == 2:
            block[-1] = (block[-1] + 1) % TARGET.vocab_size
        out.append((len(context), block))
        context += TARGET.greedy(context, 3 if i % 3 == 2 else 4)
    return out


def test_a_streams_verdicts_are_verify_calls_verdicts_and_a_refusal_ends_it_with_verifys_status():
    prompt = [1, 2, 3]
    with toy_server(TARGET, max_sessions=4, max_context=512) as verifier:
        with grpc.insecure_channel(verifier.address) as channel:
            assert GrpcTransport(verifier.address).handshake(
                FakeDraftModel(TARGET).fingerprint(), draft_model="toy", draft_hidden_size=0).round_streams
            a, b = _open(channel, prompt).session_id, _open(channel, prompt).session_id
            blocks = _blocks(prompt, 6)
            by_call = [_verify(channel)(pb.VerifyRequest(session_id=b, base_position=base, draft_tokens=block,
                                                         round_index=i), timeout=30)
                       for i, (base, block) in enumerate(blocks)]
            requests = [pb.VerifyRequest(session_id=a, base_position=base, draft_tokens=block, round_index=i)
                        for i, (base, block) in enumerate(blocks)]
            by_stream = list(_rounds(channel)(iter(requests), timeout=30))
            assert [m.verdict for m in by_stream] == [m.verdict for m in by_call]
            assert [m.verdict.accepted for m in by_stream] == [3, 3, 2] * 2  # rejections happened

            stale = pb.VerifyRequest(session_id=a, base_position=len(prompt), draft_tokens=[4], round_index=9)
            with pytest.raises(grpc.RpcError) as unary:
                _verify(channel)(stale, timeout=30)
            answers = _rounds(channel)(iter([stale, requests[0]]), timeout=30)
            with pytest.raises(grpc.RpcError) as streamed:
                list(answers)
            assert streamed.value.code() == unary.value.code() == grpc.StatusCode.ABORTED  # a stale round
            assert streamed.value.details() == unary.value.details()


def test_a_stream_without_the_token_is_refused_and_with_it_served():
    with toy_server(TARGET, max_sessions=2, max_context=256, token="s3cret-token-of-16") as verifier:
        with grpc.insecure_channel(verifier.address) as channel:
            auth = (("authorization", "Bearer s3cret-token-of-16"),)
            sid = _open(channel, [1, 2, 3], auth).session_id
            request = pb.VerifyRequest(session_id=sid, base_position=3, draft_tokens=TARGET.greedy([1, 2, 3], 2))
            with pytest.raises(grpc.RpcError) as refused:
                list(_rounds(channel)(iter([request]), timeout=30))
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            [answer] = list(_rounds(channel)(iter([request]), timeout=30, metadata=auth))
            assert answer.verdict.accepted == 2


class _Proxy(grpc.GenericRpcHandler):
    """Forwards every call to `upstream`; the first Rounds stream's answers pass through
    `first(proxy, n, context)` once answer n is sent on (to hold the next back, or to end the stream)."""

    def __init__(self, upstream: str, first) -> None:
        self.channel = grpc.insecure_channel(upstream)
        self.first = first
        self.release = threading.Event()
        self.streams = 0

    def service(self, details):
        method = details.method
        meta = tuple(details.invocation_metadata)
        if method.endswith("/Rounds"):
            self.streams += 1
            first = self.streams == 1
            upstream = self.channel.stream_stream(method)

            def forward(requests, context):
                for n, answer in enumerate(upstream(requests, metadata=meta)):
                    yield answer
                    if first:
                        self.first(self, n, context)

            return grpc.stream_stream_rpc_method_handler(forward)
        unary = self.channel.unary_unary(method)
        return grpc.unary_unary_rpc_method_handler(lambda req, ctx: unary(req, metadata=meta))


def _silent(proxy: _Proxy, n: int, context) -> None:
    """A verifier that stops answering mid-stream: the second answer held until `release`."""
    if n == 0:
        proxy.release.wait(30)


def _ending(proxy: _Proxy, n: int, context) -> None:
    """A proxy's idle timeout, a replica going away: the stream ended (UNAVAILABLE) after one answer."""
    if n == 0:
        context.abort(grpc.StatusCode.UNAVAILABLE, "idle stream closed by the proxy")


@contextmanager
def _behind_a_proxy(first=_silent) -> Iterator[tuple[str, _Proxy]]:
    """A toy verifier behind a `_Proxy`: the proxy's address and the proxy."""
    with toy_server(TARGET, max_sessions=4, max_context=512) as verifier:
        silent = _Proxy(verifier.address, first)
        proxy = grpc.server(futures.ThreadPoolExecutor(8), handlers=(silent,))
        port = proxy.add_insecure_port("127.0.0.1:0")
        proxy.start()
        try:
            yield f"127.0.0.1:{port}", silent
        finally:
            silent.release.set()
            proxy.stop(0)


def test_a_round_not_answered_within_its_deadline_fails_as_a_verify_call_would_and_the_next_gets_a_new_stream():
    with _behind_a_proxy() as (address, silent):
        gen = GenerationConfig(max_tokens=16, draft_k=3, drafting="fixed", stop_at_eos=False)
        config = ClientConfig(timeout=0.5, retry_for=30, retry_initial=0.05, retry_max=0.1, round_streams=True,
                              first_route="speculative")  # the rounds this test is about, whatever the timings
        with EdgeClient(address, draft=FakeDraftModel(TARGET), config=config, generation=gen) as client:
            out = client.generate([1, 2, 3]).until_done()
    assert list(out.token_ids) == TARGET.greedy([1, 2, 3], 16)  # the late round re-sent on a new stream
    assert silent.streams >= 2


def test_the_transport_raises_verifys_timeout_error_for_a_round_past_its_deadline():
    draft = FakeDraftModel(TARGET)
    config = ClientConfig(timeout=0.5, round_streams=True)
    with _behind_a_proxy() as (address, silent), GrpcTransport(address, config) as t:
        t.handshake(draft.fingerprint(), draft_model="toy", draft_hidden_size=0)
        opened = t.open_session(OpenRequest([1, 2, 3], "greedy", 0, draft.fingerprint()))
        first = t.verify(BlockRequest(opened.session_id, 3, tuple(TARGET.greedy([1, 2, 3], 2))))
        assert first.accepted == 2
        context = [1, 2, 3, *TARGET.greedy([1, 2, 3], 3)]
        late = BlockRequest(opened.session_id, len(context), tuple(TARGET.greedy(context, 2)), round_index=1)
        t0 = time.monotonic()
        with pytest.raises(VerifierUnavailableError, match="did not answer round 1 within 0.5 s") as info:
            t.verify(late)
        assert info.value.code == "DEADLINE_EXCEEDED" and time.monotonic() - t0 < 10
        silent.release.set()
        again = t.verify(late)  # a new stream; the verifier answers the applied round again by key
        assert again.accepted == 2 and silent.streams == 2


def test_a_stream_ended_between_two_rounds_is_replaced_without_an_error():
    draft = FakeDraftModel(TARGET)
    config = ClientConfig(timeout=10, round_streams=True)
    with _behind_a_proxy(_ending) as (address, ending), GrpcTransport(address, config) as t:
        t.handshake(draft.fingerprint(), draft_model="toy", draft_hidden_size=0)
        sid = t.open_session(OpenRequest([1, 2, 3], "greedy", 0, draft.fingerprint())).session_id
        assert t.verify(BlockRequest(sid, 3, tuple(TARGET.greedy([1, 2, 3], 2)))).accepted == 2
        until(lambda: sid not in t._streams or t._streams[sid].over, "the proxy ended the stream")
        context = [1, 2, 3, *TARGET.greedy([1, 2, 3], 3)]
        second = t.verify(BlockRequest(sid, len(context), tuple(TARGET.greedy(context, 2)), round_index=1))
        assert second.accepted == 2 and ending.streams == 2
        assert t._round_streams  # a stream that ended is no sign the way carries none
