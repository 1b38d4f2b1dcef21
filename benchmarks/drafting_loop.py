"""The client's drafting loop against raw llama.cpp decoding: what the loop adds per draft token.

One draft model, one prompt, greedy. "raw": one `llama_decode` of the last token and an argmax of
its logits, per step, straight on the draft's llama.cpp context (the least any drafting can do).
"drafter": the client's own loop (`edgekit.client._drafter.Drafter.block`, a fixed window of
`--k`), as a round drafts its block: the controller's decision, the logit statistics, the token
pick and the block's bookkeeping around the same decode. Both draft the same `--steps` tokens from
the same prompt (the test of that: both produce the same tokens), in alternating order, `--repeats`
times in one process; the ratio of each repeat's step times (raw / drafter, 1.0 = the loop adds
nothing) is the figure, since absolute times move with the load on a shared machine.

    python -m benchmarks drafting_loop [--pair gemma-270m] [--steps 128] [--k 8] [--repeats 15] [--threads 1]
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from benchmarks import harness as C
from edgekit import FixedWindow, GenerationConfig
from edgekit.client._drafter import Drafter, SharedDraft
from edgekit.models import get_pair, model_path
from edgekit.runtime import LlamaDraftModel

PROMPT = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"


def raw(draft: LlamaDraftModel, prompt: list[int], steps: int) -> tuple[float, list[int]]:
    """Seconds for `steps` greedy steps by llama_decode and argmax alone, and the tokens."""
    ctx = draft._ctx
    draft.truncate(0)
    draft.prefill(prompt[:-1])
    pos, tok, out = len(prompt) - 1, prompt[-1], []
    ctx.set_embeddings(False)
    t0 = time.perf_counter()
    for _ in range(steps):
        ctx.decode([tok], [pos], [0], [True])
        tok = int(np.argmax(ctx.logits(-1)))
        out.append(tok)
        pos += 1
    return time.perf_counter() - t0, out


def drafter(draft: LlamaDraftModel, prompt: list[int], steps: int, k: int) -> tuple[float, list[int]]:
    """Seconds for `steps` greedy steps through the client's drafting loop, and the tokens."""
    config = GenerationConfig(mode="greedy", drafting="fixed", draft_k=k, upload="tokens", stop_at_eos=False)
    d = Drafter(draft, SharedDraft(draft), config, FixedWindow(k), np.random.default_rng(0))
    draft.truncate(0)
    d.reset(prompt)
    t0 = time.perf_counter()
    with d.held():
        while len(d.chain) < steps:
            d.chain.add(d.block(min(k, steps - len(d.chain))))
    return time.perf_counter() - t0, list(d.chain.tokens)


def main() -> None:
    ap = C.arguments(__doc__, pair="gemma-270m", repeats=15, out="drafting_loop")
    ap.add_argument("--steps", type=int, default=128)
    ap.add_argument("--k", type=int, default=8)
    args = C.parse(ap)
    spec = get_pair(args.pair)
    draft = LlamaDraftModel(model_path(spec.draft), name=spec.draft, n_ctx=1024)
    prompt = draft.tokenize(PROMPT)
    raw(draft, prompt, 16), drafter(draft, prompt, 16, args.k)  # warm both paths
    rows = []
    for r in range(args.repeats):
        order = ("raw", "drafter") if r % 2 == 0 else ("drafter", "raw")
        runs = {
            name: raw(draft, prompt, args.steps) if name == "raw" else drafter(draft, prompt, args.steps, args.k)
            for name in order
        }
        if runs["raw"][1] != runs["drafter"][1]:
            raise SystemExit("the drafting loop and raw decoding drafted different tokens: not the same work")
        raw_ms, loop_ms = (runs[n][0] / args.steps * 1e3 for n in ("raw", "drafter"))
        rows.append({"repeat": r, "raw_ms_per_step": raw_ms, "drafter_ms_per_step": loop_ms,
                     "ratio": raw_ms / loop_ms})
        C.progress(f"  repeat {r}: raw {raw_ms:.3f} ms/step, drafter {loop_ms:.3f} ms/step, "
                   f"ratio {raw_ms / loop_ms:.3f}")
    ratios = [row["ratio"] for row in rows]
    summary = {
        "median_ratio": statistics.median(ratios),
        "min_ratio": min(ratios),
        "max_ratio": max(ratios),
        "median_raw_ms_per_step": statistics.median(r["raw_ms_per_step"] for r in rows),
        "median_drafter_ms_per_step": statistics.median(r["drafter_ms_per_step"] for r in rows),
    }
    path = C.write_result(args.out, {
        "settings": {"pair": args.pair, "draft": spec.draft, "steps": args.steps, "k": args.k,
                     "repeats": args.repeats, "threads": args.threads, "prompt_tokens": len(prompt)},
        "summary": summary,
        "repeats": rows,
    })
    fig, (ax,) = C.subplots()
    ax.plot([r["repeat"] for r in rows], ratios, "o-", label="raw / drafter (per repeat)")
    ax.axhline(summary["median_ratio"], ls="--", color="gray", label=f"median {summary['median_ratio']:.3f}")
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xlabel("repeat")
    ax.set_ylabel("speed of the drafting loop relative to raw decode")
    ax.set_title(f"{spec.draft}: drafting loop vs llama_decode + argmax ({args.steps} steps, K={args.k})")
    C.save_figure(fig, path.with_suffix(".png"))
    print(f"{args.pair}: drafting loop at {summary['median_ratio']:.3f}x raw decode speed "
          f"(median of {args.repeats}; range {summary['min_ratio']:.3f}-{summary['max_ratio']:.3f}); "
          f"raw {summary['median_raw_ms_per_step']:.2f} ms/step")
    print(f"results: {path}")


if __name__ == "__main__":
    main()
