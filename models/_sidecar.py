"""The JSON kept beside a derived model: what was made, from what, and its checksum.

Derived files have no upstream checksum, so the one measured when the file was
made is the reference later checks compare against. The sidecar also keeps the
file's mtime at that moment (``mtime_ns``): loading trusts a file of the recorded
size and mtime, and hashes one that changed since (or whose sidecar predates the
field) before it is used.

A model file and its sidecar are written so that a crash or a power cut at any
point leaves either no sidecar (the model counts as absent) or a sidecar that
vouches for a complete file: the file goes to ``NAME.partial``, is fsync'd and
renamed, the directory is fsync'd, and only then is the sidecar written, the
same way.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any


def sidecar_path(model_file: Path) -> Path:
    return model_file.with_name(model_file.name + ".json")


def partial_path(path: Path) -> Path:
    """Where `path` is written before it is renamed into place: never listed, never loaded."""
    return path.with_name(path.name + ".partial")


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
    """Write atomically and durably, so a crash never leaves a sidecar that vouches for a half-written file."""
    path = sidecar_path(model_file)
    # A name of its own: loads that record a new mtime write sidecars without the pull's lock.
    tmp = path.with_name(f"{path.name}.{os.getpid()}-{threading.get_ident()}.partial")
    try:
        with open(tmp, "w") as f:
            f.write(json.dumps(data, indent=2, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def remove_sidecar(model_file: Path) -> None:
    sidecar_path(model_file).unlink(missing_ok=True)


def fsync_dir(directory: Path) -> None:
    """Make the renames in `directory` durable: until its entry is on disk a power cut can undo one."""
    if os.name != "posix":  # Windows cannot open a directory; NTFS journals the rename itself
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
