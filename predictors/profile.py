"""Profiling the drafting loop on this device: what the rejection predictor adds
to a draft step. WISP's budget for features plus predictor is 2% of a draft
step (issue 4).

Steps alternate between the two ways the session drafts greedily: a plain step
(decode, then the argmax for the token) and a predictor step (decode, then the
controller's decision: features and predictor, then the token from the same
logit statistics). Each pair of neighbouring steps gives one difference, so
machine noise that drifts over seconds falls on both alike; the median
difference is what the predictor adds to a step (`added_us`, `added_share`).

The features and predictor are also timed inside the predictor steps
(`features_us`, `predictor_us`), but those timers overstate them: the first code
after a llama.cpp decode runs with cold caches, and a plain step pays that
refill in its own argmax and loop instead.
"""

from __future__ import annotations

import platform
import time

import numpy as np

from edgekit.drafting import OnnxPredictor
from edgekit.runtime import ALL_COLUMNS, FEATURE_NAMES, LlamaDraftModel, current_kernel, default_threads

__all__ = ["profile_drafting"]

_PROMPT = (
    "def merge_intervals(intervals):\n"
    '    """Merge overlapping [start, end] intervals and return them sorted."""\n'
)


def _summary(us: np.ndarray) -> dict:
    return {"median": float(np.median(us)), "p99": float(np.percentile(us, 99)), "mean": float(us.mean())}


def profile_drafting(
    draft: LlamaDraftModel,
    predictor: OnnxPredictor | None = None,
    *,
    steps: int = 400,
    warmup: int = 10,
    samples: bool = False,
) -> dict:
    """Times `steps` greedy draft steps on `draft` (a LlamaDraftModel), half of
    them plain and half deciding with `predictor` (an OnnxPredictor; without
    one, the features alone). Times are microseconds; `samples` adds every one
    (`samples_us`: plain steps, deciding steps, features, predictor)."""
    x: np.ndarray
    if predictor is not None:  # what PredictorController.draft_next does, in its two parts
        x, columns = predictor._x, predictor._column_bytes
    else:
        x, columns = np.empty(len(FEATURE_NAMES), dtype=np.float32), ALL_COLUMNS
    prompt = draft.tokenize(_PROMPT)
    draft.truncate(0)
    draft.prefill(prompt[:-1])
    token = prompt[-1]
    plain_us: list[float] = []
    step_us: list[float] = []
    feat_us: list[float] = []
    pred_us: list[float] = []
    out = draft.eval([token])
    t_prev = time.perf_counter()
    for i in range(steps + warmup):
        deciding = i % 2 == 1
        if deciding:
            t0 = time.perf_counter()
            out.stats.features_into(x, columns, i % 8 + 1, 0.7)
            t1 = time.perf_counter()
            if predictor is not None:
                predictor._run()
            t2 = time.perf_counter()
        token = out.stats.argmax()
        if draft.n_past >= draft.n_ctx - 2:
            draft.truncate(len(prompt) - 1)
            token = prompt[-1]
        out = draft.eval([token])
        t = time.perf_counter()
        if i >= warmup:
            (step_us if deciding else plain_us).append((t - t_prev) * 1e6)
            if deciding:
                feat_us.append((t1 - t0) * 1e6)
                pred_us.append((t2 - t1) * 1e6)
        t_prev = t
    draft.truncate(0)
    n = min(len(plain_us), len(step_us))
    plain, deciding_steps = np.array(plain_us[:n]), np.array(step_us[:n])
    added = deciding_steps - plain
    f_ = np.array(feat_us)
    step_med = float(np.median(plain))
    result = {
        "draft": draft.name,
        "n_vocab": draft.n_vocab,
        "steps": steps,
        "threads": default_threads(),  # llama.cpp's threads for the draft (EDGEKIT_THREADS, else the cores)
        "cpu": platform.processor() or platform.machine(),
        "kernel": current_kernel(),
        "draft_step_us": _summary(plain),
        "deciding_step_us": _summary(deciding_steps),
        "added_us": _summary(added),
        "added_share": float(np.median(added)) / step_med,
        "features_us": _summary(f_),
        "features_share": float(np.median(f_)) / step_med,
    }
    if samples:
        result["samples_us"] = {"plain": plain.tolist(), "deciding": deciding_steps.tolist(), "features": feat_us,
                                "predictor": pred_us if predictor is not None else []}
    if predictor is not None:
        p = np.array(pred_us)
        both = f_ + p
        result.update(
            predictor=str(predictor.path),
            predictor_us=_summary(p),
            predictor_share=float(np.median(p)) / step_med,
            features_and_predictor_us=_summary(both),
            features_and_predictor_share=float(np.median(both)) / step_med,
        )
    return result
