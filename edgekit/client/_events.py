"""Typed events of a generation stream."""

from __future__ import annotations

from dataclasses import dataclass

from ._metrics import GenerationStats, RoundStats

__all__ = ["Event", "FinalStats", "Provisional", "Resumed", "RoundEvent", "TextDelta"]


@dataclass(frozen=True)
class TextDelta:
    """New output text and the token ids it came from (text may lag tokens on split UTF-8)."""

    text: str
    token_ids: tuple[int, ...]
    type: str = "text"


@dataclass(frozen=True)
class RoundEvent:
    """One speculate-verify round finished."""

    stats: RoundStats
    type: str = "round"


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
    type: str = "resumed"


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
    type: str = "provisional"


@dataclass(frozen=True)
class FinalStats:
    """The generation ended; `stats.finish_reason` says why."""

    stats: GenerationStats
    token_ids: tuple[int, ...]
    text: str
    type: str = "final"


Event = TextDelta | RoundEvent | Resumed | Provisional | FinalStats
