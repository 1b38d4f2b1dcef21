"""The link policy: how each round uploads (tokens, FH or SH) and, when asked,
how long its window is, from the latency model over the measured link.

`LinkPolicy` owns a session's cost estimates (`CostTracker`) and reads the
client's `LinkEstimator` as it stands each round. Its settings are the upload
rule, the RTT rule's threshold and the hidden-state encoding of a
`GenerationConfig`; `configure` takes a changed one. `needs_rates` says whether
those settings need the link's rates measured first.
"""

from __future__ import annotations

from ..config import GenerationConfig
from ._estimator import LinkEstimator
from ._latency import CostTracker, LatencyModel, Overheads, PayloadModel, RoundPlan

__all__ = ["LinkPolicy"]


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
        self.link = link
        self.costs = costs or CostTracker()
        self._payloads = {
            enc: PayloadModel.for_models(hidden_dim, n_vocab, enc, overheads) for enc in ("fp16", "int8")
        }
        self.configure(config)

    def configure(self, config: GenerationConfig) -> None:
        """Takes the upload settings of `config`: upload, rtt_rule_ms, hidden_encoding."""
        self.upload = config.upload
        self.rtt_rule_ms = config.rtt_rule_ms
        self.encoding = config.hidden_encoding
        # The latency model weighs payloads by the link's rates; the semantic head's CSI is made of them.
        self._uses_rates = config.upload == "auto" or config.drafting == "latency" or config.mode == "semantic"

    def needs_rates(self) -> bool:
        """Whether the link's rates should be measured before a session opens: the settings use
        them and nobody measured them yet. Once per client: a server without an echo endpoint (or
        a link too fast to time) leaves them at 0, and probing again would not change that."""
        link = self.link
        return self._uses_rates and not link.probed and not (link.uplink_mbps and link.downlink_mbps)

    def model(self) -> LatencyModel:
        return LatencyModel(self._payloads[self.encoding], self.link.state(), self.costs)

    def _options(self) -> tuple[str, ...]:
        if self.upload == "auto":
            return ("fh", "sh")
        if self.upload == "rtt":
            return ("fh" if self.link.state().rtt_ms > self.rtt_rule_ms else "sh",)
        return (self.upload,)

    def upload_for(self, k: int) -> str:
        """The upload of a drafted block of k tokens."""
        options = self._options()
        if k == 0 or options == ("tokens",):
            return "tokens"
        return options[0] if len(options) == 1 else self.model().choose_upload(k, options)

    def plan(self, limit: int) -> RoundPlan:
        """The window in 1..limit (and its upload) with the least expected time per committed token."""
        return self.model().plan(limit, self._options())
