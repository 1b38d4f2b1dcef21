"""Where pulled models live, and whether a usable copy is there.

Loading checks the size, not the sha256: hashing a 1 GB file on every start is too
slow on a device. A packaged model was checked in full before it was renamed into
place; a derived one's sidecar records the file's mtime when its sha256 was
measured, and a file that changed since (or was never stamped) is hashed before
it is used. ``verify`` does the full sha256 check on demand; pulling always does.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from edgekit.errors import ModelIntegrityError, ModelNotFoundError

from ._digest import sha256_file
from ._sidecar import read_sidecar, write_sidecar
from .registry import ModelSpec, _pair_containing, _resolve_model, base_of, get_pair

__all__ = ["cache_dir", "is_present", "model_path", "pair_paths", "verify"]


def cache_dir() -> Path:
    """``$EDGEKIT_CACHE_DIR``, else ``$XDG_CACHE_HOME/edgekit/models``, else ``~/.cache/edgekit/models``."""
    override = os.environ.get("EDGEKIT_CACHE_DIR")
    if override:
        return Path(override).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    # The XDG spec says to ignore a relative value.
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "edgekit" / "models"
    return Path.home() / ".cache" / "edgekit" / "models"


def model_path(model: str | ModelSpec) -> Path:
    """Path of the cached model file; ModelNotFoundError (naming the pull command) unless present."""
    spec = _resolve_model(model)
    path = _sized(spec)
    meta = read_sidecar(path) if spec.sha256 is None else None
    if meta is not None and meta.get("mtime_ns") != path.stat().st_mtime_ns:
        _check_changed(spec, path, meta)
    return path


def _sized(spec: ModelSpec) -> Path:
    """The cached file of `spec` if it has the expected size; ModelNotFoundError otherwise."""
    path = cache_dir() / spec.filename
    expected = _expected_size_sha(spec, path)
    if expected is None or not path.is_file():
        raise ModelNotFoundError(f"model '{spec.name}' is not in the cache ({cache_dir()}); run: {_pull_command(spec)}")
    size = path.stat().st_size
    if size != expected[0]:
        raise ModelNotFoundError(
            f"model '{spec.name}' in the cache is incomplete or damaged ({path}: {size} bytes, "
            f"expected {expected[0]}); run: {_pull_command(spec)}"
        )
    return path


def _check_changed(spec: ModelSpec, path: Path, meta: dict) -> None:
    """A derived file touched since its sidecar was written: used only if its sha256 still matches."""
    mtime = path.stat().st_mtime_ns
    actual = sha256_file(path)
    if actual != meta["sha256"]:
        raise ModelNotFoundError(
            f"model '{spec.name}' in the cache is damaged ({path} changed since it was made: sha256 {actual}, "
            f"expected {meta['sha256']}); run: {_pull_command(spec)}"
        )
    _restamp(path, meta, mtime)


def _restamp(path: Path, meta: dict, mtime: int) -> None:
    """Record that the file as it is now was hashed, so the next load need not hash it again."""
    if meta.get("mtime_ns") == mtime:
        return
    try:
        write_sidecar(path, {**meta, "mtime_ns": mtime})
    except OSError:  # a read-only cache: hashed again next time, no harm
        pass


def is_present(model: str | ModelSpec) -> bool:
    try:
        model_path(model)
    except ModelNotFoundError:
        return False
    return True


def pair_paths(pair_name: str) -> tuple[Path, Path]:
    """(draft, target) paths of a pulled pair."""
    pair = get_pair(pair_name)
    return model_path(pair.draft), model_path(pair.target)


def verify(model: str | ModelSpec, progress: Callable[[str, int, int], None] | None = None) -> Path:
    """Full size and sha256 check of a cached model; returns its path.

    ModelNotFoundError if it is absent, ModelIntegrityError if it does not match.
    ``progress`` gets ("verify <model>", bytes hashed, total bytes).
    """
    spec = _resolve_model(model)
    path = _sized(spec)  # hashed in full below, so model_path's check of a changed file would be twice the work
    mtime = path.stat().st_mtime_ns
    _check_derived_base(spec, path)
    pinned = _expected_size_sha(spec, path)
    if pinned is None:  # _sized found the sidecar a moment ago; it went since
        raise ModelNotFoundError(f"model '{spec.name}' lost its checksum sidecar; run: {_pull_command(spec)}")
    size, expected_sha = pinned
    label = f"verify {spec.name}"
    on_bytes = None if progress is None else (lambda done: progress(label, done, size))
    actual = sha256_file(path, on_bytes)
    if actual != expected_sha:
        raise ModelIntegrityError(
            f"model '{spec.name}' ({path}) has sha256 {actual}, expected {expected_sha}; "
            f"run: {_pull_command(spec)}"
        )
    meta = read_sidecar(path) if spec.sha256 is None else None
    if meta is not None:
        _restamp(path, meta, mtime)
    return path


def _expected_size_sha(spec: ModelSpec, path: Path) -> tuple[int, str] | None:
    """Pinned values for packaged models; the sidecar's for derived ones (None if it is missing)."""
    if spec.size is not None and spec.sha256 is not None:  # a packaged model (ModelSpec enforces both)
        return spec.size, spec.sha256
    meta = read_sidecar(path)
    return None if meta is None else (meta["size"], meta["sha256"])


def _check_derived_base(spec: ModelSpec, path: Path) -> None:
    """A derived file made from another base than the pinned one is stale, even if intact."""
    base = base_of(spec)
    if base is None or spec.derive is None:
        return
    meta = read_sidecar(path) or {}
    wanted = (base.sha256, spec.derive.ftype, spec.derive.token_embedding_type)
    recorded = (meta.get("base_sha256"), meta.get("ftype"), meta.get("token_embedding_type"))
    if base.sha256 is not None and recorded != wanted:
        raise ModelIntegrityError(
            f"model '{spec.name}' ({path}) was derived as {recorded}, expected {wanted}; "
            f"run: {_pull_command(spec)}"
        )


def _pull_command(spec: ModelSpec) -> str:
    # Pulling re-checks and repairs whatever is there, so the same command fits every case.
    pair = _pair_containing(spec.name)
    return f"edgekit models pull {pair.name if pair is not None else spec.name}"
