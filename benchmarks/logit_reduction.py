"""What reducing a round's logits where llama.cpp makes them saves the verifier: greedy, and top-k sampling.

A greedy round over plain logits needs one id per row: the argmax. Before, the engine copied each
row out of llama.cpp's output buffer (n_vocab floats: 1 MB a row on gemma's 262,144 tokens) and
the rounds took its argmax; now the feed asks for the ids (`Feed.argmax`) and the engine reduces
its rows in the buffer, one argmax per decode. This times a batch of B sessions' rounds (K drafted
tokens each, K + 1 rows) both ways on the same `LlamaEngine`, interleaved, with the argmax the
rounds would take added to the copying path, and checks both name the same ids.

A top-k sampling round needs, of each row, only the logits that reach its k-th largest (a min-p
one, those within its spread of the largest: `--sampler temperature=0.8,min_p=0.05`): with
`--mode sample` the copying path copies the rows out and judges the block over them as the rounds
did (`accept_sampling` over whole rows), the reducing one asks for kept rows (`Feed.keep`, `Feed.spread`) and
judges the block in their columns; both with the same generator seeds, checked to give the same
verdicts. The times include the rules' work, which is where whole rows cost most.

    python -m benchmarks logit_reduction                        # gemma-270m, B = 1, 4, 8, exact and fast
    python -m benchmarks logit_reduction --mode sample --numerics exact --out logit_reduction_sample
    python -m benchmarks logit_reduction --pairs qwen-coder --batches 1,8 --repeats 20
    python -m benchmarks logit_reduction --llama --numerics fast --out logit_reduction_llama
    python -m benchmarks logit_reduction --mode host-cost --out logit_reduction_host_cost
    python -m benchmarks logit_reduction --k 0 --mode sample --numerics fast --out target_only_sample

With `--k 0` a session's feed is one row, as a target-only stream's step (`Generate`): greedy takes
its best id, sampling draws the token from the target's distribution (the rule's bonus draw: the
sampler's `probs` and a draw, as the stream makes them).

With `--llama` (greedy), a third way beside them: llama.cpp reduces the rows itself (its backend
sampling, `edgekit serve --reduce-rows llama`, the default on a GPU target), keeping each row's few
largest logits where it is made; the same batches on a second engine over the same file, checked
to name the same ids. On a CPU the logits are made in host memory either way, so this says what
the reduction costs there, not what it saves a GPU (no vocabulary-wide row crossing to the host).

`--mode host-cost` times what the host pays per GPU step for the rows llama.cpp hands it whole, at
a GPU batch's sizes (B sessions x 5 rows, Qwen2.5's 152,064 logits by default): numpy's argmax over
them on one thread and split over `--split` threads, a top-k 40 sampler's kept logits of each row
(numpy's partition row by row, and `kept_rows`, the kernel's heap, a session's rows a call), and
copying them; no model is loaded.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import harness as C
from edgekit import Sampler
from edgekit.models import pair_paths
from edgekit.protocol import SparseDistribution, accept_sampling, in_columns
from edgekit.runtime import KERNEL, kept_of, kept_rows
from edgekit.verifier import Feed, LlamaEngine

TEXT = (
    "A verifier checks the blocks many devices draft, one batch for all of them. "
    "def mean(xs):\n    return sum(xs) / len(xs)\n"
) * 6


SAMPLER = "temperature=0.8,top_k=20"  # --sampler's default: what sampled rounds judge by


def sampler_of(text: str) -> Sampler:
    """`--sampler`'s settings, "name=value" comma-separated (Sampler's fields)."""
    settings = {}
    for item in filter(None, text.split(",")):
        name, _, value = item.partition("=")
        settings[name.strip()] = int(value) if name.strip() in ("top_k", "penalty_last_n") else float(value)
    return Sampler(**settings)


def _drafts(block: tuple[int, ...], vocab: int, seed: int) -> list[SparseDistribution]:
    """Draft distributions over 20 ids holding each drafted token, as a device uploads them."""
    rng = np.random.default_rng(seed)
    out = []
    for tok in block:
        ids = np.unique(np.append(rng.choice(vocab, size=19, replace=False), tok)).astype(np.int32)
        probs = rng.random(ids.size).astype(np.float32) + 0.05
        out.append(SparseDistribution(ids, (probs / probs.sum()).astype(np.float32)))
    return out


def _verdicts(outs: list[Any], block: tuple[int, ...], dists: list[SparseDistribution], reduced: bool,
              seed: int, sampler: Sampler) -> list[tuple[int, int]]:
    """Each session's (accepted, next token), as the rounds judge it, its generator seeded alike either way."""
    verdicts = []
    for s, out in enumerate(outs):
        rng = np.random.default_rng(seed + s)
        if reduced:
            columns, kept = in_columns(out.ids, block, dists)
            accepted, at = accept_sampling(out.logits, columns, kept, sampler, rng)
            verdicts.append((accepted, int(out.ids[at])))
        else:
            verdicts.append(accept_sampling(out, block, dists, sampler, rng))
    return verdicts


def measure(pair: str, batches: list[int], k: int, repeats: int, exact: bool, threads: int | None,
            mode: str = "greedy", llama: bool = False, sampler: Sampler | None = None) -> dict[str, Any]:
    sampler = sampler or sampler_of(SAMPLER)
    keep, spread = sampler.support_cut()
    if mode == "sample" and (not (keep or spread < float("inf")) or sampler.adjusts):
        raise SystemExit(f"--sampler {sampler.describe()}: no top-k or min-p to keep rows to, or it adjusts the "
                         "logits (the rounds take whole rows there)")
    _, target = pair_paths(pair)
    n = max(batches)
    engines = {way: LlamaEngine(str(target), max_context=256, n_seq=n, max_block=k, exact=exact, threads=threads,
                                reduce_rows=way)
               for way in ("host", *(("llama",) if llama else ()))}
    engine = engines["host"]
    tokens = tuple(engine.model.tokenize(TEXT))
    head, block = tokens[:100], tokens[100 : 100 + k]
    for e in engines.values():
        for seq in range(n):
            e.run_batch([Feed(seq, 0, head[:-1], 0)])
    ways = ("copied", "reduced", *(("llama",) if llama else ()))
    times: dict[tuple[int, str], list[float]] = {(b, w): [] for b in batches for w in ways}
    ids_of: dict[tuple[int, str, int], list[Any]] = {}
    cells = list(times)
    dists = _drafts(block, engine.n_vocab, 1)
    for r in range(repeats):
        random.shuffle(cells)
        for b, way in cells:
            reduced = way != "copied"
            kept = {"keep": keep, "within": engine.n_vocab, "spread": spread}
            asks = ({"argmax": engine.n_vocab} if mode == "greedy" else kept) if reduced else {}
            feeds = [Feed(s, len(head) - 1, (head[-1], *block), k + 1, **asks) for s in range(b)]
            t0 = time.perf_counter()
            outs = engines["llama" if way == "llama" else "host"].run_batch(feeds)
            if mode == "greedy":
                ids = [i.tolist() for i in outs] if reduced else [np.argmax(o, axis=1).tolist() for o in outs]
            else:
                ids = _verdicts(outs, block, dists, reduced, seed=1000 * r, sampler=sampler)
            times[b, way].append((time.perf_counter() - t0) * 1e3)
            ids_of[b, way, r] = ids
    differ = [{"sessions": b, "repeat": r, "way": w, "copied": ids_of[b, "copied", r], "ids": ids_of[b, w, r]}
              for b in batches for r in range(repeats) for w in ways if ids_of[b, "copied", r] != ids_of[b, w, r]]
    same = not differ
    for e in engines.values():
        e.close()
    rows = []
    for b in batches:
        copied, reduced = C.median(times[b, "copied"]), C.median(times[b, "reduced"])
        rows.append({"sessions": b, "rows": b * (k + 1), "copied_ms": copied, "reduced_ms": reduced,
                     "saved_ms": copied - reduced, "copied_over_reduced": copied / reduced})
        if llama:
            by_llama = C.median(times[b, "llama"])
            rows[-1].update(llama_ms=by_llama, llama_saved_ms=copied - by_llama, reduced_over_llama=reduced / by_llama)
    return {"pair": pair, "numerics": "exact" if exact else "fast", "mode": mode, "llama": llama,
            "sampler": sampler.describe() if mode == "sample" else "greedy", "n_vocab": engine.n_vocab, "k": k,
            "same_ids": same, "differ": differ, "rows": rows}


def host_cost(sessions: list[int], vocab: int, repeats: int, splits: list[int]) -> dict[str, Any]:
    """The host's time for a step's rows handed over whole: argmax (on 1..n threads) and a copy."""
    from concurrent.futures import ThreadPoolExecutor

    rows_all = np.random.default_rng(0).standard_normal((max(sessions) * 5, vocab)).astype(np.float32)
    pools = {n: ThreadPoolExecutor(n) for n in splits if n > 1}
    rows = []
    for b in sessions:
        view = rows_all[: b * 5]
        timed: dict[str, list[float]] = {}
        best = np.argmax(view, axis=1)
        for _ in range(repeats):
            for n in splits:
                t0 = time.perf_counter()
                if n == 1:
                    got = np.argmax(view, axis=1)
                else:
                    parts = np.array_split(np.arange(view.shape[0]), n)
                    got = np.concatenate([f.result() for f in [
                        pools[n].submit(np.argmax, view[p[0] : p[-1] + 1], 1) for p in parts if p.size]])
                timed.setdefault(f"argmax_{n}", []).append((time.perf_counter() - t0) * 1e3)
                assert np.array_equal(got, best)
            for n in splits:  # a top-k 40 sampler's rows: what each keeps, with numpy (`kept_of`), row by row
                t0 = time.perf_counter()
                if n == 1:
                    kept = [kept_of(row, 40, vocab) for row in view]
                else:
                    kept = [f.result() for f in [pools[n].submit(kept_of, row, 40, vocab) for row in view]]
                timed.setdefault(f"keep_{n}", []).append((time.perf_counter() - t0) * 1e3)
                assert len(kept) == view.shape[0]
            for n in splits:  # the same with `kept_rows` (the kernel where built), a session's 5 rows a call
                blocks = [view[s : s + 5] for s in range(0, view.shape[0], 5)]
                t0 = time.perf_counter()
                if n == 1:
                    by_kernel = [pair for block in blocks for pair in kept_rows(block, 40, vocab)]
                else:
                    by_kernel = [pair for f in [pools[n].submit(kept_rows, block, 40, vocab) for block in blocks]
                                 for pair in f.result()]
                timed.setdefault(f"kernel_{n}", []).append((time.perf_counter() - t0) * 1e3)
                assert all(np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]) for a, b in zip(kept, by_kernel))
            t0 = time.perf_counter()
            view.copy()
            timed.setdefault("copy", []).append((time.perf_counter() - t0) * 1e3)
        rows.append({"sessions": b, "rows": b * 5, "mb": view.nbytes / 1e6,
                     **{f"{k}_ms": C.median(v) for k, v in timed.items()}})
    for pool in pools.values():
        pool.shutdown()
    return {"mode": "host-cost", "vocab": vocab, "splits": splits, "kernel": KERNEL, "rows": rows}


def plot_host_cost(result: dict[str, Any], png: Path) -> None:
    fig, (ax,) = C.subplots(width=6.5)
    rows = result["rows"]
    xs = [r["rows"] for r in rows]
    for n in result["splits"]:
        ax.plot(xs, [r[f"argmax_{n}_ms"] for r in rows], "o-", label=f"numpy argmax, {n} thread{'s' * (n > 1)}")
    for n in result["splits"]:
        ax.plot(xs, [r[f"keep_{n}_ms"] for r in rows], "^:", label=f"top-k 40 kept, numpy, {n} thread{'s' * (n > 1)}")
    for n in result["splits"]:
        if f"kernel_{n}_ms" in rows[0]:
            ax.plot(xs, [r[f"kernel_{n}_ms"] for r in rows], "v-.",
                    label=f"top-k 40 kept, kept_rows ({'C' if result.get('kernel') != 'numpy' else 'numpy'}), "
                          f"{n} thread{'s' * (n > 1)}")
    ax.plot(xs, [r["copy_ms"] for r in rows], "s--", color="grey", label="copying the rows")
    ax.set_xlabel(f"rows handed to the host whole (5 per session), {result['vocab']:,} logits each")
    ax.set_ylabel("ms per GPU step (median)")
    ax.set_title("What the host pays for a step's whole rows")
    C.save_figure(fig, png)


def plot(result: dict[str, Any], png: Path) -> None:
    if result.get("mode") == "host-cost":
        plot_host_cost(result, png)
        return
    fig, (ax,) = C.subplots(width=6.5)
    for r in result["results"]:
        xs = [row["sessions"] for row in r["rows"]]
        sampler = r.get("sampler", "greedy")
        if isinstance(sampler, dict):
            sampler = ", ".join(f"{k} {v}" for k, v in sampler.items())
        ax.plot(xs, [row["saved_ms"] for row in r["rows"]], "o-", label=f"{r['pair']}, {r['numerics']}, {sampler}"
                + (": host's argmax in the buffer" if r.get("llama") else ""))
        if r.get("llama"):
            ax.plot(xs, [row["llama_saved_ms"] for row in r["rows"]], "s--",
                    label=f"{r['pair']}, {r['numerics']}: llama.cpp's backend sampling")
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xlabel("sessions in the batch (K + 1 rows each)")
    ax.set_ylabel("ms saved per batch (median): copied - reduced")
    sampled = any(r.get("mode") == "sample" for r in result["results"])
    by_llama = any(r.get("llama") for r in result["results"])
    ax.set_title("Sampling rows kept to the sampler's cut in llama.cpp's buffer, judged" if sampled
                 else "Greedy rows reduced by the host or by llama.cpp, against copied out" if by_llama
                 else "Greedy rows reduced in llama.cpp's buffer instead of copied out")
    C.save_figure(fig, png)


def main() -> None:
    ap = C.arguments(__doc__, replot=True, pairs="gemma-270m", repeats=10, out="logit_reduction")
    ap.add_argument("--batches", default="1,4,8", help="sessions per batch, comma-separated")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--numerics", default="exact,fast")
    ap.add_argument("--mode", default="greedy", choices=("greedy", "sample", "host-cost"),
                    help="greedy rounds (argmax), top-k sampling rounds judged by the lossless rule, or the host's "
                         "cost of a GPU step's whole rows (no model)")
    ap.add_argument("--vocab", type=int, default=152064, help="host-cost: logits per row (Qwen2.5's)")
    ap.add_argument("--split", default="1,2", help="host-cost: threads the argmax is split over")
    ap.add_argument("--sampler", default=SAMPLER, help="sample: the sampler's settings, name=value comma-separated "
                    "(a top-k or a min-p: the rows are kept to its cut)")
    ap.add_argument("--llama", action="store_true", help="greedy: llama.cpp's own reduction too (its backend sampling)")
    args = C.parse(ap, plot=plot)
    if args.mode == "host-cost":
        cost = host_cost(C.csv_list(args.batches, int), args.vocab, args.repeats, C.csv_list(args.split, int))
        print(C.table(["sessions", "rows", "MB", *[f"argmax, {n} threads ms" for n in cost["splits"]],
                       *[f"top-k kept, numpy, {n} threads ms" for n in cost["splits"]],
                       *[f"top-k kept, kept_rows, {n} threads ms" for n in cost["splits"]], "copy ms"],
                      [[r["sessions"], r["rows"], r["mb"], *[r[f"argmax_{n}_ms"] for n in cost["splits"]],
                        *[r[f"keep_{n}_ms"] for n in cost["splits"]], *[r[f"kernel_{n}_ms"] for n in cost["splits"]],
                        r["copy_ms"]] for r in cost["rows"]]))
        path = C.write_result(args.out, {"settings": vars(args), **cost})
        plot(cost, path.with_suffix(".png"))
        print(f"wrote {path} and {path.with_suffix('.png').name}")
        return
    if args.llama and args.mode != "greedy":
        raise SystemExit("--llama reduces greedy rows: --mode greedy")
    threads = args.threads or None
    results = [measure(p, C.csv_list(args.batches, int), args.k, args.repeats, numerics == "exact", threads,
                       args.mode, args.llama, sampler_of(args.sampler))
               for p in C.csv_list(args.pairs) for numerics in C.csv_list(args.numerics)]
    print(C.table(
        ["pair", "numerics", "sessions", "rows", "copied ms", "reduced ms", "saved ms", "ratio",
         *(["by llama.cpp ms", "reduced / llama"] if args.llama else []), "same ids"],
        [[r["pair"], r["numerics"], row["sessions"], row["rows"], row["copied_ms"], row["reduced_ms"], row["saved_ms"],
          row["copied_over_reduced"], *([row["llama_ms"], row["reduced_over_llama"]] if args.llama else []),
          r["same_ids"]] for r in results for row in r["rows"]],
    ))
    path = C.write_result(args.out, {"settings": vars(args), "results": results})
    plot({"results": results}, path.with_suffix(".png"))
    print(f"wrote {path} and {path.with_suffix('.png').name}")


if __name__ == "__main__":
    main()
