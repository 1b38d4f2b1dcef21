"""Errors on the wire: the edgekit error a verifier raises becomes a gRPC status
(`status_of`), and a status becomes the edgekit error a client raises
(`error_from_status`). Both ends use this one table, so a refusal reads the same
through gRPC and through an in-process transport.

A stale round carries the session's committed length in the trailing metadata
key `edgekit-committed-length`, so the client can resynchronise.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import grpc

from ..errors import (
    AuthenticationError,
    ConfigError,
    EdgekitError,
    HiddenStateError,
    IncompatibleModelsError,
    KVCacheFullError,
    LimitExceededError,
    ProtocolError,
    SessionNotFoundError,
    StaleRoundError,
    VerifierError,
    VerifierUnavailableError,
)

__all__ = ["COMMITTED_LENGTH_KEY", "RETRY_AFTER_MS_KEY", "Status", "error_from_status", "status_of"]

COMMITTED_LENGTH_KEY = "edgekit-committed-length"
RETRY_AFTER_MS_KEY = "edgekit-retry-after-ms"  # how long a refused client should back off

# Most specific first: the first class an error is an instance of gives its status.
_STATUS_OF = (
    (SessionNotFoundError, grpc.StatusCode.NOT_FOUND),
    (StaleRoundError, grpc.StatusCode.ABORTED),
    (AuthenticationError, grpc.StatusCode.UNAUTHENTICATED),
    (VerifierUnavailableError, grpc.StatusCode.UNAVAILABLE),
    (LimitExceededError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (KVCacheFullError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (IncompatibleModelsError, grpc.StatusCode.FAILED_PRECONDITION),
    (ProtocolError, grpc.StatusCode.INVALID_ARGUMENT),
    (HiddenStateError, grpc.StatusCode.INVALID_ARGUMENT),
    (ConfigError, grpc.StatusCode.INVALID_ARGUMENT),
)


@dataclass(frozen=True)
class Status:
    code: grpc.StatusCode
    message: str
    trailers: tuple[tuple[str, str], ...] = ()


def status_of(exc: EdgekitError) -> Status:
    """The status a verifier answers with for `exc`: the error's own `code` if it
    names one, else its class's; INTERNAL for anything else (a verifier bug)."""
    code = next((status for cls, status in _STATUS_OF if isinstance(exc, cls)), grpc.StatusCode.INTERNAL)
    named = grpc.StatusCode.__members__.get(getattr(exc, "code", None) or "")
    if named is not None:
        code = named
    trailers: tuple[tuple[str, str], ...] = ()
    if isinstance(exc, StaleRoundError) and exc.committed_length is not None:
        trailers = ((COMMITTED_LENGTH_KEY, str(exc.committed_length)),)
    retry_after = getattr(exc, "retry_after", None)  # a full queue or table, a verifier draining
    if retry_after is not None:
        trailers = ((RETRY_AFTER_MS_KEY, f"{retry_after * 1e3:.0f}"),)
    return Status(code, str(exc), trailers)


def error_from_status(
    code: grpc.StatusCode | None,
    detail: str,
    trailers: Iterable[tuple[str, str]] = (),
    *,
    address: str,
    during: str,
    deadline: float | None = None,
) -> EdgekitError:
    """The edgekit error, saying what to do, for a call that ended with `code`."""
    name = code.name if code else "UNKNOWN"
    trailers = tuple(trailers)
    retry_ms = next((float(v) for k, v in trailers if k == RETRY_AFTER_MS_KEY), None)
    retry_after = None if retry_ms is None else retry_ms / 1e3
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        within = f"within {deadline:g} s" if deadline else "within the deadline"
        return VerifierUnavailableError(
            f"verifier at {address} did not answer {during} {within}; is it overloaded, or the address wrong?",
            address=address,
            code=name,
        )
    if code == grpc.StatusCode.UNAVAILABLE:
        if retry_after is not None:  # it said why and for how long
            return VerifierUnavailableError(
                f"verifier at {address}: {detail}", retry_after=retry_after, address=address, code=name
            )
        return VerifierUnavailableError(
            f"verifier at {address} is unavailable ({detail}); is `edgekit serve` running there?",
            address=address,
            code=name,
        )
    if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
        return AuthenticationError(f"verifier at {address} refused the token: {detail}", address=address, code=name)
    if code == grpc.StatusCode.NOT_FOUND:
        return SessionNotFoundError(f"verifier at {address}: {detail}", address=address, code=name)
    if code == grpc.StatusCode.ABORTED:
        committed = next((int(v) for k, v in trailers if k == COMMITTED_LENGTH_KEY), None)
        return StaleRoundError(
            f"verifier at {address}: {detail}", committed_length=committed, address=address, code=name
        )
    if code in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.OUT_OF_RANGE):
        return LimitExceededError(
            f"verifier at {address}: {detail}",
            retry_after=retry_after,
            address=address,
            code=name,
        )
    if code == grpc.StatusCode.FAILED_PRECONDITION and "tokenizer" in detail:
        return IncompatibleModelsError(f"verifier at {address}: {detail}")
    if code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.FAILED_PRECONDITION):
        return ProtocolError(f"verifier at {address} refused {during}: {detail}", address=address, code=name)
    return VerifierError(f"verifier at {address} failed {during}: {name}: {detail}", address=address, code=name)
