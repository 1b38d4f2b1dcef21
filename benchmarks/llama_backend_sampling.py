"""Which of llama.cpp's backend-sampling outputs are right when a sequence has several output rows.

`edgekit serve --reduce-rows llama` has llama.cpp take each greedy row's argmax in its graph
(backend sampling: a sampler chain per sequence, `llama_set_sampler`), and reads only the sampled
token. This is why: on the vendored llama.cpp, batches of several sequences with several output
rows each (a verify round's K + 1), decoded on one context with a chain on every sequence and on a
second context without any, the row's argmax of the second compared with what the first's chain
gave:

- `greedy`: a greedy chain, its sampled token (`llama_get_sampled_token_ith`);
- `top_k`: a top-k 4 chain, its candidates and their logits (`llama_get_sampled_candidates_ith`,
  `llama_get_sampled_logits_ith`), the best of them.

Each batch puts several sequences' rows together in another order and mix; the JSON counts the
rows each way got wrong.

    python -m benchmarks llama_backend_sampling            # gemma-270m
"""

from __future__ import annotations

import ctypes
import itertools
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import harness as C
from edgekit.models import pair_paths
from edgekit.runtime import LlamaContext, LlamaModel

TEXTS = [
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "The capital of France is Paris, and of Italy Rome.\n",
    "import numpy as np\n\ndef normalize(x):\n    return x\n",
    "1, 2, 3, 5, 8, 13, 21, 34, 55",
]
ROWS = 5  # a verify round's K + 1 at K = 4


def _chain(kind: str) -> Any:
    import llama_cpp as lc

    chain = lc.llama_sampler_chain_init(lc.llama_sampler_chain_default_params())
    step = lc.llama_sampler_init_greedy() if kind == "greedy" else lc.llama_sampler_init_top_k(4)
    lc.llama_sampler_chain_add(chain, step)
    return chain


def _best(ctx: LlamaContext, kind: str, i: int) -> int:
    import llama_cpp as lc

    if kind == "greedy":
        return int(lc.llama_get_sampled_token_ith(ctx._ctx, i))
    n = int(lc.llama_get_sampled_candidates_count_ith(ctx._ctx, i))
    ids = np.ctypeslib.as_array(lc.llama_get_sampled_candidates_ith(ctx._ctx, i), shape=(n,))
    values = np.ctypeslib.as_array(
        ctypes.cast(lc.llama_get_sampled_logits_ith(ctx._ctx, i), ctypes.POINTER(ctypes.c_float)), shape=(n,))
    return int(ids[int(np.argmax(values))])


def measure(pair: str, kind: str, threads: int | None) -> dict[str, Any]:
    import llama_cpp as lc

    model = LlamaModel(str(pair_paths(pair)[1]))
    heads = [model.tokenize(t) for t in TEXTS]
    plain, sampled = (LlamaContext(model, n_ctx=len(TEXTS) * 256, n_seq=len(TEXTS), n_threads=threads,
                                   outputs_per_seq=ROWS) for _ in range(2))
    chains = [_chain(kind) for _ in TEXTS]
    for seq, chain in enumerate(chains):
        if not lc.llama_set_sampler(sampled._ctx, seq, chain):
            raise SystemExit(f"llama.cpp cannot run a {kind} chain on this backend")
    for ctx in (plain, sampled):
        for seq, head in enumerate(heads):
            ctx.decode_sequence(head[:-ROWS], 0, seq, last_output=False)
    batches = [list(p) for n in (1, 2, 4) for p in itertools.permutations(range(len(TEXTS)), n)][::3]
    rows = wrong = 0
    wrong_batches = []
    for seqs in batches:
        tokens, positions, ids = [], [], []
        for seq in seqs:
            start = len(heads[seq]) - ROWS
            tokens += heads[seq][start:]
            positions += range(start, start + ROWS)
            ids += [seq] * ROWS
        got = []
        for ctx in (plain, sampled):
            for seq in seqs:
                ctx.truncate(seq, len(heads[seq]) - ROWS)
            ctx.decode(tokens, positions, ids, [True] * len(tokens))
            got.append([int(np.argmax(ctx.logits(i))) if ctx is plain else _best(ctx, kind, i)
                        for i in range(len(tokens))])
        bad = [i for i, (a, b) in enumerate(zip(*got)) if a != b]
        rows += len(tokens)
        wrong += len(bad)
        if bad:
            wrong_batches.append({"sequences": seqs, "wrong_rows": bad})
    plain.close()
    sampled.close()
    for chain in chains:
        lc.llama_sampler_free(chain)
    return {"pair": pair, "chain": kind, "batches": len(batches), "rows": rows, "wrong_rows": wrong,
            "wrong_share": wrong / rows, "wrong_batches": wrong_batches}


def plot(result: dict[str, Any], png: Path) -> None:
    fig, (ax,) = C.subplots(width=6.0)
    runs = result["results"]
    labels = [f"{r['chain']}\n({r['rows']} rows, {r['batches']} batches)" for r in runs]
    ax.bar(labels, [100 * r["wrong_share"] for r in runs], color=["tab:green" if not r["wrong_rows"] else "tab:red"
                                                                    for r in runs])
    for x, r in enumerate(runs):
        ax.text(x, 100 * r["wrong_share"], f"{r['wrong_rows']} wrong", ha="center", va="bottom")
    ax.set_ylabel("rows whose id is not the row's argmax (%)")
    ax.set_title("llama.cpp backend sampling, several output rows per sequence")
    C.save_figure(fig, png)


def main() -> None:
    ap = C.arguments(__doc__, replot=True, pairs="gemma-270m", out="llama_backend_sampling")
    args = C.parse(ap, plot=plot)
    threads = args.threads or None
    results = [measure(p, kind, threads) for p in C.csv_list(args.pairs) for kind in ("greedy", "top_k")]
    print(C.table(["pair", "chain", "batches", "rows", "wrong rows"],
                  [[r["pair"], r["chain"], r["batches"], r["rows"], r["wrong_rows"]] for r in results]))
    path = C.write_result(args.out, {"settings": vars(args), "results": results})
    plot({"results": results}, path.with_suffix(".png"))
    print(f"wrote {path} and {path.with_suffix('.png').name}")


if __name__ == "__main__":
    main()
