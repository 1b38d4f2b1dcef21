"""Transports to verifiers: one seam, several backends."""

from ._base import (
    BlockRequest,
    GeneratedToken,
    LinkState,
    OpenedSession,
    ServerInfo,
    VerifierTransport,
    VerifyResult,
)
from ._grpc import GrpcTransport

__all__ = [
    "BlockRequest",
    "GeneratedToken",
    "GrpcTransport",
    "LinkState",
    "OpenedSession",
    "ServerInfo",
    "VerifierTransport",
    "VerifyResult",
]
