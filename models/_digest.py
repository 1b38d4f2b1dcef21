"""Streaming sha256 of files too large to read at once."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

BLOCK = 1 << 20


def sha256_file(path: Path, on_bytes: Callable[[int], None] | None = None) -> str:
    """Hex sha256 of ``path``; ``on_bytes`` receives the running byte count."""
    digest = hashlib.sha256()
    done = 0
    with open(path, "rb") as f:
        while block := f.read(BLOCK):
            digest.update(block)
            done += len(block)
            if on_bytes is not None:
                on_bytes(done)
    return digest.hexdigest()
