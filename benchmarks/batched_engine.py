"""Verification rows per second: sessions' rounds in one batch against one round at a time.

For each pair's target, in exact and fast numerics, a `LlamaEngine` holds S
sessions (S = 1, 2, 4, 8, 16), each with its own prompt prefilled. A round is
every session verifying a block of K draft tokens (K+1 rows: its last committed
token and the block), rolled back after. The same rounds run two ways, in
alternating order so that the noise of the shared CPU falls on both: one
`run_batch` per session (today's verifier, one round at a time) and one
`run_batch` for all S (the engine loop's batches). Rows per second are
(K+1) x S over the wall time of a round, the median over repeats. In exact
numerics the batched logits must equal the one-at-a-time ones bit for bit: the
benchmark counts the rows where they do.

    python -m benchmarks batched_engine                       # both pairs, both numerics
    python -m benchmarks batched_engine --pairs gemma-270m --repeats 5
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from benchmarks import harness as C
from edgekit.models import get_pair, model_path
from edgekit.verifier import Feed, LlamaEngine

SESSIONS = (1, 2, 4, 8, 16)


def _prompts(engine: LlamaEngine, n: int, length: int) -> list[list[int]]:
    """n different token sequences of `length` tokens, from the evaluation prompts, repeated to length."""
    texts = [p["prompt"] for p in C.load_prompts()]
    out = []
    for i in range(n):
        toks = engine.model.tokenize(texts[i % len(texts)] + " " + texts[(i + 3) % len(texts)])
        while len(toks) < length:
            toks = toks + toks[1:]
        out.append(toks[:length])
    return out


def measure(
    pair: str, exact: bool, k: int, repeats: int, context: int, threads: int | None, max_block: int
) -> dict:
    spec = get_pair(pair)
    t0 = time.perf_counter()
    engine = LlamaEngine(str(model_path(spec.target)), name=spec.target, max_context=context + k + 8,
                         n_seq=max(SESSIONS), max_block=max(max_block, k), exact=exact, threads=threads)
    load_s = time.perf_counter() - t0
    seqs = _prompts(engine, max(SESSIONS), context + k + 1)
    for s, toks in enumerate(seqs):  # each session's committed tokens but the last, in its KV
        engine.run_batch([Feed(s, 0, tuple(toks[: context - 1]), 0)])
    rng = np.random.default_rng(0)
    rows = []
    for n in SESSIONS:
        feeds = [Feed(s, context - 1, tuple(seqs[s][context - 1 : context + k]), k + 1) for s in range(n)]
        alone_ms, batched_ms = [], []
        exact_rows = 0
        for r in range(repeats):
            order = ("alone", "batched") if (r + rng.integers(2)) % 2 == 0 else ("batched", "alone")
            for how in order:
                t = time.perf_counter()
                if how == "alone":
                    outs = [engine.run_batch([f])[0] for f in feeds]
                    alone_ms.append((time.perf_counter() - t) * 1e3)
                    alone_out = outs
                else:
                    outs = engine.run_batch(feeds)
                    batched_ms.append((time.perf_counter() - t) * 1e3)
                    batched_out = outs
            if r == 0:
                exact_rows = sum(int(np.array_equal(a[i], b[i])) for a, b in zip(alone_out, batched_out)
                                 for i in range(k + 1))
        a_ms, b_ms = C.median(alone_ms), C.median(batched_ms)
        row = {
            "sessions": n,
            "rows_per_round": n * (k + 1),
            "one_at_a_time_ms": a_ms,
            "batched_ms": b_ms,
            "one_at_a_time_rows_per_s": n * (k + 1) / (a_ms / 1e3),
            "batched_rows_per_s": n * (k + 1) / (b_ms / 1e3),
            "speedup": a_ms / b_ms,
            "bit_identical_rows": exact_rows,
            "repeats_ms": {"one_at_a_time": alone_ms, "batched": batched_ms},
        }
        rows.append(row)
        C.progress(f"{pair} {'exact' if exact else 'fast'} S={n}: one at a time {row['one_at_a_time_rows_per_s']:.0f} "
                   f"rows/s, batched {row['batched_rows_per_s']:.0f} rows/s ({row['speedup']:.2f}x), "
                   f"identical rows {exact_rows}/{n * (k + 1)}")
    result = {
        "pair": pair,
        "target": spec.target,
        "numerics": "exact" if exact else "fast",
        "invariant_batch": engine.invariant_batch,
        "mixes_sessions": engine.mixes_sessions,
        "load_s": load_s,
        "rows": rows,
    }
    engine.close()
    return result


def plot(results: list[dict], path: Path) -> Path:
    pairs = sorted({r["pair"] for r in results})
    fig, axes = C.subplots(len(pairs))
    for ax, pair in zip(axes, pairs):
        for r in (r for r in results if r["pair"] == pair):
            xs = [row["sessions"] for row in r["rows"]]
            style = "-" if r["numerics"] == "exact" else "--"
            ax.plot(xs, [row["batched_rows_per_s"] for row in r["rows"]], style, marker="o",
                    label=f"{r['numerics']}: batched")
            ax.plot(xs, [row["one_at_a_time_rows_per_s"] for row in r["rows"]], style, marker="x", alpha=0.6,
                    label=f"{r['numerics']}: one round at a time")
        ax.set_xscale("log", base=2)
        ax.set_xticks(SESSIONS, [str(s) for s in SESSIONS])
        ax.set_xlabel("sessions verifying at once")
        ax.set_ylabel("verified rows per second")
        ax.set_title(f"{pair} target ({results[0]['k']} draft tokens per round)")
    return C.save_figure(fig, path)


def main() -> None:
    ap = C.arguments(__doc__, whole_doc=True, threads=0, pairs="gemma-270m,qwen-coder", repeats=7,
                     out="batched_engine")
    ap.add_argument("--numerics", default="exact,fast")
    ap.add_argument("--k", type=int, default=4, help="draft tokens per round (default 4)")
    ap.add_argument("--context", type=int, default=128, help="committed tokens per session (default 128)")
    ap.add_argument("--max-block", type=int, default=32,
                    help="the engine's max block, as `edgekit serve --max-block` (bounds the invariant batch's search)")
    args = C.parse(ap)
    threads = args.threads or None
    results = []
    for pair in C.csv_list(args.pairs):
        for numerics in C.csv_list(args.numerics):
            r = measure(pair, numerics == "exact", args.k, args.repeats, args.context, threads, args.max_block)
            r["k"] = args.k
            results.append(r)
    path = C.write_result(args.out, {"settings": vars(args), "results": results})
    png = plot(results, path.with_suffix(".png"))
    table = [
        [r["pair"], r["numerics"], row["sessions"], row["one_at_a_time_rows_per_s"], row["batched_rows_per_s"],
         row["speedup"], f"{row['bit_identical_rows']}/{row['rows_per_round']}"]
        for r in results
        for row in r["rows"]
    ]
    headers = ["pair", "numerics", "sessions", "one at a time rows/s", "batched rows/s", "speedup", "identical rows"]
    print(C.table(headers, table))
    print(path, png, sep="\n")


if __name__ == "__main__":
    main()
