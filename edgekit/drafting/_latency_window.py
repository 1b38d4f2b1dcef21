"""`LatencyWindow`: the window the latency model expects fastest per committed token."""

from __future__ import annotations

from ..link import LinkPolicy
from ..runtime import DraftOutput
from ._controller import Decision

__all__ = ["LatencyWindow"]


class LatencyWindow:
    """Drafts the window the latency model picks each round (WISV sec. VII-B: the
    time per committed token is U-shaped in the window), up to `max_window`."""

    def __init__(self, policy: LinkPolicy, max_window: int) -> None:
        self.policy = policy
        self.max_window = max_window
        self.name = "latency"

    def window(self, limit: int) -> int:
        return self.policy.plan(max(1, min(limit, self.max_window))).window

    def draft_next(self, index: int, step: DraftOutput) -> Decision:
        return Decision.DRAFT

    def observe(self, drafted: int, accepted: int) -> None:
        pass  # the policy's tracker sees every round
