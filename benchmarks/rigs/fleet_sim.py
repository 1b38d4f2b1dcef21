"""The fleet simulator's parts: recorded drafting traces, and simulated devices that
replay them against a real verifier.

A trace is what a real draft model would propose on one prompt, recorded once:
the target's greedy output after the prompt (from the verifier's own target-only
decoding), and at every committed position of it the draft's greedy
continuation up to the maximum window, with the draft's logit features at each
step (what a rejection predictor reads) and the draft's measured step time.
In greedy mode every position a device can reach is a prefix of the target's
output, so a simulated device can replay any window policy exactly: its block
is the recorded continuation cut where the policy stops, its drafting time the
recorded step time times the steps (scaled by the device's speed factor), its
link time the RTT and its message sizes over its rates. The rounds themselves
are real: gRPC calls to the verifier. Each verdict is checked against what the
trace says the target accepts, and the committed text against the target's
output: that is the check that the replay is faithful.

Per response a device logs its achieved token speed (WISP eq. 4: committed
tokens over the response's time), its SLO class and whether it fell short; per
round the verifier's queue and verify time and whether its budget was met.
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from edgekit import ClientConfig
from edgekit.drafting import Controller, Decision, FixedWindow
from edgekit.protocol import BlockRequest, Fingerprint, GenerateRequest, OpenRequest, SpeedObjective
from edgekit.runtime import ALL_COLUMNS, DraftModel
from edgekit.transport import GrpcTransport

N_LOGIT_FEATURES = 4  # confidence, entropy, margin, logit_std: the rest are position and acceptance


# -- traces --------------------------------------------------------------------------------


@dataclass
class Trace:
    prompt: list[int]
    target: list[int]  # the target's greedy tokens after the prompt
    drafts: list[list[int]]  # drafts[i]: the draft's greedy continuation of prompt + target[:i]
    features: list[list[list[float]]]  # features[i][j]: the logit features of draft step j there
    step_ms: float  # the draft's median step time while recording

    def accepted(self, i: int, block: Sequence[int]) -> int:
        """How many of `block` the target accepts at position i (greedy)."""
        a = 0
        while a < len(block) and i + a < len(self.target) and block[a] == self.target[i + a]:
            a += 1
        return a


def record_trace(draft: DraftModel, prompt: list[int], target: list[int], window: int) -> Trace:
    """The draft's greedy continuation (and features) at every position of the target's output."""
    drafts, features, steps = [], [], []
    x = np.empty(len(ALL_COLUMNS), dtype=np.float32)
    draft.truncate(0)
    for i in range(len(target)):
        tokens = prompt + target[:i]
        draft.truncate(min(draft.n_past, len(tokens) - 1))
        feed = tokens[draft.n_past :]
        cont, feats = [], []
        for j in range(window):
            t0 = time.perf_counter()
            out = draft.eval(feed)
            if j:  # a one-token step, as a device drafts
                steps.append((time.perf_counter() - t0) * 1e3)
            tok = out.stats.argmax()
            out.stats.features_into(x, ALL_COLUMNS, j + 1, 0.0)
            cont.append(int(tok))
            feats.append([float(v) for v in x[:N_LOGIT_FEATURES]])
            feed = [tok]
        drafts.append(cont)
        features.append(feats)
    draft.truncate(0)
    return Trace(prompt, target, drafts, features, statistics.median(steps) if steps else 0.0)


def weakened(trace: Trace, p: float, n_vocab: int, seed: int = 0) -> Trace:
    """The trace as a weaker draft model would have drafted it: each drafted token is, with
    probability p, replaced by another (the next id), so the target accepts less of every
    block. A stand-in for a device with a smaller or coarser draft (GOODSPEED's clients
    draft with different models); the target's output, and so the verdicts, are unchanged."""
    rng = random.Random(seed)
    drafts = [[(t + 1) % n_vocab if rng.random() < p else t for t in cont] for cont in trace.drafts]
    return replace(trace, drafts=drafts)


def save_traces(path: Path, traces: Sequence[Trace], meta: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"meta": meta, "traces": [asdict(t) for t in traces]}))


def load_traces(path: Path) -> tuple[list[Trace], dict]:
    data = json.loads(path.read_text())
    return [Trace(**t) for t in data["traces"]], data["meta"]


class _RecordedStats:
    """A recorded draft step as a predictor reads it (`LogitStats`' two methods)."""

    __slots__ = ("_features", "_token")

    def __init__(self, token: int, features: Sequence[float]) -> None:
        self._token = token
        self._features = features

    def argmax(self) -> int:
        return self._token

    def features_into(self, x: np.ndarray, columns: bytes, position: int, recent_acceptance: float) -> None:
        row = [*self._features, float(position), float(recent_acceptance)]
        flat = x.reshape(-1)  # a predictor binds a [1, n] input
        for k, c in enumerate(columns):
            flat[k] = row[c]


class _RecordedStep:
    __slots__ = ("hidden", "stats")

    def __init__(self, token: int, features: Sequence[float]) -> None:
        self.stats = _RecordedStats(token, features)
        self.hidden = None


def draft_block(controller: Controller, trace: Trace, pos: int, k: int) -> tuple[list[int], int]:
    """The block a window policy drafts at `pos` (the recorded continuation, cut where the
    policy stops) and the draft steps it took (a stop decision costs the step it read)."""
    cont, feats = trace.drafts[pos], trace.features[pos]
    block: list[int] = []
    steps = 0
    for j in range(min(k, len(cont))):
        steps += 1
        decision = controller.draft_next(j + 1, _RecordedStep(cont[j], feats[j]))  # type: ignore[arg-type]
        if not decision:
            break
        block.append(cont[j])
        if decision == Decision.LAST:
            break
    return block, steps


# -- devices ------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeviceSpec:
    slo_class: str | None  # None: best effort
    speed: float | None  # the class's tokens/s (for violations); None: best effort
    speed_factor: float = 1.0  # drafting time x this (a slower device > 1)
    rtt_ms: float = 20.0
    uplink_mbps: float = 20.0
    downlink_mbps: float = 50.0
    # Which traces the device's prompts come from (indices; None: any), and from `switch_s` seconds
    # into the run on, `traces_after` (its prompts change kind: non-stationary acceptance).
    traces: tuple[int, ...] | None = None
    switch_s: float | None = None
    traces_after: tuple[int, ...] | None = None

    def pool(self, elapsed_s: float) -> tuple[int, ...] | None:
        """The traces this device draws from `elapsed_s` seconds into the run."""
        if self.switch_s is not None and elapsed_s >= self.switch_s and self.traces_after is not None:
            return self.traces_after
        return self.traces


@dataclass
class RoundLog:
    device: int
    t: float  # when the round's verdict came, seconds since the run started
    queue_ms: float
    verify_ms: float
    budget_ms: float | None
    deadline_met: bool | None
    drafted: int
    committed: int
    round_trip_ms: float = 0.0  # the verify call as the device saw it (queue, verify and loopback)
    draft_ms: float = 0.0  # the device's drafting time for the block
    link_ms: float = 0.0  # its modelled link time, both ways


@dataclass
class ResponseLog:
    device: int
    slo_class: str | None
    target_speed: float | None
    tokens: int
    seconds: float
    rounds: int
    started: float  # seconds since the run started
    mode: str

    @property
    def speed(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else math.inf

    @property
    def violated(self) -> bool:
        return self.target_speed is not None and self.speed < self.target_speed


class FaithfulnessError(AssertionError):
    """A verdict or a committed text that is not what the trace says the target does."""


@dataclass
class Fleet:
    """N simulated devices against the verifier at `address` until `duration` seconds pass.

    mode: "speculative" (sessions with prefix reuse), "reprefill" (SLED without a
    prefix cache: every round opens a session on the whole context), or
    "centralized" (target-only Generate streams). `controller` builds each
    device's window policy (fixed K, or a predictor) for speculative modes.
    `min_responses`: a device goes on past `duration` until it has finished that
    many responses (tests: every device finishes one, however long it took to start).
    `on_divergence`: what a verdict that leaves the recorded target output does. "fail" stops
    the device with a FaithfulnessError (a verifier with exact numerics that builds the KV as the
    recording did never diverges; SLED's re-prefill does not, see `fleet.run_fleet`); "end"
    ends that response where it diverged (the verifier's tokens up to there count) and counts it
    in `divergences`: for verifiers whose kernels depend on the batch (a GPU, fast numerics),
    where a near tie can go the other way in a batch than in the recording.
    `connect`: how a device reaches the verifier, `connect(i, config)` a transport (default: a
    `GrpcTransport` to `address`); handshakes then go one at a time (a stateless transport reads the
    shared draft's tokenizer while it checks it). `trace_order`: "random" (each response draws one),
    or "unique" (the devices take the traces in turn, so no two responses share a context while
    traces last, then start over, counted in `traces_reused`): for a verifier whose prefix cache
    would otherwise serve one device what another computed. `cut_at_end`: a response still going
    when `duration` passes stops there (a slow verifier would otherwise hold the run for whole traces).
    """

    address: str
    draft_fingerprint: Fingerprint  # the devices' draft tokenizer (the recording draft's)
    traces: Sequence[Trace]
    specs: Sequence[DeviceSpec]
    mode: str = "speculative"
    controller: Callable[[], Controller] = field(default=lambda: FixedWindow(4))
    duration: float = 30.0
    max_window: int = 8
    seed: int = 0
    token: str | None = None
    timeout: float = 120.0
    min_responses: int = 0
    on_divergence: str = "fail"
    connect: Callable[[int, ClientConfig], Any] | None = None
    trace_order: str = "random"
    cut_at_end: bool = False
    divergences: int = 0
    traces_reused: int = 0
    rounds: list[RoundLog] = field(default_factory=list)
    responses: list[ResponseLog] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def run(self) -> Fleet:
        self._lock = threading.Lock()
        self._handshake = threading.Lock()
        self._next_trace = 0
        self._t0 = time.perf_counter()
        self._end = self._t0 + self.duration
        threads = [threading.Thread(target=self._device, args=(i,), daemon=True) for i in range(len(self.specs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(self.duration + self.timeout + 60)
        return self

    def _device(self, i: int) -> None:
        spec = self.specs[i]
        rng = random.Random(self.seed * 1000 + i)
        time.sleep(rng.uniform(0, 0.5))  # devices do not start in lockstep
        # each device its own client id: a proxy in front of several verifiers hashes on it
        config = ClientConfig(timeout=self.timeout, token=self.token, client_id=f"device-{i}")
        try:
            transport = GrpcTransport(self.address, config) if self.connect is None else self.connect(i, config)
            with contextlib.closing(transport):
                if self.connect is None:
                    transport.handshake(self.draft_fingerprint, draft_model="fleet", draft_hidden_size=0)
                else:
                    with self._handshake:
                        transport.handshake(self.draft_fingerprint, draft_model="fleet", draft_hidden_size=0)
                done = 0
                while time.perf_counter() < self._end or done < self.min_responses:
                    trace = self._trace(spec, rng)
                    if self.mode == "centralized":
                        self._centralized(i, spec, transport, trace)
                    else:
                        self._speculative(i, spec, transport, trace)
                    done += 1
        except FaithfulnessError as exc:
            with self._lock:
                self.errors.append(f"device {i}: {exc}")
        except Exception as exc:  # a device that stops for any reason is reported, never silently lost
            with self._lock:
                self.errors.append(f"device {i}: {type(exc).__name__}: {exc}")

    def _trace(self, spec: DeviceSpec, rng: random.Random) -> Trace:
        if self.trace_order == "unique":
            with self._lock:
                k, self._next_trace = self._next_trace, self._next_trace + 1
                self.traces_reused += k >= len(self.traces)
            return self.traces[k % len(self.traces)]
        pool = spec.pool(time.perf_counter() - self._t0)
        return self.traces[rng.choice(pool)] if pool else rng.choice(self.traces)

    def _link_ms(self, spec: DeviceSpec, up_bytes: int, down_bytes: int) -> float:
        return spec.rtt_ms + up_bytes * 8 / (spec.uplink_mbps * 1e3) + down_bytes * 8 / (spec.downlink_mbps * 1e3)

    def _speculative(self, i: int, spec: DeviceSpec, transport: GrpcTransport, trace: Trace) -> None:
        slo = SpeedObjective(spec.slo_class)
        controller = self.controller()
        started = time.perf_counter()
        pos, rounds, budget = 0, 0, 0
        sid = None
        base = len(trace.prompt)
        link_ms = self._link_ms(spec, 4 * base, 64)
        if self.mode == "speculative":
            opened = transport.open_session(OpenRequest(trace.prompt, mode="greedy", seed=0, slo=slo,
                                            draft=self.draft_fingerprint, client_id=f"device-{i}"))
            sid, budget = opened.session_id, opened.next_budget
        try:
            while pos < len(trace.target):
                if self.cut_at_end and time.perf_counter() > self._end:
                    break
                limit = min(self.max_window, len(trace.target) - pos)
                if budget:
                    limit = min(limit, budget)
                block, steps = draft_block(controller, trace, pos, controller.window(limit))
                draft_ms = steps * trace.step_ms * spec.speed_factor
                time.sleep(draft_ms / 1e3)
                context = trace.prompt + trace.target[:pos]
                up = 4 * len(block) + 32 + (4 * len(context) if self.mode == "reprefill" else 0)
                net_ms = self._link_ms(spec, up, 32)
                time.sleep(net_ms / 2e3)
                if self.mode == "reprefill":  # SLED without a prefix cache: the whole context, every round
                    opened = transport.open_session(
                        OpenRequest(context, mode="greedy", seed=0, slo=slo,
                                    draft=self.draft_fingerprint, client_id=f"device-{i}")
                    )
                    sid = opened.session_id
                assert sid is not None
                t_call = time.perf_counter()
                v = transport.verify(BlockRequest(sid, base + pos, block, round_index=rounds, draft_ms=draft_ms,
                                                  network_ms=link_ms))
                call_ms = (time.perf_counter() - t_call) * 1e3
                if self.mode == "reprefill":
                    transport.close_session(sid)
                time.sleep(net_ms / 2e3)
                link_ms = net_ms
                expected = trace.accepted(pos, block)
                nxt = trace.target[pos + expected] if pos + expected < len(trace.target) else None
                diverged = v.accepted != expected or (nxt is not None and v.next_token != nxt)
                if diverged and self.on_divergence == "end":
                    with self._lock:
                        self.divergences += 1
                    pos += v.accepted + 1  # what this verifier committed
                    break
                if diverged:
                    raise FaithfulnessError(
                        f"at position {pos} of a trace the verifier accepted {v.accepted} and sent {v.next_token}; "
                        f"the trace says {expected} and {nxt}"
                    )
                controller.observe(len(block), v.accepted)
                budget = v.next_budget
                committed = v.accepted + 1
                pos += committed
                rounds += 1
                with self._lock:
                    f = v.server
                    self.rounds.append(RoundLog(i, time.perf_counter() - self._t0, f.queue_ms, f.verify_ms,
                                                f.budget_ms, f.deadline_met, len(block), committed, call_ms,
                                                draft_ms, net_ms))
        finally:
            if sid is not None and self.mode == "speculative":
                transport.close_session(sid)
        self._response(i, spec, min(pos, len(trace.target)), started, rounds)

    def _centralized(self, i: int, spec: DeviceSpec, transport: GrpcTransport, trace: Trace) -> None:
        started = time.perf_counter()
        time.sleep(self._link_ms(spec, 4 * len(trace.prompt), 0) / 2e3)
        out = [t.token for t in transport.generate(GenerateRequest(
            trace.prompt, "greedy", seed=0, max_tokens=len(trace.target), slo=SpeedObjective(spec.slo_class)))]
        time.sleep(spec.rtt_ms / 2e3)
        if out != trace.target[: len(out)]:
            if self.on_divergence != "end":
                raise FaithfulnessError("target-only decoding differs from the recorded target output")
            with self._lock:
                self.divergences += 1
        self._response(i, spec, len(out), started, len(out), mode="centralized")

    def _response(self, i: int, spec: DeviceSpec, tokens: int, started: float, rounds: int,
                  mode: str | None = None) -> None:
        now = time.perf_counter()
        if now > self._end + self.timeout:
            return
        with self._lock:
            self.responses.append(ResponseLog(i, spec.slo_class, spec.speed, tokens, now - started, rounds,
                                              started - self._t0, mode or self.mode))

    # -- figures ----------------------------------------------------------------------------

    def summary(self, warmup: float = 0.0) -> dict:
        """Per class: responses, violation rate, mean achieved speed; goodput over the run."""
        done = [r for r in self.responses if r.started >= warmup]
        classes: dict[str, dict] = {}
        for name in sorted({r.slo_class or "best-effort" for r in done}):
            rs = [r for r in done if (r.slo_class or "best-effort") == name]
            classes[name] = {
                "responses": len(rs),
                "violation_rate": sum(r.violated for r in rs) / len(rs),
                "mean_speed": statistics.fmean(r.speed for r in rs),
                "target_speed": rs[0].target_speed,
            }
        window = [r for r in self.rounds if r.t >= warmup]
        span = max(self.duration - warmup, 1e-9)
        committed = sum(r.committed for r in window) if self.mode != "centralized" else sum(
            r.tokens for r in done)
        return {
            "classes": classes,
            "goodput_tokens_per_s": committed / span,
            "responses": len(done),
            "rounds": len(window),
            "errors": list(self.errors),
            "divergences": self.divergences,
        }
