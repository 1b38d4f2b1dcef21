"""Per-token cost of drafting, logit features and the shipped predictor, on both drafts.

The same measurement as `edgekit profile --json` (edgekit.predictors.profile),
for every pair, into benchmarks/results/profile_drafting.json. WISP's budget
for features plus predictor is 2% of a draft step (issue 4).

    python -m benchmarks profile_drafting [--pairs gemma-270m,qwen-coder] [--steps 400] [--threads 1,0] [--repeats 3]
        [--kernels avx2,avx512f]

`--kernels` profiles each named logit kernel this CPU runs (`edgekit.runtime._logitstats.KERNELS`),
so that an AVX-512 machine also says what a CPU with AVX2 only would pay.

Each (pair, threads) is profiled `--repeats` times in one process; the summary
gives every repeat's added share and their median, since the draft step itself
moves by tens of percent with the load on a shared machine.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from benchmarks import harness as C


def main() -> None:
    parser = C.arguments(__doc__, threads=None, pairs="gemma-270m,qwen-coder", repeats=3, out="profile_drafting")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--threads", dest="thread_counts", default="1,0",
                        help="llama.cpp thread counts, each profiled in turn (0: all cores, edgekit's default)")
    parser.add_argument("--kernels", default="", help="logit kernels to profile (default: the best this CPU runs)")
    # --threads here is a list (another dest, so C.parse applies none of it): each count is set in turn below
    args = C.parse(parser, machine=False)
    from edgekit import LlamaDraftModel
    from edgekit.drafting import OnnxPredictor, shipped_predictor
    from edgekit.models import get_pair, model_path
    from edgekit.predictors.profile import profile_drafting
    from edgekit.runtime import current_kernel, use_kernel

    kernels = C.csv_list(args.kernels) if args.kernels else [current_kernel()]

    rows = []
    for pair in C.csv_list(args.pairs):
        spec = get_pair(pair)
        predictor = OnnxPredictor(shipped_predictor(spec.draft, spec.target))
        for threads in (int(t) for t in C.csv_list(args.thread_counts)):
            if threads:
                os.environ["EDGEKIT_THREADS"] = str(threads)
            else:
                os.environ.pop("EDGEKIT_THREADS", None)
            draft = LlamaDraftModel(model_path(spec.draft), name=spec.draft, n_ctx=1024)
            try:
                for r in range(args.repeats):
                    for kernel in kernels:  # interleaved, so that a drift in the machine's load falls on each
                        use_kernel(kernel)
                        rows.append({"pair": pair, "repeat": r, **profile_drafting(draft, predictor,
                                                                                   steps=args.steps)})
                        print(_line(rows[-1]), flush=True)
            finally:
                draft.close()
    summary = {}
    for r in rows:
        summary.setdefault(f"{r['pair']} {r['kernel']} threads={r['threads']}", []).append(r["added_share"])
    summary = {k: {"added_share": v, "median": float(np.median(v))} for k, v in summary.items()}
    path = C.write_result(args.out, {"settings": vars(args), "summary": summary, "results": rows})
    for k, v in summary.items():
        print(f"{k:<40} added share per repeat {' '.join(f'{100 * x:.2f}%' for x in v['added_share'])}  "
              f"median {100 * v['median']:.2f}%")
    plot(summary, path.with_suffix(".png"))
    print(path)


def plot(summary: dict, path: Path) -> None:
    fig, (ax,) = C.subplots(1, width=max(5.0, 1.6 * len(summary)))
    names = list(summary)
    for i, name in enumerate(names):
        shares = [100 * x for x in summary[name]["added_share"]]
        ax.scatter([i] * len(shares), shares, color="#47a", alpha=0.6, s=18)
        ax.hlines(100 * summary[name]["median"], i - 0.3, i + 0.3, color="k")
    ax.axhline(2.0, color="r", linestyle="--", label="WISP's budget: 2% of a draft step")
    ax.set_xticks(range(len(names)), [n.replace(" ", "\n", 2).replace("threads=", "threads: ") for n in names],
                  fontsize=7)
    ax.set_ylabel("decision's added share of a draft step (%)")
    ax.set_title("Decision cost (features + predictor)\ndots: repeats, bars: medians", fontsize=9)
    ax.legend(fontsize=7)
    ax.set_ylim(bottom=0)
    print(f"figure: {C.save_figure(fig, path)}")


def _line(r: dict) -> str:
    return (
        f"{r['pair']:<11} {r['kernel']:<8} threads {r['threads']:<16} step {r['draft_step_us']['median']:>7.0f} us  "
        f"added {r['added_us']['median']:>5.0f} us ({100 * r['added_share']:.2f}%)  "
        f"timed: features {r['features_us']['median']:>4.0f} us, predictor {r['predictor_us']['median']:>4.0f} us"
    )


if __name__ == "__main__":
    main()
