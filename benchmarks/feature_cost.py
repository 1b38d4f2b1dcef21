"""Cost of the per-token logit features against a real draft step, on both drafts.

For each pair's draft model: decode a prompt, then N greedy draft steps; time
each step (llama.cpp decode + logits) and the feature computation on that
step's logits, interleaved so noise hits both. Reports median and p99 in
microseconds and the feature time as a share of a draft step (median/median).
WISP's budget for features plus predictor is 2% of a draft step (issue 4).

    python benchmarks/feature_cost.py [--pairs gemma-270m,qwen-coder] [--steps 200] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from _common import write_result


def measure(pair: str, steps: int) -> dict:
    from edgekit import LlamaDraftModel
    from edgekit.models import get_pair, model_path
    from edgekit.predictors.features import LogitFeatures

    name = get_pair(pair).draft
    draft = LlamaDraftModel(model_path(name), name=name, n_ctx=2048)
    features = LogitFeatures(draft.n_vocab)
    prompt = draft.tokenize("def merge_sort(items):\n    \"\"\"Sort a list with merge sort.\"\"\"\n")
    draft.prefill(prompt[:-1])
    token = prompt[-1]
    step_us, feat_us = [], []
    for i in range(steps):
        t0 = time.perf_counter()
        out = draft.eval([token])
        t1 = time.perf_counter()
        features(out.logits, i % 8 + 1, 0.7)
        t2 = time.perf_counter()
        token = int(np.argmax(out.logits))
        step_us.append((t1 - t0) * 1e6)
        feat_us.append((t2 - t1) * 1e6)
        if draft.n_past > 1900:
            draft.truncate(len(prompt) - 1)
            token = prompt[-1]
    draft.close()
    s, f = np.array(step_us), np.array(feat_us)
    return {
        "pair": pair,
        "draft": name,
        "n_vocab": features.n_vocab,
        "steps": steps,
        "draft_step_us": {"median": float(np.median(s)), "p99": float(np.percentile(s, 99))},
        "features_us": {"median": float(np.median(f)), "p99": float(np.percentile(f, 99))},
        "features_share_of_step": float(np.median(f) / np.median(s)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", default="gemma-270m,qwen-coder")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1, help="llama.cpp threads (0: all cores)")
    args = parser.parse_args()
    if args.threads:
        os.environ["EDGEKIT_THREADS"] = str(args.threads)
    rows = [measure(p, args.steps) for p in args.pairs.split(",")]
    table = [
        f"{r['pair']:<11} vocab {r['n_vocab']:>6}  step {r['draft_step_us']['median']:>8.0f} us  "
        f"features {r['features_us']['median']:>5.0f} us (p99 {r['features_us']['p99']:.0f})  "
        f"share {100 * r['features_share_of_step']:.2f}%"
        for r in rows
    ]
    path = write_result(
        "feature_cost",
        {"settings": {"steps": args.steps, "threads": args.threads or "all cores", "pairs": args.pairs}, "results": rows},
    )
    print("\n".join(table))
    print(path)


if __name__ == "__main__":
    main()
