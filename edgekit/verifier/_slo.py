"""Token-speed SLOs on the verifier (WISP sec. 3.1 and 4.2).

A session declares the token speed s_c it needs, in tokens per second, or names
a class the verifier maps to one. Each round the device reports the time it
spent drafting the block and the time it expects on the link; what is left of
the round's share of the speed objective is the verifier's budget for queueing
and verifying it (eq. 6):

    tau = N^v / s_c - T_draft - T_network,    N^v = alpha * N_d + 1

with alpha the session's smoothed acceptance and N_d the block's length. Eq. 5
counts accepted draft tokens only; a round also commits the verifier's own
token (the correction, or the bonus after a fully accepted block: WISP's
"extra token", sec. 2.4), so the tokens a round adds are one more. The round's
deadline is d = a + tau (eq. 12), a being when its request arrived. A session
without an objective is best effort: its work has no deadline.

Eq. 6 budgets each round on its own: a short block gets a short budget,
however far ahead of its speed the response is. With `budget="response"` a
round's budget is what keeps the whole response at its speed (the measured
quantity, WISP eq. 4 over the response): with D tokens committed since the
response began at b,

    tau = (D + N^v) / s_c - (a - b) - T_network / 2

(the time since b already holds this round's drafting and uplink; the verdict's
way down is left). On pace it equals eq. 6; a response ahead of its speed has
the credit it earned, one behind has less (or none: it is late).

A prompt or a turn is prefilled apart from the rounds (WISP verifies it with
the first block, as a cold start): it is due 1/s_c after it arrives, the time
the objective gives one token, and worth that token, so that a session's start
is as urgent as its rounds and is not left behind other sessions' rounds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from ..config import DEFAULT_SLO_CLASSES
from ..errors import ProtocolError
from ._validation import clip
from .scheduler import Objective

__all__ = ["BEST_EFFORT", "CUSTOM", "SpeedClasses"]

BEST_EFFORT = "best-effort"  # a session without an objective; the name also asks for none
CUSTOM = "custom"  # a session that gave a speed rather than a class (one label for metrics)


class SpeedClasses:
    """The verifier's named classes, and the objective of each round."""

    def __init__(
        self, classes: Mapping[str, float] = DEFAULT_SLO_CLASSES, *, smoothing: float = 0.3, budget: str = "round"
    ) -> None:
        for name, speed in classes.items():
            if not name or name in (BEST_EFFORT, CUSTOM) or not (math.isfinite(speed) and speed > 0):
                raise ValueError(f"SLO class {name!r}: a class needs a name of its own and a positive speed")
        if not 0 < smoothing <= 1:
            raise ValueError(f"smoothing must be in (0, 1], got {smoothing}")
        if budget not in ("round", "response"):
            raise ValueError(f"budget must be 'round' or 'response', got {budget!r}")
        self.classes = dict(classes)
        self.smoothing = smoothing
        self.budget = budget

    def resolve(self, name: str, speed: float) -> tuple[str, float | None]:
        """A session's (class name, tokens/s) from what it asked for; a speed wins over a name.
        An unknown class or a speed that is not positive is refused (INVALID_ARGUMENT)."""
        if speed:
            if not (math.isfinite(speed) and speed > 0):
                raise ProtocolError(f"the target token speed must be a positive number of tokens/s, got {speed}")
            return CUSTOM, float(speed)
        if not name or name == BEST_EFFORT:
            return BEST_EFFORT, None
        if name not in self.classes:
            known = ", ".join(f"{n} ({s:g} tok/s)" for n, s in self.classes.items())
            raise ProtocolError(f"unknown SLO class {clip(name)}; this verifier serves {known}, or {BEST_EFFORT}")
        return name, self.classes[name]

    def objective(
        self,
        speed: float | None,
        acceptance: float,
        n_draft: int,
        draft_ms: float,
        network_ms: float,
        arrived: float,
        progress: tuple[int, float] | None = None,
    ) -> Objective:
        """A round's budget and deadline (eqs. 5, 6, 12); `arrived` is a perf_counter().
        `progress`: (tokens committed since the response began, when it began), for
        response budgets."""
        for what, ms in (("drafting", draft_ms), ("network", network_ms)):
            if not (math.isfinite(ms) and ms >= 0):
                raise ProtocolError(f"the round's {what} time must be a non-negative number of ms, got {ms}")
        value = acceptance * n_draft + 1.0
        if speed is None:
            return Objective(None, None, value, arrived)
        if self.budget == "response" and progress is not None:
            done, began = progress
            budget_ms = ((done + value) / speed - (arrived - began)) * 1e3 - network_ms / 2
        else:
            budget_ms = value / speed * 1e3 - draft_ms - network_ms
        return Objective(arrived + budget_ms / 1e3, budget_ms, value, arrived)

    def token(self, speed: float | None, arrived: float, value: float = 1.0) -> Objective:
        """Work due one token's time (1/s) after it arrives, worth one token: a
        target-only step, or a prefill (worth nothing of its own when best effort)."""
        if speed is None:
            return Objective(None, None, value, arrived)
        return Objective(arrived + 1.0 / speed, 1e3 / speed, 1.0, arrived)

    def prefill(self, speed: float | None, arrived: float) -> Objective:
        """A prompt's or a turn's prefill (see the module's docstring)."""
        return self.token(speed, arrived, value=0.0)

    def smoothed(self, acceptance: float, drafted: int, accepted: int) -> float:
        """The session's acceptance after a round (an exponential average; rounds without drafts leave it)."""
        if drafted <= 0:
            return acceptance
        return (1 - self.smoothing) * acceptance + self.smoothing * accepted / drafted
