"""Stop at the first predicted rejection (WISP sec. 4.1, eq. 25): draft while a
predictor says the next token will be accepted, end the block where it says
it will not. `ConfidenceThreshold` is the same rule with the draft's own top
probability as the predictor (llama.cpp's `--draft-p-min`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import numpy as np

from ..errors import ConfigError
from ..runtime import DraftOutput, LogitStats
from ._controller import Decision, StopRule
from ._delay import DelaySchedule, round_cost_in_steps

if TYPE_CHECKING:
    from ..link import LinkPolicy

__all__ = ["AcceptancePredictor", "AcceptanceTracker", "ConfidenceThreshold", "PredictorController"]


class AcceptancePredictor(Protocol):
    """P(accepted) of a draft step's token (`edgekit.predictors.OnnxPredictor` is one)."""

    threshold: float  # its own operating threshold

    def p_accept_step(self, stats: LogitStats, position: int, recent_acceptance: float) -> float: ...


class AcceptanceTracker:
    """The `recent_acceptance` feature: an exponential moving average over the
    session's labelled positions (each accepted token 1, a round's first
    rejection 0; positions after it carry no outcome), starting at `initial`."""

    def __init__(self, alpha: float = 0.1, initial: float = 0.5) -> None:
        self.alpha = alpha
        self.value = initial

    def update(self, drafted: int, accepted: int) -> None:
        a = self.alpha
        for _ in range(accepted):
            self.value += a * (1.0 - self.value)
        if accepted < drafted:
            self.value -= a * self.value


class PredictorController:
    """Stop-at-first-predicted-rejection: draft while the predictor says the
    next token will be accepted (p >= threshold), within [min_window, max_window];
    at a predicted rejection, end the block before or after that token (`stop`,
    by default the predictor's own rule).

    With a `schedule` (and the session's link `policy`), the threshold, the stop rule and
    the largest block are the schedule's for what a round costs now, in draft steps, as the
    latency model measures it: each round they follow the link's delay and the verifier's
    speed (`DelaySchedule`; the name gains "+delay")."""

    def __init__(
        self,
        predictor: AcceptancePredictor,
        max_window: int,
        *,
        min_window: int = 1,
        threshold: float | None = None,
        stop: StopRule | None = None,
        name: str | None = None,
        schedule: DelaySchedule | None = None,
        policy: LinkPolicy | None = None,
    ) -> None:
        if schedule is not None and policy is None:
            raise ConfigError("a delay schedule needs the session's link policy to read round costs from")
        self.predictor = predictor
        self.max_window = max_window
        self.min_window = min_window
        self.threshold = predictor.threshold if threshold is None else threshold
        self.stop: StopRule = stop if stop is not None else getattr(predictor, "stop", "before")
        path = getattr(predictor, "path", None)
        self.name = name or f"predictor-{path.stem if path is not None else type(predictor).__name__}"
        self.schedule, self.policy = schedule, policy
        if schedule is not None:
            self.name += "+delay"
        self.acceptance = AcceptanceTracker()
        self._k = max_window  # this round's window, set by window()
        self.decisions = 0  # predictor calls so far

    def window(self, limit: int) -> int:
        cap = self.max_window
        if self.schedule is not None and self.policy is not None:
            rho, sigma = round_cost_in_steps(self.policy.model(), self.policy.upload_for(cap), cap)
            point = self.schedule.at(rho, sigma)
            self.threshold, self.stop = point.threshold, point.stop
            cap = min(cap, point.max_window)
        self._k = min(cap, limit)
        return self._k

    def draft_next(self, index: int, step: DraftOutput) -> Decision:
        if index <= self.min_window:
            return Decision.DRAFT
        if index >= self._k and self.stop == "after":
            return Decision.DRAFT  # the block's last token goes either way: no decision to make
        if self.threshold <= 0.0:
            return Decision.DRAFT  # every token passes (a schedule's fixed window): no call to make
        self.decisions += 1
        if self.predictor.p_accept_step(step.stats, index, self.acceptance.value) >= self.threshold:
            return Decision.DRAFT
        return Decision.stop(self.stop)

    def observe(self, drafted: int, accepted: int) -> None:
        self.acceptance.update(drafted, accepted)


class _TopProbability:
    """The draft's top probability read as P(accepted): p-min as a predictor."""

    feature_names = ("confidence",)
    threshold = 0.5

    def __init__(self) -> None:
        self._x = np.empty(1, dtype=np.float32)

    def p_accept(self, features: np.ndarray) -> float:
        return float(features[0])  # FEATURE_NAMES[0] is confidence

    def p_accept_step(self, stats: LogitStats, position: int, recent_acceptance: float) -> float:
        stats.features_into(self._x, b"\x00", position, recent_acceptance)  # confidence: no moments computed
        return self._x.item(0)


class ConfidenceThreshold(PredictorController):
    """Draft while the top token's probability is at least `p_min`, up to
    `max_window` tokens and never fewer than `min_window`. `stop="before"` drops
    the unsure token, as llama.cpp's `--draft-p-min` does; "after" sends it and
    ends the block."""

    def __init__(self, p_min: float, max_window: int, *, min_window: int = 1, stop: StopRule = "before") -> None:
        if not 0.0 <= p_min <= 1.0:
            raise ConfigError(f"p_min must be in [0, 1], got {p_min}")
        if stop not in ("before", "after"):
            raise ConfigError(f"stop must be 'before' or 'after', got {stop!r}")
        name = f"p-min-{p_min:g}" + ("-after" if stop == "after" else "")
        super().__init__(_TopProbability(), max_window, min_window=min_window, threshold=p_min, stop=stop, name=name)
        self.p_min = p_min
