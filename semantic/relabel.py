"""CSI-aware relabeling (WISV sec. V-B, Stage 2, eqs. 28-31).

An episode's mismatches, in order, at answer offsets p_1 < ... < p_m, carry base
labels c_i (1: critical, the task's outcome changes if the draft's token is
kept). For a channel quality q (`edgekit.verifier.channel_quality`):

- eq. 28, smoothed importance with exponential decay over token distance:
  s_i = sum_j c_j k_ij / sum_j k_ij, k_ij = exp(-|p_i - p_j| / L), the
  kernel-weighted share of critical mismatches around i (in [0, 1]). A critical
  mismatch among other critical ones weighs more than an isolated one. (The
  paper's text of eq. 28 did not survive extraction; this is our reading of
  "critical mismatches influence nearby positions with exponential decay". A
  plain capped sum would give every critical mismatch s = 1, its own term,
  and the smoothing would never order them.)
- the repair budget B(q) = beta(q) * sum_i c_i, beta(q) = beta_min + (1 - beta_min) q,
  monotone in q: on a perfect link every critical mismatch is repaired;
- eq. 29: choose repairs a_i in {0, 1} to maximise sum a_i s_i subject to
  sum a_i <= B(q) and a_i <= c_i (one-way: only critical mismatches are relaxed);
- eq. 30, its Lagrangian: a_i = c_i 1[s_i > mu], mu the budget's multiplier;
- eq. 31, the entropy-regularised Bernoulli relaxation:
  pi_i = c_i sigma((s_i - mu) / T), with mu solved so that sum_i pi_i = B(q)
  (bisection; mu rises as the channel worsens, so repairs thin out).

`relabel_episode` gives the repair probabilities pi; `sample_actions` draws the
relabeled actions a_i ~ Bernoulli(pi_i) for one CSI draw, as WISV samples several
CSI realisations per episode to build its training set.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["RelabelConfig", "relabel_episode", "repair_budget", "sample_actions", "smoothed_importance"]


@dataclass(frozen=True)
class RelabelConfig:
    decay_tokens: float = 8.0  # L of eq. 28
    beta_min: float = 0.4  # the share of critical mismatches still repaired on the worst link
    temperature: float = 0.1  # T of eq. 31


def smoothed_importance(positions: np.ndarray, critical: np.ndarray, decay_tokens: float) -> np.ndarray:
    """Eq. 28: s_i = sum_j c_j k_ij / sum_j k_ij, k_ij = exp(-|p_i - p_j| / L)."""
    p = np.asarray(positions, dtype=np.float64)
    c = np.asarray(critical, dtype=np.float64)
    if p.size == 0:
        return np.zeros(0)
    kernel = np.exp(-np.abs(p[:, None] - p[None, :]) / decay_tokens)
    return (kernel @ c) / kernel.sum(axis=1)


def repair_budget(n_critical: int, quality: float, beta_min: float) -> float:
    """B(q): how many of an episode's critical mismatches a link of quality q repairs."""
    q = min(max(quality, 0.0), 1.0)
    return n_critical * (beta_min + (1.0 - beta_min) * q)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def relabel_episode(
    positions: np.ndarray, critical: np.ndarray, quality: float, config: RelabelConfig = RelabelConfig()
) -> np.ndarray:
    """Eq. 31's repair probabilities pi_i for one episode under channel quality q."""
    c = np.asarray(critical, dtype=bool)
    pi = np.zeros(len(c))
    n = int(c.sum())
    if n == 0:
        return pi
    s = smoothed_importance(positions, c, config.decay_tokens)[c]
    budget = repair_budget(n, quality, config.beta_min)
    t = config.temperature

    def spent(mu: float) -> float:
        return float(_sigmoid((s - mu) / t).sum())

    lo, hi = float(s.min()) - 20 * t, float(s.max()) + 20 * t  # spent(lo) ~ n, spent(hi) ~ 0
    if budget >= spent(lo):
        mu = lo
    else:
        for _ in range(60):  # spent() falls as mu rises
            mid = 0.5 * (lo + hi)
            if spent(mid) > budget:
                lo = mid
            else:
                hi = mid
        mu = 0.5 * (lo + hi)
    pi[c] = _sigmoid((s - mu) / t)
    return pi


def sample_actions(pi: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Relabeled actions a_i ~ Bernoulli(pi_i): 1 repair (reject), 0 skip (accept)."""
    return (rng.random(len(pi)) < pi).astype(np.float64)
