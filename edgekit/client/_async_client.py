"""`AsyncEdgeClient`: `EdgeClient` for asyncio, of the same shape.

llama.cpp and gRPC calls block, so models load and streams run on worker
threads (`AsyncGenerationStream`); the event loop never waits on a model.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from ..link import ProbeResult
from ..plan import Plan
from ..protocol import ServerInfo
from ._chat import Conversation
from ._client import EdgeClient
from ._events import FinalStats
from ._stream import AsyncGenerationStream, GenerationStream

__all__ = ["AsyncConversation", "AsyncEdgeClient"]

class AsyncConversation:
    """`Conversation` for asyncio: `send` returns an `AsyncGenerationStream`."""

    def __init__(self, conversation: Conversation) -> None:
        self._conv = conversation

    @property
    def messages(self) -> list[dict]:
        return self._conv.messages

    def send(self, text: str) -> AsyncGenerationStream:
        return AsyncGenerationStream(lambda: self._conv.send(text))

    def configure(self, **overrides: Any) -> None:
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

    async def recommended_sampling(self) -> dict[str, float]:
        """The target's recommended sampler, else the draft's (see `EdgeClient.recommended_sampling`)."""
        client = await self._sync()
        return await asyncio.to_thread(client.recommended_sampling)

    async def probe_link(self, **options: Any) -> ProbeResult:
        """Measures RTT, jitter, rates and loss (see `EdgeClient.probe_link`)."""
        client = await self._sync()
        return await asyncio.to_thread(client.probe_link, **options)

    async def tokenize(self, prompt: str | Sequence[int]) -> list[int]:
        return (await self._sync()).tokenize(prompt)

    def _stream(self, make: Callable[[EdgeClient], GenerationStream]) -> AsyncGenerationStream:
        def start() -> GenerationStream:
            client = self._client
            if client is None:
                raise RuntimeError("use `async with AsyncEdgeClient(...)` or await server_info() first")
            return make(client)

        return AsyncGenerationStream(start)

    def generate(self, prompt: str | Sequence[int], **overrides: Any) -> AsyncGenerationStream:
        return self._stream(lambda c: c.generate(prompt, **overrides))

    def generate_target_only(self, prompt: str | Sequence[int], **overrides: Any) -> AsyncGenerationStream:
        return self._stream(lambda c: c.generate_target_only(prompt, **overrides))

    def chat(self, messages: Sequence[dict] | str, **overrides: Any) -> AsyncGenerationStream:
        return self._stream(lambda c: c.chat(messages, **overrides))

    async def generate_many(
        self,
        prompts: Sequence[str | Sequence[int]],
        *,
        concurrency: int | None = None,
        return_exceptions: bool = False,
        plan: Plan | None = None,
        **overrides: Any,
    ) -> list[FinalStats | BaseException]:
        """`EdgeClient.generate_many` on worker threads: the tasks pipeline through the draft
        model's slots while the event loop goes on. Cancelling the await does not stop the
        tasks already running; they finish (or fail) and their slots are freed."""
        client = await self._sync()
        return await asyncio.to_thread(
            client.generate_many,
            prompts,
            concurrency=concurrency,
            return_exceptions=return_exceptions,
            plan=plan,
            **overrides,
        )

    async def conversation(self, *, system: str | None = None, **overrides: Any) -> AsyncConversation:
        client = await self._sync()
        conv = await asyncio.to_thread(client.conversation, system=system, **overrides)
        return AsyncConversation(conv)

    async def close(self) -> None:
        if self._client is not None:
            await asyncio.to_thread(self._client.close)
            self._client = None

    async def __aenter__(self) -> AsyncEdgeClient:
        await self._sync()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
