"""Model references (edgekit.models.refs): every form the parser accepts and every one it refuses,
and the resolver for each source on files in tmp_path: a registry cache, GGUF paths, an Ollama store
laid out as Ollama writes it, and the Hub through a fake `edgekit.models.hub`. One `models` test loads
a draft from an Ollama store whose blob is the registry's gemma draft."""

from __future__ import annotations

import dataclasses

import pytest
from _model_files import add_ollama_model

from edgekit.models._sidecar import read_sidecar  # private: the sidecar's contents, which only the cache reads
from edgekit.models.refs import ModelRef, resolve


def ollama(name: str, tag: str = "latest", **fields: str) -> ModelRef:
    return ModelRef("ollama", name=name, tag=tag, **fields)  # type: ignore[arg-type]


@pytest.mark.models
def test_a_draft_resolved_from_an_ollama_store_is_the_registry_draft(tmp_path, monkeypatch, gemma_paths, gemma_draft):
    from edgekit.runtime import LlamaDraftModel

    registry_draft = gemma_paths[0]
    store = tmp_path / "ollama"
    monkeypatch.setenv("OLLAMA_MODELS", str(store))
    sidecar = read_sidecar(registry_draft)
    assert sidecar is not None
    # Linked, not copied; the digest the cache measured when it derived the draft spares hashing 158 MB.
    blob = add_ollama_model(store, registry_draft, "gemma3-draft", "270m", family="gemma3", sha256=sidecar["sha256"],
                            link=True)  # fmt: skip

    resolved = resolve("ollama:gemma3-draft:270m")
    assert resolved.path == blob and resolved.name == "gemma3-draft:270m"
    draft = LlamaDraftModel(resolved.path, name=resolved.name, n_ctx=256)
    try:
        fingerprint = draft.fingerprint()
    finally:
        draft.close()
    assert fingerprint.model_name == "gemma3-draft:270m"
    assert dataclasses.replace(fingerprint, model_name=gemma_draft.name) == gemma_draft.fingerprint()
