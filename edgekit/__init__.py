"""edgekit: the device side of distributed speculative LLM decoding.

The package's folders follow the architecture: `protocol` (the wire protocol
and the verdict), `runtime` (llama.cpp, the draft model, the logit kernel),
`drafting` (how long each block is), `link` (the link estimate, latency model
and upload policy), `transport` (the seam to verifiers), `client` (sessions,
streams, chat, the sync and async clients), `verifier` (the reference verifier:
service, sessions, rounds, scheduler, engine). What most programs need is
re-exported here.
"""

from .__version__ import __version__
from .client import (
    AsyncConversation,
    AsyncEdgeClient,
    AsyncGenerationStream,
    ChatTemplate,
    Conversation,
    EdgeClient,
    Event,
    FinalStats,
    GenerationStats,
    GenerationStream,
    Resumed,
    RoundEvent,
    RoundStats,
    SpeculativeSession,
    TextDelta,
)
from .config import ClientConfig, GenerationConfig, ServerConfig
from .drafting import ConfidenceThreshold, Controller, Decision, FixedWindow, PredictorController
from .errors import (
    AuthenticationError,
    ConfigError,
    DependencyMissingError,
    EdgekitError,
    HiddenStateError,
    IncompatibleModelsError,
    InferenceError,
    InternalError,
    KVCacheFullError,
    LimitExceededError,
    ModelError,
    ModelFetchError,
    ModelIntegrityError,
    ModelLoadError,
    ModelNotFoundError,
    PredictorError,
    ProtocolError,
    SessionNotFoundError,
    StaleRoundError,
    VerifierError,
    VerifierUnavailableError,
)
from .link import LinkEstimator, ProbeResult, RoundPlan
from .protocol import LinkState
from .runtime import DraftModel, DraftOutput, LlamaDraftModel, LogitStats

__all__ = [
    "AsyncConversation",
    "AsyncEdgeClient",
    "AsyncGenerationStream",
    "AuthenticationError",
    "ChatTemplate",
    "ClientConfig",
    "ConfidenceThreshold",
    "ConfigError",
    "Controller",
    "Conversation",
    "Decision",
    "DependencyMissingError",
    "DraftModel",
    "DraftOutput",
    "EdgeClient",
    "EdgekitError",
    "Event",
    "FinalStats",
    "FixedWindow",
    "GenerationConfig",
    "GenerationStats",
    "GenerationStream",
    "HiddenStateError",
    "IncompatibleModelsError",
    "InferenceError",
    "InternalError",
    "KVCacheFullError",
    "LimitExceededError",
    "LinkEstimator",
    "LinkState",
    "LlamaDraftModel",
    "LogitStats",
    "ModelError",
    "ModelFetchError",
    "ModelIntegrityError",
    "ModelLoadError",
    "ModelNotFoundError",
    "PredictorController",
    "PredictorError",
    "ProbeResult",
    "ProtocolError",
    "Resumed",
    "RoundEvent",
    "RoundPlan",
    "RoundStats",
    "ServerConfig",
    "SessionNotFoundError",
    "SpeculativeSession",
    "StaleRoundError",
    "TextDelta",
    "VerifierError",
    "VerifierUnavailableError",
    "__version__",
]
