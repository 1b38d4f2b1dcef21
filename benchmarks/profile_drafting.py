"""Per-token cost of drafting, logit features and the shipped predictor, on both drafts.

The same measurement as `edgekit profile --json` (edgekit.predictors.profile),
for every pair, into benchmarks/results/profile_drafting.json. WISP's budget
for features plus predictor is 2% of a draft step (issue 4).

    python benchmarks/profile_drafting.py [--pairs gemma-270m,qwen-coder] [--steps 300] [--threads 2]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", default="gemma-270m,qwen-coder")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--threads", type=int, default=0, help="llama.cpp threads (0: all cores, the default of edgekit)")
    args = parser.parse_args()
    if args.threads:
        os.environ["EDGEKIT_THREADS"] = str(args.threads)
    from edgekit import LlamaDraftModel
    from edgekit.models import get_pair, model_path
    from edgekit.predictors.profile import profile_drafting
    from edgekit.predictors.runtime import OnnxPredictor
    from edgekit.predictors.shipped import shipped_predictor

    rows = []
    for pair in C.csv_list(args.pairs):
        spec = get_pair(pair)
        draft = LlamaDraftModel(model_path(spec.draft), name=spec.draft, n_ctx=1024)
        try:
            row = profile_drafting(draft, OnnxPredictor(shipped_predictor(spec.draft, spec.target)), steps=args.steps)
        finally:
            draft.close()
        rows.append({"pair": pair, **row})
    path = C.write_result("profile_drafting", {"settings": vars(args), "results": rows})
    for r in rows:
        print(
            f"{r['pair']:<11} vocab {r['n_vocab']:>6}  step {r['draft_step_us']['median']:>7.0f} us  "
            f"features {r['features_us']['median']:>5.0f} us  predictor {r['predictor_us']['median']:>4.0f} us  "
            f"(p99 {r['features_and_predictor_us']['p99']:.0f})  share {100 * r['features_and_predictor_share']:.2f}%"
        )
    print(path)


if __name__ == "__main__":
    main()
