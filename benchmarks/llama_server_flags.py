"""What the verifiers guide's llama-cpp-python recipe costs: its server started with the guide's flags
against its defaults, on the same target, verifying the same drafts.

On CPUs with AMX, llama.cpp's AMX matmul for batches of more than one row crashes the server on its
first completion (docs/guides/verifiers-and-engines.md); batches of one row (`--n_ubatch 1`) never
reach it. Where the defaults work (this benchmark's machine must not have AMX), this measures what
that costs: per flag set, the same greedy drafting (fixed window) over the same prompts, in
alternating order, through edgekit's OpenAI transport. Figures: wall time per committed token and
per round (the whole HTTP call: the server says no time of its own), llama.cpp's own compute in the
server (its `llama_perf_context_print` lines: prompt eval and eval ms, per evaluated token and per
round), and whether the outputs agree. Writes benchmarks/results/llama_server_flags.json and its figure.

Most of a round is the server's Python: with `echo` and `logprobs` it sorts the whole vocabulary at
every position of the context (262,144 entries for gemma), every round; llama.cpp's share is what
the flags can change.

    python -m benchmarks llama_server_flags --prompts 2 --max-tokens 12
"""

from __future__ import annotations

import re
import shlex
import time
from pathlib import Path

from benchmarks import harness as C
from benchmarks.rigs.llama_cpp_server import start_llama_server
from edgekit import ClientConfig, EdgeClient, GenerationConfig, LlamaDraftModel
from edgekit.models import get_pair, model_path
from edgekit.runtime import llama_build

DEFAULT_SETS = ("", "--n_ubatch 1", "--n_batch 1 --n_ubatch 1")


def run(client: EdgeClient, prompt: str) -> dict:
    t0 = time.perf_counter()
    final = client.generate(prompt).until_done()
    s = final.stats
    rounds = [r.round_trip_ms for r in s.rounds_detail]  # the whole HTTP call: the server says no time
    return {"tokens": list(final.token_ids), "committed": s.completion_tokens, "wall_s": time.perf_counter() - t0,
            "round_ms": rounds}


PERF = re.compile(r"llama_perf_context_print: +(prompt eval|eval) time = +([\d.]+) ms / +(\d+) (?:tokens|runs)")


def llama_compute(log: Path) -> dict:
    """llama.cpp's own time in a server's log: ms and tokens evaluated, over every request."""
    ms = tokens = 0.0
    for _kind, t, n in PERF.findall(log.read_text(errors="replace")):
        ms, tokens = ms + float(t), tokens + int(n)
    return {"ms": ms, "tokens": tokens}


def plot(result: dict, png) -> None:  # type: ignore[no-untyped-def]
    names = list(result["summary"])
    labels = [n or "defaults" for n in names]
    fig, (rounds, compute) = C.subplots(2, width=5.5)
    x = list(range(len(names)))
    rounds.bar(x, [result["summary"][n]["round_ms"] / 1e3 for n in names], color="tab:blue")
    rounds.set_xticks(x, labels)
    rounds.set_ylabel("s per round (median HTTP call)")
    rounds.set_title("a round, as the client waits for it")
    compute.bar(x, [result["summary"][n]["llama_ms_per_round"] for n in names], color="tab:orange")
    compute.set_xticks(x, labels)
    compute.set_ylabel("llama.cpp ms per round")
    compute.set_title("llama.cpp's own compute in it")
    for ax in (rounds, compute):
        ax.tick_params(axis="x", labelsize=8)
    fig.suptitle(f"llama-cpp-python's server, {result['settings']['pair']} target, "
                 f"{result['machine']['cpu']}", fontsize=9)
    C.save_figure(fig, png)


def main() -> None:
    ap = C.arguments(__doc__, pair="gemma-270m", prompts=2, max_tokens=12, draft_k=3)
    ap.add_argument("--sets", default="|".join(DEFAULT_SETS),
                    help="flag sets to compare, separated by '|' (an empty one: the server's defaults)")
    args = C.parse(ap)
    if "AMX_INT8 = 1" in llama_build()["llama_build"]:
        raise SystemExit("llama.cpp here is built with AMX: its defaults crash, there is nothing to compare against")
    spec = get_pair(args.pair)
    prompts = C.load_prompts("eval", args.prompts)
    sets = args.sets.split("|")
    draft = LlamaDraftModel(model_path(spec.draft), name=spec.draft, n_ctx=2048)
    gen = GenerationConfig(max_tokens=args.max_tokens, drafting="fixed", draft_k=args.draft_k, stop_at_eos=False)
    servers, clients, logs = [], {}, {}
    runs: dict[str, list[dict]] = {s: [] for s in sets}
    try:
        for flags in sets:
            log = logs[flags] = C.RESULTS_DIR / f"llama_server_flags-{len(servers)}.log"
            proc, url = start_llama_server(str(model_path(spec.target)), args.threads, str(log), shlex.split(flags))
            servers.append(proc)
            # a stateless server reads every round's whole context: minutes, not seconds, on a busy core
            clients[flags] = EdgeClient(url, draft=draft, generation=gen, config=ClientConfig(timeout=600))
            run(clients[flags], "warm up")
        for i, p in enumerate(prompts):
            order = sets[i % len(sets):] + sets[: i % len(sets)]  # each set first in turn
            for flags in order:
                runs[flags].append(run(clients[flags], p["prompt"]))
                C.progress(f"{p['id']} [{flags or 'defaults'}]: {runs[flags][-1]['wall_s']:.2f} s")
    finally:
        for client in clients.values():
            client.close()
        draft.close()
        for proc in servers:
            C.stop_process(proc, 20)
    summary = {}
    for flags, rs in runs.items():
        committed = sum(r["committed"] for r in rs)
        rounds = sum(len(r["round_ms"]) for r in rs)
        llama = llama_compute(logs[flags])  # the warm-up's included: the same for every set
        summary[flags] = {
            "committed": committed,
            "rounds": rounds,
            "wall_ms_per_token": 1e3 * sum(r["wall_s"] for r in rs) / committed,
            "round_ms": C.median([ms for r in rs for ms in r["round_ms"]]),
            "llama_ms": llama["ms"],
            "llama_tokens_evaluated": llama["tokens"],
            "llama_ms_per_token_evaluated": llama["ms"] / max(llama["tokens"], 1),
            "llama_ms_per_round": llama["ms"] / max(rounds + 1, 1),  # +1: the warm-up's round
        }
    base = sets[0]
    for flags in sets:
        summary[flags]["wall_vs_first_set"] = summary[flags]["wall_ms_per_token"] / summary[base]["wall_ms_per_token"]
        summary[flags]["identical_to_first_set"] = sum(
            a["tokens"] == b["tokens"] for a, b in zip(runs[flags], runs[base]))
    print(C.table(
        ["flags", "wall ms/token", f"vs {base or 'defaults'}", "round ms", "llama.cpp ms/round",
         "llama.cpp ms/row", "same text"],
        [[f or "defaults", v["wall_ms_per_token"], v["wall_vs_first_set"], v["round_ms"], v["llama_ms_per_round"],
          v["llama_ms_per_token_evaluated"], f"{v['identical_to_first_set']}/{len(prompts)}"]
         for f, v in summary.items()],
    ))
    result = {"settings": vars(args) | {"prompts": [p["id"] for p in prompts], "sets": sets},
              "summary": summary, "runs": runs}
    path = C.write_result("llama_server_flags", result)
    result["machine"] = C.machine()
    plot(result, path.with_suffix(".png"))
    print(f"wrote {path} and its figure")


if __name__ == "__main__":
    main()
