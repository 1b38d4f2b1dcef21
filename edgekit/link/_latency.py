"""The per-round latency model: payload sizes (WISV eqs. 3-10), compute, and the
choices made with it: FH or SH for a block, and the draft window.

Payloads, in bits, for a block of K draft tokens of which m are mismatches:

    B_h   = d * b_h                          (3)  one hidden row
    F     = b_pos + b_tok + O_dl             (4)  the verdict
    U_FH  = K * b_tok + K * B_h + O_ul       (5)  FH: tokens and every row
    U_SH1 = K * b_tok + O_ul                 (7)  SH: tokens first
    D_req = m * b_pos + O_dl                 (8)  SH: the verifier's request
    U_SH2 = m * B_h + O_ul                   (9)  SH: the requested rows

Our encoding: token ids and offsets are protobuf varints, so b_tok is the
varint width of the vocabulary's largest id (24 bits below 2^21) and b_pos 8
bits (offsets below 128); b_h is 16 for fp16, 8 + 32/d for int8 (a float32
scale per row). O_ul and O_dl are each message's fixed fields plus gRPC and
HTTP/2 framing (`Overheads`; measured in `benchmarks/link_sweep.py`).

Time of a round (eqs. 6, 10, 18, 19), with R the measured rates, RTT the
smoothed round trip, and T_loss = loss x RTO the expected retransmission delay
of one exchange:

    FH: T_draft(K) + U_FH/R_ul + F/R_dl + RTT + T_loss + T_verify(K)
    SH: T_draft(K) + U_SH1/R_ul + T_verify(K) + RTT + T_loss
        + [m > 0] (D_req/R_dl + U_SH2/R_ul + RTT + T_loss) + F/R_dl

Two departures from the paper, both measured facts of this system: our
verifier answers a block without mismatches at once, so SH's second exchange
is paid with probability 1 - p^K only; and gRPC runs over TCP, where a lost
segment costs a retransmission timeout per exchange rather than stretching
serialization by 1/(1-PER), so loss is charged per exchange.

Committed tokens per round with per-token acceptance p: (1 - p^(K+1)) / (1 - p)
(accepted plus the correction or bonus), so time per committed token is U-shaped
in K (WISV sec. VII-B): short windows pay the round trip often, long ones draft
and upload tokens that are thrown away.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

from ..protocol import LinkState, bits_per_element
from ._estimator import MIN_RTO_MS

__all__ = ["CostTracker", "LatencyModel", "Overheads", "PayloadModel", "RoundPlan", "varint_bits"]


def varint_bits(value: int) -> int:
    """Bits of a protobuf varint holding `value` (non-negative)."""
    return 8 * max(1, math.ceil(max(value, 1).bit_length() / 7))


@dataclass(frozen=True)
class Overheads:
    """Fixed bits per message (O_ul, O_dl of WISV): protobuf fields that do not
    grow with the block (session id, base, link state, timings) plus the gRPC
    length prefix and HTTP/2 frame headers. Defaults: measured on the wire in
    `benchmarks/link_sweep.py` for this protocol (gRPC over h2c, HPACK warm)."""

    uplink_bits: float = 8 * 200
    downlink_bits: float = 8 * 80


@dataclass(frozen=True)
class PayloadModel:
    hidden_dim: int  # d: the draft model's hidden size
    encoding: str = "fp16"
    token_bits: float = 24.0  # b_tok
    position_bits: float = 8.0  # b_pos
    overheads: Overheads = Overheads()

    @classmethod
    def for_models(
        cls, hidden_dim: int, n_vocab: int, encoding: str = "fp16", overheads: Overheads | None = None
    ) -> PayloadModel:
        return cls(hidden_dim, encoding, float(varint_bits(n_vocab - 1)), 8.0, overheads or Overheads())

    def hidden_row(self) -> float:  # (3)
        return self.hidden_dim * bits_per_element(self.encoding, self.hidden_dim)

    def feedback(self) -> float:  # (4)
        return self.position_bits + self.token_bits + self.overheads.downlink_bits

    def fh_uplink(self, k: int) -> float:  # (5)
        return k * self.token_bits + k * self.hidden_row() + self.overheads.uplink_bits

    def tokens_uplink(self, k: int) -> float:  # (7), also the tokens-only upload
        return k * self.token_bits + self.overheads.uplink_bits

    def sh_request(self, m: float) -> float:  # (8)
        return m * self.position_bits + self.overheads.downlink_bits

    def sh_hidden_uplink(self, m: float) -> float:  # (9)
        return m * self.hidden_row() + self.overheads.uplink_bits


class CostTracker:
    """Running estimates of what a round costs besides the link: draft time per
    step, verification time as a + b (K+1), per-token acceptance p, and how
    many positions after the first mismatch also mismatch (q). Old rounds fade
    (`decay` per round), so the estimates follow the text being written. A client
    keeps one per mode across its sessions (`rounds`: how many it has observed), which may run
    at once: an observation and a read of the verify line are each whole."""

    def __init__(
        self,
        *,
        draft_step_ms: float = 10.0,
        verify_ms: tuple[float, float] = (10.0, 5.0),
        acceptance: float = 0.7,
        mismatch_density: float = 0.5,
        decay: float = 0.95,
        prior_rounds: float = 4.0,
    ) -> None:
        self.decay = decay
        self.rounds = 0  # rounds observed (the priors aside)
        self._lock = threading.Lock()
        w = prior_rounds
        self._step = [draft_step_ms * w, w]  # sum of ms, sum of steps
        # p: accepted tokens over accepted tokens plus rejections (a geometric MLE, censored at K).
        self._acc = [acceptance * w, (1 - acceptance) * w]
        self._q = [mismatch_density * w, w]
        # Least squares of verify_ms on n = K + 1, with forgetting; the prior is two points on the prior line.
        a, b = verify_ms
        self._ls = [0.0] * 5  # sum w, sum w n, sum w n^2, sum w y, sum w n y
        for n in (1.0, 9.0):
            self._add_ls(n, a + b * n, w / 2)

    def _add_ls(self, n: float, y: float, w: float = 1.0) -> None:
        s = self._ls
        s[0] += w
        s[1] += w * n
        s[2] += w * n * n
        s[3] += w * y
        s[4] += w * n * y

    def observe(
        self,
        *,
        drafted: int,
        accepted: int,
        draft_ms: float,
        draft_steps: int,
        verify_ms: float,
        mismatches: int | None = None,
    ) -> None:
        with self._lock:
            self._observe(drafted, accepted, draft_ms, draft_steps, verify_ms, mismatches)

    def _observe(self, drafted: int, accepted: int, draft_ms: float, draft_steps: int, verify_ms: float,
                 mismatches: int | None) -> None:
        self.rounds += 1
        d = self.decay
        for acc in (self._step, self._acc, self._q):
            acc[0] *= d
            acc[1] *= d
        self._ls = [v * d for v in self._ls]
        if draft_steps:
            self._step[0] += draft_ms
            self._step[1] += draft_steps
        self._acc[0] += accepted
        self._acc[1] += accepted < drafted
        self._add_ls(drafted + 1.0, verify_ms)
        after = drafted - accepted - 1  # positions after the first mismatch
        if mismatches is not None and mismatches > 0 and after > 0:
            self._q[0] += (mismatches - 1) / after
            self._q[1] += 1

    @property
    def draft_step_ms(self) -> float:
        return self._step[0] / self._step[1]

    @property
    def acceptance(self) -> float:
        a, r = self._acc
        return min(a / (a + r), 0.995) if a + r > 0 else 0.7

    @property
    def mismatch_density(self) -> float:
        return self._q[0] / self._q[1]

    def verify_line(self) -> tuple[float, float]:
        """(a, b) of verify_ms = a + b (K+1); b >= 0."""
        with self._lock:
            sw, sn, snn, sy, sny = self._ls
        var = snn * sw - sn * sn
        if var <= 1e-9 * max(sw * sw, 1.0):
            return 0.0, max(sy / sn, 0.0) if sn else 0.0
        b = max((sny * sw - sn * sy) / var, 0.0)
        return max((sy - b * sn) / sw, 0.0), b

    def verify_ms(self, k: int) -> float:
        a, b = self.verify_line()
        return a + b * (k + 1)


@dataclass(frozen=True)
class RoundPlan:
    """The latency model's choice for a round: its upload, its window, and the time it expects the
    round to take, in all and per committed token."""

    upload: str  # "tokens", "fh" or "sh"
    window: int
    expected_ms: float  # the model's time for the round
    per_token_ms: float  # ... per committed token


class LatencyModel:
    """Expected round time and time per committed token, from a link state,
    a payload model and the cost tracker's estimates."""

    def __init__(self, payload: PayloadModel, link: LinkState, costs: CostTracker) -> None:
        self.payload, self.link, self.costs = payload, link, costs

    def _up_ms(self, bits: float) -> float:
        r = self.link.uplink_mbps
        return bits / (r * 1e3) if r > 0 else 0.0

    def _down_ms(self, bits: float) -> float:
        r = self.link.downlink_mbps
        return bits / (r * 1e3) if r > 0 else 0.0

    def _exchange_ms(self) -> float:
        """Round trip plus the expected retransmission delay of one exchange."""
        rto = max(MIN_RTO_MS, self.link.rtt_ms + 4 * self.link.rtt_jitter_ms)
        return self.link.rtt_ms + self.link.loss_rate * rto

    def comm_ms(self, k: int, upload: str) -> float:
        """Expected communication time of a round (eqs. 6 and 10, as above)."""
        pm = self.payload
        feedback = self._down_ms(pm.feedback())
        if upload == "tokens":
            return self._up_ms(pm.tokens_uplink(k)) + feedback + self._exchange_ms()
        if upload == "fh":
            return self._up_ms(pm.fh_uplink(k)) + feedback + self._exchange_ms()
        if upload == "sh":
            p_some, m = self.expected_mismatches(k)
            second = self._down_ms(pm.sh_request(m)) + self._up_ms(pm.sh_hidden_uplink(m)) + self._exchange_ms()
            return self._up_ms(pm.tokens_uplink(k)) + self._exchange_ms() + feedback + p_some * second
        raise ValueError(f"unknown upload {upload!r}")

    def expected_mismatches(self, k: int) -> tuple[float, float]:
        """(P(m > 0), E[m | m > 0]) for a block of k: the first mismatch is at
        offset j with probability p^j (1 - p); each later offset mismatches with
        probability q."""
        p, q = self.costs.acceptance, self.costs.mismatch_density
        if k <= 0:
            return 0.0, 0.0
        p_some = 1.0 - p**k
        if p_some <= 0:
            return 0.0, 0.0
        mean = sum(p**j * (1 - p) * (1 + q * (k - j - 1)) for j in range(k)) / p_some
        return p_some, mean

    def round_ms(self, k: int, upload: str) -> float:
        c = self.costs
        return c.draft_step_ms * k + self.comm_ms(k, upload) + c.verify_ms(k)

    def committed_per_round(self, k: int) -> float:
        p = self.costs.acceptance
        return (1 - p ** (k + 1)) / (1 - p)

    def per_token_ms(self, k: int, upload: str) -> float:
        return self.round_ms(k, upload) / self.committed_per_round(k)

    def choose_upload(self, k: int, options: tuple[str, ...] = ("fh", "sh")) -> str:
        return min(options, key=lambda u: self.round_ms(k, u))

    def plan(self, max_window: int, options: tuple[str, ...] = ("fh", "sh"), *, window: int | None = None) -> RoundPlan:
        """The upload (among `options`) and the window in 1..max_window with the
        least expected time per committed token; `window` fixes the window."""
        windows = [window] if window is not None else range(1, max(max_window, 1) + 1)
        best: RoundPlan | None = None
        for k in windows:
            u = self.choose_upload(k, options)
            per = self.per_token_ms(k, u)
            if best is None or per < best.per_token_ms:
                best = RoundPlan(u, k, self.round_ms(k, u), per)
        assert best is not None
        return best
