"""Whether a draft can serve a target, from the two GGUF files' tokenizers alone: no weights load.

Speculative decoding is lossless only when a token id means the same text to both models. The
tokenizer is read from each file's header (`edgekit.runtime.read_metadata`, which stops at the
last key it needs and never touches tensor data: 0.08 s for gemma's 262,144 tokens, where the
`gguf` package's GGUFReader takes 9 s to parse the same header): the tokenizer model, its
tokens with their types, its BPE merges, and the special token ids (bos, eos, eot, pad, unk).

The rule: the same tokenizer is lossless-compatible, including when the vocabularies differ
only by padding at the end (`edgekit.runtime.trailing_padding`: Qwen2.5 0.5B has 151,936
entries and 7B 152,064, the same 151,665 tokens and a different count of "[PADn]"
placeholders). The verifier then judges over the tokens alone and never commits a padding id
(see `edgekit.verifier`). Anything else is refused, naming both models and the first thing that
differs. A different pre-tokenizer name alone does not refuse a pair: the device splits text
with its own tokenizer, and an id means the same text on both sides; the reason says so.

`tokenizer_of(path)` reads one file; `check_pair(draft, target)` gives a `PairCheck`;
`require_pair` raises `IncompatibleModelsError` with its reason.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgekit.errors import IncompatibleModelsError, ModelLoadError
from edgekit.runtime import GGUF_PADDING_TYPES, read_metadata, trailing_padding

__all__ = ["GGUFTokenizer", "PairCheck", "check_pair", "require_pair", "tokenizer_of"]

_TOKENS, _TYPES, _MERGES = "tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.merges"
_MODEL, _PRE = "tokenizer.ggml.model", "tokenizer.ggml.pre"
SPECIAL_KEYS = {
    "bos": "tokenizer.ggml.bos_token_id",
    "eos": "tokenizer.ggml.eos_token_id",
    "eot": "tokenizer.ggml.eot_token_id",
    "pad": "tokenizer.ggml.padding_token_id",
    "unk": "tokenizer.ggml.unknown_token_id",
}
_KEYS = (_MODEL, _PRE, _TOKENS, _TYPES, _MERGES, *SPECIAL_KEYS.values())
# GGUF token types, as llama.cpp's convert scripts write them
_TYPE_NAMES = {0: "undefined", 1: "normal", 2: "unknown", 3: "control", 4: "user-defined", 5: "unused", 6: "byte"}
_MODEL_NAMES = {"llama": "SentencePiece", "gpt2": "BPE", "bert": "WordPiece", "t5": "Unigram", "rwkv": "RWKV"}


@dataclass(frozen=True, eq=False)
class GGUFTokenizer:
    """A GGUF file's tokenizer as its header holds it. `tokens` and `token_types` have every entry,
    trailing padding included (`padding` of them); `vocab_hash` covers the real entries (each
    token with its type), `tokenizer_hash` all that `check_pair` compares: two files of equal
    `tokenizer_hash` are a lossless pair either way."""

    path: Path
    model: str  # tokenizer.ggml.model: "llama" (SentencePiece), "gpt2" (BPE), ...
    pre: str  # tokenizer.ggml.pre, the pre-tokenizer; "" if the file names none
    tokens: tuple[bytes, ...]
    token_types: np.ndarray  # int32, one per token; empty if the file has none
    merges: tuple[bytes, ...]  # BPE merges; empty for other models
    special: dict[str, int]  # "bos", "eos", "eot", "pad", "unk" -> id, those the file sets
    padding: int  # trailing "[PADn]" placeholder entries
    vocab_hash: str
    tokenizer_hash: str

    @property
    def vocab_size(self) -> int:
        """Entries, padding included: the width of the model's logits."""
        return len(self.tokens)

    @property
    def real_size(self) -> int:
        """Entries before the trailing padding: the tokens."""
        return len(self.tokens) - self.padding

    def describe(self) -> str:
        """E.g. "262,144 tokens, SentencePiece model 'llama'", with the padding where there is some."""
        kind = f"{_MODEL_NAMES[self.model]} model" if self.model in _MODEL_NAMES else "model"
        pad = f" + {self.padding:,} padding" if self.padding else ""
        return f"{self.real_size:,} tokens{pad}, {kind} {self.model!r}"


@dataclass(frozen=True)
class PairCheck:
    """The verdict on a draft for a target. `lossless`: an id means the same text to both, so
    speculative output is the target's own; `compatible`: the pair may run at all (the check
    passes only lossless pairs: edgekit has no translating verifier for a lossy one).
    `padding`: how many more padding entries one side has than the other (0 when refused);
    `reason` names both models and what differs, or what they share."""

    draft: str
    target: str
    compatible: bool
    lossless: bool
    padding: int
    reason: str


def tokenizer_of(path: str | os.PathLike[str]) -> GGUFTokenizer:
    """The tokenizer in the GGUF header of `path`; ModelLoadError if it is not a GGUF file,
    is damaged, or holds no tokenizer."""
    path = Path(path)
    if not path.is_file():
        raise ModelLoadError(f"model file not found: {path}")
    meta = read_metadata(path, _KEYS, items=(_TOKENS, _TYPES, _MERGES))
    tokens = meta.get(_TOKENS)
    if not isinstance(tokens, tuple):
        raise ModelLoadError(f"{path}: its GGUF header holds no tokenizer ({_TOKENS})")
    model = meta.get(_MODEL, "")
    pre = meta.get(_PRE, "")
    types = meta.get(_TYPES, np.zeros(0, np.int32))
    merges = meta.get(_MERGES, ())
    if not isinstance(model, str) or not isinstance(pre, str):
        raise ModelLoadError(f"{path}: {_MODEL} and {_PRE} must be strings")
    if not isinstance(types, np.ndarray) or types.size not in (0, len(tokens)) or types.dtype.kind not in "iu":
        raise ModelLoadError(f"{path}: {_TYPES} must hold one integer per token ({len(tokens)})")
    if not isinstance(merges, tuple):
        raise ModelLoadError(f"{path}: {_MERGES} must be an array of strings")
    special: dict[str, int] = {}
    for role, key in SPECIAL_KEYS.items():
        value = meta.get(key)
        if value is None:
            continue
        # a token id: what a damaged header holds instead must not reach the int64 hash below
        if not isinstance(value, int) or isinstance(value, bool) or not -(1 << 63) <= value < 1 << 63:
            raise ModelLoadError(f"{path}: {key} must be a token id, not {value!r}")
        special[role] = value
    types = types.astype(np.int32)
    has_types = types.size > 0
    padding = trailing_padding(
        len(tokens), lambda i: (tokens[i], not has_types or int(types[i]) in GGUF_PADDING_TYPES)
    )
    real = len(tokens) - padding
    vocab = hashlib.sha256()
    _hash_strings(vocab, tokens[:real])
    vocab.update(types[:real].tobytes())
    whole = hashlib.sha256(vocab.digest())
    whole.update(model.encode())
    _hash_strings(whole, merges)
    whole.update(np.array([special.get(r, -1) for r in SPECIAL_KEYS], dtype=np.int64).tobytes())
    return GGUFTokenizer(
        path, model, pre, tokens, types, merges, special, padding, vocab.hexdigest(), whole.hexdigest()
    )


def _hash_strings(h: hashlib._Hash, items: tuple[bytes, ...]) -> None:
    """Each item's length, then all of them: a sequence of strings, unambiguously."""
    h.update(len(items).to_bytes(8, "little"))
    h.update(np.fromiter((len(s) for s in items), dtype=np.uint64, count=len(items)).tobytes())
    h.update(b"".join(items))


def check_pair(
    draft: str | os.PathLike[str],
    target: str | os.PathLike[str],
    *,
    draft_name: str | None = None,
    target_name: str | None = None,
) -> PairCheck:
    """Whether the GGUF at `draft` can draft for the one at `target`, from their headers alone.
    The names default to the file names. ModelLoadError if either file has no readable tokenizer."""
    a, b = tokenizer_of(draft), tokenizer_of(target)
    da, tb = draft_name or a.path.name, target_name or b.path.name
    what = _difference(a, b, da, tb)
    if what is not None:
        return PairCheck(
            da, tb, False, False, 0,
            f"draft {da} cannot draft for target {tb}: their tokenizers differ ({what}); "
            "use a draft from the target's family",
        )
    extra = b.vocab_size - a.vocab_size
    shared = f"draft {da} and target {tb} share a tokenizer ({a.describe()})"
    if extra:
        more, fewer = (tb, da) if extra > 0 else (da, tb)
        shared += (
            f"; {more} has {abs(extra):,} more padding entries than {fewer} "
            f"({max(a.vocab_size, b.vocab_size):,} vs {min(a.vocab_size, b.vocab_size):,}), "
            "which are never drafted or committed"
        )
    if a.pre != b.pre:
        shared += f"; their pre-tokenizers are named differently ({a.pre!r} vs {b.pre!r}): text is split by the draft's"
    return PairCheck(da, tb, True, True, abs(extra), shared + ": lossless")


def require_pair(
    draft: str | os.PathLike[str],
    target: str | os.PathLike[str],
    *,
    draft_name: str | None = None,
    target_name: str | None = None,
) -> PairCheck:
    """`check_pair`, raising IncompatibleModelsError with its reason for a pair it refuses."""
    check = check_pair(draft, target, draft_name=draft_name, target_name=target_name)
    if not check.compatible:
        raise IncompatibleModelsError(check.reason)
    return check


def _difference(a: GGUFTokenizer, b: GGUFTokenizer, na: str, nb: str) -> str | None:
    """The first thing that makes `a` and `b` different tokenizers, in words; None if none does."""
    if a.tokenizer_hash == b.tokenizer_hash:
        return None
    if a.model != b.model:
        return (
            f"tokenizer model {a.model!r} in {na}, {b.model!r} in {nb}; "
            f"{a.vocab_size:,} and {b.vocab_size:,} entries"
        )
    if a.vocab_hash != b.vocab_hash:
        return _token_difference(a, b, na, nb)
    for role in SPECIAL_KEYS:
        x, y = a.special.get(role), b.special.get(role)
        if x != y:
            return f"{role} token {_special(a, x)} in {na}, {_special(b, y)} in {nb}"
    if a.merges != b.merges:
        at = next((i for i, (x, y) in enumerate(zip(a.merges, b.merges)) if x != y), None)
        if at is None:
            return f"{len(a.merges):,} BPE merges in {na}, {len(b.merges):,} in {nb}"
        return f"BPE merge {at:,} is {_text(a.merges[at])} in {na}, {_text(b.merges[at])} in {nb}"
    return "their hashes differ"  # unreachable unless a field is added to the hash and not here


def _token_difference(a: GGUFTokenizer, b: GGUFTokenizer, na: str, nb: str) -> str:
    n = min(a.real_size, b.real_size)
    at = next((i for i in range(n) if a.tokens[i] != b.tokens[i]), None)
    if at is not None:
        return f"token {at:,} is {_text(a.tokens[at])} in {na}, {_text(b.tokens[at])} in {nb}"
    types_a, types_b = a.token_types[:n], b.token_types[:n]
    if types_a.size and types_b.size:
        bad = np.flatnonzero(types_a != types_b)
        if bad.size:
            i = int(bad[0])
            return (
                f"token {i:,} ({_text(a.tokens[i])}) is of type {_type(types_a[i])} in {na}, "
                f"{_type(types_b[i])} in {nb}"
            )
    elif types_a.size != types_b.size:
        return f"{na if types_a.size else nb} gives token types, {nb if types_a.size else na} none"
    longer, other = (a, b) if a.real_size > b.real_size else (b, a)
    name, other_name = (na, nb) if longer is a else (nb, na)
    i = other.real_size
    kind = f" of type {_type(longer.token_types[i])}" if longer.token_types.size else ""
    return (
        f"{name} has {longer.real_size:,} tokens, {other_name} {other.real_size:,}, and token {i:,} "
        f"({_text(longer.tokens[i])}{kind}) is no padding"
    )


def _text(token: bytes) -> str:
    return repr(token.decode("utf-8", errors="replace"))


def _type(code: object) -> str:
    return _TYPE_NAMES.get(int(code), str(code))  # type: ignore[call-overload]


def _special(t: GGUFTokenizer, token: int | None) -> str:
    if token is None:
        return "not set"
    if 0 <= token < t.vocab_size:
        return f"{token} ({_text(t.tokens[token])})"
    return f"{token} (outside the vocabulary)"
