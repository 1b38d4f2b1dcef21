"""Model references (edgekit.models.refs): every form the parser accepts and every one it refuses,
and the resolver for each source on files in tmp_path: a registry cache, GGUF paths, an Ollama store
laid out as Ollama writes it, and the Hub through a fake `edgekit.models.hub`. One `models` test loads
a draft from an Ollama store whose blob is the registry's gemma draft."""

from __future__ import annotations

import dataclasses
import hashlib
import sys
import types
from pathlib import Path

import pytest
from _model_files import add_ollama_model, tiny_gguf

from edgekit.errors import ConfigError, ModelLoadError, ModelNotFoundError
from edgekit.models import pull
from edgekit.models._sidecar import write_sidecar
from edgekit.models.refs import ModelRef, ResolvedModel, parse_ref, resolve

HOME = Path.home()


def registry(name: str) -> ModelRef:
    return ModelRef("registry", name=name)


def hf(repo: str, **fields: str) -> ModelRef:
    return ModelRef("hf", repo=repo, **fields)  # type: ignore[arg-type]  # the str fields of an hf reference


def ollama(name: str, tag: str = "latest", **fields: str) -> ModelRef:
    return ModelRef("ollama", name=name, tag=tag, **fields)  # type: ignore[arg-type]


def path(text: str) -> ModelRef:
    return ModelRef("path", path=Path(text))


# (written, parsed, canonical form)
ACCEPTED = [
    ("gemma-3-270m", registry("gemma-3-270m"), "gemma-3-270m"),
    ("qwen-coder", registry("qwen-coder"), "qwen-coder"),
    ("  gemma-270m\n", registry("gemma-270m"), "gemma-270m"),
    ("hf:bartowski/Llama-3.2-1B-Instruct-GGUF", hf("bartowski/Llama-3.2-1B-Instruct-GGUF"),
     "hf:bartowski/Llama-3.2-1B-Instruct-GGUF"),
    ("hf:Qwen/Qwen2.5-7B-Instruct-GGUF:Q4_K_M", hf("Qwen/Qwen2.5-7B-Instruct-GGUF", quant="Q4_K_M"),
     "hf:Qwen/Qwen2.5-7B-Instruct-GGUF:Q4_K_M"),
    ("HF:org/repo:q8_0", hf("org/repo", quant="q8_0"), "hf:org/repo:q8_0"),
    ("hf:org/repo:UD-Q4_K_XL", hf("org/repo", quant="UD-Q4_K_XL"), "hf:org/repo:UD-Q4_K_XL"),
    ("hf:org/repo:latest", hf("org/repo"), "hf:org/repo"),
    ("hf:org/repo/model-q4_k_m.gguf", hf("org/repo", file="model-q4_k_m.gguf"), "hf:org/repo/model-q4_k_m.gguf"),
    ("hf:org/repo/Q4_K_M/big-00001-of-00003.gguf", hf("org/repo", file="Q4_K_M/big-00001-of-00003.gguf"),
     "hf:org/repo/Q4_K_M/big-00001-of-00003.gguf"),
    ("hf:org/repo@v1.0:Q4_0", hf("org/repo", quant="Q4_0", revision="v1.0"), "hf:org/repo@v1.0:Q4_0"),
    ("hf:org/repo@refs%2Fpr%2F3/m.gguf", hf("org/repo", file="m.gguf", revision="refs/pr/3"),
     "hf:org/repo@refs%2Fpr%2F3/m.gguf"),
    ("hf://org/repo@0123abcd/m.gguf", hf("org/repo", file="m.gguf", revision="0123abcd"),
     "hf:org/repo@0123abcd/m.gguf"),
    ("hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M", hf("bartowski/Llama-3.2-1B-Instruct-GGUF", quant="Q4_K_M"),
     "hf:bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M"),
    ("hf.co/org/repo:latest", hf("org/repo"), "hf:org/repo"),
    ("huggingface.co/org/repo", hf("org/repo"), "hf:org/repo"),
    ("hf.co/org/repo/sub/m.gguf", hf("org/repo", file="sub/m.gguf"), "hf:org/repo/sub/m.gguf"),
    ("https://huggingface.co/org/repo", hf("org/repo"), "hf:org/repo"),
    ("https://huggingface.co/org/repo/", hf("org/repo"), "hf:org/repo"),
    ("https://huggingface.co/org/repo/blob/main/sub/m.gguf", hf("org/repo", file="sub/m.gguf", revision="main"),
     "hf:org/repo@main/sub/m.gguf"),
    ("https://huggingface.co/org/repo/resolve/main/m.gguf?download=true",
     hf("org/repo", file="m.gguf", revision="main"), "hf:org/repo@main/m.gguf"),
    ("https://www.huggingface.co/org/repo/tree/dev", hf("org/repo", revision="dev"), "hf:org/repo@dev"),
    ("http://hf.co/org/repo/resolve/refs%2Fpr%2F1/m.gguf", hf("org/repo", file="m.gguf", revision="refs/pr/1"),
     "hf:org/repo@refs%2Fpr%2F1/m.gguf"),
    ("ollama:llama3.2", ollama("llama3.2"), "ollama:llama3.2:latest"),
    ("ollama:llama3.2:1b", ollama("llama3.2", "1b"), "ollama:llama3.2:1b"),
    ("ollama:library/llama3", ollama("llama3"), "ollama:llama3:latest"),
    ("ollama:registry.ollama.ai/library/llama3:8b", ollama("llama3", "8b"), "ollama:llama3:8b"),
    ("ollama:someone/model:v2", ollama("model", "v2", namespace="someone"), "ollama:someone/model:v2"),
    ("ollama:hf.co/ORG/REPO:Q4_K_M", ollama("REPO", "Q4_K_M", namespace="ORG", host="hf.co"),
     "ollama:hf.co/ORG/REPO:Q4_K_M"),
    ("ollama:localhost:5000/ns/m", ollama("m", namespace="ns", host="localhost:5000"),
     "ollama:localhost:5000/ns/m:latest"),
    ("/models/m.gguf", path("/models/m.gguf"), "/models/m.gguf"),
    ("./m.gguf", path("m.gguf"), "./m.gguf"),
    ("m.gguf", path("m.gguf"), "./m.gguf"),
    ("M.GGUF", path("M.GGUF"), "./M.GGUF"),
    ("../models/m.gguf", path("../models/m.gguf"), "../models/m.gguf"),
    ("~/models/m.gguf", path(str(HOME / "models" / "m.gguf")), str(HOME / "models" / "m.gguf")),
    ("models/m", path("models/m"), "./models/m"),
    ("Qwen/Qwen2.5-7B-Instruct-GGUF", path("Qwen/Qwen2.5-7B-Instruct-GGUF"), "./Qwen/Qwen2.5-7B-Instruct-GGUF"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "parsed", "canonical"), ACCEPTED, ids=[a[0] for a in ACCEPTED])
def test_every_accepted_form_parses_to_its_reference_and_its_canonical_form_reads_back(text, parsed, canonical):
    ref = parse_ref(text)
    assert ref == parsed
    assert str(ref) == canonical
    assert parse_ref(str(ref)) == ref


# (written, what the message says besides the accepted forms)
REFUSED = [
    ("", "empty model reference"),
    ("   ", "empty model reference"),
    ("no-such-model", "no registry model or pair has that name .*gemma-3-270m.*qwen-coder.* no file ./no-such-model"),
    ("llama3.2:1b", "For a model in Ollama's store write ollama:llama3.2:1b"),
    ("hf:", "a Hub reference is hf:ORG/REPO"),
    ("hf:repo-without-org", "a Hub reference is hf:ORG/REPO"),
    ("hf:org/repo:", "'' is not a quant name"),
    ("hf:org/repo:Q4 K", "'Q4 K' is not a quant name"),
    ("hf:org/repo:m.gguf", "for the file m.gguf write hf:org/repo/m.gguf"),
    ("hf:org/repo/", "'' is not a file path inside the repo"),
    ("hf:org/repo/a//m.gguf", "is not a file path inside the repo"),
    ("hf:org/repo/../m.gguf", "is not a file path inside the repo"),
    ("hf:org/repo/Q4_K_M", "'Q4_K_M' is not a .gguf file; for a quant write hf:org/repo:QUANT"),
    ("hf:org/repo/model.safetensors", "is not a .gguf file"),
    ("hf:org/repo@:Q4_0", "nothing follows '@'"),
    ("hf:org--x/repo", "is not a Hub repo id"),
    ("hf:org/.repo", "is not a Hub repo id"),
    ("hf:org/repo.git", "is not a Hub repo id"),
    ("hf:datasets/squad", "only model repos hold models"),
    ("hf.co/org", "a Hub reference is hf:ORG/REPO"),
    ("https://huggingface.co/org/repo/tree/main/sub", "a folder of a repo is not a model"),
    ("https://huggingface.co/spaces/org/demo", "only model repos hold models"),
    ("ollama:", "an Ollama reference is ollama:NAME"),
    ("ollama:llama3@sha256:abcd", "no digest"),
    ("ollama:a/b/c/d", "is not an Ollama name"),
    ("ollama:llama3:", "is not an Ollama name: its tag ''"),
    ("ollama:ns.with.dots/m", "is not an Ollama name: its namespace"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "why"), REFUSED, ids=[r[0] or "empty" for r in REFUSED])
def test_every_malformed_reference_is_refused_showing_the_accepted_forms(text, why):
    with pytest.raises(ConfigError, match=why) as info:
        parse_ref(text)
    assert "hf:ORG/REPO[:QUANT]" in str(info.value) and "ollama:NAME[:TAG]" in str(info.value)


def test_a_registry_name_wins_over_a_file_of_that_name_and_dot_slash_names_the_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "gemma-3-270m").write_bytes(b"GGUF")
    (tmp_path / "mine").write_bytes(b"GGUF")
    assert parse_ref("gemma-3-270m") == registry("gemma-3-270m")
    assert parse_ref("./gemma-3-270m") == path("gemma-3-270m")
    assert str(path("gemma-3-270m")) == "./gemma-3-270m"  # so the canonical form does not read back as the registry's
    assert parse_ref("mine") == path("mine")  # any other bare word is a file when one exists


def test_the_hub_host_is_the_hub_and_the_ollama_prefix_is_ollamas_copy():
    assert parse_ref("hf.co/ORG/REPO:Q4_K_M").kind == "hf"
    assert parse_ref("ollama:hf.co/ORG/REPO:Q4_K_M").kind == "ollama"


def test_a_reference_is_built_only_with_the_fields_of_its_kind():
    assert ModelRef("ollama", name="m").tag == "latest"
    assert registry("qwen-coder").is_pair and not registry("gemma-3-270m").is_pair
    for bad in (
        dict(kind="hf"),
        dict(kind="hf", repo="o/r", quant="Q4_0", file="m.gguf"),
        dict(kind="registry", name="gemma-3-270m", repo="o/r"),
        dict(kind="path"),
        dict(kind="url", name="x"),
    ):
        with pytest.raises(ConfigError):
            ModelRef(**bad)  # type: ignore[arg-type]


# --- the resolver -------------------------------------------------------------------------------


@pytest.fixture()
def cache(tmp_path, monkeypatch) -> Path:
    """A registry cache holding the derived gemma draft as a tiny GGUF with its sidecar (so it counts as present)."""
    directory = tmp_path / "cache"
    monkeypatch.setenv("EDGEKIT_CACHE_DIR", str(directory))
    draft = tiny_gguf(directory / "gemma-3-270m-q4_0.gguf")
    data = draft.read_bytes()
    write_sidecar(draft, {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()})
    return directory


@pytest.fixture()
def no_pulls(monkeypatch):
    def refuse(*_args, **_kwargs):
        raise AssertionError("resolve pulled a model")

    monkeypatch.setattr(pull, "pull_model", refuse)


def test_a_registry_model_in_the_cache_resolves_to_its_file_without_pulling(cache, no_pulls):
    resolved = resolve("gemma-3-270m-q4_0", download=False)
    assert resolved == ResolvedModel(cache / "gemma-3-270m-q4_0.gguf", "gemma-3-270m-q4_0",
                                     registry("gemma-3-270m-q4_0"), "registry")  # fmt: skip
    assert resolve("gemma-270m", role="draft", download=False).path == resolved.path


def test_a_pair_needs_a_role(cache, no_pulls):
    with pytest.raises(ConfigError, match="'gemma-270m' is a pair .*gemma-3-270m-q4_0 drafts for gemma-3-270m.*role="):
        resolve("gemma-270m")


def test_a_registry_model_not_in_the_cache_is_pulled_unless_download_is_false(cache, monkeypatch):
    with pytest.raises(ModelNotFoundError, match="run: edgekit models pull gemma-270m"):
        resolve("gemma-270m", role="target", download=False)

    pulled = []

    def fake_pull(spec, *, progress=None):
        pulled.append((spec.name, progress))
        return tiny_gguf(cache / spec.filename)

    monkeypatch.setattr(pull, "pull_model", fake_pull)
    progress = print
    resolved = resolve("gemma-270m", role="target", progress=progress)
    assert pulled == [("gemma-3-270m", progress)]
    assert (resolved.path, resolved.name) == (cache / "gemma-3-270m-q4_k_m.gguf", "gemma-3-270m")


def test_a_path_resolves_absolute_relative_home_and_pathlike(tmp_path, monkeypatch):
    model = tiny_gguf(tmp_path / "models" / "my-draft.gguf")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    for given in (str(model), "models/my-draft.gguf", "./models/my-draft.gguf", "~/models/my-draft.gguf", model):
        resolved = resolve(given)
        assert (resolved.path, resolved.name, resolved.source) == (model, "my-draft", "path")


def test_a_path_to_a_registry_models_file_is_named_as_the_registry_names_it(tmp_path, monkeypatch):
    """`edgekit serve --model ~/models/gemma-3-270m-q4_k_m.gguf` serves "gemma-3-270m", so a client
    finds the predictor shipped for the pair as with --pair (it found none by the file's stem); a
    packaged model's size must match too, a derived one's (no pinned size) only its file name."""
    from edgekit.models.registry import list_models

    packaged = next(m for m in list_models() if m.size is not None)
    derived = next(m for m in list_models() if m.size is None)
    same = tiny_gguf(tmp_path / "a" / packaged.filename)
    monkeypatch.setattr("edgekit.models.refs.list_models", lambda: (
        dataclasses.replace(packaged, size=same.stat().st_size), derived))
    assert resolve(str(same)).name == packaged.name
    assert resolve(str(tiny_gguf(tmp_path / "b" / derived.filename))).name == derived.name
    monkeypatch.setattr("edgekit.models.refs.list_models", lambda: (packaged, derived))  # its real, larger size
    assert resolve(str(same)).name == Path(packaged.filename).stem  # another file of that name


def test_a_path_that_is_not_a_gguf_file_is_refused_naming_what_was_tried(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tried = f"no file {tmp_path}/missing.gguf \\(from the model reference ./missing.gguf\\)"
    with pytest.raises(ModelNotFoundError, match=tried):
        resolve("missing.gguf")
    with pytest.raises(ModelNotFoundError, match="for a Hugging Face Hub repo write hf:Qwen/Qwen2.5-7B-Instruct"):
        resolve("Qwen/Qwen2.5-7B-Instruct-GGUF:Q4_K_M")

    tiny_gguf(tmp_path / "dir" / "a.gguf")
    with pytest.raises(ConfigError, match="is a directory, not a GGUF file: it holds a.gguf"):
        resolve("./dir")

    (tmp_path / "weights.bin.gguf").write_bytes(b"PK\x03\x04 a zip, say")
    with pytest.raises(ModelLoadError, match=r"is not a GGUF file \(it starts with b'PK\\x03\\x04'\)"):
        resolve("weights.bin.gguf")


def test_any_part_of_a_split_gguf_stands_for_its_first_and_a_missing_part_is_named(tmp_path):
    parts = [tiny_gguf(tmp_path / f"big-{n:05d}-of-00003.gguf") for n in (1, 2, 3)]
    for part in parts:
        resolved = resolve(str(part))
        assert (resolved.path, resolved.name) == (parts[0], "big")
    parts[2].unlink()
    with pytest.raises(ModelNotFoundError, match="part of a GGUF split into 3 files; missing: big-00003-of-00003.gguf"):
        resolve(str(parts[0]))


def test_an_ollama_reference_resolves_to_the_blob_in_ollamas_store(tmp_path, monkeypatch):
    store = tmp_path / "ollama"
    monkeypatch.setenv("OLLAMA_MODELS", str(store))
    gguf = tiny_gguf(tmp_path / "tiny.gguf")
    blob = add_ollama_model(store, gguf, "tiny")
    hub_blob = add_ollama_model(store, tiny_gguf(tmp_path / "other.gguf", name="other"), "REPO", "Q4_K_M",
                                namespace="ORG", host="hf.co")  # fmt: skip

    resolved = resolve("ollama:tiny")
    assert resolved == ResolvedModel(blob, "tiny:latest", ollama("tiny"), "ollama")
    assert resolve("ollama:hf.co/ORG/REPO:Q4_K_M").path == hub_blob
    with pytest.raises(ModelNotFoundError, match=f"Ollama model tiny:v9 is not in Ollama's store \\({store}\\)"):
        resolve("ollama:tiny:v9")

    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf at all")
    add_ollama_model(store, bad, "bad")
    with pytest.raises(ModelLoadError, match="from the model reference ollama:bad:latest.* is not a GGUF file"):
        resolve("ollama:bad")


@pytest.fixture()
def fake_hub(monkeypatch, tmp_path):
    """`edgekit.models.hub` replaced by a module whose hub_gguf records its calls and returns a tiny GGUF."""
    calls: list[tuple[str, dict[str, object]]] = []
    snapshot = tiny_gguf(tmp_path / "hub" / "snapshots" / "0123" / "repo-Q4_K_M.gguf")

    def hub_gguf(repo: str, **kwargs: object) -> Path:
        calls.append((repo, kwargs))
        return snapshot

    module = types.ModuleType("edgekit.models.hub")
    module.hub_gguf = hub_gguf  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "edgekit.models.hub", module)
    return calls, snapshot


def test_a_hub_reference_resolves_through_hub_gguf(fake_hub):
    calls, snapshot = fake_hub

    resolved = resolve("hf:org/repo:Q4_K_M")
    assert resolved == ResolvedModel(snapshot, "org/repo:Q4_K_M", hf("org/repo", quant="Q4_K_M"), "hf")
    pinned = resolve("https://huggingface.co/org/repo/blob/v2/sub/m.gguf", download=False)
    assert pinned.name == "org/repo@v2/sub/m.gguf"
    assert resolve("hf.co/org/repo").name == "org/repo/repo-Q4_K_M.gguf"  # the file the hub picked
    assert calls == [
        ("org/repo", dict(quant="Q4_K_M", file=None, revision=None, download=True)),
        ("org/repo", dict(quant=None, file="sub/m.gguf", revision="v2", download=False)),
        ("org/repo", dict(quant=None, file=None, revision=None, download=True)),
    ]
