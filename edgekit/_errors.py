"""The edgekit error tree.

Every error edgekit raises is an :class:`EdgekitError`. Foreign errors (grpc,
llama.cpp, onnxruntime, pip) are mapped at the boundary where they happen, and
the message says what to do about it::

    EdgekitError
    ├── ConfigError                  an option or argument the user gave is invalid
    ├── DependencyMissingError       an optional extra is not installed
    ├── ModelError
    │   ├── ModelNotFoundError       not in the cache: names the pull command
    │   ├── ModelIntegrityError      a sha256 or size does not match
    │   ├── ModelFetchError          a package could not be downloaded
    │   └── ModelLoadError           llama.cpp refused the file
    ├── IncompatibleModelsError      draft and target tokenizers differ
    └── VerifierError                anything the verifier (or the way to it) said
        ├── VerifierUnavailableError cannot reach it, or it missed the deadline
        ├── AuthenticationError      the token was refused
        ├── SessionNotFoundError     unknown or evicted session
        ├── StaleRoundError          the round's base position is not the session's
        ├── LimitExceededError       a session, block or context limit
        └── ProtocolError            malformed message or unsupported version/mode
"""

from __future__ import annotations

__all__ = [
    "AuthenticationError",
    "ConfigError",
    "DependencyMissingError",
    "EdgekitError",
    "IncompatibleModelsError",
    "LimitExceededError",
    "ModelError",
    "ModelFetchError",
    "ModelIntegrityError",
    "ModelLoadError",
    "ModelNotFoundError",
    "ProtocolError",
    "SessionNotFoundError",
    "StaleRoundError",
    "VerifierError",
    "VerifierUnavailableError",
]


class EdgekitError(Exception):
    """Base of every error edgekit raises."""


class ConfigError(EdgekitError, ValueError):
    """An option or argument is invalid."""


class DependencyMissingError(EdgekitError, ImportError):
    """An optional dependency is missing; the message names the extra to install."""

    def __init__(self, module: str, extra: str) -> None:
        super().__init__(f"{module} is not installed; run: pip install 'edgekit[{extra}]'")
        self.module = module
        self.extra = extra


class ModelError(EdgekitError):
    """A model could not be found, fetched, checked or loaded."""


class ModelNotFoundError(ModelError):
    """The model is not in the cache."""


class ModelIntegrityError(ModelError):
    """An assembled or cached model file does not match its pinned checksum."""


class ModelFetchError(ModelError):
    """A package carrying model weights could not be downloaded."""


class ModelLoadError(ModelError):
    """llama.cpp could not load the model file."""


class IncompatibleModelsError(EdgekitError):
    """The draft and target models do not share a tokenizer."""


class VerifierError(EdgekitError):
    """The verifier, or the way to it, failed a call.

    ``address`` names the verifier; ``code`` is the gRPC status name when known.
    """

    def __init__(self, message: str, *, address: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.address = address
        self.code = code


class VerifierUnavailableError(VerifierError):
    """The verifier cannot be reached, or did not answer within the deadline."""


class AuthenticationError(VerifierError):
    """The verifier refused the client's token."""


class SessionNotFoundError(VerifierError):
    """The session is unknown to the verifier, or was evicted."""


class StaleRoundError(VerifierError):
    """A round named a base position that is not the session's committed length."""

    def __init__(self, message: str, *, committed_length: int | None = None, **kw: str | None) -> None:
        super().__init__(message, **kw)
        self.committed_length = committed_length


class LimitExceededError(VerifierError):
    """A limit was hit: sessions, block length, context or payload size."""


class ProtocolError(VerifierError):
    """A malformed message, or a protocol version or mode the peer does not support."""
