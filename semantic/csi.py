"""Links to train the semantic head on (`sample_links`); the CSI it sees of each is the
verifier's (`edgekit.verifier.csi_features`)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from edgekit.protocol import LinkState

__all__ = ["sample_links"]

def sample_links(n: int, rng: np.random.Generator) -> Sequence[LinkState]:
    """n link states spanning what devices meet: rates 2-1000 Mbit/s and RTTs 1-200 ms
    (both log-uniform), loss 0-5% (none in a third of draws)."""
    out = []
    for _ in range(n):
        rate = float(10 ** rng.uniform(math.log10(2), 3))
        rtt = float(10 ** rng.uniform(0, math.log10(200)))
        loss = 0.0 if rng.random() < 1 / 3 else float(rng.uniform(0, 0.05))
        out.append(LinkState(rtt_ms=rtt, uplink_mbps=rate, downlink_mbps=rate, loss_rate=loss, samples=8))
    return out
