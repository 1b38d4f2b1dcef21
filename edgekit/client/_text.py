"""Token ids to text as a stream produces them."""

from __future__ import annotations

import codecs
from collections.abc import Sequence

from ..runtime import DraftModel

__all__ = ["TextDecoder", "safe_end", "stop_at"]


class TextDecoder:
    """Token ids to text, incrementally: UTF-8 split across tokens is held back, not mangled."""

    def __init__(self, draft: DraftModel) -> None:
        self._draft = draft
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, tokens: Sequence[int]) -> str:
        return "".join(self._utf8.decode(self._draft.token_bytes(t)) for t in tokens if not self._draft.is_eog(t))

    def flush(self) -> str:
        return self._utf8.decode(b"", final=True)


def stop_at(text: str, stops: tuple[str, ...], shown: int) -> int | None:
    """Where the first stop string in `text` begins, searching from what may overlap the `shown`
    characters (those before held no stop string); None if none does."""
    hits = [i for s in stops if (i := text.find(s, max(0, shown - len(s) + 1))) >= 0]
    return min(hits) if hits else None


def safe_end(text: str, stops: tuple[str, ...]) -> int:
    """How much of `text` can be shown: all but a tail that may be the start of a stop string."""
    hold = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), 0, -1):
            if text.endswith(s[:k]):
                hold = max(hold, k)
                break
    return len(text) - hold
