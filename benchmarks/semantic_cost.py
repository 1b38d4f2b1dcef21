"""What the target's hidden rows cost a verify pass (WISV semantic mode, issue 20 step 1).

A semantic round asks the engine for the final-layer hidden state of each block
position besides its logits (`Feed(hidden=True)`: embeddings on for that call).
This measures a round's pass with and without them on the same `LlamaEngine`,
interleaved round by round (cells shuffled) so that the shared CPU's noise hits
both alike, for blocks of K = 1, 2, 4, 8 tokens on a fixed context, and checks
that the logits are bit-identical either way (exact numerics).

    python -m benchmarks semantic_cost                    # gemma-270m and qwen-coder
    python -m benchmarks semantic_cost --pairs gemma-270m --rounds 10
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import numpy as np

from benchmarks import harness as C
from edgekit.models import pair_paths
from edgekit.verifier import Feed, LlamaEngine

TEXT = (
    "def moving_average(values, window):\n    if window <= 0:\n        raise ValueError('window must be positive')\n"
    "    out = []\n    total = 0.0\n    for i, v in enumerate(values):\n        total += v\n"
    "        if i >= window:\n            total -= values[i - window]\n        if i >= window - 1:\n"
    "            out.append(total / window)\n    return out\n"
) * 4


def measure(pair: str, blocks: list[int], rounds: int, context: int, threads: int | None) -> dict:
    _, target = pair_paths(pair)
    engine = LlamaEngine(str(target), max_context=context + 64, n_seq=2, max_block=max(blocks), threads=threads)
    tokens = engine.model.tokenize(TEXT)[:context + max(blocks)]
    head = tuple(tokens[:context])
    for seq in (0, 1):
        engine.run_batch([Feed(seq, 0, head[:-1], 0)])
    times: dict[tuple[int, bool], list[float]] = {(k, h): [] for k in blocks for h in (False, True)}
    identical = True
    cells = list(times)
    for _ in range(rounds):
        random.shuffle(cells)
        ref: dict[int, np.ndarray] = {}
        for k, hidden in cells:
            feed = Feed(int(hidden), context - 1, (head[-1], *tokens[context:context + k]), k + 1, hidden=hidden)
            t0 = time.perf_counter()
            (out,) = engine.run_batch([feed])
            times[k, hidden].append((time.perf_counter() - t0) * 1e3)
            logits = out[0] if isinstance(out, tuple) else out
            if k in ref:
                identical &= bool(np.array_equal(ref[k], logits))
            else:
                ref[k] = logits
    engine.close()
    rows = []
    for k in blocks:
        plain, with_hidden = C.median(times[k, False]), C.median(times[k, True])
        rows.append({"block": k, "plain_ms": plain, "hidden_ms": with_hidden, "ratio": with_hidden / plain,
                     "plain_all": times[k, False], "hidden_all": times[k, True]})
    return {"pair": pair, "context": context, "rounds": rounds, "logits_identical": identical, "blocks": rows}


def plot(payload: dict, path: Path) -> None:
    fig, axes = C.subplots(len(payload["pairs"]), width=5.0 * len(payload["pairs"]), height=3.8)
    for ax, res in zip(axes, payload["pairs"]):
        ks = [r["block"] for r in res["blocks"]]
        ax.plot(ks, [r["plain_ms"] for r in res["blocks"]], "o-", label="logits only (greedy, sample)")
        ax.plot(ks, [r["hidden_ms"] for r in res["blocks"]], "s-", label="logits + hidden rows (semantic)")
        for r in res["blocks"]:
            ax.annotate(f"x{r['ratio']:.2f}", (r["block"], r["hidden_ms"]), textcoords="offset points",
                        xytext=(0, 6), ha="center", fontsize=8)
        ax.set_xlabel("block K (the pass verifies K+1 positions)")
        ax.set_ylabel("verify pass, ms (median)")
        ax.set_title(f"{res['pair']}, context {res['context']}")
        ax.set_xticks(ks)
        ax.legend(fontsize=8)
    C.save_figure(fig, path)


def main() -> None:
    ap = C.arguments(__doc__, threads=0, pairs="gemma-270m,qwen-coder")
    ap.add_argument("--blocks", default="1,2,4,8")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--context", type=int, default=256)
    args = C.parse(ap)
    threads = args.threads if args.threads > 0 else None  # None: edgekit's default
    results = []
    for pair in C.csv_list(args.pairs):
        C.progress(f"{pair}: {args.rounds} rounds")
        results.append(measure(pair, C.csv_list(args.blocks, int), args.rounds, args.context, threads))
    payload = {"machine": C.machine(), "pairs": results}
    out = C.write_result("semantic_cost", payload)
    plot(payload, out.with_suffix(".png"))
    for res in results:
        print(f"{res['pair']} (logits identical with and without hidden rows: {res['logits_identical']})")
        print(C.table(
            ["block", "plain ms", "hidden ms", "ratio"],
            [[r["block"], r["plain_ms"], r["hidden_ms"], r["ratio"]] for r in res["blocks"]],
        ))


if __name__ == "__main__":
    main()
