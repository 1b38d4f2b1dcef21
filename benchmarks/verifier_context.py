"""Verifier time per round against context length: prefix reuse vs re-prefill.

The verifier keeps each session's KV cache, so a round decodes only the
pending token and the draft block (K+1 rows) whatever the context length L.
A stateless verifier would instead decode the whole L+K tokens every round.
This benchmark measures both on the same `LlamaEngine`, round by round and
interleaved (the order of the cells is shuffled every round) so that the
noise of the shared CPU hits every cell alike.

Per round, for each context length L:
  prefix reuse: run(seq_a, [pending] + block, L-1, K+1); truncate(seq_a, L-1)
  re-prefill:   drop(seq_b); run(seq_b, ctx[:L-1], 0, 0);
                run(seq_b, [pending] + block, L-1, K+1)
(`pending` is ctx[L-1], the last committed token, which the engine's protocol
keeps out of the KV; a prefill with n_out=0 is how the verifier prefills a
prompt.) Both give the block's K+1 logit rows; the benchmark checks that they
are bit-identical.

    python -m benchmarks verifier_context                      # gemma-270m
    python -m benchmarks verifier_context --pairs all          # gemma-270m and qwen-coder
    python -m benchmarks verifier_context --pair qwen-coder --contexts 64,512,1024 --rounds 10
"""

from __future__ import annotations

import gc
import random
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks import harness as C
from edgekit.models import get_pair, pair_paths
from edgekit.verifier import Feed, LlamaEngine

ALL_PAIRS = ("gemma-270m", "qwen-coder")


def timed_run(engine: LlamaEngine, seq: int, tokens: list[int], start: int, n_out: int) -> tuple[np.ndarray, float]:
    """One feed on the engine: its logits and the milliseconds it took."""
    t0 = time.perf_counter()
    (logits,) = engine.run_batch([Feed(seq, start, tuple(tokens), n_out)])
    return logits, (time.perf_counter() - t0) * 1e3

# Filler for the context: neither an evaluation prompt nor tuned on; mixed
# prose and code so both tokenizers see ordinary text. Repeated to length.
_CONTEXT_TEXT = """\
The river begins as a thin stream high in the mountains, fed by snow that melts a little more each spring.
By the time it reaches the valley it has gathered a dozen tributaries and carries enough water to turn the
wheels of the old mills that line its banks. Farmers downstream have argued for centuries about who may
take how much of it, and the records of those disputes fill several shelves in the town archive.

def moving_average(values, window):
    if window <= 0:
        raise ValueError("window must be positive")
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out

In the nineteenth century engineers straightened the lower course to make room for the railway, and for a
few decades the floods seemed to stop. Then came the wet autumn of 1882, when the water rose above the new
embankments in a single night and reached the second floor of the station hotel.
"""


def build_context(model, length: int, extra: int) -> list[int]:  # type: ignore[no-untyped-def]
    """Exactly length + extra tokens: the model's BOS handling, then the text repeated and trimmed."""
    first = model.tokenize(_CONTEXT_TEXT)
    body = model.tokenize(_CONTEXT_TEXT, add_special=False)
    ids = list(first)
    while len(ids) < length + extra:
        ids.extend(body)
    return ids[: length + extra]


def measure(
    pair: str,
    numerics: list[str],
    contexts: list[int],
    k: int,
    rounds: int,
    warmup: int,
    seed: int,
    threads: int | None,
    max_minutes: float,
) -> list[dict]:
    """One engine per numerics mode, all loaded at once; every round runs every
    (numerics, L, method) cell once, in a shuffled order."""
    _, target_path = pair_paths(pair)
    target_name = get_pair(pair).target
    max_context = max(contexts) + k + 8
    engines: dict[str, LlamaEngine] = {}
    load_s: dict[str, float] = {}
    for num in numerics:
        t0 = time.perf_counter()
        engines[num] = LlamaEngine(
            str(target_path),
            name=target_name,
            max_context=max_context,
            n_seq=2 * len(contexts),
            max_block=k,
            exact=(num == "exact"),
            threads=threads,
        )
        load_s[num] = time.perf_counter() - t0

    cells: list[tuple[str, int, str]] = []
    data: dict[tuple[str, int], dict] = {}
    for num, engine in engines.items():
        for i, L in enumerate(contexts):
            ids = build_context(engine.model, L, k)
            ctx, pending, block = ids[: L - 1], ids[L - 1], ids[L : L + k]
            seq_reuse, seq_re = 2 * i, 2 * i + 1
            engine.release(seq_reuse)
            _, prefill_ms = timed_run(engine, seq_reuse, ctx, 0, 0)  # once: the session's prompt prefill
            data[(num, L)] = {
                "ctx": ctx,
                "feed": [pending] + block,
                "seq": {"reuse": seq_reuse, "reprefill": seq_re},
                "prefill_ms": prefill_ms,
                "ms": {"reuse": [], "reprefill": []},
                "decode_ms": {"reuse": [], "reprefill": []},
                "identical": 0,
                "argmax_identical": 0,
            }
            cells += [(num, L, "reuse"), (num, L, "reprefill")]

    def run_cell(num: str, L: int, method: str) -> tuple[float, float, np.ndarray]:
        engine, d = engines[num], data[(num, L)]
        seq = d["seq"][method]
        t = time.perf_counter()
        if method == "reuse":
            logits, dec = timed_run(engine, seq, d["feed"], L - 1, k + 1)
            engine.truncate(seq, L - 1)
        else:
            engine.release(seq)
            _, dec0 = timed_run(engine, seq, d["ctx"], 0, 0)
            logits, dec1 = timed_run(engine, seq, d["feed"], L - 1, k + 1)
            dec = dec0 + dec1
        return (time.perf_counter() - t) * 1e3, dec, logits

    rng = random.Random(seed)
    started = time.perf_counter()
    measured = 0
    stopped_early = False
    for r in range(warmup + rounds):
        if r >= warmup + 3 and time.perf_counter() - started > max_minutes * 60:
            stopped_early = True
            break
        order = cells[:]
        rng.shuffle(order)
        got: dict[tuple[str, int, str], np.ndarray] = {}
        for cell in order:
            ms, dec, logits = run_cell(*cell)
            got[cell] = logits
            if r >= warmup:
                d = data[cell[:2]]
                d["ms"][cell[2]].append(ms)
                d["decode_ms"][cell[2]].append(dec)
        if r >= warmup:
            measured += 1
            for (num, L), d in data.items():
                a, b = got[(num, L, "reuse")], got[(num, L, "reprefill")]
                d["identical"] += int(np.array_equal(a, b))
                d["argmax_identical"] += int(np.array_equal(a.argmax(-1), b.argmax(-1)))
        elapsed = time.perf_counter() - started
        print(
            f"  {pair}: round {r + 1}/{warmup + rounds} ({elapsed:.0f} s)",
            file=sys.stderr,
            flush=True,
        )
    if stopped_early:
        print(
            f"  {pair}: stopped after {measured} measured rounds (--max-minutes {max_minutes})",
            flush=True,
        )

    lo, hi = min(contexts), max(contexts)
    out = []
    for num in numerics:
        rows = []
        per_l: dict[str, dict] = {}
        for L in contexts:
            d = data[(num, L)]
            for method in ("reuse", "reprefill"):
                xs = d["ms"][method]
                rows.append(
                    {
                        "L": L,
                        "method": "prefix reuse" if method == "reuse" else "re-prefill",
                        "median_ms": C.median(xs),
                        "p90_ms": C.percentile(xs, 90),
                        "min_ms": min(xs),
                        "median_decode_ms": C.median(d["decode_ms"][method]),
                        "rounds": len(xs),
                        "samples_ms": xs,
                    }
                )
            per_l[str(L)] = {
                "reprefill_over_reuse": C.ratio(
                    C.median(d["ms"]["reprefill"]), C.median(d["ms"]["reuse"])
                ),
                "initial_prefill_ms": d["prefill_ms"],
                "logits_identical_rounds": d["identical"],
                "argmax_identical_rounds": d["argmax_identical"],
                "rounds": measured,
            }
        growth = {
            method: C.ratio(
                C.median(data[(num, hi)]["ms"][method]),
                C.median(data[(num, lo)]["ms"][method]),
            )
            for method in ("reuse", "reprefill")
        }
        out.append(
            {
                "pair": pair,
                "target": target_name,
                "target_path": str(target_path),
                "numerics": num,
                "invariant_batch": engines[num].invariant_batch,
                "engine_load_s": load_s[num],
                "measured_rounds": measured,
                "stopped_early": stopped_early,
                "rows": rows,
                "per_L": per_l,
                f"growth_{hi}_over_{lo}": growth,
            }
        )
    if "exact" in engines and "fast" in engines:
        for res in out:
            res["fast_over_exact_median"] = {
                f"{L}/{m}": C.ratio(
                    C.median(data[("fast", L)]["ms"][m]),
                    C.median(data[("exact", L)]["ms"][m]),
                )
                for L in contexts
                for m in ("reuse", "reprefill")
            }
    engines.clear()
    gc.collect()
    return out


def main() -> None:
    ap = C.arguments(__doc__, whole_doc=True, threads=1, out="verifier_context")
    # Not the shared --pair and --pairs: this --pair is repeatable, and --pairs takes 'all'.
    ap.add_argument(
        "--pair", action="append", help="a pair (repeatable); default gemma-270m"
    )
    ap.add_argument("--pairs", help="comma-separated pairs, or 'all'")
    ap.add_argument(
        "--contexts", default="64,1024", help="context lengths L (default 64,1024)"
    )
    ap.add_argument(
        "--numerics", default="exact,fast", help="exact,fast (default both)"
    )
    ap.add_argument("--k", type=int, default=4, help="draft block length K (default 4)")
    ap.add_argument(
        "--rounds", type=int, default=20, help="measured rounds per cell (default 20)"
    )
    ap.add_argument("--warmup", type=int, default=2, help="warm-up rounds (default 2)")
    ap.add_argument(
        "--seed", type=int, default=0, help="seed of the per-round cell order"
    )
    ap.add_argument(
        "--max-minutes",
        type=float,
        default=20.0,
        help="per pair: stop measuring after this long (default 20)",
    )
    args = C.parse(ap)

    if args.pairs:
        pairs = list(ALL_PAIRS) if args.pairs == "all" else C.csv_list(args.pairs)
    else:
        pairs = args.pair or ["gemma-270m"]
    contexts = sorted(C.csv_list(args.contexts, int))
    if min(contexts) < 2:
        ap.error("context lengths must be at least 2")
    numerics = C.csv_list(args.numerics)
    threads = args.threads if args.threads > 0 else None  # None: edgekit's default
    results = []
    started = time.perf_counter()
    for pair in pairs:
        print(
            f"{pair}: numerics {numerics}, contexts {contexts}, K={args.k}, {args.rounds} rounds",
            flush=True,
        )
        results.extend(
            measure(
                pair,
                numerics,
                contexts,
                args.k,
                args.rounds,
                args.warmup,
                args.seed,
                threads,
                args.max_minutes,
            )
        )

    lo, hi = contexts[0], contexts[-1]
    headers = [
        "pair",
        "numerics",
        "L",
        "method",
        "median ms",
        "p90 ms",
        f"{hi}/{lo}",
        "re-prefill/reuse",
        "identical",
    ]
    rows = []
    for res in results:
        growth = res[f"growth_{hi}_over_{lo}"]
        for row in res["rows"]:
            key = "reuse" if row["method"] == "prefix reuse" else "reprefill"
            per_l = res["per_L"][str(row["L"])]
            rows.append(
                [
                    res["pair"],
                    f"{res['numerics']} (ib={res['invariant_batch']})"
                    if res["numerics"] == "exact"
                    else "fast",
                    row["L"],
                    row["method"],
                    row["median_ms"],
                    row["p90_ms"],
                    growth[key] if row["L"] == hi else None,
                    per_l["reprefill_over_reuse"] if key == "reprefill" else None,
                    f"{per_l['logits_identical_rounds']}/{per_l['rounds']}"
                    if key == "reprefill"
                    else None,
                ]
            )
    print(C.table(headers, rows))
    path = C.write_result(
        args.out,
        {
            "settings": {
                "pairs": pairs,
                "contexts": contexts,
                "numerics": numerics,
                "k": args.k,
                "rounds": args.rounds,
                "warmup": args.warmup,
                "seed": args.seed,
                "threads": threads or "edgekit default (all cores)",
                "max_minutes_per_pair": args.max_minutes,
                "context_text": "fixed mixed prose+code filler in verifier_context.py, repeated and trimmed",
            },
            "notes": (
                "ms per round = wall time of the engine calls (prefix reuse: run + truncate; re-prefill: drop + "
                "prefill L-1 + run K+1). Cells interleaved and shuffled each round. 'identical' counts rounds "
                "whose K+1 logit rows were bit-identical between the two methods. Both numerics modes of a pair "
                "are loaded at once and interleaved too, so fast/exact ratios are side by side as well."
            ),
            "results": results,
            "wall_s": time.perf_counter() - started,
        },
    )
    print(f"wrote {path}")
    plot(results, path.with_suffix(".png"))


def plot(results: list[dict], path: Path) -> None:
    """Verify time per round against the context, reusing the session's KV or prefilling again."""
    fig, axes = C.subplots(len({r["pair"] for r in results}), width=4.6)
    for ax, pair in zip(axes, sorted({r["pair"] for r in results}), strict=True):
        for r in (r for r in results if r["pair"] == pair):
            for method, style in (("prefix reuse", "-"), ("re-prefill", "--")):
                rows = sorted((x["L"], x["median_ms"]) for x in r["rows"] if x["method"] == method)
                ax.plot([x[0] for x in rows], [x[1] for x in rows], marker="o", linestyle=style,
                        label=f"{method}, {r['numerics']} numerics")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("context (tokens)")
        ax.set_ylabel("verify time per round, median (ms)")
        ax.set_title(f"{pair}: a round's cost against the context")
        ax.legend(fontsize=7)
    print(f"figure: {C.save_figure(fig, path)}")


if __name__ == "__main__":
    main()
