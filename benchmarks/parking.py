"""What a parked session costs to bring back: its KV copied out and in, or its context re-prefilled.

A verifier with more sessions than its llama.cpp context holds parks the least recently used ones
(`edgekit serve --resident-sessions`, `SequenceSlots`). This measures, on the real target, for a
session holding N tokens: parking it (llama.cpp's per-sequence state copied to host memory, its
cells freed), loading it back into another context sequence, and the alternative, decoding its N
tokens again into an empty sequence; cells interleaved so the shared CPU's noise hits each alike.
It checks that the next round's logits after a load are bit-identical to those never parked, and
says whether the re-prefill's are (exact numerics: they were built in other batch shapes).

    python benchmarks/parking.py                                   # gemma-270m, 100/500/1500 tokens
    python benchmarks/parking.py --pair qwen-coder --tokens 256,1000,4000 --repeats 3
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C

from edgekit.models import pair_paths
from edgekit.verifier import Feed, LlamaEngine

TEXT = (
    "The verifier keeps each session's KV cache between rounds, so a round decodes only its block. "
    "def merge(a, b):\n    out = []\n    while a and b:\n        out.append(a.pop(0) if a[0] < b[0] else b.pop(0))\n"
    "    return out + a + b\n"
)


def measure(pair: str, lengths: list[int], repeats: int, threads: int | None) -> dict[str, Any]:
    _, target = pair_paths(pair)
    longest = max(lengths)
    # three engine sequences over two context sequences: placing the third parks one
    engine = LlamaEngine(str(target), max_context=longest + 64, n_seq=3, resident=2, max_block=8, threads=threads)
    ctx = engine._ctx  # the context under the engine: its state calls, timed alone
    reps = 1
    tokens = engine.model.tokenize(TEXT)
    while len(tokens) < longest + 8:
        reps *= 2
        tokens = engine.model.tokenize(TEXT * reps)
    rows = []
    for n in lengths:
        head, block = tuple(tokens[:n]), tuple(tokens[n : n + 5])
        times: dict[str, list[float]] = {"park": [], "load": [], "reprefill": []}
        exact_load = exact_reprefill = True
        state_bytes = 0
        for _ in range(repeats):
            for seq in (0, 1, 2):
                engine.release(seq)
            engine.run_batch([Feed(0, 0, head[:-1], 0)])  # the session: n - 1 tokens held, the last to come
            (ref,) = engine.run_batch([Feed(0, n - 1, (head[-1], *block), 6)])
            ref = ref.copy()
            engine.truncate(0, n - 1)
            # park and load, the calls `SequenceSlots` makes, timed alone
            physical = engine.slots.place([0])[0]
            t0 = time.perf_counter()
            state = ctx.save_sequence(physical)
            ctx.remove(physical)
            times["park"].append((time.perf_counter() - t0) * 1e3)
            state_bytes = state.nbytes
            t0 = time.perf_counter()
            ctx.load_sequence(state, physical)
            times["load"].append((time.perf_counter() - t0) * 1e3)
            # and through the engine: sequences 1 and 2 take both context sequences, 0 is parked,
            # then its round loads it back into whichever is free
            parks, loads = engine.slots.parks, engine.slots.loads
            engine.slots.place([1, 2])
            (after,) = engine.run_batch([Feed(0, n - 1, (head[-1], *block), 6)])
            assert (engine.slots.parks - parks, engine.slots.loads - loads) == (1, 1)
            exact_load &= bool(np.array_equal(after, ref))
            # the alternative: the same tokens decoded again into an empty sequence, as a reopen does
            engine.release(0)
            t0 = time.perf_counter()
            engine.run_batch([Feed(0, 0, head[:-1], 0)])
            times["reprefill"].append((time.perf_counter() - t0) * 1e3)
            (again,) = engine.run_batch([Feed(0, n - 1, (head[-1], *block), 6)])
            exact_reprefill &= bool(np.array_equal(again, ref))
        med = {k: C.median(v) for k, v in times.items()}
        rows.append({
            "tokens": n, "state_bytes": state_bytes, "bytes_per_token": state_bytes / max(n - 1, 1),
            **{f"{k}_ms": v for k, v in med.items()},
            "reprefill_over_park_and_load": med["reprefill"] / max(med["park"] + med["load"], 1e-9),
            "load_bit_identical": exact_load, "reprefill_bit_identical": exact_reprefill,
        })
        C.progress(f"  {n} tokens: park {med['park']:.2f} ms, load {med['load']:.2f} ms, "
                   f"re-prefill {med['reprefill']:.1f} ms; exact after load {exact_load}")
    engine.close()
    return {"pair": pair, "exact": engine.exact, "rows": rows}


def plot(result: dict[str, Any], png: Path) -> None:
    fig, (ax,) = C.subplots(width=6.5)
    for r in result["results"]:
        xs = [row["tokens"] for row in r["rows"]]
        park = [row["park_ms"] + row["load_ms"] for row in r["rows"]]
        ax.plot(xs, park, "o-", label=f"{r['pair']}: park + load (KV copied)")
        ax.plot(xs, [row["reprefill_ms"] for row in r["rows"]], "s--", label=f"{r['pair']}: re-prefill")
    ax.set_yscale("log")
    ax.set_xlabel("tokens the session holds")
    ax.set_ylabel("ms to bring a parked session back (median)")
    ax.set_title("A parked session: its KV copied, or its context decoded again")
    C.save_figure(fig, png)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", default="gemma-270m")
    ap.add_argument("--tokens", default="100,500,1500", help="context lengths, comma-separated")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help=C.THREADS_HELP)
    ap.add_argument("--out", default="parking")
    ap.add_argument("--replot", metavar="JSON", default=None)
    args = ap.parse_args()
    if args.replot:
        C.replot(args.replot, plot)
        return
    threads = C.apply_threads(args.threads)
    C.print_machine()
    results = [measure(p, C.csv_list(args.tokens, int), args.repeats, threads) for p in C.csv_list(args.pairs)]
    print(C.table(
        ["pair", "tokens", "state kB", "park ms", "load ms", "re-prefill ms", "ratio", "load exact",
         "re-prefill exact"],
        [[r["pair"], row["tokens"], row["state_bytes"] / 1e3, row["park_ms"], row["load_ms"], row["reprefill_ms"],
          row["reprefill_over_park_and_load"], row["load_bit_identical"], row["reprefill_bit_identical"]]
         for r in results for row in r["rows"]],
    ))
    path = C.write_result(args.out, {"settings": vars(args), "results": results})
    plot({"results": results}, path.with_suffix(".png"))
    print(f"wrote {path} and {path.with_suffix('.png').name}")


if __name__ == "__main__":
    main()
