"""The verifier transport seam: what a client can ask of any verifier.

Implementations: `GrpcTransport` (our protocol) and, for tests,
`edgekit.testing.FakeVerifier`. Later transports (OpenAI-compatible, SGLang)
implement the same protocol and report what they cannot do in `ServerInfo`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, Protocol, Sequence

import numpy as np

from .._llama import Fingerprint
from .._sampling import SparseDistribution

__all__ = [
    "BlockRequest",
    "Exchange",
    "GeneratedToken",
    "LinkState",
    "OpenedSession",
    "ServerInfo",
    "VerifierTransport",
    "VerifyResult",
]

PROTOCOL_VERSION = 1


@dataclass(frozen=True)
class ServerInfo:
    protocol_version: int
    target_model: str
    target_fingerprint: Fingerprint
    target_hidden_size: int
    modes: tuple[str, ...]  # "greedy", "sample", "semantic"
    upload_protocols: tuple[str, ...]  # "tokens", "fh", "sh"
    max_block: int
    max_context: int
    max_sessions: int
    assigns_budgets: bool
    prefix_cache: bool
    max_draft_top_k: int
    chat_template: str | None = None
    server_version: str = ""
    exact_numerics: bool = False
    invariant_batch: int = 0
    backend: str = "edgekit"  # "edgekit" (our gRPC verifier), "openai", "sglang"
    tokenizer_check: str = "fingerprint"  # how the target's tokenizer was matched to the draft's


@dataclass(frozen=True)
class OpenedSession:
    session_id: str
    committed_length: int
    max_context: int
    next_budget: int = 0
    prefill_ms: float = 0.0
    reused_tokens: int = 0


@dataclass(frozen=True)
class LinkState:
    rtt_ms: float = 0.0
    rtt_jitter_ms: float = 0.0
    uplink_mbps: float = 0.0
    downlink_mbps: float = 0.0
    loss_rate: float = 0.0
    samples: int = 0


@dataclass(frozen=True)
class BlockRequest:
    session_id: str
    base_position: int
    draft_tokens: Sequence[int]
    draft_distributions: Sequence[SparseDistribution] = ()
    link: LinkState = field(default_factory=LinkState)
    slo_class: str = "interactive"
    round_index: int = 0
    continue_after_eog: bool = False  # default: an accepted end-of-text token ends the round
    # How hidden states travel: "tokens" (none), "fh" (every row with the block)
    # or "sh" (the rows the verifier asks for, in a second exchange).
    upload: str = "tokens"
    hidden: np.ndarray | None = None  # [len(draft_tokens), d] float32: row i produced draft token i
    hidden_encoding: str = "fp16"


@dataclass(frozen=True)
class Exchange:
    """One request and its answer, as the client saw it."""

    round_trip_ms: float
    server_ms: float | None  # the verifier's queue and compute time within it; None: not reported
    uplink_bytes: int  # serialized request
    downlink_bytes: int  # serialized answer


@dataclass(frozen=True)
class VerifyResult:
    accepted: int
    next_token: int | None  # None: the accepted block ended the text
    bonus: bool
    committed_length: int
    next_budget: int = 0
    context_full: bool = False
    queue_ms: float = 0.0
    verify_ms: float = 0.0
    batch_size: int = 1
    # How it went on the wire: one exchange, or two under SH with mismatches.
    # Measurements, not part of the verdict: a retry's verdict equals the original's.
    exchanges: tuple[Exchange, ...] = field(default=(), compare=False)
    hidden_rows: int = 0  # hidden rows the verifier received and validated
    hidden_requested: tuple[int, ...] = ()  # SH: the block offsets it asked for (its mismatches)


@dataclass(frozen=True)
class GeneratedToken:
    token: int
    index: int
    decode_ms: float = 0.0
    prefill_ms: float = 0.0
    finish_reason: str | None = None  # "eos", "length", "context" on the last


class VerifierTransport(Protocol):
    address: str

    def ping(self, payload_bytes: int = 0, reply_bytes: int = 0) -> float:
        """One echo carrying `payload_bytes` up and `reply_bytes` back; its round trip in ms."""

    def handshake(self, draft: Fingerprint, *, draft_model: str, draft_hidden_size: int) -> ServerInfo: ...

    def open_session(
        self,
        prompt_tokens: Sequence[int],
        *,
        mode: str,
        temperature: float,
        seed: int,
        slo_class: str,
        draft: Fingerprint,
    ) -> OpenedSession: ...

    def extend_session(self, session_id: str, base_position: int, tokens: Sequence[int]) -> int: ...

    def verify(self, block: BlockRequest) -> VerifyResult: ...

    def close_session(self, session_id: str) -> None: ...

    def generate(
        self,
        prompt_tokens: Sequence[int],
        *,
        mode: str,
        temperature: float,
        seed: int,
        max_tokens: int,
    ) -> Iterator[GeneratedToken]: ...

    def close(self) -> None: ...
