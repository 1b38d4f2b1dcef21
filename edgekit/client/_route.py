"""`RouteChooser`: whether an "auto" generation drafts, or has the verifier decode it all.

Speculation pays where drafting a token costs less than the target's step it saves and the
link's round trips. Where the verifier's target decodes faster than the device can draft and
verify (a GPU verifier, a draft as large as its target, a long round trip), the fastest answer
is the verifier's target-only stream: one round trip for the whole answer, then the target's
own pace. Inside a generation `PlainWhenFaster` can only turn drafting off for rounds that
still pay a round trip per token; this chooses between the two ways of generating, per mode,
from what this client measured them to cost (milliseconds per output token, as the user saw
them), so links, verifier load and prompts it has not seen are all in the figure.

The first generation of a mode drafts (but see below); the next one it streams, to measure the
stream; then
the faster by `margin` is taken, and after `explore_every` generations the other once, so
that a changed link or verifier load is noticed. Each try that finds the other way still
slower doubles the wait before the next (up to `max_explore_every`): on a 200 ms link a
drafted answer took 2.7x a streamed one, and one in 8 drafted made a client 44% slower than
streaming alone (benchmarks/side_by_side.py). A try that finds it faster switches, and the
wait starts again from `explore_every`. Short answers (under `min_tokens`) do not count:
their time is mostly the prompt's. Both ways are lossless.

Where drafting cannot win, it is tried only every `max_explore_every` generations. Every
token a speculative generation commits is a draft token the device made (at least `t_d`: the
draft's measured cost per token, halved where proactive drafting overlaps it with a round) or
one a verification round added (at least a verifier step and a round trip, which the stream
pays once per answer): so while the stream's measured time per token is under `t_d` by the
margin, no acceptance rate makes drafting faster. On an H200 the stream ran at ~2-4 ms a token
and the device drafted at ~10 on one CPU core: three drafted tries in 36 answers made `auto`
1.0-2.3x slower than the stream (benchmarks/results/gpu). The test is made on the newest
measurements, so a stream that slows (a loaded verifier) brings the tries back.

Before anything was measured, a verifier that says what a target step takes
(`ServerInfo.decode_step_ms`) and the device's own draft step (`expect`) can settle the first
answer: where the step is under the draft's by the margin, drafting is dominated from the start,
and the first answer streams. Its measured time then stands in for the step, and the first
drafted try waits `max_explore_every` generations, as for a dominated draft. On an H100 the
first answer's drafting made `auto` 1.58x centralized decoding over 8 prompts
(benchmarks/results/gpu/gpu_suite_h100_run1.json). Where the two steps are close, that test is
the machine's noise: `ClientConfig.first_route` pins the first answer's route instead (the
client calls `expect_dominated` for "target-only", and expects nothing for "speculative").
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ..config import GenerationConfig
from ._events import Event, FinalStats

__all__ = ["SPECULATIVE", "STREAM", "RouteChooser", "may_stream"]

SPECULATIVE = "speculative"
STREAM = "target-only"


@dataclass
class _Route:
    ms_per_token: float | None = None  # smoothed
    runs: int = 0  # generations measured
    # smoothed, the least a draft token adds to an answer's time (speculative only; see observe)
    draft_ms_per_token: float | None = None


class RouteChooser:
    def __init__(self, *, margin: float = 1.1, explore_every: int = 8, max_explore_every: int = 256,
                 min_tokens: int = 8, smoothing: float = 0.5) -> None:
        self.margin = margin  # the other way must be this much slower to be left (less flapping on noise)
        self.explore_every = explore_every
        self.max_explore_every = max_explore_every
        self.min_tokens = min_tokens
        self.smoothing = smoothing  # the newest generation's weight
        self._routes: dict[tuple[str, str], _Route] = {}
        self._since_explore: dict[str, int] = {}
        self._wait: dict[str, int] = {}  # generations between tries of the other way, per mode
        self._best: dict[str, str] = {}  # the way last taken as the faster, per mode
        self._expected: tuple[float, float] | None = None  # (the verifier's step, a draft step), ms
        self._lock = threading.Lock()  # a client's generations may run on several threads
        self._first_told = False  # whether `expect_first` has run
        self._first = threading.Lock()  # held while a draft step is timed for it

    def _route(self, mode: str, route: str) -> _Route:
        return self._routes.setdefault((mode, route), _Route())

    def estimate(self, mode: str, route: str) -> float | None:
        """Smoothed milliseconds per output token of `route` in `mode`; None before one was measured."""
        with self._lock:
            return self._route(mode, route).ms_per_token

    def expect(self, step_ms: float, draft_ms: float) -> None:
        """What the verifier says a target step takes, and what a draft step was measured to cost
        the device, both in ms, before either way was measured."""
        with self._lock:
            self._expected = (step_ms, draft_ms) if step_ms > 0 and draft_ms > 0 else None

    def expect_dominated(self) -> None:
        """Before anything was measured, take drafting as dominated (as `expect` does where the
        verifier's step is under the draft's by the margin): answers stream, and a drafted try
        waits `max_explore_every` generations (`ClientConfig.first_route` "target-only")."""
        with self._lock:
            self._expected = (0.0, math.inf)

    def expect_first(self, first: str, step_ms: Callable[[], float], draft_ms: Callable[[], float]) -> None:
        """Once, before the first "auto" answer, as `ClientConfig.first_route` (`first`) says: by
        default, where the verifier says what a target step takes (`step_ms`, asked in any case:
        the handshake refuses a foreign tokenizer before a stream), a draft step is timed
        (`draft_ms`), so that the first answer may stream where drafting could not be faster. What
        raises here (a verifier out of reach) raises as the generation would; the next asks again."""
        with self._first:
            if self._first_told:
                return
            step = step_ms()
            if first == STREAM:
                self.expect_dominated()
            elif first == "auto" and step > 0:
                self.expect(step, draft_ms())
            self._first_told = True

    @property
    def expecting(self) -> bool:
        with self._lock:
            return self._expected is not None

    def choose(self, mode: str) -> str:
        """The route of the next generation in `mode`: SPECULATIVE or STREAM."""
        with self._lock:
            spec, stream = self._route(mode, SPECULATIVE), self._route(mode, STREAM)
            if spec.ms_per_token is None:
                return self._unmeasured(mode, stream)
            if stream.ms_per_token is None:
                return STREAM
            best = STREAM if stream.ms_per_token * self.margin < spec.ms_per_token else SPECULATIVE
            dominated = best == STREAM and spec.draft_ms_per_token is not None \
                and stream.ms_per_token * self.margin < spec.draft_ms_per_token
            if self._best.get(mode) == best:
                if self._since_explore.get(mode, 0) == -1:  # the last try found the other still slower
                    self._wait[mode] = min(2 * self._wait.get(mode, self.explore_every), self.max_explore_every)
                    self._since_explore[mode] = 0
            else:  # a switch (or the first choice): tries start again from explore_every
                self._best[mode] = best
                self._wait[mode] = self.explore_every
                self._since_explore[mode] = 0
            n = self._since_explore[mode] + 1
            if n >= (self.max_explore_every if dominated else self._wait[mode]):
                self._since_explore[mode] = -1  # a try of the other way: its outcome sets the next wait
                return SPECULATIVE if best == STREAM else STREAM
            self._since_explore[mode] = n
            return best

    def _unmeasured(self, mode: str, stream: _Route) -> str:
        """Drafting not measured yet: it is, unless `expect` found it dominated (and a measured
        stream has not contradicted that) and the wait for a try has not run out."""
        if self._expected is None:
            return SPECULATIVE
        step_ms, draft_ms = self._expected
        stream_ms = stream.ms_per_token if stream.ms_per_token is not None else step_ms
        n = self._since_explore.get(mode, 0) + 1
        if not stream_ms * self.margin < draft_ms or n >= self.max_explore_every:
            self._since_explore[mode] = 0
            return SPECULATIVE
        self._since_explore[mode] = n
        return STREAM

    def observe(self, mode: str, route: str, tokens: int, elapsed_s: float,
                draft_ms_per_token: float | None = None, *, overlapped: bool = False) -> None:
        """A generation by `route` gave `tokens` output tokens in `elapsed_s`, as its user saw it;
        a speculative one also says what a draft token cost the device (`draft_ms_per_token`), and
        whether drafting overlapped the rounds (proactive drafting): then the least a draft token
        can add to an answer's time is half of it (a block of one beside the verifier's token)."""
        if tokens < self.min_tokens or elapsed_s <= 0:
            return
        ms = 1e3 * elapsed_s / tokens
        with self._lock:
            r = self._route(mode, route)
            r.ms_per_token = self._smoothed(r.ms_per_token, ms)
            if draft_ms_per_token:
                least = draft_ms_per_token / 2 if overlapped else draft_ms_per_token
                r.draft_ms_per_token = self._smoothed(r.draft_ms_per_token, least)
            r.runs += 1

    def measured(self, gen: GenerationConfig, route: str, events: Iterator[Event]) -> Iterator[Event]:
        """`events`, their generation's speed observed for `route` once it ends (not when stopped),
        with what a draft token cost where it drafted."""
        for ev in events:
            if isinstance(ev, FinalStats) and ev.stats.finish_reason != "stopped":
                draft_ms = ev.stats.draft_ms_per_token if route == SPECULATIVE else None
                self.observe(gen.mode, route, ev.stats.completion_tokens, ev.stats.elapsed_s, draft_ms,
                             overlapped=gen.proactive)
            yield ev

    def _smoothed(self, old: float | None, new: float) -> float:
        return new if old is None else (1 - self.smoothing) * old + self.smoothing * new


def may_stream(gen: GenerationConfig) -> bool:
    """Whether the verifier's target-only stream gives what this generation asks, under the
    "auto" policy: greedy decoding, or sampling without a seed (a seeded one is the same
    text every time only by the same route), ending at EOS (the stream always does)."""
    lossless = gen.mode == "greedy" or (gen.mode == "sample" and gen.seed is None)
    return gen.drafting == "auto" and gen.stream_when_faster and lossless and gen.stop_at_eos
