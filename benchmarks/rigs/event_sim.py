"""Capacity at GPU scale by discrete-event simulation (`gpu_sim.py`, `goodspeed.py --sim`): the
verifier's own schedulers (`FcfsScheduler`, `WispScheduler`, `SpeedClasses`, `Budgets`) in virtual
time, a batch taking what WISP's estimator gives it with their published A100 coefficients for
Qwen3-32B times a lognormal noise, and devices drafting and accepted as recorded traces say."""

from __future__ import annotations

import argparse
import heapq
import itertools
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from benchmarks.rigs.fleet_sim import RoundLog, Trace, draft_block
from edgekit import ServerConfig
from edgekit.config import DEFAULT_SLO_CLASSES
from edgekit.verifier import (
    BUDGET_POLICIES,
    Budgets,
    BudgetState,
    Coefficients,
    FcfsScheduler,
    Feed,
    Objective,
    RandomShare,
    SpeedClasses,
    VerifyTimeEstimator,
    WispScheduler,
    Work,
    capacity_within,
)

# WISP sec. 4.4 (a, b_compute, b_read) and appendix C Table 12 (c), in milliseconds per unit.
WISP_A100_QWEN3_32B = Coefficients(a=143.39e-3, b_compute=2.53e-6, b_read=2.67e-3, d_out=0.0, c=14.86)
SYSTEMS = {"sled": ("fcfs", "reprefill", "fixed"), "centralized": ("fcfs", "centralized", "none"),
           "wisp": ("wisp", "speculative", "predictor"),
           # for telling the parts apart: prefix reuse alone, and each drafting under each policy
           "fcfs": ("fcfs", "speculative", "fixed"), "fcfs-predictor": ("fcfs", "speculative", "predictor"),
           "wisp-fixed": ("wisp", "speculative", "fixed"),
           "wisp-response": ("wisp/response", "speculative", "predictor"),
           "wisp-late-first": ("wisp --unreachable-share 1", "speculative", "predictor"),  # Algorithm 1's late work
           # server-assigned draft budgets (GOODSPEED): devices draft all of what they are given
           "goodspeed": ("fcfs+goodspeed", "speculative", "budget"),
           "fixed-s": ("fcfs+fixed", "speculative", "budget"),
           "random-s": ("fcfs+random", "speculative", "budget")}


Pools = tuple[tuple[int, ...], tuple[int, ...] | None]  # a device's traces, and those after the switch


@dataclass
class Device:
    idx: int
    slo_class: str
    speed: float
    speed_factor: float
    rtt_ms: float
    up_mbps: float
    down_mbps: float
    controller: object = None
    trace: Trace | None = None
    pos: int = 0
    prompt_len: int = 0  # the response's prompt, padded to the simulation's context
    started: float = 0.0
    began: float = 0.0  # when the verifier saw the response begin (its open's arrival)
    acceptance: float = 0.5
    link_ms: float = 0.0
    pending: dict = field(default_factory=dict)
    pool: tuple[int, ...] | None = None  # which traces its prompts come from (None: all)
    pool_after: tuple[int, ...] | None = None  # and after the simulation's switch time
    budget: int = 0  # the draft budget the verifier last told it (0: none assigned)
    responses: int = 0


class Simulation:
    def __init__(self, system: str, n: int, traces: list[Trace], args: argparse.Namespace,
                 controller: Callable[[], object], pools: list[Pools] | None = None, switch_s: float | None = None,
                 log_rounds: bool = False) -> None:
        policy, self.mode, _ = SYSTEMS[system]
        policy, *flags = policy.split()  # serve flags: only --unreachable-share is simulated
        share = (float(flags[flags.index("--unreachable-share") + 1]) if "--unreachable-share" in flags
                 else args.unreachable_share)
        policy, _, budget_policy = policy.partition("+")
        policy, _, budget = policy.partition("/")
        self.now = 0.0
        self.estimator = VerifyTimeEstimator(WISP_A100_QWEN3_32B)
        clock: Callable[[], float] = lambda: self.now  # noqa: E731
        self.scheduler = (WispScheduler(self.estimator, guard_ms=args.guard_ms, starvation_s=args.starvation,
                                        max_rows=args.max_rows, min_efficiency=args.min_efficiency,
                                        unreachable_share=share, clock=clock)
                          if policy == "wisp" else FcfsScheduler(max_rows=args.max_rows))
        self.slo = SpeedClasses(DEFAULT_SLO_CLASSES, budget=budget or "round")
        self.rng = random.Random(args.seed * 7919 + n)
        self.traces = traces
        self.context = args.context
        self.noise = args.noise
        self.horizon = args.horizon
        self.warmup = args.warmup
        self.max_window = args.window
        self.switch_s = switch_s
        self.budget_eta, self.budget_beta = args.budget_eta, args.budget_beta
        self.budgets = self._budgets(budget_policy, getattr(args, "token_budget", 0), args.seed, clock)
        self.log: list[RoundLog] | None = [] if log_rounds else None
        names = list(DEFAULT_SLO_CLASSES)
        self.devices = []
        for i in range(n):
            name = self.rng.choice(names)
            self.devices.append(Device(i, name, DEFAULT_SLO_CLASSES[name], self.rng.uniform(1.0, 2.0),
                                       self.rng.uniform(10, 60), self.rng.uniform(5, 50), self.rng.uniform(10, 100),
                                       controller=controller()))
            if pools:
                self.devices[-1].pool, self.devices[-1].pool_after = pools[i % len(pools)]
        self._events: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._busy = False
        self.responses: list[tuple[str, float, float, int]] = []  # (class, speed target, achieved, started)
        self.rounds = 0
        self.committed = 0
        self.batches = 0

    def _budgets(self, policy: str, token_budget: int, seed: int, clock: Callable[[], float]) -> Budgets | None:
        """The verifier's budgets as `edgekit serve --budgets POLICY --token-budget C` sets them up (C:
        from the estimator and the SLOs when 0), on the simulation's clock."""
        if not policy:
            return None
        lo, hi = 1, self.max_window

        def capacity(states: list[BudgetState]) -> int:
            return token_budget or capacity_within(self.estimator.predict_features, states, lo, hi)

        chosen = RandomShare(seed) if policy == "random" else BUDGET_POLICIES.load(policy)()
        return Budgets(chosen, capacity=capacity, lo=lo, hi=hi, eta=self.budget_eta, beta=self.budget_beta,
                       clock=clock)

    def at(self, t: float, fn: Callable[[], None]) -> None:
        heapq.heappush(self._events, (t, next(self._seq), fn))

    def run(self) -> Simulation:
        for d in self.devices:
            self.at(self.rng.uniform(0, 2.0), lambda d=d: self.start_response(d))
        while self._events:
            t, _, fn = heapq.heappop(self._events)
            if t > self.horizon:
                break
            self.now = t
            fn()
        return self

    # -- devices ----------------------------------------------------------------------

    def _net_ms(self, d: Device, up_bytes: int, down_bytes: int) -> float:
        return d.rtt_ms + up_bytes * 8 / (d.up_mbps * 1e3) + down_bytes * 8 / (d.down_mbps * 1e3)

    def start_response(self, d: Device) -> None:
        pool = d.pool_after if self.switch_s is not None and self.now >= self.switch_s and d.pool_after else d.pool
        d.trace = self.traces[self.rng.choice(pool)] if pool else self.rng.choice(self.traces)
        d.pos = 0
        d.prompt_len = max(self.context, len(d.trace.prompt))
        d.started = self.now
        d.link_ms = self._net_ms(d, 4 * d.prompt_len, 64)
        d.began = self.now
        d.responses += 1
        if self.budgets is not None:  # a session per response, as a device opens one
            self.budgets.forget(self._session(d, d.responses - 1))
            d.budget = self.budgets.opened(self._session(d), context=d.prompt_len, epoch=self.batches,
                                           client=str(d.idx))
        if self.mode == "speculative":  # the prompt's prefill (as the verifier gives it an objective), then rounds
            feed = Feed(d.idx, 0, (0,) * (d.prompt_len - 1), 0)
            self.submit(d, feed, self.slo.prefill(d.speed, self.now), lambda: self.start_round(d))
        else:
            self.start_round(d)

    def start_round(self, d: Device) -> None:
        assert d.trace is not None
        ctx = d.prompt_len + d.pos
        if self.mode == "centralized":  # one target step; due 1/speed after it was asked for
            obj = self.slo.token(d.speed, self.now)
            self.submit(d, Feed(d.idx, ctx - 1, (0,), 1), obj, lambda: self.end_round(d, 0, 0))
            return
        limit = min(self.max_window, len(d.trace.target) - d.pos, d.budget or self.max_window)
        block, steps = draft_block(d.controller, d.trace, d.pos, d.controller.window(limit))  # type: ignore[attr-defined]
        draft_ms = steps * d.trace.step_ms * d.speed_factor
        up = 4 * len(block) + 32 + (4 * ctx if self.mode == "reprefill" else 0)
        net_ms = self._net_ms(d, up, 32)
        k = len(block)
        if self.mode == "reprefill":  # no prefix cache: the whole context and the block, every round
            feed = Feed(d.idx, 0, (0,) * (ctx + k), k + 1)
        else:
            feed = Feed(d.idx, ctx - 1, (0,) * (k + 1), k + 1)
        accepted = d.trace.accepted(d.pos, block)

        def arrive() -> None:
            obj = self.slo.objective(d.speed, d.acceptance, k, draft_ms, d.link_ms, self.now, (d.pos, d.began))
            arrived = self.now
            self.submit(d, feed, obj, lambda: self.end_round(d, k, accepted, obj, (arrived, draft_ms, net_ms)),
                        net_ms=net_ms)

        self.at(self.now + (draft_ms + net_ms / 2) / 1e3, arrive)

    def end_round(self, d: Device, drafted: int, accepted: int, obj: Objective | None = None,
                  times: tuple[float, float, float] | None = None) -> None:
        assert d.trace is not None
        if self.mode != "centralized":
            d.controller.observe(drafted, accepted)  # type: ignore[attr-defined]
            d.acceptance = self.slo.smoothed(d.acceptance, drafted, accepted)
        committed = accepted + 1
        if self.budgets is not None:
            # Eq. 3's terms are known here up to the first rejection (the traces follow the target's
            # path, not the draft's past it): the accepted tokens' 1s and the rejected one's 0.
            d.budget = self.budgets.after_round(
                self._session(d), drafted=min(drafted, accepted + 1), ratios=float(accepted), committed=committed,
                epoch=self.batches, context=d.prompt_len + d.pos + committed,
                slo_budget_ms=obj.budget_ms if obj is not None else None)
        if self.log is not None and times is not None:
            arrived, draft_ms, net_ms = times
            self.log.append(RoundLog(d.idx, self.now, 0.0, 0.0, obj.budget_ms if obj else None, None, drafted,
                                     committed, round_trip_ms=(self.now - arrived) * 1e3 - net_ms / 2,
                                     draft_ms=draft_ms, link_ms=net_ms))
        d.pos += committed
        if self.now >= self.warmup:
            self.rounds += 1
            self.committed += committed
        if d.pos >= len(d.trace.target):
            tokens = len(d.trace.target)
            speed = tokens / max(self.now - d.started, 1e-9)
            if d.started >= self.warmup:
                self.responses.append((d.slo_class, d.speed, speed, int(d.started)))
            self.start_response(d)
        else:
            self.start_round(d)

    @staticmethod
    def _session(d: Device, response: int | None = None) -> str:
        return f"{d.idx}/{d.responses if response is None else response}"

    # -- the verifier ----------------------------------------------------------------------

    def submit(self, d: Device, feed: Feed, obj: Objective, then: Callable[[], None], net_ms: float = 0.0) -> None:
        work = Work(feed, session_id=str(d.idx), slo_class=d.slo_class, objective=obj, submitted=self.now)
        d.pending[id(work)] = (then, net_ms)
        self.scheduler.submit(work)
        self._dispatch()

    def _dispatch(self) -> None:
        if self._busy:
            return
        batch = self.scheduler.schedule()
        if batch is None:
            return
        self._busy = True
        ms = self.estimator.predict(batch.feeds) * math.exp(self.rng.gauss(0.0, self.noise))
        self.batches += 1

        def done() -> None:
            self._busy = False
            for w in batch.works:
                d = self.devices[int(w.session_id)]
                then, net_ms = d.pending.pop(id(w))
                self.at(self.now + net_ms / 2e3, then)  # the verdict comes back down the link
            self._dispatch()

        self.at(self.now + ms / 1e3, done)

    # -- figures ----------------------------------------------------------------------------

    def summary(self) -> dict:
        out = {}
        for name, speed in DEFAULT_SLO_CLASSES.items():
            rs = [r for r in self.responses if r[0] == name]
            out[name] = {
                "responses": len(rs),
                "violation_rate": (sum(a < s for _, s, a, _ in rs) / len(rs)) if rs else math.nan,
                "mean_speed": (sum(a for *_, a, _ in rs) / len(rs)) if rs else math.nan,
                "target_speed": speed,
            }
        span = self.horizon - self.warmup
        return {"classes": out, "goodput_tokens_per_s": self.committed / span, "rounds": self.rounds,
                "batches": self.batches}


def settings(argv: Sequence[str] = ()) -> argparse.Namespace:
    """The simulation's settings: its defaults, or those `argv` sets (`options`); `window` is the traces'."""
    return options(argparse.ArgumentParser()).parse_args(list(argv))


def options(ap: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The simulation's settings as options of `ap`: what `Simulation` reads from its namespace, less
    the traces' `window`."""
    ap.add_argument("--horizon", type=float, default=60.0, help="virtual seconds per run")
    ap.add_argument("--warmup", type=float, default=10.0)
    ap.add_argument("--context", type=int, default=0,
                    help="tokens every prompt is padded to (0: the recorded prompts as they are, 16-35 tokens)")
    ap.add_argument("--max-rows", type=int, default=8192)
    ap.add_argument("--noise", type=float, default=0.05, help="lognormal sigma of batch times around the estimate")
    ap.add_argument("--guard-ms", type=float, default=20.0)
    ap.add_argument("--starvation", type=float, default=2.0)
    ap.add_argument("--unreachable-share", type=float, default=ServerConfig().unreachable_share,
                    help="wisp: the share of a session's rounds dispatched late past which it is out of reach")
    ap.add_argument("--min-efficiency", type=float, default=ServerConfig().min_efficiency,
                    help="WispScheduler's min_efficiency (the verifier's default; 0: Algorithm 1 as published)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--token-budget", type=int, default=0,
                    help="C for the budget systems (0: from the estimator and the SLOs, as the verifier's default)")
    ap.add_argument("--budget-eta", type=float, default=ServerConfig().budget_eta)
    ap.add_argument("--budget-beta", type=float, default=ServerConfig().budget_beta)
    return ap
