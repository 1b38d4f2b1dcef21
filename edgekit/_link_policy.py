"""The link policy: how each round uploads (tokens, FH or SH) and, when asked,
how long its window is, from the latency model over the measured link.

`LinkPolicy` owns a session's cost estimates (`CostTracker`) and reads the
client's `LinkEstimator` as it stands each round. `LatencyWindow` is the
drafting controller of `drafting="latency"`.
"""

from __future__ import annotations

from ._config import GenerationConfig
from ._controller import Decision
from ._draft import DraftOutput
from ._latency import CostTracker, LatencyModel, Overheads, PayloadModel, RoundPlan
from ._link import LinkEstimator

__all__ = ["LatencyWindow", "LinkPolicy"]


class LinkPolicy:
    def __init__(
        self,
        config: GenerationConfig,
        link: LinkEstimator,
        *,
        hidden_dim: int,
        n_vocab: int,
        costs: CostTracker | None = None,
        overheads: Overheads | None = None,
    ) -> None:
        self.config = config
        self.link = link
        self.costs = costs or CostTracker()
        self._payloads = {
            enc: PayloadModel.for_models(hidden_dim, n_vocab, enc, overheads) for enc in ("fp16", "int8")
        }

    def model(self) -> LatencyModel:
        return LatencyModel(self._payloads[self.config.hidden_encoding], self.link.state(), self.costs)

    def _options(self) -> tuple[str, ...]:
        u = self.config.upload
        if u == "auto":
            return ("fh", "sh")
        if u == "rtt":
            return ("fh" if self.link.state().rtt_ms > self.config.rtt_rule_ms else "sh",)
        return (u,)

    def upload_for(self, k: int) -> str:
        """The upload of a drafted block of k tokens."""
        options = self._options()
        if k == 0 or options == ("tokens",):
            return "tokens"
        return options[0] if len(options) == 1 else self.model().choose_upload(k, options)

    def plan(self, limit: int) -> RoundPlan:
        """The window in 1..limit (and its upload) with the least expected time per committed token."""
        return self.model().plan(limit, self._options())


class LatencyWindow:
    """Drafts the window the latency model picks each round (WISV sec. VII-B: the
    time per committed token is U-shaped in the window), up to `max_window`."""

    def __init__(self, policy: LinkPolicy, max_window: int) -> None:
        self.policy = policy
        self.max_window = max_window
        self.name = "latency"
        self._k = 1

    def window(self, limit: int) -> int:
        self._k = self.policy.plan(max(1, min(limit, self.max_window))).window
        return self._k

    def draft_next(self, index: int, step: DraftOutput) -> Decision:
        return Decision.DRAFT

    def observe(self, drafted: int, accepted: int) -> None:
        pass  # the policy's tracker sees every round
