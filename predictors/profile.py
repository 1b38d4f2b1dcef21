"""Profiling the drafting loop on this device: a draft step, the features of its
logits and the predictor's decision, per token, interleaved so that machine
noise falls on all three alike. WISP's budget for features plus predictor is
2% of a draft step (issue 4)."""

from __future__ import annotations

import os
import platform
import time

import numpy as np

from .features import FEATURE_NAMES, LogitFeatures

__all__ = ["profile_drafting"]

_PROMPT = (
    "def merge_intervals(intervals):\n"
    '    """Merge overlapping [start, end] intervals and return them sorted."""\n'
)


def _summary(us: np.ndarray) -> dict:
    return {"median": float(np.median(us)), "p99": float(np.percentile(us, 99)), "mean": float(us.mean())}


def profile_drafting(draft, predictor=None, *, steps: int = 200, warmup: int = 10) -> dict:  # type: ignore[no-untyped-def]
    """Times `steps` greedy draft steps on `draft` (a LlamaDraftModel), with the
    features and, if given, the predictor (an OnnxPredictor) on each step's logits.
    Times are microseconds; shares are medians over the draft step's median."""
    features = LogitFeatures(draft.n_vocab, predictor.feature_names if predictor is not None else FEATURE_NAMES)
    prompt = draft.tokenize(_PROMPT)
    draft.truncate(0)
    draft.prefill(prompt[:-1])
    token = prompt[-1]
    step_us, feat_us, pred_us = [], [], []
    acceptance = 0.7
    for i in range(steps + warmup):
        t0 = time.perf_counter()
        out = draft.eval([token])
        t1 = time.perf_counter()
        f = features(out.logits, i % 8 + 1, acceptance)
        t2 = time.perf_counter()
        if predictor is not None:
            predictor.p_accept(f)
        t3 = time.perf_counter()
        token = int(np.argmax(out.logits))
        if i >= warmup:
            step_us.append((t1 - t0) * 1e6)
            feat_us.append((t2 - t1) * 1e6)
            pred_us.append((t3 - t2) * 1e6)
        if draft.n_past >= draft.n_ctx - 2:
            draft.truncate(len(prompt) - 1)
            token = prompt[-1]
    draft.truncate(0)
    s, f_, p = np.array(step_us), np.array(feat_us), np.array(pred_us)
    step_med = float(np.median(s))
    result = {
        "draft": draft.name,
        "n_vocab": draft.n_vocab,
        "steps": steps,
        "threads": os.environ.get("EDGEKIT_THREADS") or f"all cores ({os.cpu_count()})",
        "cpu": platform.processor() or platform.machine(),
        "draft_step_us": _summary(s),
        "features_us": _summary(f_),
        "features_share": float(np.median(f_)) / step_med,
    }
    if predictor is not None:
        both = f_ + p
        result.update(
            predictor=str(predictor.path),
            predictor_us=_summary(p),
            predictor_share=float(np.median(p)) / step_med,
            features_and_predictor_us=_summary(both),
            features_and_predictor_share=float(np.median(both)) / step_med,
        )
    return result
