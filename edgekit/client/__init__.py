"""The device side: speculative sessions (draft, send, apply the verdict), typed
event streams, chat, and the sync and async clients that put them together."""

from ._async_client import AsyncConversation, AsyncEdgeClient
from ._chat import ChatTemplate, Conversation
from ._client import DEFAULT_PAIR, EdgeClient
from ._discover import discover_pair
from ._events import Event, FinalStats, Provisional, Resumed, RoundEvent, TextDelta
from ._route import RouteChooser
from ._session import SharedDraft, SpeculativeSession
from ._stats import GenerationStats, RoundStats
from ._stream import AsyncGenerationStream, GenerationStream
from ._text import TextDecoder

__all__ = [
    "DEFAULT_PAIR",
    "AsyncConversation",
    "AsyncEdgeClient",
    "AsyncGenerationStream",
    "ChatTemplate",
    "Conversation",
    "EdgeClient",
    "Event",
    "FinalStats",
    "GenerationStats",
    "GenerationStream",
    "Provisional",
    "Resumed",
    "RoundEvent",
    "RoundStats",
    "RouteChooser",
    "SharedDraft",
    "SpeculativeSession",
    "TextDecoder",
    "TextDelta",
    "discover_pair",
]
