"""A clock a test moves by hand."""

from __future__ import annotations


class ManualClock:
    """A clock whose time passes only when a test says (`clock.now += 1.5`): pass it as
    `VerifierServer(..., clock=)` and session idleness and draining no longer depend on how fast
    the machine runs the test."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
