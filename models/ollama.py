"""Ollama's model store, read on disk: the GGUF file behind a name such as ``llama3.2:1b``,
``user/model`` or ``hf.co/ORG/REPO:Q4_K_M``, found without Ollama running and used in place.

The layout is Ollama's own (``manifest/``, ``types/model/name.go`` in its source): one JSON
manifest per model at ``manifests/<host>/<namespace>/<model>/<tag>``, in Docker's manifest v2
schema, whose layers are content-addressed files ``blobs/sha256-<hex>``. The layer of media type
``application/vnd.ollama.image.model`` is the GGUF llama.cpp loads; the config layer says its
family and quantization. A name's missing parts are host ``registry.ollama.ai``, namespace
``library`` and tag ``latest``, and names compare without regard to case, as Ollama's do.

The store is ``$OLLAMA_MODELS`` when set; else ``~/.ollama/models`` (``ollama serve`` run by the
user, and macOS and Windows) and, on Linux, ``/usr/share/ollama/.ollama/models``, where the
installer's system service (user ``ollama``, whose home that is) keeps what ``ollama pull`` fetches.
"""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from edgekit.errors import ConfigError, ModelError, ModelIntegrityError, ModelLoadError, ModelNotFoundError

from ._digest import sha256_file

__all__ = ["OllamaModel", "OllamaName", "list_ollama", "ollama_model", "ollama_stores", "parse_ollama_name"]

DEFAULT_HOST = "registry.ollama.ai"
DEFAULT_NAMESPACE = "library"
DEFAULT_TAG = "latest"
MODEL_MEDIA_TYPE = "application/vnd.ollama.image.model"
SERVICE_STORE = Path("/usr/share/ollama/.ollama/models")
_ACCESS_HINT = "; Ollama's Linux service keeps its store for the group ollama: sudo usermod -aG ollama $USER"

# Ollama's rules for each part of a name (isValidPart): a letter, digit or "_" first, then these.
_PART = {
    "host": re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:-]{0,349}"),
    "namespace": re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]{0,79}"),
    "model": re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,79}"),
    "tag": re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,79}"),
}
_DIGEST = re.compile(r"sha256[:-]([0-9a-fA-F]{64})")


@dataclass(frozen=True)
class OllamaName:
    """A fully qualified Ollama name; ``str()`` gives it as ``ollama list`` shows it."""

    host: str
    namespace: str
    model: str
    tag: str

    def __str__(self) -> str:
        if self.host.lower() != DEFAULT_HOST:
            return f"{self.host}/{self.namespace}/{self.model}:{self.tag}"
        if self.namespace.lower() != DEFAULT_NAMESPACE:
            return f"{self.namespace}/{self.model}:{self.tag}"
        return f"{self.model}:{self.tag}"

    def manifest_in(self, store: Path) -> Path:
        return store / "manifests" / self.host / self.namespace / self.model / self.tag

    def same_as(self, other: OllamaName) -> bool:
        return _casefold(self) == _casefold(other)


@dataclass(frozen=True)
class OllamaModel:
    """A model in Ollama's store: ``path`` is its GGUF blob, ``digest`` its ``sha256:<hex>``, ``name``
    the manifest's name as Ollama shows it; ``family`` and ``quant`` come from its config, when it has one."""

    name: str
    path: Path
    size: int
    digest: str
    manifest: Path
    family: str | None = None
    quant: str | None = None


def parse_ollama_name(text: str, tag: str | None = None) -> OllamaName:
    """``[host/][namespace/]model[:tag]`` as Ollama parses it (ParseName), defaults filled in;
    ``tag``, when given, is the tag (and ``text`` must not carry another). ConfigError if invalid."""
    body, written_tag = text, None
    # As Ollama does: a ":" after the last "/" starts the tag (a host may carry a port).
    if text.rfind(":") > text.rfind("/"):
        body, written_tag = text.rsplit(":", 1)
    if tag is not None and written_tag is not None and tag != written_tag:
        raise ConfigError(f"Ollama name {text!r} has the tag {written_tag!r} and was also given the tag {tag!r}")
    parts = body.split("/")
    if len(parts) > 3:
        raise ConfigError(f"{text!r} is not an Ollama name: it has more than [host/][namespace/]model before the tag")
    *prefix, model = parts
    host = prefix[-2] if len(prefix) == 2 else DEFAULT_HOST
    namespace = prefix[-1] if prefix else DEFAULT_NAMESPACE
    # An empty part that a separator promised stays empty, and invalid, as in Ollama (cutPromised).
    final_tag = tag if tag is not None else written_tag if written_tag is not None else DEFAULT_TAG
    name = OllamaName(host, namespace, model, final_tag)
    for kind, pattern in _PART.items():
        value = getattr(name, kind)
        if not pattern.fullmatch(value):
            raise ConfigError(
                f"{text!r} is not an Ollama name: its {kind} {value!r} must start with a letter, digit or '_' "
                f"and hold only letters, digits, '_', '-'{', .' if kind != 'namespace' else ''}"
                f"{' and :' if kind == 'host' else ''}"
            )
    return name


def ollama_stores() -> tuple[Path, ...]:
    """The stores looked in, in order: ``$OLLAMA_MODELS`` alone when set, else the defaults."""
    # Ollama's envconfig.Var trims spaces and quotes around the value.
    override = os.environ.get("OLLAMA_MODELS", "").strip().strip("\"'")
    if override:
        return (Path(override).expanduser(),)
    home = Path.home() / ".ollama" / "models"
    return (home, SERVICE_STORE) if sys.platform.startswith("linux") else (home,)


def ollama_model(
    name: str, tag: str | None = None, *, models_dir: Path | None = None, verify: bool = False
) -> OllamaModel:
    """The model ``name`` (tag ``tag``, else the one in ``name``, else latest) in Ollama's store.

    ``models_dir`` is the store to read (default: ``ollama_stores()``). ModelNotFoundError naming the
    stores searched and the models they hold if it is absent, or if its blob is missing;
    ModelIntegrityError if the blob's size, or with ``verify`` its sha256, is not the manifest's;
    ModelLoadError if the manifest is damaged or names no GGUF model layer.
    """
    wanted = parse_ollama_name(name, tag)
    stores = (models_dir,) if models_dir is not None else ollama_stores()
    for store in stores:
        found = _find_manifest(store, wanted)
        if found is not None:
            return _read_model(*found, store=store, verify=verify)
    raise ModelNotFoundError(_not_found(wanted, stores))


def list_ollama(models_dir: Path | None = None) -> list[OllamaModel]:
    """Every usable model in the store(s), by name; a model whose manifest is damaged, names no
    GGUF or whose blob is missing is left out (``ollama_model`` on its name says what is wrong)."""
    stores = (models_dir,) if models_dir is not None else ollama_stores()
    seen: dict[OllamaName, OllamaModel] = {}
    for store in stores:
        for name, manifest in _manifests(store):
            if _casefold(name) in seen:  # the first store wins, as in ollama_model
                continue
            try:
                seen[_casefold(name)] = _read_model(name, manifest, store=store, verify=False)
            except ModelError:
                continue
    return sorted(seen.values(), key=lambda m: m.name)


def _manifests(store: Path) -> list[tuple[OllamaName, Path]]:
    """(name, manifest file) of every manifest in the store, as Ollama globs them (four levels deep)."""
    try:
        files = sorted(p for p in (store / "manifests").glob("*/*/*/*") if p.is_file())
    except OSError:  # the store or part of it cannot be read
        return []
    found = []
    for path in files:
        host, namespace, model, tag = path.parts[-4:]
        try:
            found.append((parse_ollama_name(f"{host}/{namespace}/{model}", tag), path))
        except ConfigError:
            continue  # not a name Ollama would have written; Ollama skips it too
    return found


def _find_manifest(store: Path, wanted: OllamaName) -> tuple[OllamaName, Path] | None:
    exact = wanted.manifest_in(store)
    try:
        if exact.is_file():
            return wanted, exact
    except OSError:
        pass
    # Names compare without regard to case (Ollama's EqualFold); a case-sensitive disk keeps the case written.
    return next(((name, path) for name, path in _manifests(store) if name.same_as(wanted)), None)


def _read_model(name: OllamaName, manifest: Path, *, store: Path, verify: bool) -> OllamaModel:
    try:
        data = json.loads(manifest.read_bytes())
    except PermissionError as exc:
        raise ModelNotFoundError(f"cannot read Ollama's manifest {manifest}: {exc.strerror}{_ACCESS_HINT}") from exc
    except (OSError, ValueError) as exc:
        raise ModelLoadError(
            f"Ollama's manifest of {name} ({manifest}) is damaged ({exc}); run: ollama pull {name}"
        ) from exc
    layers = data.get("layers") if isinstance(data, dict) else None
    if not isinstance(layers, list):
        raise ModelLoadError(f"Ollama's manifest of {name} ({manifest}) has no list of layers; run: ollama pull {name}")
    model_layers = [x for x in layers if isinstance(x, dict) and x.get("mediaType") == MODEL_MEDIA_TYPE]
    if not model_layers:
        kinds = ", ".join(sorted({str(x.get("mediaType")) for x in layers if isinstance(x, dict)})) or "none"
        raise ModelLoadError(
            f"Ollama's {name} has no GGUF model layer ({MODEL_MEDIA_TYPE}) for llama.cpp to load; its layers: {kinds}"
        )
    layer = model_layers[0]
    digest = _DIGEST.fullmatch(str(layer.get("digest", "")))
    if digest is None:
        raise ModelLoadError(f"Ollama's manifest of {name} ({manifest}) names the model blob {layer.get('digest')!r}, "
                             "which is not a sha256 digest")
    hex_digest = digest.group(1).lower()
    blob = store / "blobs" / f"sha256-{hex_digest}"
    try:
        size = blob.stat().st_size
    except FileNotFoundError:
        raise ModelNotFoundError(
            f"Ollama's manifest of {name} ({manifest}) names the model blob {blob}, which is missing from the store; "
            f"run: ollama pull {name}"
        ) from None
    except PermissionError as exc:
        raise ModelNotFoundError(f"cannot read Ollama's blob {blob}: {exc.strerror}{_ACCESS_HINT}") from exc
    expected = layer.get("size")
    if isinstance(expected, int) and expected != size:
        raise ModelIntegrityError(
            f"Ollama's blob of {name} ({blob}) holds {size} bytes, its manifest says {expected}; "
            f"run: ollama pull {name}"
        )
    if verify:
        actual = sha256_file(blob)
        if actual != hex_digest:
            raise ModelIntegrityError(
                f"Ollama's blob of {name} ({blob}) has sha256 {actual}, expected {hex_digest}; run: ollama pull {name}"
            )
    family, quant = _config(store, data.get("config"))
    return OllamaModel(str(name), blob, size, f"sha256:{hex_digest}", manifest, family, quant)


def _config(store: Path, layer: object) -> tuple[str | None, str | None]:
    """(model_family, file_type) from the config blob; (None, None) when it is absent or unreadable:
    they describe the model, and the model loads without them."""
    digest = _DIGEST.fullmatch(str(layer.get("digest", ""))) if isinstance(layer, dict) else None
    if digest is None:
        return None, None
    try:
        config = json.loads((store / "blobs" / f"sha256-{digest.group(1).lower()}").read_bytes())
    except (OSError, ValueError):
        return None, None
    if not isinstance(config, dict):
        return None, None
    family, quant = config.get("model_family"), config.get("file_type")
    return (family if isinstance(family, str) and family else None, quant if isinstance(quant, str) and quant else None)


def _not_found(wanted: OllamaName, stores: tuple[Path, ...]) -> str:
    held = [m.name for store in stores for m in list_ollama(store)]
    have = f"the store holds: {', '.join(held)}" if held else "the store holds no models"
    where = " and ".join(str(s) for s in stores)
    unreadable = [s for s in stores if s.exists() and not os.access(s, os.R_OK | os.X_OK)]
    hint = f" ({', '.join(map(str, unreadable))} cannot be read{_ACCESS_HINT})" if unreadable else ""
    return (
        f"Ollama model {wanted} is not in Ollama's store ({where}){hint}; {have}. "
        f"Run: ollama pull {wanted}, or set OLLAMA_MODELS to the store it is in"
    )


def _casefold(name: OllamaName) -> OllamaName:
    return OllamaName(name.host.lower(), name.namespace.lower(), name.model.lower(), name.tag.lower())

