"""Reading Ollama's model store on disk (edgekit.models.ollama): stores laid out in tmp_path as
`ollama pull` leaves them, tiny GGUFs written with the gguf package; no Ollama, no llama.cpp."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from _model_files import add_ollama_model, tiny_gguf

from edgekit.errors import ConfigError, ModelIntegrityError, ModelLoadError, ModelNotFoundError
from edgekit.models import ollama
from edgekit.models.ollama import OllamaName, list_ollama, ollama_model, ollama_stores, parse_ollama_name


@pytest.fixture()
def store(tmp_path: Path) -> Path:
    return tmp_path / "ollama-models"


@pytest.fixture()
def gguf(tmp_path: Path) -> Path:
    return tiny_gguf(tmp_path / "src" / "tiny.gguf")


def test_a_model_is_its_manifests_model_layer_blob_used_in_place(store, gguf):
    blob = add_ollama_model(store, gguf, "tiny", family="gemma3", quant="Q4_0", link=True)

    model = ollama_model("tiny", models_dir=store)

    assert model.path == blob == store / "blobs" / blob.name
    assert os.path.samefile(model.path, gguf)  # the blob itself, not a copy
    assert model.name == "tiny:latest"
    assert model.size == gguf.stat().st_size
    assert model.digest == "sha256:" + blob.name.removeprefix("sha256-")
    assert model.manifest == store / "manifests" / "registry.ollama.ai" / "library" / "tiny" / "latest"
    assert (model.family, model.quant) == ("gemma3", "Q4_0")


@pytest.mark.parametrize(
    ("name", "tag"),
    [("tiny", None), ("tiny", "latest"), ("tiny:latest", None), ("library/tiny", None),
     ("registry.ollama.ai/library/tiny:latest", None), ("TINY:Latest", None)],
)  # fmt: skip
def test_a_name_finds_its_manifest_in_every_spelling_ollama_accepts(store, gguf, name, tag):
    add_ollama_model(store, gguf, "tiny")
    assert ollama_model(name, tag, models_dir=store).name == "tiny:latest"


def test_user_models_and_hub_models_pulled_into_ollama_keep_their_namespace_and_host(store, gguf):
    add_ollama_model(store, gguf, "m", "v2", namespace="someone")
    add_ollama_model(store, gguf, "Llama-3.2-1B-Instruct-GGUF", "Q4_K_M", namespace="bartowski", host="hf.co")

    assert ollama_model("someone/m:v2", models_dir=store).name == "someone/m:v2"
    hub = ollama_model("hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF", "Q4_K_M", models_dir=store)
    assert hub.name == "hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M"
    assert hub.manifest.relative_to(store).parts == (
        "manifests", "hf.co", "bartowski", "Llama-3.2-1B-Instruct-GGUF", "Q4_K_M"
    )  # fmt: skip
    # Ollama compares names without regard to case, and so do we (the disk keeps the case written).
    assert ollama_model("HF.CO/BARTOWSKI/llama-3.2-1b-instruct-gguf:q4_k_m", models_dir=store).name == hub.name


def test_OLLAMA_MODELS_is_the_store_when_set(monkeypatch, store, gguf):
    add_ollama_model(store, gguf, "tiny")
    monkeypatch.setenv("OLLAMA_MODELS", f' "{store}" ')  # Ollama trims spaces and quotes too
    assert ollama_stores() == (store,)
    assert ollama_model("tiny").path.parent == store / "blobs"


def test_without_OLLAMA_MODELS_the_users_store_then_the_linux_services_store_are_read(monkeypatch, tmp_path, gguf):
    monkeypatch.delenv("OLLAMA_MODELS", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    service = tmp_path / "usr-share-ollama" / ".ollama" / "models"
    monkeypatch.setattr(ollama, "SERVICE_STORE", service)
    user = tmp_path / "home" / ".ollama" / "models"
    add_ollama_model(user, gguf, "both", quant="user")
    add_ollama_model(service, gguf, "both", quant="service")
    add_ollama_model(service, gguf, "served")

    assert ollama_stores() == (user, service)
    assert ollama_model("served").path.parent == service / "blobs"
    assert ollama_model("both").quant == "user"  # the first store wins
    assert [(m.name, m.quant) for m in list_ollama()] == [("both:latest", "user"), ("served:latest", "Q4_0")]


def test_a_missing_model_names_the_store_searched_and_what_it_holds(store, gguf):
    add_ollama_model(store, gguf, "tiny")
    add_ollama_model(store, gguf, "m", "v2", namespace="someone")

    with pytest.raises(ModelNotFoundError) as info:
        ollama_model("llama3.2", "1b", models_dir=store)
    message = str(info.value)
    assert "llama3.2:1b" in message and str(store) in message
    assert "someone/m:v2, tiny:latest" in message
    assert "ollama pull llama3.2:1b" in message

    with pytest.raises(ModelNotFoundError, match="holds no models"):
        ollama_model("tiny", models_dir=store / "empty")


def test_a_manifest_naming_a_missing_blob_says_so(store, gguf):
    blob = add_ollama_model(store, gguf, "tiny")
    blob.unlink()
    with pytest.raises(ModelNotFoundError, match=rf"names the model blob {blob}, which is missing.*pull tiny:latest"):
        ollama_model("tiny", models_dir=store)
    assert list_ollama(store) == []  # a listing leaves out what cannot load


def test_a_blob_of_the_wrong_size_or_content_is_refused_with_what_was_expected(store, gguf):
    blob = add_ollama_model(store, gguf, "tiny")
    good = blob.read_bytes()
    digest = blob.name.removeprefix("sha256-")
    assert ollama_model("tiny", models_dir=store, verify=True).path == blob

    blob.write_bytes(good[:-1])
    with pytest.raises(ModelIntegrityError, match=f"holds {len(good) - 1} bytes, its manifest says {len(good)}"):
        ollama_model("tiny", models_dir=store)

    blob.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
    assert ollama_model("tiny", models_dir=store).path == blob  # only the size is checked unless asked
    with pytest.raises(ModelIntegrityError, match=f"has sha256 [0-9a-f]{{64}}, expected {digest}"):
        ollama_model("tiny", models_dir=store, verify=True)


def test_a_manifest_without_a_gguf_layer_or_damaged_is_refused(store, gguf):
    add_ollama_model(store, gguf, "tiny")
    manifest = store / "manifests" / "registry.ollama.ai" / "library" / "tiny" / "latest"
    data = json.loads(manifest.read_text())
    data["layers"] = [x for x in data["layers"] if x["mediaType"] != "application/vnd.ollama.image.model"]
    manifest.write_text(json.dumps(data))
    with pytest.raises(ModelLoadError, match="no GGUF model layer.*image.params, application/vnd.ollama.image.templ"):
        ollama_model("tiny", models_dir=store)

    manifest.write_text('{"schemaVersion": 2, "layers": [')
    with pytest.raises(ModelLoadError, match="is damaged"):
        ollama_model("tiny", models_dir=store)


def test_list_ollama_lists_every_model_by_name(store, gguf):
    add_ollama_model(store, gguf, "tiny")
    add_ollama_model(store, gguf, "tiny", "v2")
    add_ollama_model(store, gguf, "REPO", "Q8_0", namespace="ORG", host="hf.co")
    (store / "manifests" / "registry.ollama.ai" / "library" / "bad name").mkdir()  # Ollama skips such names too

    models = list_ollama(store)

    assert [m.name for m in models] == ["hf.co/ORG/REPO:Q8_0", "tiny:latest", "tiny:v2"]
    assert len({m.path for m in models}) == 1  # one blob, three names
    assert list_ollama(store / "nowhere") == []


def test_names_are_parsed_and_checked_as_ollama_does():
    assert parse_ollama_name("llama3.2") == OllamaName("registry.ollama.ai", "library", "llama3.2", "latest")
    assert parse_ollama_name("localhost:5000/ns/m:t") == OllamaName("localhost:5000", "ns", "m", "t")
    assert parse_ollama_name("ns/m", "t") == OllamaName("registry.ollama.ai", "ns", "m", "t")
    assert str(parse_ollama_name("registry.ollama.ai/library/m:t")) == "m:t"
    assert str(parse_ollama_name("hf.co/ORG/REPO:Q4_K_M")) == "hf.co/ORG/REPO:Q4_K_M"
    for bad in ("a/b/c/d", "-m", "m:", "/m", "ns.dot/m", "m m", ""):
        with pytest.raises(ConfigError, match="is not an Ollama name"):
            parse_ollama_name(bad)
    with pytest.raises(ConfigError, match="has the tag '1b' and was also given the tag '3b'"):
        parse_ollama_name("llama3.2:1b", "3b")
