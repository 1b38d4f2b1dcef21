"""Typed events of a generation stream. Each names its kind in `type`, a literal, so a check
on it narrows an `Event` to that class for a type checker (as openai-python's stream events)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..protocol import TokenLogprobs
from ._stats import GenerationStats, RoundStats

__all__ = ["Event", "FinalStats", "Provisional", "Resumed", "RoundEvent", "TextDelta"]


@dataclass(frozen=True)
class TextDelta:
    """New output text and the token ids it came from (text may lag tokens on split UTF-8)."""

    text: str
    token_ids: tuple[int, ...]
    type: Literal["text"] = "text"
    logprobs: tuple[TokenLogprobs, ...] = ()  # the target's, one per token id, when asked (GenerationConfig.logprobs)


@dataclass(frozen=True)
class RoundEvent:
    """One speculate-verify round finished."""

    stats: RoundStats
    type: Literal["round"] = "round"


@dataclass(frozen=True)
class Resumed:
    """The verifier was lost and the generation went on: for how long it was lost, how
    many tries it took, how many committed tokens the verifier prefilled again (a
    reopened session) and what failed (edgekit error class names). Nothing committed
    was lost or duplicated."""

    outage_ms: float
    attempts: int
    reprefilled_tokens: int
    causes: tuple[str, ...]
    type: Literal["resumed"] = "resumed"


@dataclass(frozen=True)
class Provisional:
    """Tokens the device drafted ahead of the output while no verifier answered
    (`ClientConfig.on_disconnect="draft"`): not committed, and possibly wrong. Each one
    replaces the one before: it holds every token now drafted past the output. A
    `TextDelta` supersedes what is shown (tokens a verifier accepted come again there,
    as output), and the `Provisional` after it holds what is still ahead; one with no
    tokens means nothing is."""

    text: str
    token_ids: tuple[int, ...]
    type: Literal["provisional"] = "provisional"


@dataclass(frozen=True)
class FinalStats:
    """The generation ended; `stats.finish_reason` says why."""

    stats: GenerationStats
    token_ids: tuple[int, ...]
    text: str
    type: Literal["final"] = "final"
    logprobs: tuple[TokenLogprobs, ...] = ()  # the target's, one per token id, when asked


Event = TextDelta | RoundEvent | Resumed | Provisional | FinalStats
