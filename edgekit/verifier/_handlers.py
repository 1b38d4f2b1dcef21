"""The service behind gRPC's asyncio server: its methods as handlers, refusals as statuses.

A round is the verifier's hot path, so it never leaves the event loop: Verify, and each
message of a Rounds stream (a session's rounds on one call), is parsed, checked, submitted
to the engine core and answered by a coroutine that awaits the engine's result
(`VerifierService.call_verify`). gRPC Python costs far less per message on a stream of the
asyncio server than per unary call of its thread-pool server (benchmarks/grpc_call_cost.py),
and no thread is woken per round. The other methods (a handshake, a prefill, a target-only
stream) block on the engine in the service's synchronous code and run on a pool of worker
threads, as they did on the thread-pool server.

An edgekit error becomes its status (`edgekit.protocol.status_of`), with its trailers; on a
Rounds stream it ends the stream, as it would have ended a Verify call.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import Executor
from functools import partial
from typing import Any, NoReturn

import grpc
from google.protobuf.message import Message

from ..errors import EdgekitError
from ..protocol import SERVICE_NAME, status_of
from ._service import VerifierService
from ._sessions import Caller

__all__ = ["service_handlers"]

log = logging.getLogger("edgekit.verifier")

_NO_DEADLINE = 7 * 86400.0  # seconds: a call that has more is one without a deadline (grpcurl's default, a proxy's)
_END = object()


def service_handlers(
    service: VerifierService,
    pool: Executor,
    tenant_of: Callable[[grpc.aio.ServicerContext], str] = lambda context: "",
) -> grpc.GenericRpcHandler:
    """`service` behind gRPC's asyncio server, its blocking methods run on `pool`.
    `tenant_of` names the tenant of a call's token ("" where tokens are not used)."""

    def caller(context: grpc.aio.ServicerContext) -> Caller:
        tenant = tenant_of(context)
        return Caller(tenant, f"tenant:{tenant}" if tenant else f"host:{_peer_host(context.peer())}")

    def unary(method: str) -> Callable[[bytes, grpc.aio.ServicerContext], Any]:
        async def handler(raw: bytes, context: grpc.aio.ServicerContext) -> Message:
            call = partial(service.call, method, raw, _deadline(context), caller(context))
            try:
                return await asyncio.get_running_loop().run_in_executor(pool, call)
            except EdgekitError as exc:
                await _abort(context, exc, method)

        return handler

    async def verify(raw: bytes, context: grpc.aio.ServicerContext) -> Message:
        try:
            return await service.call_verify(raw, _deadline(context), caller(context))
        except EdgekitError as exc:
            await _abort(context, exc, "Verify")

    async def rounds(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> AsyncIterator[Message]:
        who = caller(context)
        try:
            async for raw in requests:
                yield await service.call_verify(raw, _deadline(context), who)
        except EdgekitError as exc:
            await _abort(context, exc, "Rounds")

    async def generate(raw: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[Message]:
        who = caller(context)

        def answers(is_active: Callable[[], bool]) -> Iterator[Message]:
            return service.call_stream("Generate", raw, lambda: is_active() and not context.done(), who)

        try:
            async for message in _on_thread(answers, pool):
                yield message
        except EdgekitError as exc:
            await _abort(context, exc, "Generate")

    methods: dict[str, grpc.RpcMethodHandler] = {
        name: grpc.unary_unary_rpc_method_handler(unary(name), response_serializer=_serialize)
        for name in ("Handshake", "Ping", "OpenSession", "ExtendSession", "CloseSession")
    }
    methods["Verify"] = grpc.unary_unary_rpc_method_handler(verify, response_serializer=_serialize)
    methods["Rounds"] = grpc.stream_stream_rpc_method_handler(rounds, response_serializer=_serialize)
    methods["Generate"] = grpc.unary_stream_rpc_method_handler(generate, response_serializer=_serialize)
    return grpc.method_handlers_generic_handler(SERVICE_NAME, methods)


async def _on_thread(
    answers: Callable[[Callable[[], bool]], Iterator[Message]], pool: Executor
) -> AsyncIterator[Message]:
    """The messages of a blocking iterator run on `pool`, as they come. When the consumer
    stops (the call cancelled, its client gone), the iterator's `is_active` turns false, so
    it ends at its next check and its thread is let go."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[object, BaseException | None]] = asyncio.Queue()
    stopped = threading.Event()

    def put(item: object, exc: BaseException | None = None) -> None:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, (item, exc))
        except RuntimeError:  # the loop has closed: nobody reads any more
            stopped.set()

    def pump() -> None:
        try:
            for message in answers(lambda: not stopped.is_set()):
                put(message)
                if stopped.is_set():
                    return
        except BaseException as exc:  # the consumer raises it
            put(_END, exc)
            return
        put(_END)

    loop.run_in_executor(pool, pump)
    try:
        while True:
            item, exc = await queue.get()
            if exc is not None:
                raise exc
            if item is _END:
                return
            assert isinstance(item, Message)
            yield item
    finally:
        stopped.set()


def _deadline(context: grpc.aio.ServicerContext) -> float | None:
    """The call's deadline as a `time.monotonic()`; None for a call without one."""
    remaining = context.time_remaining()  # a call without a deadline: gRPC's "forever", ~2^63 ns
    return time.monotonic() + remaining if remaining is not None and remaining < _NO_DEADLINE else None


def _peer_host(peer: str) -> str:
    """The host of a gRPC peer string ('ipv4:1.2.3.4:5', 'ipv6:[::1]:5', 'unix:...')."""
    kind, _, rest = peer.partition(":")
    if kind in ("ipv4", "ipv6"):
        return rest.rsplit(":", 1)[0]
    return peer


def _serialize(msg: Message) -> bytes:
    return msg.SerializeToString()


async def _abort(context: grpc.aio.ServicerContext, exc: EdgekitError, method: str) -> NoReturn:
    status = status_of(exc)
    if status.code == grpc.StatusCode.INTERNAL:
        log.error("internal error in %s", method, exc_info=exc)
    if status.trailers:
        context.set_trailing_metadata(status.trailers)
    await context.abort(status.code, status.message)
    raise AssertionError("unreachable: abort raises")  # for the type checker
