"""Which GGUF of a Hugging Face repo to load: llama.cpp's rules for ``-hf ORG/REPO[:QUANT]``.

The rules are llama.cpp's, read in ggml-org/llama.cpp ``common/download.cpp`` (commit 0216dab364b8):
``find_best_model``, ``gguf_filename_is_model``, ``get_gguf_split_info``, ``get_split_files`` and
``common_download_get_hf_plan``; the file list is the repo's recursive listing, in the Hub's order
(``common/hf-cache.cpp``, ``get_repo_files``). So:

- with a file name, the file whose repo path equals it, case-insensitively (a file in a folder is
  named with its folder, ``Q4_K_M/Model-Q4_K_M-00001-of-00002.gguf``);
- with a quant, the first model GGUF whose repo path (folders included) contains the quant followed
  by ``.`` or ``-``, case-insensitively (``q4_k_m`` finds ``Model-Q4_K_M.gguf``);
- with neither, the first of Q4_K_M, then Q8_0, then the first model GGUF of the repo;
- a model GGUF is a ``.gguf`` whose file name names no sidecar (mmproj, imatrix, mtp-, eagle3-,
  dflash-, dspark-); of a split GGUF (``-00001-of-00003.gguf``) only the first part is picked, and
  every part with its prefix and count comes with it.

Two departures, both on input llama.cpp would misread: the quant is matched as text, not compiled
as a regular expression, and a split GGUF with a part missing from the listing is refused here
rather than failing in the loader. Picking a later part by name gives the first part to load.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from edgekit.errors import ModelNotFoundError

__all__ = ["DEFAULT_QUANTS", "SplitInfo", "is_model_gguf", "is_quant_name", "pick_gguf", "quant_of", "split_info"]

DEFAULT_QUANTS = ("Q4_K_M", "Q8_0")
# What a quant is named, for every parser of a reference (hf:ORG/REPO:QUANT, hub_gguf's quant=):
# words joined by single hyphens, as Unsloth's prefixed tags (UD-Q4_K_XL) are.
_QUANT_NAME = re.compile(r"[A-Za-z0-9_]+(?:-[A-Za-z0-9_]+)*")
_SIDECARS = ("mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-")
_SPLIT = re.compile(r"^(.+)-([0-9]{5})-of-([0-9]{5})$", re.IGNORECASE)
_TAG = re.compile(r"[-.]([A-Z0-9_]+)$", re.IGNORECASE)


@dataclass(frozen=True)
class SplitInfo:
    """A GGUF's name taken apart: the path before the split suffix, its quant tag (upper case, ""
    if none), and which part of how many it is (1 of 1 for a single file)."""

    prefix: str
    tag: str
    index: int
    count: int


def split_info(path: str) -> SplitInfo | None:
    """How llama.cpp reads a GGUF's name; None for a file that is not a ``.gguf``."""
    if not path.endswith(".gguf"):
        return None
    prefix, index, count = path[: -len(".gguf")], 1, 1
    if m := _SPLIT.match(prefix):
        prefix, index, count = m[1], int(m[2]), int(m[3])
    tag = m[1].upper() if (m := _TAG.search(prefix)) else ""
    return SplitInfo(prefix, tag, index, count)


def is_model_gguf(path: str) -> bool:
    """A ``.gguf`` holding a model, not a projector, an importance matrix or a draft head."""
    name = path.rsplit("/", 1)[-1]
    return path.endswith(".gguf") and not any(s in name for s in _SIDECARS)


def is_quant_name(text: str) -> bool:
    """Whether `text` can name a quant (Q4_K_M, iq2_xxs, UD-Q4_K_XL), as every model reference spells one."""
    return _QUANT_NAME.fullmatch(text) is not None


def quant_of(path: str) -> str:
    """The quant tag llama.cpp reads from a GGUF's name (``Q4_K_M``); "" if it names none."""
    info = split_info(path)
    return info.tag if info is not None else ""


def pick_gguf(files: Sequence[str], *, quant: str | None = None, file: str | None = None,
              where: str = "the repo") -> list[str]:
    """The GGUF to load from a repo's file list, and the other parts of a split GGUF.

    Returns the parts in order; the first is the one to load (llama.cpp finds the others next to it).
    ModelNotFoundError, naming `where` and what it holds, when nothing matches.
    """
    if file is not None:
        primary = next((f for f in files if f.lower() == file.lower()), None)
        if primary is None:
            raise ModelNotFoundError(f"{where} has no file {file!r}; its GGUF files: {_gguf_files(files)}")
    else:
        primary = _best_model(files, quant)
        if primary is None and quant is not None:
            raise ModelNotFoundError(f"{where} has no GGUF of quant {quant}; it has: {_quants(files)}")
        if primary is None:
            raise ModelNotFoundError(f"{where} has no GGUF model file; it holds: {_listing(files)}")
    return _split_parts(files, primary, where)


def _best_model(files: Sequence[str], quant: str | None) -> str | None:
    for tag in (quant,) if quant is not None else DEFAULT_QUANTS:
        pattern = re.compile(re.escape(tag) + "[.-]", re.IGNORECASE)
        found = next((f for f in files if _first_model_part(f) and pattern.search(f)), None)
        if found is not None:
            return found
    if quant is None:  # llama.cpp falls back to the first model only when no quant was asked for
        return next((f for f in files if _first_model_part(f)), None)
    return None


def _first_model_part(path: str) -> bool:
    info = split_info(path)
    return is_model_gguf(path) and info is not None and (info.count == 1 or info.index == 1)


def _split_parts(files: Sequence[str], primary: str, where: str) -> list[str]:
    info = split_info(primary)
    if info is None or info.count <= 1:
        return [primary]
    parts: dict[int, str] = {}
    for f in files:
        other = split_info(f)
        if other is not None and other.count == info.count and other.prefix == info.prefix:
            parts[other.index] = f
    missing = [i for i in range(1, info.count + 1) if i not in parts]
    if missing:
        raise ModelNotFoundError(
            f"{where} holds a split GGUF {info.prefix} of {info.count} parts without part(s) "
            f"{', '.join(map(str, missing))}: it cannot be loaded"
        )
    return [parts[i] for i in range(1, info.count + 1)]


def _quants(files: Sequence[str]) -> str:
    models = [f for f in files if _first_model_part(f)]
    if not models:
        return f"no GGUF model file ({_listing(files)})"
    return ", ".join(dict.fromkeys(quant_of(f) or f for f in models))  # a name without a tag stands for itself


def _gguf_files(files: Sequence[str]) -> str:
    return ", ".join(f for f in files if f.endswith(".gguf")) or f"none ({_listing(files)})"


def _listing(files: Sequence[str], most: int = 12) -> str:
    if not files:
        return "no files"
    shown = ", ".join(files[:most])
    return shown + (f" and {len(files) - most} more" if len(files) > most else "")
