"""The device's view of its link to the verifier (WISV's CSI, sec. III-B).

`LinkEstimator` keeps a smoothed RTT and its jitter (RFC 6298's SRTT and
RTTVAR), uplink and downlink rates, and a loss estimate. It is fed actively by
`probe()` (timed pings: empty ones for the RTT, ones carrying a payload each
way for the rates) and passively by every round: a round's network time is its
client-side round trip minus the verifier's reported queue and compute time.

Rates come from the extra time a payload takes over an empty ping of the same
moment (bits / (t_payload - t_empty)), the fastest of several tries, so that
queueing noise does not read as a slow link. Loss: gRPC runs over TCP, so a
lost segment shows up as a retransmission delay of at least the minimum RTO
(200 ms on Linux) over the path's base RTT; the estimate is the smoothed
fraction of samples delayed that much.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from .transport._base import LinkState

__all__ = ["LinkEstimator", "ProbeResult", "probe"]

MIN_RTO_MS = 200.0


class LinkEstimator:
    def __init__(self, *, alpha: float = 1 / 8, beta: float = 1 / 4, loss_alpha: float = 1 / 16) -> None:
        self.alpha, self.beta, self.loss_alpha = alpha, beta, loss_alpha
        self.srtt_ms: float | None = None
        self.rttvar_ms = 0.0
        self.min_rtt_ms: float | None = None
        self.uplink_mbps = 0.0
        self.downlink_mbps = 0.0
        self.loss_rate = 0.0
        self.samples = 0

    def add_rtt(self, ms: float) -> None:
        """One round-trip sample (RFC 6298 smoothing; also judges retransmission)."""
        if ms < 0:
            raise ValueError(f"a round trip cannot take {ms} ms")
        self.samples += 1
        if self.min_rtt_ms is None or ms < self.min_rtt_ms:
            self.min_rtt_ms = ms
        delayed = ms >= self.min_rtt_ms + MIN_RTO_MS
        self.loss_rate += self.loss_alpha * (float(delayed) - self.loss_rate)
        if delayed:
            return  # a retransmission says nothing about the path's delay: keep it out of SRTT
        if self.srtt_ms is None:
            self.srtt_ms, self.rttvar_ms = ms, ms / 2
        else:
            self.rttvar_ms = (1 - self.beta) * self.rttvar_ms + self.beta * abs(self.srtt_ms - ms)
            self.srtt_ms = (1 - self.alpha) * self.srtt_ms + self.alpha * ms

    def add_round(self, round_trip_ms: float, server_ms: float) -> None:
        """A verification round: its network time is the round trip minus the server's time."""
        self.add_rtt(max(round_trip_ms - server_ms, 0.0))

    def set_rate(self, direction: str, nbytes: int, extra_ms: float) -> None:
        """A rate sample: `nbytes` took `extra_ms` more than an empty exchange."""
        if extra_ms <= 0:
            return  # below timer resolution: no information
        mbps = nbytes * 8 / (extra_ms * 1e3)
        if direction == "up":
            self.uplink_mbps = mbps
        elif direction == "down":
            self.downlink_mbps = mbps
        else:
            raise ValueError(f"direction must be 'up' or 'down', got {direction!r}")

    def state(self) -> LinkState:
        return LinkState(
            rtt_ms=self.srtt_ms or 0.0,
            rtt_jitter_ms=self.rttvar_ms,
            uplink_mbps=self.uplink_mbps,
            downlink_mbps=self.downlink_mbps,
            loss_rate=self.loss_rate,
            samples=self.samples,
        )


@dataclass(frozen=True)
class ProbeResult:
    link: LinkState
    pings: int
    seconds: float


def probe(
    transport,  # a VerifierTransport with ping(payload_bytes, reply_bytes) -> ms
    estimator: LinkEstimator | None = None,
    *,
    pings: int = 5,
    payload_bytes: int = 256 * 1024,
    tries: int = 3,
) -> ProbeResult:
    """Measures the link with pings: `pings` empty ones, then `tries` pairs of an
    empty ping and a payload each way. Each ping has the transport's deadline;
    a dead or silent verifier raises the transport's error within it."""
    est = estimator or LinkEstimator()
    t0 = time.perf_counter()
    n = 0
    for _ in range(pings):
        est.add_rtt(transport.ping())
        n += 1
    for direction, kwargs in (("up", {"payload_bytes": payload_bytes}), ("down", {"reply_bytes": payload_bytes})):
        best = None
        for _ in range(tries):
            empty = transport.ping()
            loaded = transport.ping(**kwargs)
            n += 2
            est.add_rtt(empty)
            extra = loaded - empty
            best = extra if best is None or extra < best else best
        if best is not None:
            est.set_rate(direction, payload_bytes, best)
    return ProbeResult(est.state(), n, time.perf_counter() - t0)
