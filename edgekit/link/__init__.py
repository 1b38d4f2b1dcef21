"""The device's link to its verifier: the estimate of RTT, rates and loss
(WISV's CSI), the per-round latency model (WISV eqs. 3-10, 18-19), and the
policy that picks each round's upload (tokens, FH or SH) and window from them."""

from ._address import host_of, is_local
from ._estimator import MIN_RTO_MS, LinkEstimator, Pinger, ProbeResult, probe
from ._latency import CostTracker, LatencyModel, Overheads, PayloadModel, RoundPlan, varint_bits
from ._policy import LinkPolicy

__all__ = [
    "MIN_RTO_MS",
    "CostTracker",
    "LatencyModel",
    "LinkEstimator",
    "LinkPolicy",
    "Overheads",
    "PayloadModel",
    "Pinger",
    "ProbeResult",
    "RoundPlan",
    "host_of",
    "is_local",
    "probe",
    "varint_bits",
]
