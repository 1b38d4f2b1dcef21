"""Draft tokens per second: several tasks drafting on one draft model, batched, against
drafting them one at a time (issue 18, item 1).

For each pair's draft and N tasks (1, 2, 4, 8), every task drafts --steps greedy tokens
from its own prompt (an evaluation prompt, prefilled first and not timed). Three ways:

- one at a time: the tasks one after another, each step a decode of its own (a device today);
- pool, threads: a `DraftPool` with a slot per task, each task on a thread of its own
  drafting as fast as it can; steps that coincide run as one decode (group commit), as
  concurrent generations on an `EdgeClient(draft_slots=N)` do;
- pool, lockstep: one thread advancing every task by one token per decode (the most
  batching there can be: the pool's backend, without the threads).

Aggregate draft tokens per second are N x steps over the wall time, the median of
--repeats runs, the three ways interleaved so that the shared CPU's noise falls on all.
Every decode of all three runs on the pool's own thread: llama.cpp's CPU backend here is
built with OpenMP, and decodes from several OS threads in one process slowed each other
down (about 2x on this 2-core machine), so mixing a plain draft model on the main thread
with the pool's thread would measure that instead.

    python -m benchmarks draft_pool                    # both pairs
    python -m benchmarks draft_pool --pairs gemma-270m --steps 32 --repeats 3
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np

from benchmarks import harness as C
from edgekit.models import get_pair, model_path
from edgekit.runtime import DraftPool, LlamaPoolBackend, Step

TASKS = (1, 2, 4, 8)


def _prompts(tokenize, n: int) -> list[list[int]]:  # type: ignore[no-untyped-def]
    texts = [p["prompt"] for p in C.load_prompts()]
    return [tokenize(texts[i % len(texts)]) for i in range(n)]


def one_at_a_time(pool: DraftPool, prompts: list[list[int]], steps: int) -> tuple[float, list[list[int]]]:
    elapsed, outs = 0.0, []
    for p in prompts:
        (draft,) = _fresh_slots(pool, [p])
        feed, out = p[-1:], []
        t0 = time.perf_counter()
        for _ in range(steps):
            tok = int(np.argmax(draft.eval(feed).logits))
            out.append(tok)
            feed = [tok]
        elapsed += time.perf_counter() - t0
        draft.close()
        outs.append(out)
    return elapsed, outs


def _fresh_slots(pool: DraftPool, prompts: list[list[int]]) -> list:  # type: ignore[type-arg]
    slots = [pool.acquire() for _ in prompts]
    for s, p in zip(slots, prompts, strict=True):
        s.prefill(p[:-1])
    return slots


def pooled_threads(pool: DraftPool, prompts: list[list[int]], steps: int) -> tuple[float, list[list[int]]]:
    slots = _fresh_slots(pool, prompts)
    outs: list[list[int]] = [[] for _ in prompts]
    start = threading.Barrier(len(prompts) + 1)

    def task(i: int) -> None:
        feed = prompts[i][-1:]
        start.wait()
        for _ in range(steps):
            tok = int(np.argmax(slots[i].eval(feed).logits))
            outs[i].append(tok)
            feed = [tok]

    threads = [threading.Thread(target=task, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    for s in slots:
        s.close()
    return elapsed, outs


def pooled_lockstep(pool: DraftPool, prompts: list[list[int]], steps: int) -> tuple[float, list[list[int]]]:
    slots = _fresh_slots(pool, prompts)
    outs: list[list[int]] = [[] for _ in prompts]
    feeds = [p[-1] for p in prompts]
    t0 = time.perf_counter()
    for j in range(steps):
        batch = [Step(s.seq, s.n_past + j, [f]) for s, f in zip(slots, feeds, strict=True)]
        results = pool.exclusive(lambda batch=batch: pool.backend.run(batch))  # on the pool's thread
        for i, r in enumerate(results):
            assert r is not None
            feeds[i] = int(np.argmax(r.logits))
            outs[i].append(feeds[i])
    elapsed = time.perf_counter() - t0
    for s in slots:
        s.close()
    return elapsed, outs


def measure(pair: str, steps: int, repeats: int, threads: int | None) -> dict:
    spec = get_pair(pair)
    path = model_path(spec.draft)
    ctx = 512
    pool = DraftPool(LlamaPoolBackend(path, slots=max(TASKS), n_ctx_seq=ctx, n_threads=threads, name=spec.draft))
    rows = []
    try:
        for n in TASKS:
            prompts = _prompts(pool.vocab.tokenize, n)
            times: dict[str, list[float]] = {"one at a time": [], "pool, threads": [], "pool, lockstep": []}
            agree = 0
            for _ in range(repeats):
                e1, o1 = one_at_a_time(pool, prompts, steps)
                e2, o2 = pooled_threads(pool, prompts, steps)
                e3, o3 = pooled_lockstep(pool, prompts, steps)
                times["one at a time"].append(e1)
                times["pool, threads"].append(e2)
                times["pool, lockstep"].append(e3)
                agree += sum(a == b == c for a, b, c in zip(o1, o2, o3, strict=True))
            row = {"tasks": n, **{f"{k} tok/s": n * steps / C.median(v) for k, v in times.items()},
                   "same_tokens_share": agree / (n * repeats)}
            rows.append(row)
            C.progress(f"{pair} N={n}: " + ", ".join(f"{k} {row[f'{k} tok/s']:.1f} tok/s" for k in times)
                       + f"; tasks drafting the same tokens all three ways: {row['same_tokens_share']:.0%}")
    finally:
        pool.close()
    return {"pair": pair, "draft": spec.draft, "steps": steps, "rows": rows}


def plot(results: list[dict], path: Path) -> None:
    fig, axes = C.subplots(len(results), width=4.6)
    for ax, r in zip(axes, results, strict=True):
        for key in ("one at a time", "pool, threads", "pool, lockstep"):
            ax.plot([x["tasks"] for x in r["rows"]], [x[f"{key} tok/s"] for x in r["rows"]], marker="o", label=key)
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(TASKS), [str(t) for t in TASKS])
        ax.set_xlabel("tasks drafting")
        ax.set_ylabel("draft tokens per second (all tasks)")
        ax.set_title(f"{r['draft']}")
        ax.set_ylim(bottom=0)
    axes[0].legend()
    print(f"figure: {C.save_figure(fig, path)}")


def main() -> None:
    ap = C.arguments(__doc__, threads=None, pairs="gemma-270m,qwen-coder", repeats=5, out="draft_pool")
    ap.add_argument("--steps", type=int, default=48, help="tokens each task drafts")
    # Its own --threads, default None (the harness's is an int): unset, EDGEKIT_THREADS is left as it is.
    ap.add_argument("--threads", type=int, default=None,
                    help="llama.cpp threads of the draft pool (default: EDGEKIT_THREADS, or the physical cores)")
    args = C.parse(ap)
    results = [measure(p, args.steps, args.repeats, args.threads) for p in C.csv_list(args.pairs)]
    rows = [[r["draft"], x["tasks"], x["one at a time tok/s"], x["pool, threads tok/s"], x["pool, lockstep tok/s"],
             C.ratio(x["pool, threads tok/s"], x["one at a time tok/s"])] for r in results for x in r["rows"]]
    print(C.table(["draft", "tasks", "one at a time", "pool, threads", "pool, lockstep", "threads / one at a time"],
                  rows))
    path = C.write_result(args.out, {"settings": vars(args), "results": results})
    plot(results, path.with_suffix(".png"))


if __name__ == "__main__":
    main()
