"""Padding entries at the end of a vocabulary: what a tokenizer fingerprint and a pair check leave out.

A model's embedding matrix often has more rows than its tokenizer has tokens (Qwen2.5 has 151,665
tokens; its 0.5B model 151,936 rows, its 7B 152,064), and the GGUF converter fills the vocabulary
up to the rows with placeholders: llama.cpp's convert_hf_to_gguf.py writes `[PAD<id>]` for a
BPE vocabulary (`get_vocab_base`) and `[PAD1]`, `[PAD2]`, ... for a SentencePiece one, of token
type UNUSED (older conversions and some forks: USER_DEFINED). No text tokenizes into them and
no trained model prefers them, so two vocabularies that differ only in how many there are at the
end are the same tokenizer. A padding entry is never committed to a device, whose draft may
not have it.
"""

from __future__ import annotations

import re
from collections.abc import Callable

__all__ = ["GGUF_PADDING_TYPES", "LLAMA_PADDING_ATTRS", "is_padding_text", "trailing_padding"]

_PAD_TEXT = re.compile(rb"\[PAD[0-9]+\]")
GGUF_PADDING_TYPES = frozenset({4, 5})  # GGUF token types USER_DEFINED, UNUSED
LLAMA_PADDING_ATTRS = (1 << 1) | (1 << 4)  # llama.cpp's LLAMA_TOKEN_ATTR_UNUSED | LLAMA_TOKEN_ATTR_USER_DEFINED


def is_padding_text(text: bytes) -> bool:
    return _PAD_TEXT.fullmatch(text) is not None


def trailing_padding(n: int, entry: Callable[[int], tuple[bytes, bool]]) -> int:
    """How many of the last of `n` entries are padding; `entry(i)` gives entry i's text and
    whether its type is one a placeholder carries."""
    count = 0
    while count < n:
        text, placeholder = entry(n - 1 - count)
        if not (placeholder and is_padding_text(text)):
            break
        count += 1
    return count
