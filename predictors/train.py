"""Training the rejection predictor (WISP sec. 5.4, appendix B) in numpy.

- Data: the labelled positions of a trace (accepted 1, first rejection 0),
  split by prompt into train and validation so no prompt is in both.
- Models: a compact MLP (two ReLU hidden layers, sigmoid output, Adam on
  class-weighted binary cross-entropy, early stopping on validation loss) and
  a logistic-regression baseline with the same weighting.
- Operating threshold: the one that maximises expected goodput (committed
  tokens per second) when the stop-at-first-predicted-rejection rule is
  replayed over the validation rounds under a cost model, not accuracy.
- Export: ONNX (input standardisation folded into the first layer), with the
  feature names and threshold in the model's metadata.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np

from .collect import Trace
from .features import FEATURE_NAMES

__all__ = [
    "DEFAULT_FEATURES",
    "CostModel",
    "LinearModel",
    "Mlp",
    "auc",
    "classification_metrics",
    "delay_schedule",
    "replay_policy",
    "split_by_prompt",
    "standardiser",
    "train_logistic",
    "train_mlp",
]


# logit_std and recent_acceptance are computed and traced but left out by
# default: dropping either from logistic regression moved validation AUC by
# under 0.001 on both pairs' traces. logit_std costs two more sums per logit in
# the drafting loop's kernel; recent_acceptance depends on the drafting policy that
# produced the trace (a predictor that stops early sees fewer rejections).
DEFAULT_FEATURES = ("confidence", "entropy", "margin", "position")


@dataclass(frozen=True)
class CostModel:
    """Time of a round: fixed round cost (RTT and a verification whose cost does
    not grow with the block, as on a GPU verifier), per-token verification, and
    one draft step per position examined on the device."""

    draft_step_ms: float
    round_ms: float = 60.0
    verify_token_ms: float = 0.0

    def round_time(self, steps: np.ndarray, block: np.ndarray) -> np.ndarray:
        return self.round_ms + self.draft_step_ms * steps + self.verify_token_ms * (block + 1)


# -- models --------------------------------------------------------------------------


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))


@dataclass
class LinearModel:
    """Logistic regression on standardised features."""

    mean: np.ndarray
    scale: np.ndarray
    w: np.ndarray  # [F]
    b: float
    kind: str = "logistic"

    def predict(self, x: np.ndarray) -> np.ndarray:
        return _sigmoid(((x - self.mean) / self.scale) @ self.w + self.b)

    def layers(self) -> list[tuple[np.ndarray, np.ndarray]]:
        return [(self.w[:, None], np.array([self.b]))]


@dataclass
class Mlp:
    mean: np.ndarray
    scale: np.ndarray
    weights: list[np.ndarray] = field(default_factory=list)  # [in, out] each
    biases: list[np.ndarray] = field(default_factory=list)
    kind: str = "mlp"

    def _forward(self, x: np.ndarray, dropout: float = 0.0, rng: np.random.Generator | None = None) -> list[np.ndarray]:
        """Activations of every layer; with `dropout` (training), hidden units are
        dropped at that rate and the rest scaled up (inverted dropout)."""
        acts = [(x - self.mean) / self.scale]
        for i, (w, b) in enumerate(zip(self.weights, self.biases)):
            z = acts[-1] @ w + b
            if i < len(self.weights) - 1:
                h = np.maximum(z, 0.0)
                if dropout and rng is not None:
                    h *= (rng.random(h.shape) >= dropout) / (1.0 - dropout)
                acts.append(h)
            else:
                acts.append(z)
        return acts

    def predict(self, x: np.ndarray) -> np.ndarray:
        return _sigmoid(self._forward(x)[-1][:, 0])

    def layers(self) -> list[tuple[np.ndarray, np.ndarray]]:
        return list(zip(self.weights, self.biases))


def _class_weights(y: np.ndarray) -> np.ndarray:
    """Balanced: each class carries half the total weight."""
    n, pos = len(y), max(int(y.sum()), 1)
    neg = max(n - pos, 1)
    return np.where(y == 1, n / (2 * pos), n / (2 * neg))


def standardiser(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each column's mean and standard deviation (1 where a column is constant)."""
    mean = x.mean(axis=0)
    scale = x.std(axis=0)
    return mean, np.where(scale > 1e-8, scale, 1.0)


def _weighted_bce(p: np.ndarray, y: np.ndarray, w: np.ndarray) -> float:
    p = np.clip(p, 1e-7, 1 - 1e-7)
    return float(-(w * (y * np.log(p) + (1 - y) * np.log(1 - p))).sum() / w.sum())


def train_logistic(x: np.ndarray, y: np.ndarray, *, l2: float = 1e-3, iters: int = 50) -> LinearModel:
    """Class-weighted, L2-regularised logistic regression by Newton's method."""
    mean, scale = standardiser(x)
    xs = np.hstack([(x - mean) / scale, np.ones((len(x), 1))])
    sw = _class_weights(y)
    theta = np.zeros(xs.shape[1])
    reg = l2 * len(x) * np.eye(xs.shape[1])
    reg[-1, -1] = 0.0
    for _ in range(iters):
        p = _sigmoid(xs @ theta)
        grad = xs.T @ (sw * (p - y)) + reg @ theta
        hess = (xs * (sw * p * (1 - p))[:, None]).T @ xs + reg
        step = np.linalg.solve(hess, grad)
        theta -= step
        if np.abs(step).max() < 1e-8:
            break
    return LinearModel(mean, scale, theta[:-1].copy(), float(theta[-1]))


def train_mlp(
    x: np.ndarray,
    y: np.ndarray,
    x_val: np.ndarray,
    y_val: np.ndarray,
    *,
    hidden: tuple[int, ...] = (32, 16),
    lr: float = 3e-3,
    batch: int = 256,
    epochs: int = 300,
    patience: int = 25,
    l2: float = 1e-4,
    seed: int = 0,
    dropout: float = 0.0,
    sample_weight: np.ndarray | None = None,
) -> Mlp:
    """Adam on class-weighted BCE (times `sample_weight` where given), L2 weight decay
    `l2`, inverted dropout on the hidden layers at rate `dropout`; keeps the weights
    of the best validation loss."""
    rng = np.random.default_rng(seed)
    mean, scale = standardiser(x)
    model = Mlp(mean, scale)
    sizes = (x.shape[1], *hidden, 1)
    for fan_in, fan_out in itertools.pairwise(sizes):
        model.weights.append(rng.normal(0.0, np.sqrt(2.0 / fan_in), (fan_in, fan_out)))
        model.biases.append(np.zeros(fan_out))
    params = model.weights + model.biases
    m1 = [np.zeros_like(p) for p in params]
    m2 = [np.zeros_like(p) for p in params]
    sw, sw_val = _class_weights(y), _class_weights(y_val)
    if sample_weight is not None:
        sw = sw * sample_weight
    best = (np.inf, [p.copy() for p in params])
    stale, t = 0, 0
    n_layers = len(model.weights)
    for _ in range(epochs):
        order = rng.permutation(len(x))
        for start in range(0, len(x), batch):
            idx = order[start : start + batch]
            acts = model._forward(x[idx], dropout, rng)
            # d(weighted BCE)/d(logit) = w (p - y), normalised by the batch weight
            wb = sw[idx]
            delta = (wb * (_sigmoid(acts[-1][:, 0]) - y[idx]) / wb.sum())[:, None]
            grads_w: list[np.ndarray] = [np.empty(0)] * n_layers
            grads_b: list[np.ndarray] = [np.empty(0)] * n_layers
            for i in range(n_layers - 1, -1, -1):
                grads_w[i] = acts[i].T @ delta + l2 * model.weights[i]
                grads_b[i] = delta.sum(axis=0)
                if i:  # a dropped unit reads 0 and passes no gradient; a kept one was scaled
                    delta = (delta @ model.weights[i].T) * (acts[i] > 0) / (1.0 - dropout)
            t += 1
            for j, g in enumerate(grads_w + grads_b):
                m1[j] = 0.9 * m1[j] + 0.1 * g
                m2[j] = 0.999 * m2[j] + 0.001 * g * g
                params[j] -= lr * (m1[j] / (1 - 0.9**t)) / (np.sqrt(m2[j] / (1 - 0.999**t)) + 1e-8)
        loss = _weighted_bce(model.predict(x_val), y_val, sw_val)
        if loss < best[0] - 1e-5:
            best, stale = (loss, [p.copy() for p in params]), 0
        else:
            stale += 1
            if stale >= patience:
                break
    for p, b in zip(params, best[1]):
        p[...] = b
    return model


# -- evaluation ------------------------------------------------------------------------


def auc(y: np.ndarray, score: np.ndarray) -> float:
    """Area under the ROC curve (Mann-Whitney, ties counted half)."""
    order = np.argsort(score, kind="mergesort")
    ranks = np.empty(len(score))
    s = score[order]
    # average ranks over ties
    i = 0
    while i < len(s):
        j = i
        while j + 1 < len(s) and s[j + 1] == s[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    pos = y == 1
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if not n_pos or not n_neg:
        return float("nan")
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def classification_metrics(y: np.ndarray, p: np.ndarray, threshold: float) -> dict:
    """WISP Table 4: accuracy, AUC, recall on accepted (Rec1), specificity, FPR, balanced accuracy."""
    pred = p >= threshold
    pos, neg = y == 1, y == 0
    tp, tn = int((pred & pos).sum()), int((~pred & neg).sum())
    fp, fn = int((pred & neg).sum()), int((~pred & pos).sum())
    rec1 = tp / max(tp + fn, 1)
    spec = tn / max(tn + fp, 1)
    return {
        "accuracy": (tp + tn) / max(len(y), 1),
        "auc": auc(y, p),
        "recall_accepted": rec1,
        "specificity": spec,
        "false_positive_rate": 1.0 - spec,
        "balanced_accuracy": (rec1 + spec) / 2,
        "confusion": {"tp": tp, "fn": fn, "tn": tn, "fp": fp},
        "samples": len(y),
    }


@dataclass(frozen=True)
class TracedRounds:
    """A trace's rounds side by side: round r drafted `drafted[r]` tokens, rows
    `first[r]` onwards in block order, and `accepted[r]` of them were accepted."""

    first: np.ndarray  # [R] the round's first row
    drafted: np.ndarray  # [R]
    accepted: np.ndarray  # [R]

    def rows(self, width: int) -> np.ndarray:
        """[R, width] row indices of positions 0..width-1 (clipped to the round's last row)."""
        offsets = np.minimum(np.arange(width)[None, :], np.maximum(self.drafted[:, None] - 1, 0))
        return self.first[:, None] + offsets


def rounds_of(trace: Trace) -> TracedRounds:
    """The traced rounds (consecutive rows of one prompt and round index)."""
    key = trace.prompt.astype(np.int64) * 1_000_000 + trace.round
    _, starts = np.unique(key, return_index=True)
    first = np.sort(starts)
    drafted = np.diff(np.append(first, len(key)))
    accepted = np.add.reduceat((trace.label == 1).astype(np.int64), first) if len(first) else first
    return TracedRounds(first, drafted, accepted)


def replay_policy(
    trace: Trace,
    keep: np.ndarray,
    cost: CostModel,
    *,
    max_window: int | None = None,
    min_window: int = 1,
    stop: str = "before",
    traced: TracedRounds | None = None,
) -> dict:
    """Replays stop-at-first-predicted-rejection over the traced rounds.

    `keep[i]` says whether the policy predicts row i's token accepted. Each
    traced round starts where a real one did; the replayed block runs to the
    first position predicted rejected, which it leaves out (`stop="before"`,
    WISP eq. 25: the step that produced its logits is paid for nothing) or
    sends as its last token ("after"); at least `min_window` tokens, at most
    `max_window` and what the round drafted. Its accepted tokens are those of
    the traced outcome within it. Offline: a shorter block would move later
    rounds, which is not modelled. `traced`: `rounds_of(trace)`, where many
    replays share it.
    """
    t = traced if traced is not None else rounds_of(trace)
    keep = np.asarray(keep, bool)
    n = t.drafted
    limit = np.minimum(n, max_window) if max_window else n
    start = np.minimum(min_window, limit)
    width = int(limit.max(initial=0))
    pos = np.arange(width)[None, :]
    # a position that can end the block: within [start, limit) and predicted rejected
    ends = (pos >= start[:, None]) & (pos < limit[:, None]) & ~keep[t.rows(width)] if width else \
        np.zeros((len(n), 0), bool)
    stopped = ends.any(axis=1)
    k = np.where(stopped, ends.argmax(axis=1) if width else 0, limit)
    if stop == "after":  # the first predicted rejection goes in, and the block ends
        k = k + stopped
        step = k
    else:
        step = k + stopped  # stopping before a token costs the step that produced it
    acc = np.minimum(k, t.accepted)
    rounds = len(n)
    drafted, accepted, steps = int(k.sum()), int(acc.sum()), int(step.sum())
    time_ms = float(cost.round_time(step, k).sum())
    committed = accepted + rounds
    return {
        "rounds": rounds,
        "drafted": drafted,
        "accepted": accepted,
        "wasted": drafted - accepted,
        "draft_steps": steps,
        "acceptance_rate": accepted / max(drafted, 1),
        "accepted_per_round": accepted / max(rounds, 1),
        "committed_per_round": committed / max(rounds, 1),
        "target_passes_per_token": rounds / max(committed, 1),
        "goodput_tok_s": committed / (time_ms / 1e3) if time_ms else 0.0,
    }


def best_threshold(
    trace: Trace,
    score: np.ndarray,
    cost: CostModel,
    *,
    max_window: int,
    candidates: int = 99,
    stops: tuple[str, ...] = ("before", "after"),
) -> tuple[float, str, dict]:
    """The threshold on `score` (predicted accepted where score >= threshold) and
    stop rule (of `stops`) with the highest replayed goodput: (threshold, rule, replay)."""
    grid = np.unique(np.quantile(score, np.linspace(0.0, 1.0, candidates)))
    best: tuple[float, str, dict] | None = None
    for stop in stops:
        for thr in grid:
            r = replay_policy(trace, score >= thr, cost, max_window=max_window, stop=stop)
            if best is None or r["goodput_tok_s"] > best[2]["goodput_tok_s"]:
                best = (float(thr), stop, r)
    assert best is not None
    return best


# The round costs a delay schedule is made for, in draft steps: a round's fixed time (the RTT and
# the verifier's step) from a quarter of a draft step (a GPU next door) to 128 (a CPU device
# drafting for a verifier across a continent), and the verification time per block token.
ROUND_STEPS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0)
VERIFY_TOKEN_STEPS = (0.0, 0.25, 0.5, 1.0, 2.0)


def delay_schedule(
    trace: Trace,
    score: np.ndarray,
    *,
    max_window: int,
    round_steps: tuple[float, ...] = ROUND_STEPS,
    verify_token_steps: tuple[float, ...] = VERIFY_TOKEN_STEPS,
    candidates: int = 99,
    operating: tuple[float, str] | None = None,
) -> list[dict]:
    """The stopping rule with the highest replayed goodput at each round cost: the threshold
    on `score`, the stop rule and the largest block, for a round whose fixed time is
    `round_steps` draft steps and whose verification adds `verify_token_steps` per block token.

    Goodput depends on the costs only through these ratios, so one schedule serves any
    device speed. The best threshold falls as the round grows dearer (a longer wait makes a
    longer block worth its risk; UCB-SpecStop's delay-adaptive threshold) and rises as it
    grows cheap, down to a fixed window of 1 where a round costs less than a draft step.
    Fixed windows are candidates too (threshold 0 under a cap). Each point also gives its
    goodput over the best fixed window's, and over `operating` (one threshold and stop rule
    for every cost, as a predictor without a schedule runs), both replayed on `trace`."""
    traced = rounds_of(trace)
    grid = np.quantile(score, np.linspace(0.0, 1.0, candidates))
    grid = np.unique(np.append(grid, operating[0]) if operating is not None else grid)
    keep = [(float(t), score >= t) for t in grid]
    everything = np.ones(len(score), bool)
    points = []
    for sigma in verify_token_steps:
        for rho in round_steps:
            cost = CostModel(draft_step_ms=1.0, round_ms=rho, verify_token_ms=sigma)
            fixed = {k: replay_policy(trace, everything, cost, max_window=k, traced=traced)["goodput_tok_s"]
                     for k in range(1, max_window + 1)}
            best_k = max(fixed, key=lambda k: fixed[k])
            best = (fixed[best_k], 0.0, "before", best_k)
            for stop in ("before", "after"):
                for t, mask in keep:
                    g = replay_policy(trace, mask, cost, max_window=max_window, stop=stop, traced=traced)[
                        "goodput_tok_s"]
                    if g > best[0]:
                        best = (g, t, stop, max_window)
            point = {"round_steps": rho, "verify_token_steps": sigma, "threshold": best[1], "stop": best[2],
                     "max_window": best[3], "gain_over_best_fixed": best[0] / fixed[best_k] - 1.0,
                     "best_fixed_window": best_k}
            if operating is not None:
                g = replay_policy(trace, score >= operating[0], cost, max_window=max_window, stop=operating[1],
                                  traced=traced)["goodput_tok_s"]
                point["gain_over_operating_point"] = best[0] / g - 1.0 if g else 0.0
            points.append(point)
    return points


def split_by_prompt(trace: Trace, fraction: float = 0.2, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Row masks (train, validation) with whole prompts on one side."""
    prompts = np.unique(trace.prompt)
    rng = np.random.default_rng(seed)
    val = rng.choice(prompts, size=max(1, round(fraction * len(prompts))), replace=False)
    is_val = np.isin(trace.prompt, val)
    return ~is_val, is_val


def features_matrix(trace: Trace, names: tuple[str, ...]) -> np.ndarray:
    return trace.features[:, [FEATURE_NAMES.index(n) for n in names]].astype(np.float64)
