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
from ._connect import SCHEMES, connect
from ._grpc import GrpcTransport
from ._openai import OpenAITransport
from ._sglang import SGLangTransport

__all__ = [
    "BlockRequest",
    "GeneratedToken",
    "GrpcTransport",
    "OpenAITransport",
    "SCHEMES",
    "SGLangTransport",
    "connect",
    "LinkState",
    "OpenedSession",
    "ServerInfo",
    "VerifierTransport",
    "VerifyResult",
]
