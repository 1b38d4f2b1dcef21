"""Our verifier (sessions, prefix reuse) against a stock OpenAI-compatible server
(stateless: the whole context every round) on the same target, side by side.

The stock server is llama-cpp-python's own (`python -m llama_cpp.server`), started
here with the pair's target GGUF, one thread, like our verifier, and the verifiers guide's
`--n_ubatch 1` (since 2026-11-28: without it the server crashes on CPUs with AMX). Per prompt, both
backends run the same drafting (fixed window, greedy) in alternating order.
Figures: rounds, verifier time per committed token (our verifier's reported
verify time; for the stateless server the whole HTTP call, as it reports none),
tokens the verifier was sent per round, wall time per token, and whether the
outputs agree. Writes benchmarks/results/backends.json.
"""

from __future__ import annotations

import time

from benchmarks import harness as C
from benchmarks.rigs.llama_cpp_server import start_llama_server
from edgekit import EdgeClient, GenerationConfig, LlamaDraftModel, ServerConfig
from edgekit.models import get_pair, model_path


def run(client: EdgeClient, prompt: str) -> dict:
    t0 = time.perf_counter()
    final = client.generate(prompt).until_done()
    wall = time.perf_counter() - t0
    s = final.stats
    # what the verifier is sent per round: the block to a session, the whole context to a stateless server
    stateless = client.server_info().backend != "edgekit"
    sent = sum((r.base_position if stateless else 0) + r.drafted for r in s.rounds_detail)
    return {
        "tokens": list(final.token_ids),
        "committed": s.completion_tokens,
        "rounds": s.rounds,
        "accepted": s.accepted,
        "verify_ms": s.server.verify_ms + s.server.queue_ms,
        "wall_s": wall,
        "context_tokens_sent": sent,
    }


def main() -> None:
    ap = C.arguments(__doc__, pair="gemma-270m", prompts=8, max_tokens=48, draft_k=3)
    args = C.parse(ap)
    spec = get_pair(args.pair)
    prompts = C.load_prompts("eval", args.prompts)
    draft = LlamaDraftModel(model_path(spec.draft), name=spec.draft, n_ctx=2048)
    gen = GenerationConfig(max_tokens=args.max_tokens, drafting="fixed", draft_k=args.draft_k, stop_at_eos=False)
    # the verifiers guide's flag: llama.cpp's AMX kernel for several rows crashes on CPUs with AMX
    proc, url = start_llama_server(str(model_path(spec.target)), args.threads,
                                   str(C.RESULTS_DIR / "backends-llama-server.log"), ["--n_ubatch", "1"])
    ours = EdgeClient(None, pair=args.pair, draft=draft, generation=gen,
                      local_server=ServerConfig(port=0, max_sessions=2, threads=args.threads))
    stock = EdgeClient(url, draft=draft, generation=gen)
    runs: dict[str, list[dict]] = {"edgekit": [], "openai": []}
    try:
        run(ours, "warm up"), run(stock, "warm up")
        for i, p in enumerate(prompts):
            order = [("edgekit", ours), ("openai", stock)]
            for name, client in order if i % 2 == 0 else order[::-1]:
                runs[name].append(run(client, p["prompt"]))
                C.progress(f"{p['id']} {name}: {runs[name][-1]['rounds']} rounds, "
                           f"{runs[name][-1]['verify_ms'] / runs[name][-1]['committed']:.1f} ms verify/token")
    finally:
        ours.close()
        stock.close()
        draft.close()
        proc.terminate()
    summary = {}
    for name, rs in runs.items():
        committed = sum(r["committed"] for r in rs)
        rounds = sum(r["rounds"] for r in rs)
        summary[name] = {
            "committed": committed,
            "rounds": rounds,
            "accepted_length": sum(r["accepted"] for r in rs) / rounds,
            "verify_ms_per_token": sum(r["verify_ms"] for r in rs) / committed,
            "wall_ms_per_token": 1e3 * sum(r["wall_s"] for r in rs) / committed,
            "context_tokens_sent_per_round": sum(r["context_tokens_sent"] for r in rs) / rounds,
        }
    agree = sum(a["tokens"] == b["tokens"] for a, b in zip(runs["edgekit"], runs["openai"]))
    print(C.table(
        ["backend", "rounds", "AAL", "verify ms/token", "wall ms/token", "tokens sent/round"],
        [[n, v["rounds"], v["accepted_length"], v["verify_ms_per_token"], v["wall_ms_per_token"],
          v["context_tokens_sent_per_round"]] for n, v in summary.items()],
    ))
    ratio = summary["openai"]["verify_ms_per_token"] / summary["edgekit"]["verify_ms_per_token"]
    print(f"stateless/sessions verify time per token: {ratio:.2f}x; "
          f"identical outputs on {agree}/{len(prompts)} prompts")
    path = C.write_result("backends", {
        "settings": vars(args) | {"prompts": [p["id"] for p in prompts], "stock_server": "llama-cpp-python 0.3.36"},
        "summary": summary, "identical": agree, "verify_ratio": ratio, "runs": runs,
    })
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
