"""The edgekit error tree.

Every error edgekit raises on purpose is an :class:`EdgekitError`. Foreign
errors (grpc, HTTP, llama.cpp, onnxruntime, pip) are mapped at the boundary
where they happen, and the message says what to do about it::

    EdgekitError
    ├── ConfigError                  an option, argument or input file is invalid
    │   ├── PredictorError           a predictor file that cannot be used
    │   └── SemanticHeadError        a semantic decision head that cannot be used (or does not fit the pair)
    ├── DependencyMissingError       a package edgekit needs is not installed
    ├── ModelError
    │   ├── ModelNotFoundError       not in the cache (names the pull command), or not in the Hub repo named
    │   ├── ModelIntegrityError      a sha256 or size does not match (a pinned one, or the Hub's)
    │   ├── ModelFetchError          a package or a Hub file could not be downloaded: says why, what to do
    │   └── ModelLoadError           llama.cpp refused the file
    │       └── InsufficientMemoryError  it would not fit in the memory available: says what would
    ├── IncompatibleModelsError      draft and target tokenizers differ
    ├── InferenceError               llama.cpp failed a decode or a tokenization
    │   └── KVCacheFullError         no free KV cells for a batch
    ├── HiddenStateError             hidden states that do not fit the round
    ├── ApiError                     edgekit api's answer to a request: an HTTP status, OpenAI's or Ollama's error shape
    └── VerifierError                anything the verifier (or the way to it) said
        ├── VerifierUnavailableError cannot reach it, or it missed the deadline
        ├── AuthenticationError      the token was refused
        ├── SessionNotFoundError     unknown or evicted session
        ├── StaleRoundError          the round's base position is not the session's
        ├── LimitExceededError       a session, block or context limit
        ├── ProtocolError            malformed message or unsupported version/mode
        └── InternalError            the verifier failed inside (a bug: it says so and keeps serving)

`ConfigError`, `PredictorError`, `SemanticHeadError` and `HiddenStateError` are also `ValueError`s,
`DependencyMissingError` an `ImportError`. A `VerifierError` carries the
verifier's `address` and, where known, the gRPC status name in `code`; the
reference verifier raises the same classes, and its service turns them into
those status codes (see `edgekit.protocol`).
"""

from __future__ import annotations

__all__ = [
    "ApiError",
    "AuthenticationError",
    "ConfigError",
    "DependencyMissingError",
    "EdgekitError",
    "HiddenStateError",
    "IncompatibleModelsError",
    "InferenceError",
    "InsufficientMemoryError",
    "InternalError",
    "KVCacheFullError",
    "LimitExceededError",
    "ModelError",
    "ModelFetchError",
    "ModelIntegrityError",
    "ModelLoadError",
    "ModelNotFoundError",
    "PredictorError",
    "ProtocolError",
    "SemanticHeadError",
    "SessionNotFoundError",
    "StaleRoundError",
    "VerifierError",
    "VerifierUnavailableError",
]


class EdgekitError(Exception):
    """Base of every error edgekit raises."""


class ConfigError(EdgekitError, ValueError):
    """An option, argument or input file is invalid."""


class PredictorError(ConfigError):
    """A predictor file that cannot be used: missing, not ONNX, or the wrong inputs or outputs."""


class SemanticHeadError(ConfigError):
    """A semantic decision head that cannot be used: missing, not ONNX, or inputs that do not fit the pair."""


class DependencyMissingError(EdgekitError, ImportError):
    """A package edgekit needs is missing; the message says how to install it.

    `extra` names the optional extra that brings it (``pip install 'edgekit[extra]'``);
    None for a core dependency, which a reinstall of edgekit brings back.
    """

    def __init__(self, module: str, extra: str | None = None) -> None:
        how = f"pip install 'edgekit[{extra}]'" if extra else f"pip install {module} (a dependency of edgekit)"
        super().__init__(f"{module} is not installed; run: {how}")
        self.module = module
        self.extra = extra


class ModelError(EdgekitError):
    """A model could not be found, fetched, checked or loaded."""


class ModelNotFoundError(ModelError):
    """The model is not in the cache, or the Hub repo named has no such file, quant or revision."""


class ModelIntegrityError(ModelError):
    """An assembled, cached or downloaded model file does not match its pinned checksum, or the Hub's."""


class ModelFetchError(ModelError):
    """A package or a Hub file carrying model weights could not be downloaded: no access (a private or
    gated repo), no network, a transfer cut short, a full disk, a server error."""


class ModelLoadError(ModelError):
    """llama.cpp could not load the model file."""


class InsufficientMemoryError(ModelLoadError):
    """A model and its context need more memory than the device has available; checked
    before loading, and the message says how much is needed, how much is free and what fits."""


class ApiError(EdgekitError):
    """An error `edgekit api` answers a request with: its HTTP status and the fields of OpenAI's
    error object (type, param, code; Ollama's has the message only), and a Retry-After where
    waiting helps."""

    def __init__(self, status: int, message: str, *, kind: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status, self.kind, self.param, self.code, self.retry_after = status, kind, param, code, retry_after


class IncompatibleModelsError(EdgekitError):
    """The draft and target models do not share a tokenizer."""


class InferenceError(EdgekitError):
    """llama.cpp failed a decode, a rollback or a tokenization."""


class KVCacheFullError(InferenceError):
    """The context has no free KV cells for the batch (llama_decode returned 1)."""


class HiddenStateError(EdgekitError, ValueError):
    """Hidden states that do not fit the round: wrong count, width, encoding or values."""


class VerifierError(EdgekitError):
    """The verifier, or the way to it, failed a call.

    ``address`` names the verifier; ``code`` is the gRPC status name when known.
    """

    def __init__(self, message: str, *, address: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.address = address
        self.code = code


class VerifierUnavailableError(VerifierError):
    """The verifier cannot be reached, or did not answer within the deadline.

    ``retry_after`` (seconds), when the verifier gave one: it is draining for a
    restart, and says when to try again.
    """

    def __init__(
        self, message: str, *, retry_after: float | None = None, address: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message, address=address, code=code)
        self.retry_after = retry_after


class AuthenticationError(VerifierError):
    """The verifier refused the client's token."""


class SessionNotFoundError(VerifierError):
    """The session is unknown to the verifier, or was evicted."""


class StaleRoundError(VerifierError):
    """A round named a base position that is not the session's committed length."""

    def __init__(
        self, message: str, *, committed_length: int | None = None, address: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message, address=address, code=code)
        self.committed_length = committed_length


class LimitExceededError(VerifierError):
    """A limit was hit: sessions, queue, block length, context or payload size.

    ``retry_after`` (seconds), when the verifier gave one: how long to back off
    before trying again (a full session table or queue).
    """

    def __init__(
        self, message: str, *, retry_after: float | None = None, address: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message, address=address, code=code)
        self.retry_after = retry_after


class ProtocolError(VerifierError):
    """A malformed message, or a protocol version or mode the peer does not support."""


class InternalError(VerifierError):
    """The verifier failed inside (a bug); it answers INTERNAL and goes on serving other calls."""
