"""A session's rounds on one stream (issue 50, part 4): the Rounds RPC on the verifier's asyncio
server, and the round's path on the event loop.

The engine core waited for by a coroutine: its result, its deadline (queued work withdrawn) and
its caller leaving (queued work withdrawn, never run). A session held by another call is waited
for off the loop. Over gRPC: a stream's verdicts are those of Verify calls, a refusal ends the
stream with Verify's status, the token is asked of a stream too, and a client whose round is not
answered within its deadline gets Verify's timeout error and a new stream for the next round."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager

import grpc
import numpy as np
import pytest
from _wait import until
from test_engine_core import GatedEngine

from edgekit import ClientConfig, EdgeClient, GenerationConfig, LimitExceededError, ServerConfig
from edgekit.errors import VerifierUnavailableError
from edgekit.protocol import GREEDY, SERVICE_NAME, BlockRequest, OpenRequest, pb
from edgekit.testing import FakeDraftModel, ToyEngine, ToyLanguageModel
from edgekit.transport import GrpcTransport
from edgekit.verifier import EngineCore, FcfsScheduler, Feed, VerifierServer
from edgekit.verifier._sessions import SessionTable

TARGET = ToyLanguageModel(seed=5)


def test_a_coroutine_gets_the_engines_result_and_its_deadline_withdraws_queued_work():
    engine = GatedEngine(TARGET, n_seq=2, max_context=64)
    core = EngineCore(engine, FcfsScheduler())
    holder = threading.Thread(target=lambda: core.run(Feed(0, 0, (2, 3, 4), 1)))
    holder.start()
    assert engine.entered.acquire(timeout=30)  # the engine is busy (held until released)

    async def late() -> None:
        await core.run_async(Feed(1, 0, (5, 6), 1), deadline=time.monotonic() + 0.05)

    with pytest.raises(LimitExceededError, match="before the call's deadline") as info:
        asyncio.run(late())
    assert info.value.code == "DEADLINE_EXCEEDED"
    engine.gate.release()
    holder.join(30)
    assert engine.ran == [[(0, 0, 3)]] and engine.cached(1) == 0  # the withdrawn work never ran

    async def on_time() -> np.ndarray:
        engine.gate.release()
        return (await core.run_async(Feed(1, 0, (5, 6), 1), deadline=time.monotonic() + 30)).logits

    logits = asyncio.run(on_time())
    assert logits.shape == (1, TARGET.vocab_size) and engine.cached(1) == 2
    core.close()


def test_a_cancelled_coroutines_queued_work_is_withdrawn_and_never_runs():
    engine = GatedEngine(TARGET, n_seq=2, max_context=64)
    core = EngineCore(engine, FcfsScheduler())
    holder = threading.Thread(target=lambda: core.run(Feed(0, 0, (2, 3, 4), 1)))
    holder.start()
    assert engine.entered.acquire(timeout=30)

    async def leave() -> None:
        task = asyncio.ensure_future(core.run_async(Feed(1, 0, (5, 6), 1)))
        await asyncio.sleep(0)  # submitted: it waits behind the held batch
        until(lambda: core.scheduler.waiting() == 1, "the round queued")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(leave())
    engine.gate.release()
    holder.join(30)
    until(lambda: core.scheduler.waiting() == 0, "the engine loop past the withdrawn round")
    assert engine.ran == [[(0, 0, 3)]] and engine.cached(1) == 0
    core.close()


def test_a_session_another_call_holds_is_waited_for_without_blocking_the_loop():
    table = SessionTable(2, idle_timeout=60)
    sess = table.create(mode="greedy", sampler=GREEDY, seed=0)
    sess.lock.acquire()  # a call on a worker thread holds it
    order: list[str] = []

    async def main() -> None:
        async def round_() -> None:
            async with table.acquire_async(sess.id) as held:
                assert held is sess
                order.append("round")

        async def other() -> None:
            order.append("loop free")
            sess.lock.release()  # the holder's call ends

        task = asyncio.ensure_future(round_())
        await asyncio.sleep(0.01)
        assert not task.done()
        await other()
        await asyncio.wait_for(task, 30)

    asyncio.run(main())
    assert order == ["loop free", "round"] and not sess.lock.locked()


class _RecordedLock:
    """A lock that records who took and let it go."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.events: list[tuple[str, str]] = []

    def acquire(self, blocking: bool = True) -> bool:
        got = self._lock.acquire(blocking)
        if got:
            self.events.append(("acquire", threading.current_thread().name))
        return got

    def release(self) -> None:
        self.events.append(("release", threading.current_thread().name))
        self._lock.release()

    def locked(self) -> bool:
        return self._lock.locked()


def test_a_coroutine_that_leaves_while_waiting_for_a_session_lets_it_go_once_taken():
    table = SessionTable(2, idle_timeout=60)
    sess = table.create(mode="greedy", sampler=GREEDY, seed=0)
    lock = sess.lock = _RecordedLock()  # type: ignore[assignment]
    lock.acquire()  # a call on a worker thread holds it
    main_thread = threading.current_thread().name

    async def main() -> None:
        async def round_() -> None:
            async with table.acquire_async(sess.id):
                raise AssertionError("never entered")

        task = asyncio.ensure_future(round_())
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        lock.release()  # the holder's call ends: the waiting thread takes the lock, and lets it go
        for _ in range(3000):
            if len(lock.events) >= 4:
                return
            await asyncio.sleep(0.01)

    asyncio.run(main())
    (_, holder), (_, ended), (_, taker), (let_go, _) = lock.events
    assert holder == ended == main_thread and taker != main_thread and let_go == "release"
    assert not lock.locked()


# -- over gRPC --------------------------------------------------------------------------------------


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
    c = ServerConfig(port=0, max_sessions=4, max_context=512)
    with VerifierServer(ToyEngine(TARGET, n_seq=4, max_context=512), c) as verifier:
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
    c = ServerConfig(port=0, max_sessions=2, max_context=256, token="s3cret-token-of-16")
    with VerifierServer(ToyEngine(TARGET, n_seq=2, max_context=256), c) as verifier:
        with grpc.insecure_channel(verifier.address) as channel:
            auth = (("authorization", "Bearer s3cret-token-of-16"),)
            sid = _open(channel, [1, 2, 3], auth).session_id
            request = pb.VerifyRequest(session_id=sid, base_position=3, draft_tokens=TARGET.greedy([1, 2, 3], 2))
            with pytest.raises(grpc.RpcError) as refused:
                list(_rounds(channel)(iter([request]), timeout=30))
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            [answer] = list(_rounds(channel)(iter([request]), timeout=30, metadata=auth))
            assert answer.verdict.accepted == 2


class _Silent(grpc.GenericRpcHandler):
    """Forwards every call to `upstream` but holds the answers of the first Rounds stream's
    second round until `release` is set: a verifier that stops answering mid-stream."""

    def __init__(self, upstream: str) -> None:
        self.channel = grpc.insecure_channel(upstream)
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
                    if first and n == 1:
                        self.release.wait(30)
                    yield answer

            return grpc.stream_stream_rpc_method_handler(forward)
        unary = self.channel.unary_unary(method)
        return grpc.unary_unary_rpc_method_handler(lambda req, ctx: unary(req, metadata=meta))


@contextmanager
def _behind_a_silent_proxy() -> Iterator[tuple[str, _Silent]]:
    """A toy verifier behind `_Silent`: the proxy's address and the proxy."""
    c = ServerConfig(port=0, max_sessions=4, max_context=512)
    with VerifierServer(ToyEngine(TARGET, n_seq=4, max_context=512), c) as verifier:
        silent = _Silent(verifier.address)
        proxy = grpc.server(futures.ThreadPoolExecutor(8), handlers=(silent,))
        port = proxy.add_insecure_port("127.0.0.1:0")
        proxy.start()
        try:
            yield f"127.0.0.1:{port}", silent
        finally:
            silent.release.set()
            proxy.stop(0)


def test_a_round_not_answered_within_its_deadline_fails_as_a_verify_call_would_and_the_next_gets_a_new_stream():
    with _behind_a_silent_proxy() as (address, silent):
        gen = GenerationConfig(max_tokens=16, draft_k=3, drafting="fixed", stop_at_eos=False)
        config = ClientConfig(timeout=0.5, retry_for=30, retry_initial=0.05, retry_max=0.1)
        with EdgeClient(address, draft=FakeDraftModel(TARGET), config=config, generation=gen) as client:
            out = client.generate([1, 2, 3]).until_done()
    assert list(out.token_ids) == TARGET.greedy([1, 2, 3], 16)  # the late round re-sent on a new stream
    assert silent.streams >= 2


def test_the_transport_raises_verifys_timeout_error_for_a_round_past_its_deadline():
    draft = FakeDraftModel(TARGET)
    with _behind_a_silent_proxy() as (address, silent), GrpcTransport(address, ClientConfig(timeout=0.5)) as t:
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
