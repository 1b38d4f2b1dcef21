"""edgekit: the device side of distributed speculative LLM decoding."""

__version__ = "0.1.0"

from ._async_client import AsyncConversation, AsyncEdgeClient, AsyncGenerationStream
from ._chat import ChatTemplate, Conversation
from ._client import EdgeClient, GenerationStream
from ._config import ClientConfig, GenerationConfig, ServerConfig
from ._controller import Controller, Decision, FixedWindow
from ._draft import DraftModel, DraftOutput, LlamaDraftModel
from ._logits import LogitStats
from ._errors import (
    AuthenticationError,
    ConfigError,
    DependencyMissingError,
    EdgekitError,
    IncompatibleModelsError,
    LimitExceededError,
    ModelError,
    ModelFetchError,
    ModelIntegrityError,
    ModelLoadError,
    ModelNotFoundError,
    ProtocolError,
    SessionNotFoundError,
    StaleRoundError,
    VerifierError,
    VerifierUnavailableError,
)
from ._events import Event, FinalStats, RoundEvent, TextDelta
from ._link import LinkEstimator, ProbeResult
from ._latency import RoundPlan
from ._metrics import GenerationStats, RoundStats
from ._session import SpeculativeSession
from .transport._base import LinkState
from .predictors.runtime import ConfidenceThreshold  # the p-min policy is a predictor that reads confidence

__all__ = [
    "AsyncConversation",
    "AsyncEdgeClient",
    "AsyncGenerationStream",
    "AuthenticationError",
    "ChatTemplate",
    "ClientConfig",
    "Conversation",
    "ConfigError",
    "ConfidenceThreshold",
    "Controller",
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
    "IncompatibleModelsError",
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
    "ProbeResult",
    "ProtocolError",
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
