"""A GGUF file's metadata, read without llama.cpp (to size a model before loading it).

GGUF (llama.cpp's gguf.md): "GGUF", a version, the tensor and key counts, then the
key-value pairs, each a string key, a type and a value. Reading stops once the keys
asked for are found, or at the first key that starts with `until` (keys come grouped:
general.*, then the architecture's, then the tokenizer's hundreds of thousands of
strings); an array's value is a `GGUFArray` (its item type and length; the items are skipped),
unless its key is one of `items`: then its items are read, strings as bytes (a tokenizer's
vocabulary: 262,144 of them in 0.3 s, where the `gguf` package's GGUFReader, which parses every
array and tensor header into numpy views, takes 9 s on the same file). Tensor data is never read.

Headers come from anywhere (a Hub repo, an Ollama store, a path), so every count and length is
checked against the bytes the file has before it is trusted, and array nesting is bounded:
whatever the bytes, reading ends in the metadata or in ModelLoadError, in time and memory
proportional to the file.
"""

from __future__ import annotations

import mmap
import os
import re
import struct
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import ModelLoadError

__all__ = ["SPLIT_NAME", "GGUFArray", "read_metadata", "split_parts"]

# A part of a GGUF split by llama.cpp's gguf-split: STEM-00001-of-00003.gguf
SPLIT_NAME = re.compile(r"^(?P<stem>.*)-(?P<part>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)


def split_parts(path: str | os.PathLike[str]) -> list[Path]:
    """Every file of the model `path` is part of, in order (a split GGUF's parts, present or not);
    just `path` for a file in one piece."""
    path = Path(path)
    split = SPLIT_NAME.match(path.name)
    if not split:
        return [path]
    count = int(split.group("count"))
    return [path.with_name(f"{split.group('stem')}-{n:05d}-of-{count:05d}.gguf") for n in range(1, count + 1)]

@dataclass(frozen=True)
class GGUFArray:
    """An array's item type (GGUF's code) and length; its items are not read."""

    item_type: int
    length: int


# value types: struct format of the scalars; 8 string, 9 array
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_VERSIONS = (2, 3)  # 1 had 32-bit counts; llama.cpp reads 2 and 3
_HEADER = 24  # magic, version, tensor count, key count
# The fewest bytes each takes, to check a count against what the file holds: a key-value pair
# (key length, type, a one-byte value), a tensor's info (name length, dimensions, type, offset),
# a string (its length) and an array (item type, length).
_MIN_KV, _MIN_TENSOR, _MIN_STRING, _MIN_ARRAY = 13, 24, 8, 12
_MAX_KEY = 65535  # gguf.md: a key is at most 2^16 - 1 bytes
# llama.cpp refuses an array of arrays outright; the gguf package writes one level of them. Deeper
# is never a model, and unbounded it would recurse until Python gives up.
_MAX_NESTING = 2


def read_metadata(
    path: str | os.PathLike[str],
    keys: Collection[str] | None = None,
    *,
    until: str | None = None,
    items: Collection[str] = (),
) -> dict[str, object]:
    """The metadata of `path` (only `keys`, if given), up to the first key starting with `until`;
    the arrays named in `items` with their items (a tuple of bytes for strings, a numpy array for
    numbers), any other array as a `GGUFArray`. ModelLoadError if it is not a GGUF file or is cut short."""
    wanted = set(keys) if keys is not None else None
    with open(path, "rb") as f:
        try:
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError as exc:  # an empty file
            raise ModelLoadError(f"{path}: not a GGUF file (empty)") from exc
    with data:
        return _read(data, wanted, until, frozenset(items), str(path))


def _read(
    data: mmap.mmap, wanted: set[str] | None, until: str | None, items: frozenset[str], name: str
) -> dict[str, object]:
    if data[:4] != b"GGUF":
        raise ModelLoadError(f"{name}: not a GGUF file")
    if len(data) < _HEADER:
        raise ModelLoadError(f"{name}: damaged GGUF metadata (the header is cut short at {len(data)} bytes)")
    version, tensors, count = struct.unpack_from("<IQQ", data, 4)
    if version not in _VERSIONS:
        raise ModelLoadError(f"{name}: GGUF version {version} is not supported (only {_VERSIONS[0]} and "
                             f"{_VERSIONS[-1]}; a big-endian file reads as a huge version)")
    pos = _HEADER
    try:
        if count * _MIN_KV + tensors * _MIN_TENSOR > len(data) - pos:
            raise ValueError(f"{count:,} keys and {tensors:,} tensors cannot fit in {len(data):,} bytes")
        out: dict[str, object] = {}
        for _ in range(count):
            key, pos = _string(data, pos, _MAX_KEY)
            if until is not None and key.startswith(until):
                break
            (kind,) = struct.unpack_from("<I", data, pos)
            pos += 4
            if kind == _ARRAY and key in items:
                value, pos = _items(data, pos)
            else:
                value, pos = _value(data, pos, kind)
            if wanted is None or key in wanted:
                out[key] = value
                if wanted is not None and wanted <= out.keys():
                    break
        return out
    # ValueError: what the readers below find wrong (UnicodeDecodeError among them)
    except (struct.error, ValueError, IndexError, OverflowError) as exc:
        raise ModelLoadError(f"{name}: damaged GGUF metadata ({exc})") from exc


def _string(data: mmap.mmap, pos: int, limit: int | None = None) -> tuple[str, int]:
    (n,) = struct.unpack_from("<Q", data, pos)
    pos += 8
    if limit is not None and n > limit:
        raise ValueError(f"a key of {n:,} bytes (at most {limit:,})")
    if pos + n > len(data):
        raise ValueError("a string runs past the end of the file")
    return data[pos : pos + n].decode("utf-8"), pos + n


def _value(data: mmap.mmap, pos: int, kind: int, depth: int = 0) -> tuple[object, int]:
    if kind in _SCALARS:
        fmt = _SCALARS[kind]
        return struct.unpack_from(fmt, data, pos)[0], pos + struct.calcsize(fmt)
    if kind == _STRING:
        return _string(data, pos)
    if kind == _ARRAY:
        if depth >= _MAX_NESTING:
            raise ValueError(f"arrays nested more than {_MAX_NESTING} deep")
        item, n = struct.unpack_from("<IQ", data, pos)
        pos += 12
        if item in _SCALARS:
            pos += n * struct.calcsize(_SCALARS[item])
        elif item in (_STRING, _ARRAY):
            _check_length(data, pos, n, _MIN_STRING if item == _STRING else _MIN_ARRAY)
            for _ in range(n):
                if item == _STRING:
                    (size,) = struct.unpack_from("<Q", data, pos)
                    pos += 8 + size
                else:
                    _, pos = _value(data, pos, item, depth + 1)
                if pos > len(data):
                    break
        else:
            raise ValueError(f"an array of unknown GGUF value type {item}")
        if pos > len(data):
            raise ValueError("an array runs past the end of the file")
        return GGUFArray(item, n), pos
    raise ValueError(f"unknown GGUF value type {kind}")


def _check_length(data: mmap.mmap, pos: int, n: int, least: int) -> None:
    """Refuse an array longer than the rest of the file could hold, before looping over it."""
    if n * least > len(data) - pos:
        raise ValueError(f"an array of {n:,} items cannot fit in the {max(len(data) - pos, 0):,} bytes left")


_NUMPY = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8", 11: "<i8", 12: "<f8"}


def _items(data: mmap.mmap, pos: int) -> tuple[object, int]:
    """An array's items: numbers as a numpy array (a copy), strings as a tuple of bytes."""
    item, n = struct.unpack_from("<IQ", data, pos)
    pos += 12
    if item in _NUMPY:
        dtype = np.dtype(_NUMPY[item])
        if pos + n * dtype.itemsize > len(data):
            raise ValueError("an array runs past the end of the file")
        return np.frombuffer(data, dtype, count=n, offset=pos).copy(), pos + n * dtype.itemsize
    if item != _STRING:
        raise ValueError(f"an array of GGUF type {item} where numbers or strings were expected")
    _check_length(data, pos, n, _MIN_STRING)
    out: list[bytes] = []
    append, size_at, end = out.append, struct.Struct("<Q").unpack_from, len(data)
    for _ in range(n):
        (size,) = size_at(data, pos)
        pos += 8
        if pos + size > end:
            raise ValueError("a string runs past the end of the file")
        append(data[pos : pos + size])
        pos += size
    return tuple(out), pos
