"""What the engine host's socket costs a front end (`edgekit serve --frontends`): one engine call of B
sessions' rounds (5 rows each) made on the engine in this process, and the same call made through an
`EngineHost` as a front end makes it (`RemoteEngine`: pickled over a Unix socket, answered from the
host's threads), with the rows reduced three ways: best ids (greedy), kept rows (top-k 40) and
whole rows (logprobs, penalties, top-p alone), these last both through the socket and through
shared memory (the host's default on Linux: arrays of 64 KiB or more go through a memory file). The
engine answers every call from rows it made once (no model runs), so the difference is the
socket's, the pickling's and the host's threads'; every way's outputs are checked equal, and the
calls are interleaved so the machine's noise hits them alike.

    python -m benchmarks engine_host                                    # vocabulary 32,000
    python -m benchmarks engine_host --vocab 152064 --batches 1,16,64,128 --out engine_host_qwen
"""

from __future__ import annotations

import random
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import harness as C
from edgekit.runtime import ToyLanguageModel
from edgekit.verifier import Feed, ToyEngine
from edgekit.verifier.engine import EngineHost, KeptRows, RemoteEngine

WAYS = {"best ids": {"argmax": -1}, "kept rows (top-k 40)": {"keep": 40}, "whole rows": {}}


class CannedEngine(ToyEngine):
    """The toy engine's interface, every call answered from rows made once: what a call's outputs
    weigh, without a model's time (whole rows are copied out, as llama.cpp's engine copies them)."""

    def __init__(self, lm: ToyLanguageModel, n_seq: int) -> None:
        super().__init__(lm, n_seq=n_seq, max_context=64)
        rng = np.random.default_rng(0)
        self.rows = rng.standard_normal((5, lm.vocab_size)).astype(np.float32)
        self.kept = KeptRows(self.rows[:, :40].copy(), np.arange(40, dtype=np.int64))

    def run_batch(self, feeds):  # type: ignore[no-untyped-def]
        return [np.argmax(self.rows, axis=1) if f.argmax
                else KeptRows(self.kept.logits.copy(), self.kept.ids.copy()) if f.keep else self.rows.copy()
                for f in feeds]  # each its own arrays, as an engine's are (pickle sends a shared one once)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, KeptRows):
        return np.array_equal(a.ids, b.ids) and np.array_equal(a.logits, b.logits)
    return bool(np.array_equal(a, b))


def measure(vocab: int, batches: list[int], repeats: int) -> dict[str, Any]:
    n = max(batches)
    lm = ToyLanguageModel(vocab_size=vocab, seed=3)
    local = CannedEngine(lm, n)
    hosts = {"host": EngineHost(CannedEngine(lm, n), clients=1, seqs=n, shared_rows=None),
             "shared": EngineHost(CannedEngine(lm, n), clients=1, seqs=n)}
    remotes = {name: RemoteEngine(h.address, h.authkey) for name, h in hosts.items()}
    engines = {"local": local, **remotes}
    try:
        cells = [(b, way) for b in batches for way in WAYS]
        times: dict[tuple[int, str, str], list[float]] = {(b, w, e): [] for b, w in cells for e in engines}
        for _ in range(repeats):
            random.shuffle(cells)
            for b, way in cells:
                asks = {k: (vocab if v == -1 else v) for k, v in WAYS[way].items()}
                if "keep" in asks:
                    asks["within"] = vocab
                feeds = [Feed(s, 4, (9, 10, 11, 12, 13), 5, **asks) for s in range(b)]
                outs = {}
                for name in random.sample(list(engines), len(engines)):
                    t0 = time.perf_counter()
                    outs[name] = engines[name].run_batch(feeds)
                    times[b, way, name].append((time.perf_counter() - t0) * 1e3)
                for name in remotes:
                    assert all(_same(x, y) for x, y in zip(outs["local"], outs[name], strict=True)), (b, way, name)
    finally:
        for name, remote in remotes.items():
            remote.close()
            hosts[name].close()
    rows = []
    for b in batches:
        for way in WAYS:
            here, there, shared = (statistics.median(times[b, way, e]) for e in ("local", "host", "shared"))
            rows.append({"sessions": b, "rows": 5 * b, "way": way, "local_ms": here, "host_ms": there,
                         "socket_ms": there - here, "socket_us_per_row": (there - here) * 1e3 / (5 * b),
                         "shared_host_ms": shared, "shared_ms": shared - here})
    return {"vocab": vocab, "repeats": repeats, "rows": rows}


def plot(result: dict[str, Any], png: Path) -> None:
    fig, (ax,) = C.subplots(width=6.5)
    for way in WAYS:
        rs = [r for r in result["rows"] if r["way"] == way and r["socket_ms"] > 0]  # (noise can make one <= 0)
        line = ax.plot([r["rows"] for r in rs], [r["socket_ms"] for r in rs], "o-", label=way)[0]
        if way == "whole rows" and any("shared_ms" in r for r in rs):
            rs = [r for r in rs if r.get("shared_ms", 0) > 0]
            ax.plot([r["rows"] for r in rs], [r["shared_ms"] for r in rs], "s--", color=line.get_color(),
                    label="whole rows, through shared memory")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(f"rows in the engine call (5 a session), {result['vocab']:,} logits each")
    ax.set_ylabel("ms the host adds to a call (median)")
    ax.legend(fontsize=8)
    ax.set_title("An engine call through the engine host, over one made in process")
    C.save_figure(fig, png)


def main() -> None:
    ap = C.arguments(__doc__, replot=True, threads=None, repeats=20, out="engine_host")
    ap.add_argument("--vocab", type=int, default=32000, help="logits per row")
    ap.add_argument("--batches", default="1,8,32,128", help="sessions per call, comma-separated")
    args = C.parse(ap, plot=plot)
    result = measure(args.vocab, C.csv_list(args.batches, int), args.repeats)
    print(C.table(["sessions", "rows", "way", "in process ms", "through the host ms", "added ms", "added us a row",
                   "added ms, shared memory"],
                  [[r["sessions"], r["rows"], r["way"], r["local_ms"], r["host_ms"], r["socket_ms"],
                    r["socket_us_per_row"], r["shared_ms"]] for r in result["rows"]]))
    path = C.write_result(args.out, {"settings": vars(args), **result})
    plot(result, path.with_suffix(".png"))
    print(f"wrote {path} and {path.with_suffix('.png').name}")


if __name__ == "__main__":
    main()
