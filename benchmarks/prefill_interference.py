"""How long one session's rounds wait while another session's long prompt is prefilled.

A verifier over the pair's target (in process, exact numerics) serves two
sessions: one sends rounds of K draft tokens back to back, the other opens with
a prompt of `--prompt-tokens` tokens. With chunked prefill the rounds run
between the prompt's chunks; with chunks as long as the prompt, a round that
arrives during the prefill waits for all of it. For each chunk size the
benchmark logs every round's latency while the prefill runs, and reports the
longest and the median beside the prefill's own time.

    python -m benchmarks prefill_interference --pair gemma-270m --chunks 64,128,512,4096
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from benchmarks import harness as C
from edgekit import ServerConfig
from edgekit.models import get_pair, model_path
from edgekit.protocol import BlockRequest, OpenRequest
from edgekit.runtime import LlamaModel
from edgekit.testing import InProcessTransport
from edgekit.verifier import LlamaEngine, VerifierService


def run(engine: LlamaEngine, chunk: int, prompt: list[int], k: int, config: ServerConfig) -> dict:
    service = VerifierService(engine, ServerConfig(**{**config.__dict__, "prefill_chunk": chunk}))
    v = InProcessTransport(service)
    fp = engine.fingerprint()
    rounds: list[tuple[float, float]] = []  # (start, ms) of every round, seconds from the prefill's start
    stop = threading.Event()
    t0 = time.perf_counter()

    def rounds_loop() -> None:
        short = v.open_session(OpenRequest(prompt[:32], mode="greedy", seed=0, draft=fp))
        sid, base = short.session_id, short.committed_length
        while not stop.is_set():
            s = time.perf_counter()
            r = v.verify(BlockRequest(session_id=sid, base_position=base, draft_tokens=[5] * k))
            rounds.append((s - t0, (time.perf_counter() - s) * 1e3))
            base = r.committed_length
        v.close_session(sid)

    worker = threading.Thread(target=rounds_loop)
    worker.start()
    time.sleep(0.5)  # rounds running before the long prompt arrives
    t0 = time.perf_counter()
    rounds.clear()
    start = time.perf_counter()
    long = v.open_session(OpenRequest(prompt, mode="greedy", seed=0, draft=fp))
    prefill_s = time.perf_counter() - start
    stop.set()
    worker.join()
    v.close_session(long.session_id)
    during = [ms for s, ms in rounds if s < prefill_s]
    service.close()
    return {
        "prefill_chunk": chunk,
        "prefill_s": prefill_s,
        "rounds_during_prefill": len(during),
        "round_ms_max": max(during) if during else None,
        "round_ms_median": C.median(during) if during else None,
        "rounds": rounds,
    }


def plot(result: dict, path: Path) -> Path:
    fig, (ax,) = C.subplots(width=8.0)
    for r in result["runs"]:
        xs = [s + ms / 1e3 for s, ms in r["rounds"]]  # at each round's end
        ax.plot(xs, [ms for _, ms in r["rounds"]], marker="o", markersize=4, linestyle="none", alpha=0.8,
                label=f"chunk {r['prefill_chunk']}: prefill {r['prefill_s']:.1f} s, longest round "
                      f"{(r['round_ms_max'] or 0) / 1e3:.2f} s")
        ax.axvline(r["prefill_s"], linestyle=":", alpha=0.4)
    ax.set_yscale("log")
    ax.set_xlabel("seconds since the long prompt arrived, at each round's end (dotted: the prefill done)")
    ax.set_ylabel("round latency, ms (log)")
    ax.set_title(f"{result['target']}: a session's rounds while another prefills {result['prompt_tokens']} tokens")
    return C.save_figure(fig, path)


def main() -> None:
    ap = C.arguments(__doc__, whole_doc=True, threads=0, pair="gemma-270m", out="prefill_interference")
    ap.add_argument("--prompt-tokens", type=int, default=4095)
    ap.add_argument("--chunks", default="64,128,512,4096")
    ap.add_argument("--k", type=int, default=4)
    args = C.parse(ap)
    threads = args.threads if args.threads > 0 else None  # None: edgekit's default
    spec = get_pair(args.pair)
    config = ServerConfig(port=0, max_sessions=2, max_context=args.prompt_tokens + 64, max_block=32, threads=threads)
    engine = LlamaEngine(str(model_path(spec.target)), name=spec.target, max_context=config.max_context, n_seq=2,
                         max_block=config.max_block, threads=threads)
    model: LlamaModel = engine.model
    text = " ".join(p["prompt"] for p in C.load_prompts())
    prompt = model.tokenize(text)
    while len(prompt) < args.prompt_tokens:
        prompt += prompt[1:]
    prompt = prompt[: args.prompt_tokens]
    runs = []
    for chunk in C.csv_list(args.chunks, int):
        r = run(engine, chunk, prompt, args.k, config)
        runs.append(r)
        C.progress(f"chunk {chunk}: prefill {r['prefill_s']:.1f} s, {r['rounds_during_prefill']} rounds during it, "
                   f"longest {r['round_ms_max']} ms, median {r['round_ms_median']} ms")
    result = {"pair": args.pair, "target": spec.target, "prompt_tokens": len(prompt), "k": args.k, "runs": runs}
    path = C.write_result(args.out, {"settings": vars(args), "result": result})
    png = plot(result, path.with_suffix(".png"))
    rows = [[r["prefill_chunk"], r["prefill_s"], r["rounds_during_prefill"], r["round_ms_median"], r["round_ms_max"]]
            for r in runs]
    print(C.table(["prefill chunk", "prefill s", "rounds during it", "median round ms", "longest round ms"], rows))
    print(path, png, sep="\n")


if __name__ == "__main__":
    main()
