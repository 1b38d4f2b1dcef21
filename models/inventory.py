"""What models this machine has, from every source, and which can draft for which.

Three places hold GGUF models: edgekit's registry cache (``edgekit models pull``), the Hugging Face
Hub's cache (shared with every tool that uses ``huggingface_hub``) and Ollama's store. ``local_models``
lists them all, each under the reference that names it (``gemma-3-270m``, ``hf:ORG/REPO/FILE.gguf``,
``ollama:NAME:TAG``), with its size, its quant and its tokenizer, read from its GGUF header
(``edgekit.models.compat``). Two models of the same tokenizer are a lossless pair; the smaller
drafts for the larger (``drafts_for``, ``smallest_draft_for``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from edgekit.errors import EdgekitError

from .cache import cache_dir, is_present
from .registry import list_models

__all__ = ["LocalModel", "can_draft_for", "drafts_for", "local_models", "smallest_draft_for"]

log = logging.getLogger("edgekit.models")


@dataclass(frozen=True)
class LocalModel:
    """A model on this machine: the reference that names it, where it comes from ("registry",
    "hf", "ollama"), its file (a split model's first part), size in bytes (all parts), quant
    ("" when unknown) and tokenizer (`tokenizer` is its hash, "" when the header could not be
    read; `tokenizer_kind` says what it is, e.g. "151,643 tokens + 293 padding, BPE model 'gpt2'")."""

    ref: str
    source: str
    path: Path
    size: int
    quant: str
    tokenizer: str
    tokenizer_kind: str


def local_models(*, sources: Iterable[str] = ("registry", "hf", "ollama")) -> list[LocalModel]:
    """Every GGUF model the sources hold (a source that cannot be read is left out, and logged)."""
    found: list[tuple[str, str, Path, int, str]] = []
    wanted = set(sources)
    if "registry" in wanted:
        for spec in list_models():
            if is_present(spec.name):
                path = cache_dir() / spec.filename
                found.append((spec.name, "registry", path, path.stat().st_size, _quant_of(spec.filename)))
    if "hf" in wanted:
        try:
            from .hub import list_hub_cache

            for m in list_hub_cache():
                if m.complete:
                    found.append((f"hf:{m.repo}/{m.file}", "hf", m.path, m.size, m.quant or ""))
        except EdgekitError as exc:
            log.warning("the Hugging Face cache could not be read: %s", exc)
    if "ollama" in wanted:
        from .ollama import list_ollama

        for o in list_ollama():
            found.append((f"ollama:{o.name}", "ollama", o.path, o.size, o.quant or ""))
    return [_with_tokenizer(*f) for f in found]


def _quant_of(filename: str) -> str:
    from ._gguf_pick import quant_of

    return quant_of(filename) or ""


def _with_tokenizer(ref: str, source: str, path: Path, size: int, quant: str) -> LocalModel:
    from .compat import tokenizer_of

    try:
        t = tokenizer_of(path)
    except EdgekitError as exc:  # a damaged or foreign file: listed, without a tokenizer
        log.warning("%s: its tokenizer could not be read: %s", ref, exc)
        return LocalModel(ref, source, path, size, quant, "", "")
    return LocalModel(ref, source, path, size, quant, t.tokenizer_hash, t.describe())


def can_draft_for(draft: LocalModel, target: LocalModel) -> bool:
    """Whether `draft` drafts for `target` losslessly (one tokenizer) and is the smaller of the two."""
    return bool(draft.tokenizer) and draft.tokenizer == target.tokenizer and draft.size < target.size


def drafts_for(target: LocalModel, models: Iterable[LocalModel]) -> list[LocalModel]:
    """The models that can draft for `target`, smallest first."""
    return sorted((m for m in models if can_draft_for(m, target)), key=lambda m: (m.size, m.ref))


def smallest_draft_for(target_path: Path, models: Iterable[LocalModel] | None = None) -> LocalModel | None:
    """The smallest model on this machine of the same tokenizer as the GGUF at `target_path`, or None."""
    from .compat import tokenizer_of

    t = tokenizer_of(target_path)
    size = target_path.stat().st_size
    target = LocalModel(str(target_path), "path", target_path, size, "", t.tokenizer_hash, t.describe())
    candidates = [m for m in (models if models is not None else local_models()) if m.path != target_path]
    options = drafts_for(target, candidates)
    return options[0] if options else None
