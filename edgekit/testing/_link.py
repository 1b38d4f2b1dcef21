"""A modelled link's exchange times, without waiting."""

from __future__ import annotations

import numpy as np

from ..link import MIN_RTO_MS


class SimulatedLink:
    """Times of exchanges over a modelled link, without waiting: base RTT, rates
    each way, Gaussian jitter and, with probability `loss`, one retransmission
    timeout (seeded, so tests are exact)."""

    def __init__(
        self,
        rtt_ms: float = 0.0,
        uplink_mbps: float = 1e6,
        downlink_mbps: float = 1e6,
        jitter_ms: float = 0.0,
        loss: float = 0.0,
        rto_ms: float = MIN_RTO_MS,
        seed: int = 0,
    ) -> None:
        self.rtt_ms, self.uplink_mbps, self.downlink_mbps = rtt_ms, uplink_mbps, downlink_mbps
        self.jitter_ms, self.loss, self.rto_ms = jitter_ms, loss, rto_ms
        self._rng = np.random.default_rng(seed)

    def exchange_ms(self, up_bytes: int, down_bytes: int) -> float:
        t = self.rtt_ms + up_bytes * 8 / (self.uplink_mbps * 1e3) + down_bytes * 8 / (self.downlink_mbps * 1e3)
        t += abs(self._rng.normal(0.0, self.jitter_ms)) if self.jitter_ms else 0.0
        if self.loss and self._rng.random() < self.loss:
            t += self.rto_ms
        return t
