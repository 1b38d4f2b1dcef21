"""Models from the Hugging Face Hub: llama.cpp's rules for which GGUF of a repo to load, and
downloads by the real huggingface_hub client from a hub served on loopback (tests/hub_fake.py),
into a cache of the test's own."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
from hub_fake import ORG

from edgekit.errors import ModelNotFoundError
from edgekit.models.hub import hub_gguf

# -- downloads from a hub on loopback ------------------------------------------------------------









# -- end to end: a real draft through the hub ------------------------------------------------------


def _greedy(draft, prompt: str, n: int = 16) -> list[int]:
    """The draft's own greedy continuation of `prompt`: what it drafts at temperature 0."""
    tokens = draft.tokenize(prompt)
    draft.truncate(0)
    draft.prefill(tokens[:-1])
    last, out = tokens[-1], []
    for _ in range(n):
        last = int(np.argmax(draft.eval([last]).logits))
        out.append(last)
    return out


def _drafts_as(path: Path, reference, name: str) -> None:
    """The GGUF at `path` loads in llama.cpp and drafts what the `reference` draft does."""
    from edgekit import LlamaDraftModel

    fetched = LlamaDraftModel(path, name=name, n_ctx=reference.n_ctx)
    try:
        prompt = "The rain in Spain falls mainly"
        assert _greedy(fetched, prompt) == _greedy(reference, prompt)
    finally:
        fetched.close()


@pytest.mark.models
def test_the_gemma_draft_from_the_hub_drafts_as_the_registrys_copy(hub, gemma_paths, gemma_draft):
    """The registry's draft is served from where it lies; the copy huggingface_hub downloads passes
    the sha256 check, loads in llama.cpp and drafts the same tokens."""
    hub.add_repo(f"{ORG}/gemma-3-270m-GGUF", {"README.md": b"# gemma\n", "gemma-3-270m-Q4_0.gguf": gemma_paths[0]})
    path = hub_gguf(f"{ORG}/gemma-3-270m-GGUF", quant="Q4_0")
    assert path.stat().st_size == gemma_paths[0].stat().st_size and not path.resolve().samefile(gemma_paths[0])
    _drafts_as(path, gemma_draft, "gemma-3-270m-q4_0 (hub)")


@pytest.mark.models
def test_a_split_draft_from_the_hub_loads_from_its_first_part(hub, tmp_path):
    """A draft split in two with the gguf package (as gguf-split does: split.no, split.count in each
    part) comes through the hub into one snapshot folder, where llama.cpp finds the second part
    from the first part's name, and drafts as the whole file does. SmolLM2, as the gguf package
    reads its 49k-token vocabulary in 2 s (gemma's 262k take 10 s)."""
    from gguf.scripts.gguf_new_metadata import copy_with_new_metadata

    from edgekit import LlamaDraftModel
    from edgekit.models import model_path

    try:
        whole = model_path("smollm2-135m-instruct")
    except ModelNotFoundError as exc:  # as conftest's fixtures: a missing model fails, never skips
        pytest.fail(str(exc), pytrace=False)
    reader = gguf.GGUFReader(whole)
    out = tmp_path / "split"
    out.mkdir()
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(out / "SmolLM2-135M-Q4_1.gguf", arch, split_max_tensors=(len(reader.tensors) + 1) // 2)
    copy_with_new_metadata(reader, writer, {}, [])
    parts = sorted(out.iterdir())
    assert [p.name for p in parts] == [f"SmolLM2-135M-Q4_1-0000{i}-of-00002.gguf" for i in (1, 2)]
    hub.add_repo(f"{ORG}/SmolLM2-135M-split-GGUF", {f"Q4_1/{p.name}": p for p in parts})
    path = hub_gguf(f"{ORG}/SmolLM2-135M-split-GGUF", quant="q4_1")
    assert path.name == parts[0].name and (path.parent / parts[1].name).exists()
    reference = LlamaDraftModel(whole, name="smollm2-135m-instruct", n_ctx=512)
    try:
        _drafts_as(path, reference, "smollm2-135m-instruct (split, hub)")
    finally:
        reference.close()
