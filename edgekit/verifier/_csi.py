"""The channel state (CSI) the semantic head sees, from the link state a device sends each round.

WISV conditions its decision head on CSI features (eq. 23) and its relabeling on a
scalar channel quality (sec. V-B). edgekit's link estimate (`LinkState`: RTT, its
jitter, uplink and downlink rates, loss) is what a device measures, so the CSI is
built from it:

- `round_cost_ms`: what one more round costs on this link: the RTT plus the
  serialisation of a reference FH round (8 draft rows of 896 fp16 values up,
  a verdict down), inflated by retransmissions at the loss rate (eq. 6's form).
- `channel_quality` q = exp(-round_cost_ms / 50 ms), in (0, 1]: 1 where a round
  is free, ~0.9 on a 500 Mbit/s, 5 ms link, ~0.33 on a 20 Mbit/s, 50 ms one.
- `csi_features`: [q, log10 of the uplink rate in Mbit/s, RTT in units of 100 ms,
  loss rate x 10], the head's CSI input (`CSI_FEATURES` names them).

A link that was never measured (no samples) reads as a free one: the head is
then as strict as it is on the best link.
"""

from __future__ import annotations

import math

import numpy as np

from ..protocol import LinkState

__all__ = ["CSI_FEATURES", "channel_quality", "csi_features", "round_cost_ms"]

CSI_FEATURES = ("quality", "log_uplink_mbps", "rtt_100ms", "loss_x10")
QUALITY_SCALE_MS = 50.0
_REF_UP_BYTES = 8 * 896 * 2 + 64  # a reference FH round: 8 rows of a 896-wide draft, fp16, and the block
_REF_DOWN_BYTES = 64
_MAX_LOSS = 0.5


def _measured(link: LinkState | None) -> bool:
    return link is not None and link.samples > 0 and link.uplink_mbps > 0


def round_cost_ms(link: LinkState | None) -> float:
    """Milliseconds one more round costs on the link (0 when it was never measured)."""
    if not _measured(link):
        return 0.0
    assert link is not None
    down = link.downlink_mbps if link.downlink_mbps > 0 else link.uplink_mbps
    serialise = 8 * _REF_UP_BYTES / (link.uplink_mbps * 1e3) + 8 * _REF_DOWN_BYTES / (down * 1e3)
    loss = min(max(link.loss_rate, 0.0), _MAX_LOSS)
    return (max(link.rtt_ms, 0.0) + serialise) / (1.0 - loss)


def channel_quality(link: LinkState | None) -> float:
    """WISV's scalar channel quality q in (0, 1]: higher is a better link."""
    return math.exp(-round_cost_ms(link) / QUALITY_SCALE_MS)


def csi_features(link: LinkState | None) -> np.ndarray:
    """The head's CSI input for one link state, float32 [len(CSI_FEATURES)]."""
    if not _measured(link):
        return np.array([1.0, 3.0, 0.0, 0.0], dtype=np.float32)  # as a free link: 1 Gbit/s, no delay, no loss
    assert link is not None
    return np.array(
        [
            channel_quality(link),
            math.log10(max(link.uplink_mbps, 1e-3)),
            max(link.rtt_ms, 0.0) / 100.0,
            min(max(link.loss_rate, 0.0), _MAX_LOSS) * 10.0,
        ],
        dtype=np.float32,
    )

