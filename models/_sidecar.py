"""The JSON kept beside a derived model: what was made, from what, and its checksum.

Derived files have no upstream checksum, so the one measured when the file was
made is the reference later checks compare against.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def sidecar_path(model_file: Path) -> Path:
    return model_file.with_name(model_file.name + ".json")


def read_sidecar(model_file: Path) -> dict[str, Any] | None:
    """The sidecar's content, or None if it is missing or unreadable (the model then counts as absent)."""
    try:
        data = json.loads(sidecar_path(model_file).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("size"), int) or not isinstance(data.get("sha256"), str):
        return None
    return data


def write_sidecar(model_file: Path, data: dict[str, Any]) -> None:
    """Write atomically so a crash never leaves a sidecar that vouches for a half-written file."""
    path = sidecar_path(model_file)
    tmp = path.with_name(path.name + ".partial")
    try:
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def remove_sidecar(model_file: Path) -> None:
    sidecar_path(model_file).unlink(missing_ok=True)
