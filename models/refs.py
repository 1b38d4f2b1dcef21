"""Model references: one way to name a model wherever edgekit takes one, and its resolution to a GGUF file.

The forms ``parse_ref`` accepts::

    gemma-3-270m, qwen-coder               a registry model or pair (``edgekit models list``)
    hf:ORG/REPO                            a GGUF repo on the Hugging Face Hub, its quant picked as llama.cpp's -hf does
    hf:ORG/REPO:QUANT                      ... that quant (Q4_K_M, q8_0, IQ2_XXS, UD-Q4_K_XL, ...)
    hf:ORG/REPO/DIR/FILE.gguf              one file of the repo (of a split GGUF, any part stands for the set)
    hf:ORG/REPO@REVISION:QUANT, ...        at a branch, tag or commit ("/" in it written %2F, as in hf:// URLs)
    hf.co/ORG/REPO[:QUANT], huggingface.co/ORG/REPO[:QUANT], https://huggingface.co/ORG/REPO/blob/REV/FILE.gguf
                                           the same, as Ollama, llama.cpp and a browser write them
    ollama:NAME[:TAG]                      a model in Ollama's store (NAME: llama3.2, user/model, hf.co/ORG/REPO)
    ./model.gguf, /abs/model.gguf, ~/m.gguf  a GGUF file

How the ambiguous cases are decided:

- A bare word that names a registry model or pair is that, even when a file of that name is in the
  working directory: write ``./NAME`` for the file. Any other bare word is a file if one exists.
- Text with a "/" and no ``hf:``/``ollama:`` prefix or Hub host is a path, ``Qwen/Qwen2.5-GGUF`` included;
  when there is no such file the error suggests ``hf:Qwen/Qwen2.5-GGUF``.
- ``hf.co/ORG/REPO:QUANT`` is the Hub (a folder named hf.co is ``./hf.co/...``); ``ollama:hf.co/ORG/REPO:QUANT``
  is Ollama's copy of it.
- The quant ``latest`` (Ollama's and llama.cpp's tag for "the default quant") means no quant.
- A bare ``NAME:TAG`` is refused, with the hint to write ``ollama:NAME:TAG``.

``resolve`` finds the file: the registry's cache (pulling unless ``download=False``), Ollama's store
read in place, the Hub through ``edgekit.models.hub``, or the path as given.
"""

from __future__ import annotations

import importlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import quote, unquote, urlsplit

from edgekit.errors import ConfigError, ModelLoadError, ModelNotFoundError
from edgekit.runtime import SPLIT_NAME, split_parts

from . import cache, pull
from ._gguf_pick import is_quant_name
from .ollama import DEFAULT_HOST, DEFAULT_NAMESPACE, ollama_model, parse_ollama_name
from .registry import get_model, get_pair, list_models, list_pairs

__all__ = ["ACCEPTED_FORMS", "ModelRef", "RefKind", "ResolvedModel", "parse_ref", "resolve", "resolve_for_use"]

RefKind = Literal["registry", "hf", "ollama", "path"]
Role = Literal["draft", "target"]

ACCEPTED_FORMS = (
    "a registry model or pair (gemma-3-270m, qwen-coder), hf:ORG/REPO[:QUANT], hf:ORG/REPO/FILE.gguf, "
    "hf.co/ORG/REPO[:QUANT], ollama:NAME[:TAG], or a path to a .gguf file"
)

_HUB_HOSTS = ("hf.co", "huggingface.co", "www.huggingface.co")


@dataclass(frozen=True)
class ModelRef:
    """A parsed model reference; ``str()`` gives it back in canonical form (``parse_ref`` reads that back equal).

    registry: ``name`` (a model or pair). hf: ``repo`` ("ORG/REPO") and at most one of ``quant`` and
    ``file`` (a .gguf path in the repo), ``revision`` optional. ollama: ``name`` (the model), ``tag``,
    and ``namespace`` and ``host`` when they are not Ollama's defaults (library, registry.ollama.ai).
    path: ``path``.
    """

    kind: RefKind
    name: str | None = None
    repo: str | None = None
    quant: str | None = None
    file: str | None = None
    revision: str | None = None
    tag: str | None = None
    namespace: str | None = None
    host: str | None = None
    path: Path | None = None

    def __post_init__(self) -> None:
        needs = {"registry": ("name",), "hf": ("repo",), "ollama": ("name", "tag"), "path": ("path",)}
        allowed = {
            "registry": {"name"}, "hf": {"repo", "quant", "file", "revision"},
            "ollama": {"name", "tag", "namespace", "host"}, "path": {"path"},
        }  # fmt: skip
        if self.kind not in needs:
            raise ConfigError(f"unknown model reference kind {self.kind!r}; kinds: {', '.join(needs)}")
        if self.kind == "ollama" and self.tag is None:
            object.__setattr__(self, "tag", "latest")
        given = {f for f in ("name", "repo", "quant", "file", "revision", "tag", "namespace", "host", "path")
                 if getattr(self, f) is not None}  # fmt: skip
        missing = [f for f in needs[self.kind] if f not in given]
        extra = sorted(given - allowed[self.kind])
        if missing or extra or (self.quant is not None and self.file is not None):
            raise ConfigError(
                f"a {self.kind} model reference takes {', '.join(sorted(allowed[self.kind]))} "
                f"(needing {', '.join(needs[self.kind])}; a quant or a file, not both); got {', '.join(sorted(given))}"
            )

    @property
    def ollama_name(self) -> str:
        """``[host/][namespace/]name`` as Ollama writes it (ollama references only)."""
        prefix = "/".join(p for p in (self.host, self.namespace) if p is not None)
        return f"{prefix}/{self.name}" if prefix else str(self.name)

    @property
    def is_pair(self) -> bool:
        return self.kind == "registry" and self.name in {p.name for p in list_pairs()}

    def __str__(self) -> str:
        if self.kind == "hf":
            at = f"@{quote(self.revision, safe='')}" if self.revision is not None else ""
            rest = f":{self.quant}" if self.quant is not None else f"/{self.file}" if self.file is not None else ""
            return f"hf:{self.repo}{at}{rest}"
        if self.kind == "ollama":
            return f"ollama:{self.ollama_name}:{self.tag}"
        if self.kind == "path":
            assert self.path is not None
            # "./" keeps a relative path from reading back as a registry name or a prefixed reference.
            relative = not self.path.is_absolute() and self.path.parts[:1] != ("..",)
            return f".{os.sep}{self.path}" if relative else str(self.path)
        return str(self.name)


@dataclass(frozen=True)
class ResolvedModel:
    """A reference resolved to the GGUF file to load (of a split GGUF, its first part) and a name to show."""

    path: Path
    name: str
    ref: ModelRef
    source: RefKind


def parse_ref(text: str) -> ModelRef:
    """The reference ``text`` names (see the module's docstring); ConfigError, showing the accepted
    forms, if it is malformed or names nothing. Only a bare word that is not a registry name is
    looked up on disk; whether other paths exist is ``resolve``'s question."""
    if not isinstance(text, str):
        raise ConfigError(f"a model reference is a string, not {type(text).__name__}; accepted: {ACCEPTED_FORMS}")
    text = text.strip()
    if not text:
        raise ConfigError(f"empty model reference; accepted: {ACCEPTED_FORMS}")
    lowered = text.lower()
    if lowered.startswith("hf://"):
        return _parse_hf(text[5:], text)
    if lowered.startswith("hf:"):
        return _parse_hf(text[3:], text)
    if lowered.startswith("ollama:"):
        return _parse_ollama(text[7:], text)
    hub_path = _hub_url_path(text)
    if hub_path is not None:
        return _parse_hub_url(hub_path, text)
    if text in _registry_names():
        return ModelRef("registry", name=text)
    if _looks_like_path(text) or Path(text).is_file():
        return ModelRef("path", path=Path(text).expanduser())
    hint = ""
    if ":" in text:
        hint = f" For a model in Ollama's store write ollama:{text}."
    models = ", ".join(m.name for m in list_models())
    pairs = ", ".join(p.name for p in list_pairs())
    raise ConfigError(
        f"{text!r} is not a model reference: no registry model or pair has that name (models: {models}; "
        f"pairs: {pairs}) and there is no file .{os.sep}{text}.{hint} Accepted: {ACCEPTED_FORMS}"
    )


def resolve(
    ref: str | os.PathLike[str] | ModelRef,
    *,
    download: bool = True,
    role: Role | None = None,
    progress: pull.Progress | None = None,
) -> ResolvedModel:
    """The GGUF file ``ref`` names, fetched when ``download`` allows and needed.

    A registry pair names two models: ``role`` picks its draft or its target. ``progress`` reports a
    registry pull as ``pull_model`` does (the Hub shows its own). ModelNotFoundError when the model is
    not there (and ``download`` is False, or the source cannot fetch: a path, Ollama's store);
    ModelLoadError when the file is not a GGUF.
    """
    if isinstance(ref, ModelRef):
        parsed = ref
    elif isinstance(ref, str):
        parsed = parse_ref(ref)
    else:
        parsed = ModelRef("path", path=Path(ref).expanduser())
    if parsed.kind == "registry":
        return _resolve_registry(parsed, download, role, progress)
    if parsed.kind == "ollama":
        model = ollama_model(parsed.ollama_name, parsed.tag)
        return ResolvedModel(_checked_gguf(model.path, str(parsed)), model.name, parsed, "ollama")
    if parsed.kind == "hf":
        # Imported here: the Hub client is needed only for Hub references.
        hub = importlib.import_module(".hub", __package__)
        path = Path(hub.hub_gguf(
            parsed.repo, quant=parsed.quant, file=parsed.file, revision=parsed.revision, download=download
        ))  # fmt: skip
        shown = str(parsed)[3:] if parsed.quant or parsed.file else f"{parsed.repo}/{path.name}"
        return ResolvedModel(_checked_gguf(path, str(parsed)), shown, parsed, "hf")
    assert parsed.path is not None
    path = _local_gguf(parsed.path, str(parsed))
    split = SPLIT_NAME.match(path.name)
    shown = _registry_name_of(path) or (split.group("stem") if split else path.stem)
    return ResolvedModel(path, shown, parsed, "path")


def _registry_name_of(path: Path) -> str | None:
    """The registry model a file is, by its file name and (for a packaged model) its size: what a
    verifier serving `--model ~/models/gemma-3-270m-q4_k_m.gguf` calls its target, so that the
    predictor shipped for the pair is found for it as for `--pair`."""
    for m in list_models():
        if path.name == m.filename:
            try:
                size = path.stat().st_size
            except OSError:
                return None
            return m.name if m.size is None or size == m.size else None
    return None


def resolve_for_use(ref: str | os.PathLike[str] | ModelRef, *, role: Role | None = None) -> ResolvedModel:
    """``resolve`` as a command or the SDK uses a model: a Hub model is fetched on first use (into
    the Hub's cache, as llama.cpp's -hf does); a registry model must have been pulled (its error
    names the ``edgekit models pull`` command: its weights are assembled from packages, and big)."""
    parsed: ModelRef | None = None
    if isinstance(ref, ModelRef):
        parsed = ref
    elif isinstance(ref, str):
        parsed = parse_ref(ref)
    return resolve(parsed or ref, download=parsed is not None and parsed.kind == "hf", role=role)


def _registry_names() -> set[str]:
    return {m.name for m in list_models()} | {p.name for p in list_pairs()}


def _parse_hf(body: str, text: str) -> ModelRef:
    """``ORG/REPO[@REV][:QUANT | /PATH.gguf]``, after the ``hf:`` prefix."""
    match = re.fullmatch(r"(?P<repo>[^/@:]+/[^/@:]+)(?:@(?P<rev>[^/:]*))?(?::(?P<quant>.*)|/(?P<file>.*))?", body)
    if match is None:
        raise _malformed(text, "a Hub reference is hf:ORG/REPO, hf:ORG/REPO:QUANT or hf:ORG/REPO/FILE.gguf")
    repo, rev, quant, file = match.group("repo", "rev", "quant", "file")
    if repo.split("/")[0] in ("datasets", "spaces"):
        raise _malformed(text, "only model repos hold models; this names a dataset or a Space")
    try:
        from huggingface_hub.utils import validate_repo_id  # the Hub client's own rule for a repo id

        validate_repo_id(repo)
    except ValueError as exc:  # HFValidationError is one
        raise _malformed(text, f"{repo!r} is not a Hub repo id ({exc})") from None
    if rev is not None:
        rev = unquote(rev)
        if not rev:
            raise _malformed(text, "nothing follows '@' where a revision (branch, tag or commit) belongs")
    if quant is not None:
        if quant.lower().endswith(".gguf"):
            raise _malformed(text, f"for the file {quant} write hf:{repo}/{quant}")
        if not is_quant_name(quant):
            raise _malformed(text, f"{quant!r} is not a quant name such as Q4_K_M or UD-Q4_K_XL")
        quant = None if quant.lower() == "latest" else quant
    if file is not None:
        segments = file.split("/")
        if any(s in ("", ".", "..") for s in segments) or "\\" in file:
            raise _malformed(text, f"{file!r} is not a file path inside the repo")
        if not file.lower().endswith(".gguf"):
            raise _malformed(text, f"{file!r} is not a .gguf file; for a quant write hf:{repo}:QUANT")
    return ModelRef("hf", repo=repo, quant=quant, file=file, revision=rev)


def _hub_url_path(text: str) -> str | None:
    """The path after the Hub's host in ``[https://][www.]huggingface.co/...`` or ``hf.co/...``; None otherwise."""
    url = text if "://" in text else f"https://{text}"
    try:
        parts = urlsplit(url)
    except ValueError:
        return None
    if (parts.hostname or "") not in _HUB_HOSTS or (parts.scheme not in ("http", "https")):
        return None
    if "://" not in text and not text.lower().startswith(tuple(f"{h}/" for h in _HUB_HOSTS)):
        return None
    return parts.path.strip("/")


def _parse_hub_url(path: str, text: str) -> ModelRef:
    """A Hub page or download URL, or Ollama's hf.co name, rewritten to the hf: form and parsed as that."""
    segments = path.split("/")
    if len(segments) >= 4 and segments[2] in ("blob", "resolve"):
        path = f"{segments[0]}/{segments[1]}@{segments[3]}/{'/'.join(segments[4:])}"
    elif len(segments) >= 3 and segments[2] == "tree":
        if len(segments) != 4:
            raise _malformed(text, "a folder of a repo is not a model: name its .gguf file, or the repo")
        path = f"{segments[0]}/{segments[1]}@{segments[3]}"
    return _parse_hf(path, text)


def _parse_ollama(body: str, text: str) -> ModelRef:
    if not body or "@" in body:
        raise _malformed(text, "an Ollama reference is ollama:NAME or ollama:NAME:TAG (no digest)")
    try:
        name = parse_ollama_name(body)
    except ConfigError as exc:
        raise _malformed(text, str(exc)) from None
    # Kept as written, less Ollama's defaults, so that str() gives the short name Ollama shows.
    written = body.rsplit(":", 1)[0] if body.rfind(":") > body.rfind("/") else body
    parts = written.split("/")
    host = parts[-3] if len(parts) == 3 and parts[-3].lower() != DEFAULT_HOST else None
    namespace = parts[-2] if len(parts) >= 2 else None
    if host is None and namespace is not None and namespace.lower() == DEFAULT_NAMESPACE:
        namespace = None
    return ModelRef("ollama", name=name.model, tag=name.tag, namespace=namespace, host=host)


def _looks_like_path(text: str) -> bool:
    separators = {"/", os.sep, os.altsep or "/"}
    return (
        any(s in text for s in separators)
        or text.startswith(("~", "."))
        or text.lower().endswith(".gguf")
        or re.match(r"[A-Za-z]:[\\/]", text) is not None  # a Windows drive
    )


def _malformed(text: str, why: str) -> ConfigError:
    return ConfigError(f"bad model reference {text!r}: {why}. Accepted: {ACCEPTED_FORMS}")


def _resolve_registry(
    ref: ModelRef, download: bool, role: Role | None, progress: pull.Progress | None
) -> ResolvedModel:
    name = str(ref.name)
    if ref.is_pair:
        pair = get_pair(name)
        if role is None:
            raise ConfigError(
                f"{name!r} is a pair ({pair.draft} drafts for {pair.target}): name one of its models, "
                "or say which one is meant (role='draft' or role='target')"
            )
        name = pair.draft if role == "draft" else pair.target
    spec = get_model(name)
    try:
        path = cache.model_path(spec)
    except ModelNotFoundError:
        if not download:
            raise
        path = pull.pull_model(spec, progress=progress)
    return ResolvedModel(path, spec.name, ref, "registry")


def _local_gguf(given: Path, text: str) -> Path:
    """The absolute path of a GGUF file named by the user: of a split GGUF its first part, every part checked."""
    path = given.expanduser().absolute()
    if not path.exists():
        hint = ""
        if re.fullmatch(r"[^/\\:]+/[^/\\:]+(:[^/\\:]+)?", str(given)) and not str(given).lower().endswith(".gguf"):
            hint = f"; for a Hugging Face Hub repo write hf:{given}"
        raise ModelNotFoundError(f"no file {path} (from the model reference {text}){hint}")
    if path.is_dir():
        ggufs = sorted(p.name for p in path.glob("*.gguf"))[:5]
        inside = f": it holds {', '.join(ggufs)}" if ggufs else ", and it holds no .gguf file"
        raise ConfigError(f"{path} is a directory, not a GGUF file{inside}; name the file")
    parts = split_parts(path)
    missing = [p.name for p in parts if not p.is_file()]
    if missing:
        raise ModelNotFoundError(f"{path.name} is part of a GGUF split into {len(parts)} files; missing: "
                                 f"{', '.join(missing)} (in {path.parent})")  # fmt: skip
    path = parts[0]
    return _checked_gguf(path, text)


def _checked_gguf(path: Path, text: str) -> Path:
    """``path`` if it starts as every GGUF file does; ModelLoadError otherwise."""
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as exc:
        raise ModelNotFoundError(f"cannot read {path} (from the model reference {text}): {exc.strerror}") from exc
    if magic != b"GGUF":
        raise ModelLoadError(f"{path} (from the model reference {text}) is not a GGUF file (it starts with {magic!r})")
    return path
