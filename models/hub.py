"""GGUF models from the Hugging Face Hub, through huggingface_hub and its cache.

``hub_gguf(repo, quant=...)`` picks the repo's GGUF by llama.cpp's rules (``_gguf_pick``), downloads
it, and every other part of a split GGUF, into huggingface_hub's cache (shared with every tool on
the machine), and checks each file it downloaded against the Hub's own hash: the sha256 of an LFS
file (the git blob id of a file kept in git) from the repo's file metadata. A file that does not
match is removed from the cache and refused with both hashes.

What huggingface_hub honours applies: ``HF_ENDPOINT``, ``HF_HOME``/``HF_HUB_CACHE``,
``HF_HUB_OFFLINE``, ``HF_TOKEN`` or the stored login (``hf auth login``), its progress bars
(``HF_HUB_DISABLE_PROGRESS_BARS``) and its deadlines: ``HF_HUB_ETAG_TIMEOUT`` for the listing and
each file's metadata, ``HF_HUB_DOWNLOAD_TIMEOUT`` for each read of a download. A transfer cut
short is resumed within the call (huggingface_hub asks for the rest with a Range request while
bytes keep coming); a download that fails leaves no partial file (huggingface_hub 2.x writes to a
temporary file of its own and removes it), so running again starts over cleanly.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import HfApi, constants, hf_hub_download, scan_cache_dir, try_to_load_from_cache
from huggingface_hub.errors import CacheNotFound, LocalEntryNotFoundError
from huggingface_hub.hf_api import ModelInfo, RepoSibling

from edgekit.errors import ConfigError, ModelIntegrityError, ModelNotFoundError

from ._digest import BLOCK, sha256_file
from ._gguf_pick import is_model_gguf, is_quant_name, pick_gguf, split_info
from ._hub_errors import disk_free, hub_error, no_space_error, unreachable

__all__ = ["HubGGUF", "hub_gguf", "hub_reference", "list_hub_cache"]

log = logging.getLogger("edgekit.models")

_SPACE_MARGIN = 32 << 20  # the cache's own files and the filesystem's overhead


@dataclass(frozen=True)
class HubGGUF:
    """A GGUF model in the local Hugging Face cache.

    `file` is its path in the repo and `path` where it lies (for a split GGUF: its first part, the
    one to load); `size` counts every part there; `complete` is False when a part is missing.
    """

    repo: str
    file: str
    size: int
    path: Path
    quant: str
    commit: str
    refs: tuple[str, ...]
    parts: int = 1
    complete: bool = True


def hub_gguf(repo: str, *, quant: str | None = None, file: str | None = None, revision: str | None = None,
             download: bool = True) -> Path:
    """The local path of a GGUF from the Hub repo `repo` ("ORG/NAME"), downloaded if need be.

    `file` names the file (its path in the repo); `quant` (Q4_K_M, q8_0, IQ4_XS, F16...) the repo's
    GGUF of that quant; with neither, the one llama.cpp's ``-hf ORG/REPO`` picks (Q4_K_M, else Q8_0,
    else the first). A split GGUF's parts all land next to each other; the first part's path is
    returned. `download=False` uses the cache only (ModelNotFoundError, naming the command that
    fetches it, when the file is not there), as does ``HF_HUB_OFFLINE=1``; so does a Hub that
    cannot be reached, when the cache has the file.
    """
    _check_arguments(repo, quant, file)
    rev = revision or constants.DEFAULT_REVISION
    ref = hub_reference(repo, quant=quant, file=file)
    if not download:
        return _from_cache(repo, quant, file, rev, f"not downloaded: run `edgekit models pull {ref}`")
    if constants.is_offline_mode():
        return _from_cache(repo, quant, file, rev, f"HF_HUB_OFFLINE is set: unset it to download {ref}")
    api = HfApi()
    try:
        info = _listing(api, repo, rev)
    except Exception as exc:
        edgekit_error = hub_error(exc, repo=repo, what="the file list", revision=rev)
        if not unreachable(exc):
            raise edgekit_error from exc
        try:
            path = _from_cache(repo, quant, file, rev, "")
        except ModelNotFoundError:
            raise edgekit_error from exc
        log.warning("%s; using the copy in the cache: %s", edgekit_error, path)
        return path
    return _download(api, info, quant, file, rev)


def hub_reference(repo: str, *, quant: str | None = None, file: str | None = None) -> str:
    """The reference edgekit's commands take for this model: ``hf:ORG/REPO:QUANT``, ``hf:ORG/REPO/FILE``."""
    if file is not None:
        return f"hf:{repo}/{file}"
    return f"hf:{repo}:{quant}" if quant is not None else f"hf:{repo}"


def list_hub_cache() -> list[HubGGUF]:
    """Every GGUF model in the local Hugging Face cache (``HF_HUB_CACHE``), one entry per model and
    revision (the parts of a split GGUF are one entry), by repo and file."""
    try:
        cache = scan_cache_dir(constants.HF_HUB_CACHE)
    except CacheNotFound:
        return []
    found: list[HubGGUF] = []
    for repo in cache.repos:
        if repo.repo_type != "model":
            continue
        for revision in repo.revisions:
            files = {_repo_path(f.file_path, revision.snapshot_path): f for f in revision.files}
            for name in sorted(files):
                info = split_info(name)
                if info is None or not is_model_gguf(name) or info.index != 1:
                    continue
                parts = [p for p in files if (s := split_info(p)) and (s.prefix, s.count) == (info.prefix, info.count)]
                found.append(HubGGUF(
                    repo=repo.repo_id, file=name, size=sum(files[p].size_on_disk for p in parts),
                    path=files[name].file_path, quant=info.tag, commit=revision.commit_hash,
                    refs=tuple(sorted(revision.refs)), parts=info.count, complete=len(parts) == info.count,
                ))
    return sorted(found, key=lambda g: (g.repo, g.file, g.commit))


# -- online ---------------------------------------------------------------------------------------


def _listing(api: HfApi, repo: str, rev: str) -> ModelInfo:
    """The repo's files at `rev` with their sizes and hashes, and the commit they are at."""
    return api.model_info(repo, revision=rev, files_metadata=True, timeout=constants.HF_HUB_ETAG_TIMEOUT)


def _download(api: HfApi, info: ModelInfo, quant: str | None, file: str | None, rev: str) -> Path:
    repo = info.id  # the Hub's spelling of the name, which names its folder in the cache
    listings = {info.sha: {s.rfilename: s for s in info.siblings or []}}
    parts = pick_gguf(list(listings[info.sha]), quant=quant, file=file, where=f"{repo} on {constants.ENDPOINT}")
    fresh = [p for p in parts if not isinstance(try_to_load_from_cache(repo, p, constants.HF_HUB_CACHE, info.sha), str)]
    _check_space(fresh, listings[info.sha])
    paths = []
    for part in parts:
        try:
            path = Path(hf_hub_download(repo, part, revision=rev, cache_dir=constants.HF_HUB_CACHE))
        except Exception as exc:
            raise hub_error(exc, repo=repo, what=part, revision=rev) from exc
        if part in fresh:  # checked at once: a later part that fails leaves no unchecked part behind
            _verify(repo, part, path, _listing_at(api, repo, _commit_of(path, part), listings).get(part))
        paths.append(path)
    return paths[0]


def _listing_at(api: HfApi, repo: str, commit: str, listings: dict[str | None, dict[str, RepoSibling]]
                ) -> dict[str, RepoSibling]:
    """The files of `repo` at `commit`, listed once. The listing and a download are two looks at the
    branch: should it move in between, a file is checked against the listing of its own commit."""
    if commit not in listings:
        try:
            listings[commit] = {s.rfilename: s for s in _listing(api, repo, commit).siblings or []}
        except Exception as exc:
            raise hub_error(exc, repo=repo, what="the file list", revision=commit) from exc
    return listings[commit]


def _check_space(fresh: Sequence[str], siblings: dict[str, RepoSibling]) -> None:
    """Refuse a download bound to run out of space before it starts."""
    sizes = [_size(siblings[p]) for p in fresh]
    if not fresh or None in sizes:
        return
    needed = sum(s for s in sizes if s is not None) + _SPACE_MARGIN
    if disk_free(constants.HF_HUB_CACHE) < needed:
        raise no_space_error(", ".join(fresh), needed)


def _size(sibling: RepoSibling) -> int | None:
    return sibling.lfs.size if sibling.lfs is not None else sibling.size


def _verify(repo: str, part: str, path: Path, sibling: RepoSibling | None) -> None:
    """Check a downloaded file against the Hub's hash of it; a file that differs leaves the cache."""
    if sibling is not None and sibling.lfs is not None:
        kind, expected, actual = "sha256", sibling.lfs.sha256, sha256_file(path)
    elif sibling is not None and sibling.blob_id is not None:
        kind, expected, actual = "git blob id", sibling.blob_id, _git_blob_id(path)
    else:
        log.warning("%s lists no hash of %s: it was not checked", constants.ENDPOINT, part)
        return
    if actual != expected:
        _remove_from_cache(path)
        raise ModelIntegrityError(
            f"{part} of {repo}, downloaded from {constants.ENDPOINT}, has {kind} {actual}, but the Hub lists "
            f"{expected}: it was removed from the cache. Run it again; if it recurs, what serves "
            "HF_ENDPOINT (a mirror, a proxy) hands out other bytes than the Hub lists"
        )


def _git_blob_id(path: Path) -> str:
    """git's hash of a file it keeps itself: sha1 of "blob <size>\\0" and the bytes."""
    digest = hashlib.sha1(b"blob %d\0" % path.stat().st_size)
    with open(path, "rb") as f:
        while block := f.read(BLOCK):
            digest.update(block)
    return digest.hexdigest()


def _remove_from_cache(path: Path) -> None:
    """Remove a snapshot's file and the blob it links to."""
    blob = path.resolve()
    path.unlink(missing_ok=True)
    blob.unlink(missing_ok=True)


def _commit_of(path: Path, part: str) -> str:
    """The commit of a file in the cache: its snapshot folder (``snapshots/<commit>/<part>``)."""
    return path.parts[-len(part.split("/")) - 1]


# -- the cache ------------------------------------------------------------------------------------


def _from_cache(repo: str, quant: str | None, file: str | None, rev: str, hint: str) -> Path:
    """The GGUF as the cache holds it, picked from the files cached at `rev`; `hint` ends the
    ModelNotFoundError that says it is not there."""
    ref = hub_reference(repo, quant=quant, file=file)
    cached = _cached_files(repo, rev)
    if cached is None:
        raise ModelNotFoundError(f"{ref} is not in the Hugging Face cache ({constants.HF_HUB_CACHE}); {hint}")
    repo, files = cached
    where = f"the cached copy of {repo} (revision {rev!r}, in {constants.HF_HUB_CACHE})"
    parts = pick_gguf(files, quant=quant, file=file, where=where)
    paths = []
    for part in parts:
        try:
            paths.append(Path(hf_hub_download(repo, part, revision=rev, cache_dir=constants.HF_HUB_CACHE,
                                              local_files_only=True)))
        except LocalEntryNotFoundError as exc:
            raise ModelNotFoundError(f"{part} of {ref} is not in {where}; {hint}") from exc
    return paths[0]


def _cached_files(repo: str, rev: str) -> tuple[str, list[str]] | None:
    """The repo's name as cached and the paths of its files cached at `rev` (a branch, tag or
    commit), sorted; None if there are none. Names are matched in any case, as the Hub does (the
    cache keeps the Hub's spelling). The Hub lists a repo's files in its own order; the cache has none."""
    try:
        cache = scan_cache_dir(constants.HF_HUB_CACHE)
    except CacheNotFound:
        return None
    for cached in cache.repos:
        if cached.repo_type == "model" and cached.repo_id.lower() == repo.lower():
            for revision in cached.revisions:
                if rev == revision.commit_hash or rev in revision.refs:
                    files = sorted(_repo_path(f.file_path, revision.snapshot_path) for f in revision.files)
                    return cached.repo_id, files
    return None


def _repo_path(path: Path, snapshot: Path) -> str:
    return path.relative_to(snapshot).as_posix()


def _check_arguments(repo: str, quant: str | None, file: str | None) -> None:
    names = repo.split("/")
    if len(names) != 2 or not all(names):
        raise ConfigError(f"a Hugging Face repo is named ORG/NAME (bartowski/Qwen2.5-7B-Instruct-GGUF), not {repo!r}")
    if quant is not None and file is not None:
        raise ConfigError(f"name a quant or a file of {repo}, not both ({quant!r}, {file!r})")
    if quant is not None and not is_quant_name(quant):
        raise ConfigError(f"{quant!r} is not a quant name (Q4_K_M, Q8_0, IQ4_XS, UD-Q4_K_XL...)")
    if file is not None and not file.endswith(".gguf"):
        raise ConfigError(f"{file!r} is not a GGUF file (its name ends in .gguf)")
