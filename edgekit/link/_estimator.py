"""The device's view of its link to the verifier (WISV's CSI, sec. III-B).

`LinkEstimator` keeps a smoothed RTT and its jitter (RFC 6298's SRTT and
RTTVAR), uplink and downlink rates, and a loss estimate. It is fed actively by
`probe()` (timed pings: empty ones for the RTT, ones carrying a payload each
way for the rates) and passively by every exchange of a round: its network time
is its client-side round trip minus the verifier's reported queue and compute
time and the payloads' serialization; large uploads (FH) also time the uplink.

Rates come from the extra time a payload takes over an empty ping of the same
moment (bits / (t_payload - t_empty)), the fastest of several tries, so that
queueing noise does not read as a slow link. Loss: gRPC runs over TCP, so a
lost segment shows up as a retransmission delay of at least the minimum RTO
(200 ms on Linux) over the path's base RTT; the estimate is the smoothed
fraction of samples delayed that much.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Protocol

from ..errors import ProtocolError, VerifierUnavailableError
from ..protocol import LinkState

__all__ = ["MIN_RTO_MS", "LinkEstimator", "Pinger", "ProbeResult", "probe"]

MIN_RTO_MS = 200.0  # Linux's minimum TCP retransmission timeout
RATE_SAMPLE_BYTES = 4 * 1024  # an upload this large times the uplink passively
MIN_TIMED_MS = 2.0  # a payload's extra time below this is mostly noise: probe with a larger one


class LinkEstimator:
    """The device's running estimate of its link (see this module): smoothed RTT and jitter
    (`alpha`, `beta`: RFC 6298's gains), rates each way and loss (`loss_alpha`), fed by `probe`
    and by every round. `state()` is the `LinkState` the latency model and uploads read."""

    def __init__(self, *, alpha: float = 1 / 8, beta: float = 1 / 4, loss_alpha: float = 1 / 16) -> None:
        self.alpha, self.beta, self.loss_alpha = alpha, beta, loss_alpha
        self.srtt_ms: float | None = None
        self.rttvar_ms = 0.0
        self.min_rtt_ms: float | None = None
        self.uplink_mbps = 0.0
        self.downlink_mbps = 0.0
        self.loss_rate = 0.0
        self.samples = 0
        self.probed = False  # whether probe() has measured with it (rates that stay 0 are then unmeasurable)

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

    def add_exchange(self, round_trip_ms: float, server_ms: float, up_bytes: int = 0, down_bytes: int = 0) -> None:
        """A request and its answer (a verification round, or half of an SH one).

        Its RTT sample is the round trip less the server's time and the payloads'
        serialization at the current rates. An upload large enough to take
        clearly longer than the RTT's noise is also an uplink rate sample."""
        network = max(round_trip_ms - server_ms, 0.0)
        serial = self._serial_ms(up_bytes, self.uplink_mbps) + self._serial_ms(down_bytes, self.downlink_mbps)
        if self.srtt_ms is not None and up_bytes >= RATE_SAMPLE_BYTES:
            extra = network - self._serial_ms(down_bytes, self.downlink_mbps) - self.srtt_ms
            if extra > max(1.0, 2 * self.rttvar_ms) and network < self.srtt_ms + MIN_RTO_MS:
                mbps = up_bytes * 8 / (extra * 1e3)
                old = self.uplink_mbps
                self.uplink_mbps = mbps if not old else old + self.beta * (mbps - old)
        self.add_rtt(max(network - serial, 0.0))

    @staticmethod
    def _serial_ms(nbytes: int, mbps: float) -> float:
        return nbytes * 8 / (mbps * 1e3) if mbps > 0 and nbytes else 0.0

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


class Pinger(Protocol):
    """What probing needs of a transport: timed echoes."""

    def ping(self, payload_bytes: int = 0, reply_bytes: int = 0) -> float: ...


@dataclass(frozen=True)
class ProbeResult:
    """What `probe` measured: the link as estimated after it, how many pings it took, and how long."""

    link: LinkState
    pings: int
    seconds: float


def probe(
    transport: Pinger,
    estimator: LinkEstimator | None = None,
    *,
    pings: int = 5,
    payload_bytes: int = 256 * 1024,
    tries: int = 3,
    max_payload_bytes: int = 8 * 1024 * 1024,
) -> ProbeResult:
    """Measures the link with pings: `pings` empty ones, then `tries` pairs of an
    empty ping and a payload each way; a payload's extra time is its quickest
    exchange's over the quickest empty one's (each the least delayed by queueing).
    A payload that takes too little extra time
    to tell from the RTT's noise is made 4x larger, up to `max_payload_bytes`
    (and the verifier's message limit). Each ping has the transport's deadline; a
    dead or silent verifier raises the transport's error within it."""
    est = estimator or LinkEstimator()
    t0 = time.perf_counter()
    n = 0
    empties: list[float] = []
    for _ in range(pings):
        empties.append(transport.ping())
        est.add_rtt(empties[-1])
        n += 1
    directions = ("up", "down") if getattr(transport, "can_time_payloads", True) else ()
    for direction in directions:  # a server without an echo endpoint: RTT only
        size = payload_bytes
        measured: tuple[int, float] | None = None  # the last size timed, and its extra time
        while True:
            kwargs = {"payload_bytes": size} if direction == "up" else {"reply_bytes": size}
            fastest = None  # the quickest loaded exchange: the least queueing on top of its transfer
            for _ in range(tries):
                empty = transport.ping()
                n += 1
                est.add_rtt(empty)
                empties.append(empty)
                try:
                    loaded = transport.ping(**kwargs)
                except ProtocolError:
                    if measured is None:
                        raise
                    break  # past the verifier's limit on a ping's payload: the last size measured stands
                except VerifierUnavailableError as exc:
                    raise VerifierUnavailableError(
                        f"{exc}; empty pings took {empty:.0f} ms but a {size // 1024} KiB payload "
                        f"{'up' if direction == 'up' else 'down'} did not cross in time: a very slow link, or "
                        "probe with a smaller payload",
                        address=exc.address,
                        code=exc.code,
                    ) from None
                n += 1
                fastest = loaded if fastest is None or loaded < fastest else fastest
            if fastest is None:
                assert measured is not None
                size, best = measured
                break
            # Against the quickest empty exchange of the whole probe, not the one just before: on a
            # link whose RTT jitters by more than the payload takes, an empty ping that queued made
            # every pair's difference negative (no rate at all), where the two minima each shed it.
            best = fastest - min(empties)
            noise = statistics.pstdev(empties) if len(empties) > 1 else 0.0
            if best >= max(MIN_TIMED_MS, 3 * noise) or size * 4 > max_payload_bytes:
                break
            measured = (size, best)
            size *= 4
        est.set_rate(direction, size, best)
    est.probed = True
    return ProbeResult(est.state(), n, time.perf_counter() - t0)
