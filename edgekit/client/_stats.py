"""Per-round and per-generation figures, named as the field names them.

- drafted: draft tokens sent for verification
- accepted: draft tokens the verifier accepted
- acceptance_rate: accepted / drafted
- accepted_length (AAL): mean accepted draft tokens per round, WITHOUT the
  bonus/correction token; `committed_per_round` counts it (AAL + 1 per round)
- wasted_draft_tokens (WDT, WISP eq. 7): drafted - accepted, the part of each
  block past the accepted prefix
- target_passes_per_token: verification rounds per committed token (each round
  is one target forward pass; the prompt prefill is not counted)
- goodput / tokens_per_second: committed tokens per second of wall time
- plain_rounds: rounds sent without a draft because plain target decoding was expected
  to be faster (`plain_when_faster`)
- proactive_drafted / proactive_used / proactive_wasted: tokens drafted past a block
  while it was being verified (proactive drafting), those that started the next round
  (the verdict took the whole block and the guessed token), and those dropped
- server: what the verifier reported of the round (`edgekit.protocol.ServerFigures`: its queue
  and verify time, hidden rows taken, semantic acceptances, the SLO budget and whether it was
  kept), one value from the wire to here, added up over a generation by its own rules
  (`stats.server.verify_ms`); deadlines_missed counts the rounds whose deadline it says was missed
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..protocol import ServerFigures

__all__ = ["GenerationStats", "RoundStats"]


@dataclass(frozen=True)
class RoundStats:
    """One round's figures (this module names each): where its block started, what was drafted
    and accepted, how the time went (drafting, upload, the link), and what the verifier reported
    of it (`server`)."""

    index: int
    base_position: int
    drafted: int
    accepted: int
    bonus: bool
    committed: int  # tokens this round added to the output: accepted + 1
    wasted: int  # drafted - accepted
    draft_ms: float  # device time spent drafting the block
    draft_steps: int  # draft model evaluations this round (a stop decision costs one past the block)
    round_trip_ms: float  # client-side time of the verify call
    server: ServerFigures = field(default_factory=ServerFigures)
    upload: str = "tokens"  # how hidden states went: tokens, fh, sh
    exchanges: int = 1  # request/answer pairs (SH with mismatches: 2)
    uplink_bytes: int = 0  # serialized requests
    downlink_bytes: int = 0  # serialized answers
    proactive_drafted: int = 0  # tokens drafted past the block while it was being verified
    proactive_used: int = 0  # of those, tokens that start the next round

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class GenerationStats:
    """One generation's figures (this module names each): its settings, tokens, rounds and time,
    the verifier's share, outages, and each round's `RoundStats` in `rounds_detail`."""

    mode: str
    draft_k: int
    drafting: str = ""  # the controller's name: fixed-4, predictor-gemma-270m, p-min-0.5
    sampler: dict = field(default_factory=dict)  # the settings sampled by (`Sampler.describe`); greedy: temperature 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    wasted_draft_tokens: int = 0
    draft_steps: int = 0
    bonus_tokens: int = 0
    draft_ms: float = 0.0
    round_trip_ms: float = 0.0
    server: ServerFigures = field(default_factory=ServerFigures)  # the rounds' figures from the verifier, added up
    deadlines_missed: int = 0  # rounds whose verifier-side budget was exceeded (sessions with an SLO)
    exchanges: int = 0
    uplink_bytes: int = 0
    downlink_bytes: int = 0
    # Semantic mode (lossy): the threshold the verifier's decision head decided at and its identity.
    semantic_threshold: float | None = None
    semantic_head: str = ""
    outages: int = 0  # times the verifier was lost and the generation went on
    outage_ms: float = 0.0  # time spent waiting for it
    reprefilled_tokens: int = 0  # committed tokens the verifier prefilled again on reopening
    provisional_tokens: int = 0  # tokens drafted ahead and shown while no verifier answered
    provisional_kept: int = 0  # of those, tokens a verifier accepted (or matched) into the output
    proactive_drafted: int = 0  # tokens drafted past blocks while they were being verified
    proactive_used: int = 0  # of those, tokens that started the next round
    plain_rounds: int = 0  # rounds without a draft: plain target decoding was expected to be faster
    target_speed: float | None = None  # tokens/s the verifier held the session to; None: best effort
    uploads: dict[str, int] = field(default_factory=dict)  # rounds per upload protocol
    prefill_ms: float = 0.0  # client-side time to open the session (both prefills)
    time_to_first_token_ms: float | None = None
    elapsed_s: float = 0.0
    finish_reason: str | None = None
    device: dict | None = None  # the device's load over the generation (edgekit.runtime.DeviceLoad)
    rounds_detail: list[RoundStats] = field(default_factory=list, repr=False)

    def add_outage(self, r: Any) -> None:
        """Counts a `Resumed` event."""
        self.outages += 1
        self.outage_ms += r.outage_ms
        self.reprefilled_tokens += r.reprefilled_tokens

    def add_round(self, r: RoundStats) -> None:
        self.rounds += 1
        self.drafted += r.drafted
        self.accepted += r.accepted
        self.wasted_draft_tokens += r.wasted
        self.draft_steps += r.draft_steps
        self.bonus_tokens += int(r.bonus)
        self.draft_ms += r.draft_ms
        self.round_trip_ms += r.round_trip_ms
        self.server += r.server
        self.deadlines_missed += r.server.deadline_met is False
        self.exchanges += r.exchanges
        self.uplink_bytes += r.uplink_bytes
        self.downlink_bytes += r.downlink_bytes
        self.proactive_drafted += r.proactive_drafted
        self.proactive_used += r.proactive_used
        self.uploads[r.upload] = self.uploads.get(r.upload, 0) + 1
        self.rounds_detail.append(r)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def accepted_length(self) -> float:
        return self.accepted / self.rounds if self.rounds else 0.0

    @property
    def committed_per_round(self) -> float:
        return (self.accepted + self.rounds) / self.rounds if self.rounds else 0.0

    @property
    def target_passes_per_token(self) -> float:
        return self.rounds / self.completion_tokens if self.completion_tokens else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.completion_tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def proactive_wasted(self) -> int:
        return self.proactive_drafted - self.proactive_used

    @property
    def draft_ms_per_token(self) -> float:
        return self.draft_ms / self.drafted if self.drafted else 0.0

    def to_dict(self, *, rounds: bool = False) -> dict:
        d = {k: v for k, v in asdict(self).items() if k != "rounds_detail"}
        d.update(
            acceptance_rate=self.acceptance_rate,
            accepted_length=self.accepted_length,
            committed_per_round=self.committed_per_round,
            target_passes_per_token=self.target_passes_per_token,
            tokens_per_second=self.tokens_per_second,
            draft_ms_per_token=self.draft_ms_per_token,
            proactive_wasted=self.proactive_wasted,
        )
        if rounds:
            d["rounds_detail"] = [r.to_dict() for r in self.rounds_detail]
        return d
