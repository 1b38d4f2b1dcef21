"""Model files for tests: tiny GGUFs written with the `gguf` package, and Ollama's store laid out
on disk as Ollama leaves it after `ollama pull` (manifest and content-addressed blobs)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

MODEL_MEDIA_TYPE = "application/vnd.ollama.image.model"


def tiny_gguf(path: Path, *, name: str = "tiny", arch: str = "llama") -> Path:
    """A valid GGUF of a few hundred bytes (metadata and one tensor): what a resolver checks, not a model to run."""
    import gguf

    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(name)
    writer.add_tensor("t", np.arange(4, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def add_ollama_model(
    store: Path,
    gguf: Path,
    model: str,
    tag: str = "latest",
    *,
    namespace: str = "library",
    host: str = "registry.ollama.ai",
    family: str = "llama",
    quant: str = "Q4_0",
    sha256: str | None = None,
    link: bool = False,
) -> Path:
    """Put `gguf` into the store under host/namespace/model:tag with a config, template and params
    layer beside it, as `ollama pull` writes them (Go's json.Encoder: compact, one line); return the blob.

    `link` hard-links the blob to `gguf` (a symlink across filesystems) instead of copying it;
    `sha256` spares hashing a large file whose digest is known."""
    blobs = store / "blobs"
    blobs.mkdir(parents=True, exist_ok=True)
    digest = sha256 or hashlib.sha256(gguf.read_bytes()).hexdigest()
    blob = blobs / f"sha256-{digest}"
    if not blob.exists():
        if link:
            try:
                os.link(gguf, blob)
            except OSError:
                blob.symlink_to(gguf.resolve())
        else:
            blob.write_bytes(gguf.read_bytes())
    config = {
        "model_format": "gguf", "model_family": family, "model_families": [family], "model_type": "270M",
        "file_type": quant, "architecture": "amd64", "os": "linux",
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{digest}"]},
    }  # fmt: skip
    layers = [{"mediaType": MODEL_MEDIA_TYPE, "digest": f"sha256:{digest}", "size": blob.stat().st_size}]
    for media_type, content in (
        ("application/vnd.ollama.image.template", b"{{ .Prompt }}"),
        ("application/vnd.ollama.image.params", b'{"stop":["<end_of_turn>"]}'),
    ):
        layers.append(_small_blob(blobs, media_type, content))
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": _small_blob(blobs, "application/vnd.docker.container.image.v1+json", _compact(config)),
        "layers": layers,
    }
    path = store / "manifests" / host / namespace / model / tag
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(_compact(manifest) + b"\n")
    return blob


def _small_blob(blobs: Path, media_type: str, content: bytes) -> dict[str, object]:
    digest = hashlib.sha256(content).hexdigest()
    (blobs / f"sha256-{digest}").write_bytes(content)
    return {"mediaType": media_type, "digest": f"sha256:{digest}", "size": len(content)}


def _compact(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()
