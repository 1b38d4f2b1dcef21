"""`PlainWhenFaster`: speculation off while the latency model expects plain target decoding to win.

Plain decoding is a round with an empty block: one round trip and one target step per
token. Where acceptance has collapsed on this kind of text, or drafting a token costs
more than the link and the target's step it would save, every window is slower than
that. Each round this asks the session's latency model (its measured draft step, verify
line, acceptance and link) whether the empty round is faster per committed token than
the best window; while it is, the window is 0, and every `probe_every` such rounds a
short block of `probe_window` is drafted so that the acceptance estimate can recover
when the text changes. Both kinds of round are lossless. It decides once `warmup`
rounds have been measured, by this generation or by the client's earlier ones (the
client carries its cost estimate across them), and only where plain decoding wins
by a margin.

TensorRT-LLM turns speculation off below a rolling acceptance threshold and vLLM's
adaptive K allows K = 0; here the threshold is not fixed but comes from the costs.
"""

from __future__ import annotations

from ..link import LinkPolicy
from ..runtime import DraftOutput
from ._controller import Controller, Decision

__all__ = ["PlainWhenFaster"]


class PlainWhenFaster:
    def __init__(
        self,
        inner: Controller,
        policy: LinkPolicy,
        *,
        probe_every: int = 8,
        probe_window: int = 2,
        warmup: int = 6,
        margin: float = 1.1,
    ) -> None:
        self.inner = inner
        self.policy = policy
        self.name = inner.name
        self.probe_every = probe_every
        self.probe_window = probe_window
        self.warmup = warmup
        self.margin = margin  # plain must be this much faster (less flapping on noise)
        self.rounds = 0  # verdicts seen
        self.plain_rounds = 0  # rounds it turned speculation off for
        self._since_probe = 0
        self._limit = 1  # the last round's room: the windows the next decision weighs
        self._plain = False  # the decision for the coming round, made at the last verdict
        self._probe = False
        self._first = True  # no verdict yet: the first round decides on the client's earlier measurements

    def plain_is_faster(self, limit: int) -> bool:
        """Whether an empty round beats every window by `margin`, per committed token. The plain
        round is charged the verify time of the window it is set against (never less than its
        own): the verify line's slope is a prior until windows vary, and this way only the
        measured draft time and acceptance can turn drafting off."""
        if self.rounds < self.warmup and self.policy.costs.rounds < self.warmup:
            return False  # neither this generation nor the client's earlier ones measured enough
        model = self.policy.model()
        costs = model.costs
        plain_comm = model.comm_ms(0, "tokens")
        for k in range(1, limit + 1):
            verify = costs.verify_ms(k)
            spec = (costs.draft_step_ms * k + model.comm_ms(k, "tokens") + verify) / model.committed_per_round(k)
            if spec <= (plain_comm + verify) * self.margin:
                return False
        return True

    def window(self, limit: int) -> int:
        """The round's window: the same however often it is asked within a round (a block drafted
        ahead asks too); the decision is made once per verdict, in `observe`."""
        self._limit = max(limit, 1)
        if self._first:
            self._first = False
            self._plain = self.plain_is_faster(self._limit)  # False until enough rounds were measured
        if not self._plain or limit < 1:
            return self.inner.window(limit)
        if self._probe:  # a short block now and then, to see whether drafting pays again
            return min(self.probe_window, self.inner.window(limit))
        return 0

    def draft_next(self, index: int, step: DraftOutput) -> Decision | bool:
        return self.inner.draft_next(index, step)

    def observe(self, drafted: int, accepted: int) -> None:
        self._first = False
        self.rounds += 1
        self.inner.observe(drafted, accepted)
        if self._plain and drafted == 0:
            self.plain_rounds += 1
        self._plain = self.plain_is_faster(self._limit)
        if not self._plain or drafted:
            self._since_probe = 0  # drafting (or a probe) just ran
        else:
            self._since_probe += 1
        self._probe = self._plain and self._since_probe >= self.probe_every
