"""Removing a model from edgekit's cache or from the Hugging Face Hub's cache.

Only what edgekit fetched there: Ollama's store is Ollama's (``ollama rm``), a path is the user's.
In the Hub's cache a model is a file of a repo at a revision: its snapshot links go, and each blob
they point to unless another revision still links to it (the cache's own layout, read with
``huggingface_hub.scan_cache_dir``).
"""

from __future__ import annotations

from pathlib import Path

from edgekit.errors import ConfigError, ModelNotFoundError

from ._sidecar import sidecar_path
from .cache import cache_dir
from .refs import ModelRef
from .registry import get_model, get_pair, list_pairs

__all__ = ["remove"]


def remove(ref: ModelRef) -> list[str]:
    """Removes the model `ref` names; a line per file removed (or for what was not there)."""
    if ref.kind == "registry":
        assert ref.name is not None
        names = [get_pair(ref.name).draft, get_pair(ref.name).target] if ref.name in {
            p.name for p in list_pairs()
        } else [ref.name]
        return [line for name in names for line in _remove_registry(name)]
    if ref.kind == "hf":
        return _remove_hub(ref)
    raise ConfigError(f"{ref}: not edgekit's to remove")


def _remove_registry(name: str) -> list[str]:
    path = cache_dir() / get_model(name).filename
    lines = []
    for p in (path, sidecar_path(path)):
        if p.exists():
            p.unlink()
            lines.append(f"removed {p}")
    return lines or [f"{name}: not in the cache ({cache_dir()})"]


def _remove_hub(ref: ModelRef) -> list[str]:
    from huggingface_hub import constants, scan_cache_dir

    from ._gguf_pick import split_info
    from .hub import hub_gguf

    assert ref.repo is not None
    first = hub_gguf(ref.repo, quant=ref.quant, file=ref.file, revision=ref.revision, download=False)
    info = split_info(first.name)
    stem = info.prefix if info is not None and info.count > 1 else None
    lines: list[str] = []
    for repo in scan_cache_dir(constants.HF_HUB_CACHE).repos:  # the cache as configured now (HF_HUB_CACHE)
        if repo.repo_id.lower() != ref.repo.lower() or repo.repo_type != "model":
            continue
        keep = set()  # blobs another file of the repo still links to
        gone: list[tuple[Path, Path]] = []
        for revision in repo.revisions:
            for f in revision.files:
                name = f.file_path.name
                part = stem is not None and name.startswith(stem + "-") and name.endswith(".gguf")
                same = name == first.name or part
                if same and f.file_path.parent == first.parent:
                    gone.append((f.file_path, f.blob_path))
                else:
                    keep.add(f.blob_path)
        for link, blob in gone:
            link.unlink(missing_ok=True)
            lines.append(f"removed {link}")
            if blob not in keep and blob.exists():
                blob.unlink()
                lines.append(f"removed {blob}")
    if not lines:
        raise ModelNotFoundError(f"{ref}: not in the Hugging Face cache")
    return lines
