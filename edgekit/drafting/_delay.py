"""The predictor's stopping rule as a function of what a round costs (issue 37, item 3).

A predictor trained at one cost model has one operating threshold. The best one moves with
the delay: where a round costs many draft steps (a long round trip, a slow verifier) a longer
block is worth its risk, and the threshold on P(accepted) falls; where a round costs about a
draft step, only sure tokens pay, and below that a window of one beats any rule (the
delay-adaptive threshold of UCB-SpecStop, 2026). `DelaySchedule` is that rule tabulated by
training (`edgekit.predictors.train.delay_schedule`, replayed on the held-out rounds and kept
in the predictor's card under "delay_schedule"), and `round_cost_in_steps` reads the two
ratios it is indexed by off the session's latency model, every round.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import PredictorError

if TYPE_CHECKING:
    from ..link import LatencyModel
    from ._controller import StopRule

__all__ = ["DelaySchedule", "StopPoint", "round_cost_in_steps"]


@dataclass(frozen=True)
class StopPoint:
    """The stopping rule at one round cost: draft while P(accepted) >= `threshold`, end a
    block `stop` a predicted rejection, at most `max_window` tokens."""

    round_steps: float  # a round's fixed time, in draft steps
    verify_token_steps: float  # verification time per block token, in draft steps
    threshold: float
    stop: StopRule
    max_window: int


class DelaySchedule:
    """The stopping rule for each round cost, from a predictor card's "delay_schedule" points;
    `at(round_steps, verify_token_steps)` is the nearest tabulated point (the per-token cost
    first, then the round's, on a log scale; outside the table, its edge)."""

    def __init__(self, points: list[StopPoint]) -> None:
        if not points:
            raise PredictorError("a delay schedule needs at least one point")
        self.points = points
        # per-token cost, then the points at it with log2 of their round cost (looked up every round)
        self._columns: dict[float, list[tuple[float, StopPoint]]] = {}
        for p in points:
            self._columns.setdefault(p.verify_token_steps, []).append((math.log2(p.round_steps), p))

    @classmethod
    def from_card(cls, entries: list[dict], source: str = "the card") -> DelaySchedule:
        try:
            points = [
                StopPoint(float(e["round_steps"]), float(e["verify_token_steps"]), float(e["threshold"]),
                          e["stop"], e["max_window"])
                for e in entries
            ]
        except (KeyError, TypeError, ValueError) as exc:
            raise PredictorError(f"{source}: a malformed delay_schedule entry ({exc!r})") from exc
        for p in points:
            finite = all(map(math.isfinite, (p.round_steps, p.verify_token_steps, p.threshold)))
            if not finite or p.stop not in ("before", "after") or not 0.0 <= p.threshold <= 1.0 \
                    or not isinstance(p.max_window, int) or isinstance(p.max_window, bool) or p.max_window < 1 \
                    or p.round_steps <= 0 or p.verify_token_steps < 0:
                raise PredictorError(f"{source}: a delay_schedule entry out of range: {p}")
        return cls(points)

    def at(self, round_steps: float, verify_token_steps: float) -> StopPoint:
        want = math.log1p(max(verify_token_steps, 0.0))
        sigma = min(self._columns, key=lambda s: abs(math.log1p(s) - want))
        rho = math.log2(max(round_steps, 1e-6))
        return min(self._columns[sigma], key=lambda lp: abs(lp[0] - rho))[1]


def round_cost_in_steps(model: LatencyModel, upload: str, window: int) -> tuple[float, float]:
    """(a round's fixed time, verification and upload time per block token), both in draft
    steps, as the latency model expects them for blocks of up to `window` sent as `upload`.
    The training replay charges a round R + steps + v (block + 1); here a round is
    comm(k) + a + b (k + 1) + draft steps, with comm(k) about comm(0) + c k, so
    R = comm(0) + a - c and v = b + c."""
    costs = model.costs
    step = max(costs.draft_step_ms, 1e-3)
    a, b = costs.verify_line()
    k = max(window, 1)
    comm0 = model.comm_ms(0, upload)
    c = max((model.comm_ms(k, upload) - comm0) / k, 0.0)
    return max(comm0 + a - c, 0.0) / step, (b + c) / step
