"""The verification-time estimator (WISP sec. 4.4, eqs. 18-19).

A batch's run time on the engine, from three counts over its feeds:

    T = a * N_linear + b_compute * N_interactions + b_read * N_cached + c

N_linear = sum L_new (tokens through the linear layers), N_interactions =
sum L_total * L_new (query-key pairs, eq. 18), N_cached = sum L_cached (cached
KV read). One term is added to eq. 19: d * N_out, the rows whose next-token
logits are computed (a verification round wants K+1 of them, a prefill none).
The output projection costs a row as much as the whole of another layer stack
for a model with a large vocabulary and a small body: on gemma-3-270m (262,144
tokens, 640 wide) a row with logits measured six times a prefill row on this
CPU, which eq. 19 alone cannot tell apart. With d = 0 the model is eq. 19; the
fit benchmark reports both. The coefficients are fitted by least squares on batches profiled on
the machine it runs on (`calibrate`), kept non-negative (a negative cost would
let a bigger batch look cheaper), and refitted online from every batch the
engine runs, old batches weighing less and less (forgetting). The calibration
set is the prior: it fades as live batches come, but never below a floor, so
that what the live load never varies (say, long cold prefills) is still
predicted from it, while what the live load does vary follows the machine.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .engine import Feed

__all__ = ["Coefficients", "FitReport", "VerifyTimeEstimator", "batch_features", "fit_coefficients", "fit_report"]

FEATURES = ("n_linear", "n_interactions", "n_cached", "n_out", "batches")
# Features are divided by these before solving, so the normal equations are well conditioned.
SETTLED_AFTER = 50  # batches learnt online before an estimator without a calibration is trusted for a step
_SCALE = np.array([100.0, 1e5, 1e3, 10.0, 1.0])


def batch_features(feeds: Sequence[Feed]) -> np.ndarray:
    """[N_linear, N_interactions, N_cached, N_out, 1] of a batch (eqs. 18-19, and the logit rows).
    One loop over the feeds (a batch is a few to a few hundred): once per batch on the engine's
    thread, where NumPy's calls on arrays this small cost more than the sums."""
    n_linear = n_interactions = n_cached = n_out = 0
    for f in feeds:
        new = len(f.tokens)
        n_linear += new
        n_interactions += (f.start + new) * new
        n_cached += f.start
        n_out += f.n_out
    return np.array([n_linear, n_interactions, n_cached, n_out, 1.0], dtype=np.float64)


@dataclass(frozen=True)
class Coefficients:
    """Eq. 19's coefficients, in milliseconds per unit."""

    a: float = 0.0  # per new token
    b_compute: float = 0.0  # per query-key interaction
    b_read: float = 0.0  # per cached token
    d_out: float = 0.0  # per row with logits (not in eq. 19; 0 makes it eq. 19)
    c: float = 0.0  # per batch

    def vector(self) -> np.ndarray:
        return np.array([self.a, self.b_compute, self.b_read, self.d_out, self.c])

    @classmethod
    def of(cls, v: Sequence[float]) -> Coefficients:
        return cls(*(float(x) for x in v))


@dataclass(frozen=True)
class FitReport:
    """How well predictions match measurements (WISP Table 7's figures)."""

    samples: int
    r2: float
    adjusted_r2: float
    rmse_ms: float
    mae_ms: float
    mape_pct: float
    max_error_ms: float


def _nnls_normal(g: np.ndarray, h: np.ndarray, passive: np.ndarray | None = None) -> np.ndarray:
    """min ||y - X w||^2 subject to w >= 0, from the normal equations (G = X'X, h = X'y):
    Lawson and Hanson's active-set method (Solving Least Squares Problems, 1974, ch. 23) on them.

    The problem is convex, so the first point where the gradient h - G w has no positive part
    on the coefficients held at zero, and the free ones solve the unconstrained problem
    restricted to them, is a global optimum. `passive` (the coefficients free at the last fit,
    `w > 0`) starts the search there: an online refit mostly keeps them, and then one solve
    checks it, where the exhaustive search over the 31 subsets of five took milliseconds
    on the engine's thread. Each subproblem is solved by `lstsq`, so a singular block (a
    feature the batches never varied) gives the least-norm solution."""
    n = len(h)
    tol = 1e-12 * n * max(float(np.abs(g).max(initial=0.0)), float(np.abs(h).max(initial=0.0)))
    w = np.zeros(n)
    free = np.zeros(n, dtype=bool)
    if passive is not None and passive.any():
        s = _solve_on(g, h, passive)
        if np.all(s[passive] > 0):
            w, free = s, passive.copy()
    for _ in range(4 * n):  # Lawson and Hanson's loop ends; a bound guards against rounding cycling it
        gradient = h - g @ w
        gradient[free] = -np.inf
        j = int(np.argmax(gradient))
        if gradient[j] <= tol:
            break
        free[j] = True
        while True:
            s = _solve_on(g, h, free)
            bad = free & (s <= 0)
            if not bad.any():
                w = s
                break
            # Step from w towards s as far as stays feasible, and hold at zero what reaches it (a
            # coefficient at zero already, as one just freed that `lstsq` left at zero: no step).
            gap = w[bad] - s[bad]
            ratios = np.divide(w[bad], gap, out=np.zeros_like(gap), where=gap > 0)
            k = int(np.argmin(ratios))
            w = w + float(ratios[k]) * (s - w)
            w[np.flatnonzero(bad)[k]] = 0.0
            free &= w > 0
            w[~free] = 0.0
    return w


def _solve_on(g: np.ndarray, h: np.ndarray, free: np.ndarray) -> np.ndarray:
    """The unconstrained least squares restricted to the `free` coefficients (others zero)."""
    s = np.zeros(len(h))
    idx = np.flatnonzero(free)
    s[idx] = np.linalg.lstsq(g[np.ix_(idx, idx)], h[idx], rcond=None)[0]
    return s


def fit_coefficients(features: np.ndarray, ms: np.ndarray, *, logit_rows: bool = True) -> Coefficients:
    """Least squares with non-negative coefficients on profiled batches ([n, 5] features, [n] ms);
    `logit_rows=False` fits eq. 19 as published (no N_out term)."""
    x = np.asarray(features, dtype=np.float64) / _SCALE
    if not logit_rows:
        x = x.copy()
        x[:, 3] = 0.0
    y = np.asarray(ms, dtype=np.float64)
    return Coefficients.of(_nnls_normal(x.T @ x, x.T @ y) / _SCALE)


def fit_report(coef: Coefficients, features: np.ndarray, ms: np.ndarray, *, terms: int = 4) -> FitReport:
    """Prediction errors on [n, 5] features and their measured ms; `terms` (the model's
    terms besides the constant: 4 as shipped, 3 for eq. 19) for the adjusted R^2."""
    y = np.asarray(ms, dtype=np.float64)
    if not len(y):
        raise ValueError("no samples to report on")
    pred = np.asarray(features, dtype=np.float64) @ coef.vector()
    err = pred - y
    n, p = len(y), terms
    ss_tot = float(((y - y.mean()) ** 2).sum())
    r2 = 1 - float((err**2).sum()) / ss_tot if ss_tot > 0 else math.nan
    adjusted = 1 - (1 - r2) * (n - 1) / (n - p - 1) if n > p + 1 else math.nan
    return FitReport(
        samples=n,
        r2=r2,
        adjusted_r2=adjusted,
        rmse_ms=float(np.sqrt((err**2).mean())),
        mae_ms=float(np.abs(err).mean()),
        mape_pct=float((np.abs(err) / np.maximum(y, 1e-9)).mean() * 100),
        max_error_ms=float(np.abs(err).max()),
    )


class VerifyTimeEstimator:
    """Predicts a batch's run time (ms) and learns from the batches that ran.

    `prior` (features and ms, e.g. the calibration set) starts at `prior_weight`
    samples' worth of weight; each observed batch weighs 1; both decay by
    `forgetting` per observed batch (0.98: about the last fifty batches count), the
    prior down to `prior_floor`. The coefficients are refitted every `refit_every`
    observations. Used from the
    engine thread (observe) and the scheduler (predict); a refit replaces the
    coefficients in one assignment.
    """

    def __init__(
        self,
        coefficients: Coefficients | None = None,
        *,
        prior: tuple[np.ndarray, np.ndarray] | None = None,
        prior_weight: float = 30.0,
        prior_floor: float = 1.0,
        forgetting: float = 0.98,
        refit_every: int = 8,
    ) -> None:
        if not 0 < forgetting <= 1:
            raise ValueError(f"forgetting must be in (0, 1], got {forgetting}")
        self.forgetting = forgetting
        self.refit_every = refit_every
        self.prior_weight = prior_weight
        self.prior_floor = min(prior_floor, prior_weight)
        self._g0 = np.zeros((5, 5))
        self._h0 = np.zeros(5)
        if prior is not None and len(prior[1]):
            x = np.asarray(prior[0], dtype=np.float64) / _SCALE
            y = np.asarray(prior[1], dtype=np.float64)
            k = 1.0 / len(y)  # the prior's statistics per unit of weight
            self._g0, self._h0 = k * x.T @ x, k * x.T @ y
            if coefficients is None:
                coefficients = Coefficients.of(_nnls_normal(x.T @ x, x.T @ y) / _SCALE)
        self.given = coefficients is not None or prior is not None  # not only what it learns online
        self.coefficients = coefficients or Coefficients()
        self._g = np.zeros((5, 5))
        self._h = np.zeros(5)
        self.observed = 0

    @property
    def calibrated(self) -> bool:
        return bool(self.coefficients.vector().any())

    @property
    def settled(self) -> bool:
        """Whether its forecasts rest on a calibration (or given coefficients), or on `SETTLED_AFTER`
        batches learnt online: a fit of the first few, mostly prefills, can be far off for a step."""
        return self.calibrated and (self.given or self.observed >= SETTLED_AFTER)

    def predict(self, feeds: Sequence[Feed]) -> float:
        return self.predict_features(batch_features(feeds))

    def predict_features(self, x: np.ndarray) -> float:
        return float(x @ self.coefficients.vector())

    def observe(self, feeds: Sequence[Feed], ms: float) -> None:
        """A batch ran in `ms`: it joins the online fit."""
        self.observe_features(batch_features(feeds), ms)

    def observe_features(self, features: np.ndarray, ms: float) -> None:
        x = features / _SCALE
        f = self.forgetting
        self._g = f * self._g + np.outer(x, x)
        self._h = f * self._h + x * ms
        self.observed += 1
        if self.observed % self.refit_every == 0:
            p = max(self.prior_floor, self.prior_weight * f**self.observed)
            # the search starts from the coefficients the last fit left free (non-zero)
            w = _nnls_normal(p * self._g0 + self._g, p * self._h0 + self._h, self.coefficients.vector() > 0)
            self.coefficients = Coefficients.of(w / _SCALE)

    # -- persistence -----------------------------------------------------------------------

    def save(self, path: Path, features: np.ndarray, ms: np.ndarray, key: dict[str, object]) -> None:
        """Writes the calibration (its samples and what it was measured on) as JSON."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(
            json.dumps(
                {
                    "key": key,
                    "coefficients_ms": self.coefficients.__dict__,
                    "features": np.asarray(features).tolist(),
                    "ms": np.asarray(ms).tolist(),
                }
            )
        )
        tmp.replace(path)

    @staticmethod
    def load_samples(path: Path, key: dict[str, object]) -> tuple[np.ndarray, np.ndarray] | None:
        """A saved calibration's samples if it was measured on `key`, else None."""
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        if data.get("key") != key:
            return None
        return np.asarray(data["features"], dtype=np.float64), np.asarray(data["ms"], dtype=np.float64)
