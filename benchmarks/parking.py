"""What a parked session costs to bring back: its KV copied out and in, or its context re-prefilled.

A verifier with more sessions than its llama.cpp context holds parks the least recently used ones
(`edgekit serve --resident-sessions`, `SequenceSlots`). This measures, on the real target, for a
session holding N tokens: parking it (llama.cpp's per-sequence state copied to host memory, its
cells freed), loading it back into another context sequence, and the alternative, decoding its N
tokens again into an empty sequence; cells interleaved so the shared CPU's noise hits each alike.
It checks that the next round's logits after a load are bit-identical to those never parked, and
says whether the re-prefill's are (exact numerics: they were built in other batch shapes).

A reopened session (the verifier restarted, a replica took it over, it was evicted) comes back the
same ways: rebuilt from its history (issue 52: the prompt prefilled, the answer decoded as rounds
decoded it; exact), prefilled whole (as before; not exact), or, where its KV was saved (a drain),
loaded from a file: the session here is a prompt and an answer committed by rounds (`--generated`
of its tokens), and each way's next logits are compared with the session's own.

    python -m benchmarks parking                                   # gemma-270m, 100/500/1500 tokens
    python -m benchmarks parking --tokens 256,1000,4000 --repeats 3 --out reopen
    python -m benchmarks parking --pair qwen-coder --tokens 256,1000,4000 --repeats 3
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import harness as C
from edgekit.models import pair_paths
from edgekit.protocol import ContextSpan
from edgekit.verifier import Feed, LlamaEngine
from edgekit.verifier._rounds import rebuild_feeds
from edgekit.verifier.engine import default_calibration_dir

TEXT = (
    "The verifier keeps each session's KV cache between rounds, so a round decodes only its block. "
    "def merge(a, b):\n    out = []\n    while a and b:\n        out.append(a.pop(0) if a[0] < b[0] else b.pop(0))\n"
    "    return out + a + b\n"
)


def _rounds(engine: LlamaEngine, text: tuple[int, ...], tokens: list[int], until: int) -> None:
    """Rounds on sequence 0 as `Rounds` feeds them, committing `text` until `tokens` holds
    `until`: a block of 4, two accepted and the target's next token."""
    while len(tokens) < until:
        n = len(tokens)
        engine.run_batch([Feed(0, n - 1, (tokens[-1], *text[n : n + 4]), 5)])
        tokens.extend(text[n : n + 3])


def measure(pair: str, lengths: list[int], repeats: int, threads: int | None, generated: float) -> dict[str, Any]:
    _, target = pair_paths(pair)
    longest = max(lengths)
    # three engine sequences over two context sequences: placing the third parks one
    engine = LlamaEngine(str(target), max_context=longest + 64, n_seq=3, resident=2, max_block=8, threads=threads,
                         cache_dir=default_calibration_dir())
    ctx = engine._ctx  # the context under the engine: its state calls, timed alone
    reps = 1
    text = engine.model.tokenize(TEXT)
    while len(text) < longest + 8:
        reps *= 2
        text = engine.model.tokenize(TEXT * reps)
    tokens_all = tuple(text)
    rows = []
    for n in lengths:
        # the session: a prompt, then an answer of `generated` of its tokens, committed by rounds
        for seq in (0, 1, 2):
            engine.release(seq)
        prompt = max(2, round(n * (1 - generated)))
        head = list(tokens_all[:prompt])
        engine.run_batch([Feed(0, 0, tuple(head[:-1]), 0)])
        _rounds(engine, tokens_all, head, n)
        n = len(head)
        history = (ContextSpan(prompt), ContextSpan(n - prompt, generated=True))
        block = tokens_all[n : n + 5]
        (ref,) = engine.run_batch([Feed(0, n - 1, (head[-1], *block), 6)])
        ref = ref.copy()
        engine.truncate(0, n - 1)
        engine.settle(0, n - 1)
        times: dict[str, list[float]] = {"park": [], "load": [], "to_disk": [], "from_disk": [], "reprefill": [],
                                         "rebuild": []}
        exact = {"load": True, "reprefill": True, "rebuild": True}
        state_bytes = 0
        for _ in range(repeats):
            # park and load, the calls `SequenceSlots` makes, timed alone; and the state to a file and back
            physical = engine.slots.place([0])[0]
            t0 = time.perf_counter()
            state = ctx.save_sequence(physical)
            ctx.remove(physical)
            times["park"].append((time.perf_counter() - t0) * 1e3)
            state_bytes = state.nbytes
            with tempfile.TemporaryDirectory() as folder:
                path = os.path.join(folder, "session.kv")
                t0 = time.perf_counter()
                with open(path, "wb") as f:
                    f.write(state.tobytes())
                    f.flush()
                    os.fsync(f.fileno())
                times["to_disk"].append((time.perf_counter() - t0) * 1e3)
                t0 = time.perf_counter()
                state = np.fromfile(path, dtype=state.dtype)
                times["from_disk"].append((time.perf_counter() - t0) * 1e3)
            t0 = time.perf_counter()
            ctx.load_sequence(state, physical)
            times["load"].append((time.perf_counter() - t0) * 1e3)
            # and through the engine: sequences 1 and 2 take both context sequences, 0 is parked,
            # then its round loads it back into whichever is free
            parks, loads = engine.slots.parks, engine.slots.loads
            engine.slots.place([1, 2])
            (after,) = engine.run_batch([Feed(0, n - 1, (head[-1], *block), 6)])
            assert (engine.slots.parks - parks, engine.slots.loads - loads) == (1, 1)
            exact["load"] &= bool(np.array_equal(after, ref))
            engine.truncate(0, n - 1)
            # a reopen: the same tokens decoded again into an empty sequence, prefilled whole (as before
            # issue 52) or rebuilt from the session's history (the prompt prefilled, the answer as rounds)
            for way, spans in (("reprefill", ()), ("rebuild", history)):
                engine.release(1)
                t0 = time.perf_counter()
                for feed in rebuild_feeds(1, head, spans):
                    engine.run_batch([feed])
                times[way].append((time.perf_counter() - t0) * 1e3)
                (again,) = engine.run_batch([Feed(1, n - 1, (head[-1], *block), 6)])
                exact[way] &= bool(np.array_equal(again, ref))
                engine.release(1)  # empty again: the next repeat's parking moves sequence 0 only
        med = {k: C.median(v) for k, v in times.items()}
        rows.append({
            "tokens": n, "generated": n - prompt, "state_bytes": state_bytes,
            "bytes_per_token": state_bytes / max(n - 1, 1),
            **{f"{k}_ms": v for k, v in med.items()},
            "reprefill_over_park_and_load": med["reprefill"] / max(med["park"] + med["load"], 1e-9),
            "rebuild_over_reprefill": med["rebuild"] / max(med["reprefill"], 1e-9),
            "load_bit_identical": exact["load"], "reprefill_bit_identical": exact["reprefill"],
            "rebuild_bit_identical": exact["rebuild"],
        })
        C.progress(f"  {n} tokens ({n - prompt} generated): park {med['park']:.2f} ms, load {med['load']:.2f} ms, "
                   f"re-prefill {med['reprefill']:.1f} ms, rebuild {med['rebuild']:.1f} ms; exact {exact}")
    engine.close()
    return {"pair": pair, "exact": engine.exact, "generated": generated, "rows": rows}


def plot(result: dict[str, Any], png: Path) -> None:
    fig, (ax,) = C.subplots(width=6.5)
    for r in result["results"]:
        xs = [row["tokens"] for row in r["rows"]]
        park = [row["park_ms"] + row["load_ms"] for row in r["rows"]]
        ax.plot(xs, park, "o-", label=f"{r['pair']}: park + load (KV copied)")
        ax.plot(xs, [row["reprefill_ms"] for row in r["rows"]], "s--", label=f"{r['pair']}: re-prefill (not exact)")
        if "rebuild_ms" in r["rows"][0]:
            ax.plot(xs, [row["rebuild_ms"] for row in r["rows"]], "^-",
                    label=f"{r['pair']}: rebuilt from history (exact)")
            ax.plot(xs, [row["to_disk_ms"] + row["from_disk_ms"] + row["load_ms"] for row in r["rows"]], "d:",
                    label=f"{r['pair']}: KV to a file and loaded")
    ax.set_yscale("log")
    ax.set_xlabel("tokens the session holds")
    ax.set_ylabel("ms to bring a session back (median)")
    ax.set_title("A session brought back: its KV copied, or decoded again")
    C.save_figure(fig, png)


def main() -> None:
    ap = C.arguments(__doc__, replot=True, pairs="gemma-270m", repeats=5, out="parking")
    ap.add_argument("--tokens", default="100,500,1500", help="context lengths, comma-separated")
    ap.add_argument("--generated", type=float, default=0.5,
                    help="the share of the context an answer generated (rounds), the rest a prompt")
    args = C.parse(ap, plot=plot)
    threads = args.threads or None
    lengths = C.csv_list(args.tokens, int)
    results = [measure(p, lengths, args.repeats, threads, args.generated) for p in C.csv_list(args.pairs)]
    print(C.table(
        ["pair", "tokens", "generated", "state kB", "park ms", "load ms", "file ms", "re-prefill ms",
         "rebuild ms", "load exact", "re-prefill exact", "rebuild exact"],
        [[r["pair"], row["tokens"], row["generated"], row["state_bytes"] / 1e3, row["park_ms"], row["load_ms"],
          row["to_disk_ms"] + row["from_disk_ms"], row["reprefill_ms"], row["rebuild_ms"],
          row["load_bit_identical"], row["reprefill_bit_identical"], row["rebuild_bit_identical"]]
         for r in results for row in r["rows"]],
    ))
    path = C.write_result(args.out, {"settings": vars(args), "results": results})
    plot({"results": results}, path.with_suffix(".png"))
    print(f"wrote {path} and {path.with_suffix('.png').name}")


if __name__ == "__main__":
    main()
