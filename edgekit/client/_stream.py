"""Streams of generation events, sync and async twins of one shape.

`GenerationStream` iterates a generation's typed events and closes what it
holds when left, early or not. `AsyncGenerationStream` runs a synchronous
stream on a worker thread (llama.cpp and gRPC calls block) and hands its events
to the event loop; leaving it early stops the worker at the next event boundary
(a round), so the session stays consistent.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from ._events import Event, FinalStats
from ._stats import GenerationStats

__all__ = ["AsyncGenerationStream", "GenerationStream"]

_DONE = object()


class GenerationStream:
    """An iterator of events that is also a context manager.

    >>> with client.generate("Hello") as stream:
    ...     for event in stream:
    ...         if event.type == "text": print(event.text, end="")
    >>> client.generate("Hello").text()   # all at once
    """

    def __init__(self, events: Iterator[Event], on_close: Callable[[], None] | None = None) -> None:
        self._events = events
        self._on_close = on_close
        self.final: FinalStats | None = None

    def __iter__(self) -> Iterator[Event]:
        try:
            for ev in self._events:
                if isinstance(ev, FinalStats):
                    self.final = ev
                yield ev
        finally:
            self.close()

    def __enter__(self) -> GenerationStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        close = getattr(self._events, "close", None)
        if close:
            close()
        on_close, self._on_close = self._on_close, None
        if on_close is not None:
            on_close()

    def __del__(self) -> None:
        # A stream dropped without being read or closed still gives back what it holds
        # (its verifier session, its draft slot).
        if self._on_close is not None:
            try:
                self.close()
            except Exception:  # interpreter shutdown, a verifier gone: nothing more to do
                pass

    def until_done(self) -> FinalStats:
        for _ in self:
            pass
        assert self.final is not None
        return self.final

    def text(self) -> str:
        return self.until_done().text

    @property
    def stats(self) -> GenerationStats:
        return self.until_done().stats


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
        except BaseException as exc:
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

    async def __aenter__(self) -> AsyncGenerationStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
