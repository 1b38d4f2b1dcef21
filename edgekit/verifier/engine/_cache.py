"""Where start-up measurements of an engine are kept between runs, and what they are keyed by.

A measurement holds for one model file, thread count, CPU, llama.cpp and edgekit: `machine_key`
names all but the first two. Files are JSON, written whole (a temporary file, then a rename);
one that cannot be read or written is measured again, never trusted half-written.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import tempfile
from pathlib import Path

from ...__version__ import __version__
from ...runtime import llama_build

__all__ = ["cpu_name", "default_calibration_dir", "load_cached", "machine_key", "store_cached"]

log = logging.getLogger("edgekit.verifier")


def default_calibration_dir() -> Path:
    """``$XDG_CACHE_HOME/edgekit/calibration``, else ``~/.cache/edgekit/calibration``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "edgekit" / "calibration"


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_key() -> dict[str, str]:
    return {"cpu": cpu_name(), **llama_build(), "edgekit": __version__}


def _path(directory: Path, kind: str, key: dict) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return directory / f"{kind}-{digest}.json"


def load_cached(directory: Path, kind: str, key: dict) -> object | None:
    """The value stored under this key, or None (absent, unreadable, or another key's)."""
    try:
        rec = json.loads(_path(directory, kind, key).read_text())
    except (OSError, ValueError):
        return None
    return rec.get("value") if isinstance(rec, dict) and rec.get("key") == key else None


def store_cached(directory: Path, kind: str, key: dict, value: object) -> None:
    """Stores the value; a directory that cannot take it (read-only, full) only costs a warning."""
    path = _path(directory, kind, key)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=path.stem, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump({"key": key, "value": value}, f)
        os.replace(tmp, path)
    except OSError as exc:
        log.warning("could not keep the %s measurement in %s (%s); it will be measured again", kind, directory, exc)
