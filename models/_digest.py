"""Streaming sha256 of files too large to read at once."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path

BLOCK = 1 << 20


def sha256_file(path: Path, on_bytes: Callable[[int], None] | None = None, *, sync: bool = False) -> str:
    """Hex sha256 of ``path``; ``on_bytes`` receives the running byte count. ``sync`` fsyncs the
    file too: one just written, whose bytes must be on disk before anything vouches for them."""
    digest = hashlib.sha256()
    done = 0
    with open(path, "rb") as f:
        while block := f.read(BLOCK):
            digest.update(block)
            done += len(block)
            if on_bytes is not None:
                on_bytes(done)
        if sync:
            os.fsync(f.fileno())
    return digest.hexdigest()
