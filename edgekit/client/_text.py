"""Token ids to text as a stream produces them."""

from __future__ import annotations

import codecs
from collections.abc import Sequence

from ..runtime import DraftModel

__all__ = ["TextDecoder"]


class TextDecoder:
    """Token ids to text, incrementally: UTF-8 split across tokens is held back, not mangled."""

    def __init__(self, draft: DraftModel) -> None:
        self._draft = draft
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, tokens: Sequence[int]) -> str:
        return "".join(self._utf8.decode(self._draft.token_bytes(t)) for t in tokens if not self._draft.is_eog(t))

    def flush(self) -> str:
        return self._utf8.decode(b"", final=True)
