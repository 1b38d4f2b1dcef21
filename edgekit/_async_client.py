"""`AsyncEdgeClient`: `EdgeClient` for asyncio, of the same shape.

llama.cpp and gRPC calls block, so a stream runs the synchronous one on a
worker thread and hands its events to the event loop; the loop never waits on
a model. Leaving a stream early stops the worker at the next event boundary
(a round), so the session stays consistent.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, AsyncIterator, Callable, Sequence

from ._link import ProbeResult
from ._client import EdgeClient, GenerationStream
from ._events import Event, FinalStats
from .transport._base import ServerInfo

__all__ = ["AsyncConversation", "AsyncEdgeClient", "AsyncGenerationStream"]

_DONE = object()


class AsyncGenerationStream:
    """`async for event in stream`, `async with stream`, `await stream.text()`."""

    def __init__(self, start: Callable[[], GenerationStream]) -> None:
        self._start = start
        self._queue: asyncio.Queue | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.final: FinalStats | None = None

    def _run(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue) -> None:
        def put(item: Any) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, item)

        try:
            with self._start() as stream:
                for event in stream:
                    put(event)
                    if self._stop.is_set():
                        break
        except BaseException as exc:  # noqa: BLE001 - re-raised in the consumer
            put(exc)
        put(_DONE)

    def __aiter__(self) -> AsyncIterator[Event]:
        return self._events()

    async def _events(self) -> AsyncIterator[Event]:
        if self._thread is not None:
            raise RuntimeError("an async stream can be iterated once")
        loop = asyncio.get_running_loop()
        self._queue = asyncio.Queue()
        self._thread = threading.Thread(target=self._run, args=(loop, self._queue), daemon=True)
        self._thread.start()
        try:
            while True:
                item = await self._queue.get()
                if item is _DONE:
                    return
                if isinstance(item, BaseException):
                    raise item
                if isinstance(item, FinalStats):
                    self.final = item
                yield item
        finally:
            self._stop.set()

    async def until_done(self) -> FinalStats:
        async for _ in self:
            pass
        assert self.final is not None
        return self.final

    async def text(self) -> str:
        return (await self.until_done()).text

    async def aclose(self) -> None:
        self._stop.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)

    async def __aenter__(self) -> "AsyncGenerationStream":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class AsyncConversation:
    def __init__(self, conversation) -> None:  # type: ignore[no-untyped-def]
        self._conv = conversation

    @property
    def messages(self) -> list[dict]:
        return self._conv.messages

    def send(self, text: str) -> AsyncGenerationStream:
        return AsyncGenerationStream(lambda: self._conv.send(text))

    def configure(self, **overrides: object) -> None:
        self._conv.configure(**overrides)

    async def clear(self) -> None:
        await asyncio.to_thread(self._conv.clear)

    async def close(self) -> None:
        await asyncio.to_thread(self._conv.close)


class AsyncEdgeClient:
    """Takes the same arguments as `EdgeClient`; models load on a worker thread.

    >>> async with AsyncEdgeClient("127.0.0.1:50551", pair="gemma-270m") as client:
    ...     async for event in client.generate("Hello"):
    ...         ...
    """

    def __init__(self, verifier: Any = None, **kwargs: Any) -> None:
        self._args = (verifier, kwargs)
        self._client: EdgeClient | None = None
        self._lock = asyncio.Lock()

    async def _sync(self) -> EdgeClient:
        async with self._lock:
            if self._client is None:
                verifier, kwargs = self._args
                self._client = await asyncio.to_thread(EdgeClient, verifier, **kwargs)
        return self._client

    async def server_info(self) -> ServerInfo:
        client = await self._sync()
        return await asyncio.to_thread(client.server_info)

    async def probe_link(self, **options: Any) -> ProbeResult:
        """Measures RTT, jitter, rates and loss (see `EdgeClient.probe_link`)."""
        client = await self._sync()
        return await asyncio.to_thread(client.probe_link, **options)

    async def tokenize(self, prompt: str | Sequence[int]) -> list[int]:
        return (await self._sync()).tokenize(prompt)

    def _stream(self, make: Callable[[EdgeClient], GenerationStream]) -> AsyncGenerationStream:
        client_ready = self._client

        def start() -> GenerationStream:
            if client_ready is None and self._client is None:
                raise RuntimeError("use `async with AsyncEdgeClient(...)` or await server_info() first")
            return make(self._client)  # type: ignore[arg-type]

        return AsyncGenerationStream(start)

    def generate(self, prompt: str | Sequence[int], **overrides: object) -> AsyncGenerationStream:
        return self._stream(lambda c: c.generate(prompt, **overrides))

    def generate_target_only(self, prompt: str | Sequence[int], **overrides: object) -> AsyncGenerationStream:
        return self._stream(lambda c: c.generate_target_only(prompt, **overrides))

    def chat(self, messages: Sequence[dict] | str, **overrides: object) -> AsyncGenerationStream:
        return self._stream(lambda c: c.chat(messages, **overrides))

    async def conversation(self, *, system: str | None = None, **overrides: object) -> AsyncConversation:
        client = await self._sync()
        conv = await asyncio.to_thread(client.conversation, system=system, **overrides)
        return AsyncConversation(conv)

    async def close(self) -> None:
        if self._client is not None:
            await asyncio.to_thread(self._client.close)
            self._client = None

    async def __aenter__(self) -> "AsyncEdgeClient":
        await self._sync()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
