"""huggingface_hub's errors as edgekit's, each saying what to do.

A repo or file the Hub does not have, and a copy that is not in the cache, are ModelNotFoundErrors;
everything that stops a download (access refused, no network, a cut or stalled transfer, a full
disk, a server error) is a ModelFetchError. huggingface_hub 2.x keeps no partial file after a
failed download, so "run again" starts it over cleanly.
"""

from __future__ import annotations

import errno
import os
import shutil

import httpx2
from huggingface_hub import constants
from huggingface_hub.errors import (
    DisabledRepoError,
    FileMetadataError,
    GatedRepoError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    OfflineModeIsEnabled,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from edgekit.errors import ModelError, ModelFetchError, ModelNotFoundError

__all__ = ["LOGIN_HINT", "disk_free", "hub_error", "no_space_error", "unreachable"]

LOGIN_HINT = "set HF_TOKEN to a token that can read it, or log in with `hf auth login` (`huggingface-cli login`)"
_AGAIN = "nothing half-written was kept; run it again"


def unreachable(exc: BaseException) -> bool:
    """The Hub could not be reached, or failed on its side: a copy in the cache may still serve."""
    status = _status(exc)
    return isinstance(exc, (httpx2.TransportError, OfflineModeIsEnabled)) or (
        status is not None and (status >= 500 or status == 429)
    )


def hub_error(exc: BaseException, *, repo: str, what: str, revision: str) -> ModelError:
    """The edgekit error for `exc`, raised fetching `what` (a file or a listing) of `repo`."""
    endpoint = constants.ENDPOINT
    status = _status(exc)
    if isinstance(exc, GatedRepoError):
        return ModelFetchError(
            f"{repo} is gated on {endpoint}: accept its conditions at {endpoint}/{repo} with your account, "
            f"then {LOGIN_HINT}"
        )
    if isinstance(exc, RepositoryNotFoundError):
        if _sent_token(exc):
            return ModelFetchError(
                f"{repo} is not on {endpoint}, or the token in use ({_token_source()}) cannot read it: "
                "check the repo's name and the token's access"
            )
        return ModelFetchError(
            f"{repo} is not on {endpoint}, or it is private and no token was sent: check the repo's name; "
            f"for a private repo, {LOGIN_HINT}"
        )
    if isinstance(exc, RevisionNotFoundError):
        return ModelNotFoundError(f"{repo} has no revision {revision!r} on {endpoint}")
    if isinstance(exc, RemoteEntryNotFoundError):
        return ModelNotFoundError(f"{repo} has no file {what} at revision {revision!r} on {endpoint}")
    if isinstance(exc, DisabledRepoError):
        return ModelFetchError(f"{repo} is disabled on {endpoint}: it cannot be downloaded")
    if status == 401:
        return ModelFetchError(
            f"{endpoint} refused the token in use ({_token_source()}): it is invalid or expired; {LOGIN_HINT}"
        )
    if status == 403:
        return ModelFetchError(
            f"{endpoint} refused access to {repo} (403 Forbidden): the token in use ({_token_source()}) lacks "
            f"the permission to read it; {LOGIN_HINT}"
        )
    if status is not None and (status >= 500 or status == 429):
        return ModelFetchError(f"{endpoint} answered {status} fetching {what} of {repo}: try again later; {_AGAIN}")
    if isinstance(exc, LocalEntryNotFoundError) and exc.__cause__ is not None:  # the Hub was out of reach
        return hub_error(exc.__cause__, repo=repo, what=what, revision=revision)
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return no_space_error(what, None)
    if isinstance(exc, (httpx2.ConnectError, httpx2.ConnectTimeout, OfflineModeIsEnabled, LocalEntryNotFoundError)):
        return ModelFetchError(
            f"cannot reach the Hub at {endpoint} ({exc}): check the network, a proxy or HF_ENDPOINT; "
            "once downloaded, a model loads without the network"
        )
    if isinstance(exc, httpx2.TimeoutException):
        return ModelFetchError(
            f"{endpoint} stopped answering while fetching {what} of {repo} ({type(exc).__name__}: the limits are "
            f"HF_HUB_ETAG_TIMEOUT={constants.HF_HUB_ETAG_TIMEOUT} s for metadata, HF_HUB_DOWNLOAD_TIMEOUT="
            f"{constants.HF_HUB_DOWNLOAD_TIMEOUT} s per read); {_AGAIN}"
        )
    if isinstance(exc, httpx2.TransportError) or (isinstance(exc, OSError) and "Consistency check" in str(exc)):
        return ModelFetchError(f"the download of {what} of {repo} from {endpoint} was cut short ({exc}); {_AGAIN}")
    if isinstance(exc, FileMetadataError):
        return ModelFetchError(f"{endpoint} does not answer as the Hugging Face Hub does ({exc}): check HF_ENDPOINT")
    if isinstance(exc, OSError):
        return ModelFetchError(f"could not store {what} of {repo} in {constants.HF_HUB_CACHE}: {exc}")
    return ModelFetchError(f"fetching {what} of {repo} from {endpoint} failed: {type(exc).__name__}: {exc}")


def no_space_error(what: str, needed: int | None) -> ModelFetchError:
    """Out of disk space in the Hugging Face cache, with how much is free there."""
    cache = constants.HF_HUB_CACHE
    try:
        free = f"{disk_free(cache) / 1e6:,.0f} MB free"
    except OSError:
        free = "free space unknown"
    need = f" ({needed / 1e6:,.0f} MB)" if needed is not None else ""
    return ModelFetchError(
        f"no room for {what}{need}: the Hugging Face cache {cache} has {free}; free some space there, or set "
        "HF_HUB_CACHE to a disk with room, and run it again (nothing half-written was kept)"
    )


def disk_free(path: str) -> int:
    """Free bytes on the disk that holds `path` (or would, for a folder not made yet)."""
    here = os.path.abspath(path)
    while not os.path.exists(here) and os.path.dirname(here) != here:
        here = os.path.dirname(here)
    return shutil.disk_usage(here).free


def _status(exc: BaseException) -> int | None:
    response = getattr(exc, "response", None) if isinstance(exc, HfHubHTTPError) else None
    return getattr(response, "status_code", None)


def _sent_token(exc: HfHubHTTPError) -> bool:
    request = getattr(exc.response, "request", None)
    return request is not None and "authorization" in request.headers


def _token_source() -> str:
    if os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN"):
        return "HF_TOKEN"
    return f"the stored login, {constants.HF_TOKEN_PATH}"
