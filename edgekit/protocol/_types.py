"""edgekit.verifier.v1 as Python values: what a client and a verifier exchange,
without the protobuf (`_wire` converts). Every transport speaks these."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from ._acceptance import SparseDistribution
from ._hidden import EncodedHidden
from ._logprobs import TokenLogprobs
from ._sampler import GREEDY, Sampler

__all__ = [
    "MIN_PROTOCOL_VERSION",
    "PROTOCOL_VERSION",
    "BlockRequest",
    "ContextSpan",
    "Exchange",
    "Fingerprint",
    "GenerateRequest",
    "GeneratedToken",
    "HiddenRequest",
    "LinkState",
    "OpenRequest",
    "OpenedSession",
    "ReceivedBlock",
    "ServerFigures",
    "ServerInfo",
    "SpeedObjective",
    "VerifyResult",
]

PROTOCOL_VERSION = 2  # 2: token-speed SLOs
MIN_PROTOCOL_VERSION = 1  # the oldest a peer may agree on


@dataclass(frozen=True)
class SpeedObjective:
    """A session's token-speed SLO (WISP sec. 3.1): a class the verifier names,
    or a speed in tokens per second (which wins if both are given). Neither:
    best effort, verified when there is time."""

    slo_class: str | None = None
    tokens_per_s: float | None = None

    @property
    def best_effort(self) -> bool:
        return self.slo_class is None and self.tokens_per_s is None


@dataclass(frozen=True)
class Fingerprint:
    """What makes two tokenizers interchangeable: same ids for the same text.

    `vocab_size` is the model's vocabulary as its logits are wide, padding included;
    `token_hash` covers the entries before the trailing padding (`edgekit.runtime.trailing_padding`:
    the "[PADn]" placeholders a converter adds up to the embedding's rows), so two models whose
    vocabularies differ only in padding (Qwen2.5 0.5B and 7B) have the same tokenizer. Both ends
    compute the hash the same way from their own model; the wire carries it as it is.
    `padding`, how many of `vocab_size` are padding, is the model's own: it does not travel
    (a fingerprint from the wire says 0), and only the verifier reads it, of its own target.
    """

    vocab_size: int
    token_hash: bytes
    bos_token: int
    eos_token: int
    model_name: str
    padding: int = 0

    @classmethod
    def unknown(cls) -> Fingerprint:
        """No tokenizer: a handshake with it only asks which target the verifier serves."""
        return cls(0, b"", -1, -1, "")

    @property
    def real_vocab_size(self) -> int:
        """The ids that are tokens: those below it (what a verifier may commit)."""
        return self.vocab_size - self.padding

    def same_tokenizer(self, other: Fingerprint) -> bool:
        """Same tokens and special tokens; the vocabulary sizes may differ by padding."""
        return (self.token_hash, self.bos_token, self.eos_token) == (
            other.token_hash,
            other.bos_token,
            other.eos_token,
        )


@dataclass(frozen=True)
class LinkState:
    """The device's view of its link (WISV's CSI), sent with every round."""

    rtt_ms: float = 0.0
    rtt_jitter_ms: float = 0.0
    uplink_mbps: float = 0.0
    downlink_mbps: float = 0.0
    loss_rate: float = 0.0
    samples: int = 0


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
    # the sampler settings the target's GGUF recommends, by GenerationConfig field name; empty: none
    recommended_sampling: dict[str, float] = field(default_factory=dict)
    server_version: str = ""
    exact_numerics: bool = False
    invariant_batch: int = 0
    backend: str = "edgekit"  # "edgekit" (our gRPC verifier), "openai", "sglang"
    slo_classes: dict[str, float] = field(default_factory=dict)  # named classes, tokens/s (protocol 2)
    scheduling_policy: str = ""  # "fcfs", "wisp"; empty: not said
    sampler_features: tuple[str, ...] = ()  # what it applies past the temperature (`Sampler.features`)
    max_top_logprobs: int = 0  # most alternatives per token it returns with the target's log-probabilities; 0: none
    decode_step_ms: float = 0.0  # one target step of one sequence (ms), forecast or timed at start; 0: not known
    round_streams: bool = False  # it takes a session's rounds on one stream (the Rounds RPC)
    tokenizer_check: str = "fingerprint"  # how the target's tokenizer was matched to the draft's
    semantic_head: str = ""  # the decision head of its semantic mode (identity); empty: no semantic mode
    semantic_threshold: float = 0.0  # that head's shipped operating threshold
    hidden_encodings: tuple[str, ...] = ()  # "fp16", "int8": how it takes hidden states
    max_message_bytes: int = 0  # the largest request it reads; 0: not said


@dataclass(frozen=True)
class ContextSpan:
    """A span of a session's context as the verifier built it: `length` tokens, prefilled (a
    prompt or a turn) or `generated` (decoded in rounds, or a target-only stream's steps)."""

    length: int
    generated: bool = False


@dataclass(frozen=True)
class OpenRequest:
    """An OpenSession request: the prompt the verifier prefills and the session's settings.
    `seed` seeds the verifier's acceptance draws; `sampler`: how the target's logits become its
    distribution (temperature 0 unless the mode samples); `slo`: the session's token-speed objective."""

    prompt_tokens: Sequence[int]
    mode: str  # "greedy", "sample", "semantic"; from the wire, the name of one it does not know
    seed: int
    draft: Fingerprint
    sampler: Sampler = GREEDY
    draft_hidden_size: int = 0  # width of the hidden states the session may upload (FH, SH)
    slo: SpeedObjective = SpeedObjective()
    client_id: str = ""
    semantic_threshold: float = 0.0  # semantic mode: the threshold asked for (0: the head's own)
    logprobs: int = -1  # the target's log-probabilities of committed tokens, with this many alternatives; -1: none
    # how the verifier built this context before (a session opened again), span by span; (): one prompt
    history: Sequence[ContextSpan] = ()


@dataclass(frozen=True)
class GenerateRequest:
    """A Generate request: the verifier's target decodes every token after `prompt_tokens` (the
    target-only stream), as `mode` and `sampler` say, seeded by `seed`, until `max_tokens`, an end
    of text or one of `stop_tokens` (each token id ends the stream as EOS does, and is its last);
    `slo`: its token-speed objective; `logprobs` as `OpenRequest`'s."""

    prompt_tokens: Sequence[int]
    mode: str
    seed: int
    max_tokens: int
    sampler: Sampler = GREEDY
    stop_tokens: Sequence[int] = ()
    slo: SpeedObjective = SpeedObjective()
    logprobs: int = -1


@dataclass(frozen=True)
class OpenedSession:
    session_id: str
    committed_length: int
    max_context: int
    next_budget: int = 0
    prefill_ms: float = 0.0
    target_speed: float = 0.0  # tokens/s the verifier holds the session to; 0: best effort


@dataclass(frozen=True)
class BlockRequest:
    session_id: str
    base_position: int
    draft_tokens: Sequence[int]
    draft_distributions: Sequence[SparseDistribution] = ()
    link: LinkState = field(default_factory=LinkState)
    round_index: int = 0
    continue_after_eog: bool = False  # default: an accepted end-of-text token ends the round
    # How hidden states travel: "tokens" (none), "fh" (every row with the block)
    # or "sh" (the rows the verifier asks for, in a second exchange).
    upload: str = "tokens"
    hidden: np.ndarray | None = None  # [len(draft_tokens), d] float32: row i produced draft token i
    hidden_encoding: str = "fp16"
    # The round's cost outside the verifier, for its SLO deadline (WISP eq. 6):
    # time spent drafting the block, and the expected time on the link.
    draft_ms: float = 0.0
    network_ms: float = 0.0


@dataclass(frozen=True)
class ReceivedBlock:
    """A Verify request as the verifier reads it: the block, and its hidden rows as they
    travelled (decoded once the session says their width). `key` names the round for retries
    (`round_key`); `link`: None when the request carried no link state."""

    session_id: str
    base_position: int
    round_index: int
    draft_tokens: tuple[int, ...]
    distributions: Sequence[SparseDistribution]
    upload: str  # "tokens", "fh", "sh", or the wire's name of one this verifier does not know
    hidden: EncodedHidden | None  # rows sent with this request, if any
    hidden_encoding: str  # the encoding an SH round will answer in
    continue_after_eog: bool
    key: bytes  # what identifies the request: a retry has the same key
    draft_ms: float = 0.0  # the device's drafting time for the block (WISP eq. 6)
    network_ms: float = 0.0  # the device's expected link time for the round
    link: LinkState | None = None  # the device's link estimate (WISV's CSI); semantic mode reads it


@dataclass(frozen=True)
class Exchange:
    """One request and its answer, as the client saw it."""

    round_trip_ms: float
    server_ms: float | None  # the verifier's queue and compute time within it; None: not reported
    uplink_bytes: int  # serialized request
    downlink_bytes: int  # serialized answer


def _total(rule: str, **kw: Any) -> Any:
    """A figure's field, with how a round's parts and a generation's rounds add it up (`ServerFigures.__add__`)."""
    return field(metadata={"total": rule}, **kw)


@dataclass(frozen=True)
class ServerFigures:
    """What the verifier reports of a round besides its verdict, as one value from the wire to
    a generation's stats (`RoundStats.server`, `GenerationStats.server`). Figures add up by
    each field's rule: `+` sums them ("sum", the default), takes the larger ("max") or keeps a
    deadline met only where every part met its own ("all"; None where none had one). A new
    figure is a field here and its `_wire` mapping: the stats carry it as they are."""

    queue_ms: float = 0.0  # waiting for a batch and the engine
    verify_ms: float = 0.0  # the target pass, the checks and the acceptance rule
    hidden_rows: int = 0  # hidden rows the verifier received and validated
    semantic_accepted: int = 0  # semantic mode: mismatches its decision head accepted (in `accepted`)
    # A session with an SLO: the round's server-side budget (WISP eq. 6) and whether its queue
    # and verify time kept within it. None: best effort. SH's two halves report the same budget.
    budget_ms: float | None = _total("max", default=None)
    deadline_met: bool | None = _total("all", default=None)
    # Measurements, not part of the verdict (a retry's verdict equals the original's):
    batch_size: int = _total("max", default=1, compare=False)  # blocks verified in the same target pass
    estimated_ms: float = field(default=0.0, compare=False)  # the verifier's forecast for the batch it ran in

    def __add__(self, other: ServerFigures) -> ServerFigures:
        out: dict[str, Any] = {}
        for f in fields(self):
            a, b = getattr(self, f.name), getattr(other, f.name)
            if a is None or b is None:
                out[f.name] = b if a is None else a
                continue
            rule = f.metadata.get("total", "sum")
            out[f.name] = a and b if rule == "all" else max(a, b) if rule == "max" else a + b
        return ServerFigures(**out)


@dataclass(frozen=True)
class VerifyResult:
    """A round's verdict and the verifier's figures of it (`server`), as the verifier answers it
    and the client reads it (the client adds what it measured: `exchanges`, `hidden_requested`,
    and, over SH's two exchanges, the figures of both)."""

    accepted: int
    next_token: int | None  # None: the accepted block ended the text
    bonus: bool
    committed_length: int
    next_budget: int = 0
    context_full: bool = False
    server: ServerFigures = field(default_factory=ServerFigures)
    # How it went on the wire: one exchange, or two under SH with mismatches.
    # Measurements, not part of the verdict: a retry's verdict equals the original's.
    exchanges: tuple[Exchange, ...] = field(default=(), compare=False)
    hidden_requested: tuple[int, ...] = ()  # SH: the block offsets it asked for (its mismatches)
    # Semantic mode: the threshold the round was decided at and the head's identity.
    semantic_threshold: float = 0.0
    semantic_head: str = ""
    logprobs: tuple[TokenLogprobs, ...] = ()  # one per committed token, when the session asked


@dataclass(frozen=True)
class HiddenRequest:
    """SH's first answer: the verifier asks for the hidden states at `positions` (block
    offsets, its mismatches) in `encoding`, and says what the target pass took (`server`)."""

    positions: tuple[int, ...]
    encoding: str = "fp16"
    server: ServerFigures = field(default_factory=ServerFigures)


@dataclass(frozen=True)
class GeneratedToken:
    token: int
    index: int
    decode_ms: float = 0.0
    prefill_ms: float = 0.0
    finish_reason: str | None = None  # "eos", "length", "context" on the last
    logprobs: TokenLogprobs | None = None  # when asked
