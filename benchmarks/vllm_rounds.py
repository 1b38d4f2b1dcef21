"""What a verification round costs against vLLM as the context grows, per route, beside `edgekit serve`.

A real vLLM (its CPU build, engines/vllm/: the gemma target as float32 safetensors, one thread)
verifies the gemma draft's blocks through `openai+http://` by each route of the OpenAI transport:

    prompt-logprobs  one completion of context + block asking for the log-probabilities of every
                     prompt position: vLLM skips its prefix cache for those, so each round
                     prefills the whole context again
    prefixes         one-token completions of the context and of each longer prefix, sent at
                     once: each reads the prefix cache and prefills only what is not cached
    generate         one request to vLLM's token-in/token-out /inference/v1/generate
                     (--enable-scale-out) that reads the prefix cache: the block, and the
                     context's tail past the last whole KV block (serve.sh: --block-size 16,
                     which the CPU build makes 32), are all it computes

and `edgekit serve` (the GGUF target, llama.cpp, one thread), whose sessions keep their KV. For
each context length, prompts of that many tokens (held-out text, repeated to length) are
continued greedily with a fixed window of 4; a round's time is the client's round trip. Each route
has prompts of its own (vLLM's prefix cache would serve one route what another computed), and vLLM's
own greedy completion of them, asked once every route is done, is what each route's tokens must
equal (checked); `edgekit serve`
decodes another target (quantized GGUF), so its tokens are not compared.

Each round's requests and the prompt tokens vLLM computed for them are read from its /metrics.

    python -m benchmarks vllm_rounds [--contexts 64,127,128,256,512,1024,2048] [--prompts 2] [--tokens 12]
                                     [--routes prompt-logprobs,prefixes,generate]

Needs engines/vllm/prepare.sh done (`make vllm`). Writes benchmarks/results/vllm_rounds.{json,png}
(vllm_rounds_ROUTES.{json,png} with some of the routes).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from benchmarks import harness as C
from benchmarks.rigs.verifier_process import serve_process
from benchmarks.rigs.vllm_server import VllmServer, post, prepared, vllm_counter
from edgekit import ClientConfig, EdgeClient, GenerationConfig
from edgekit.models import get_pair, model_path
from edgekit.runtime import LlamaDraftModel

ROUTES = ("prompt-logprobs", "prefixes", "generate")
SERVED = "gemma-3-270m"


def contexts_of(draft: LlamaDraftModel, lengths: list[int], n: int, first: int = 0) -> dict[int, list[list[int]]]:
    """n token-id prompts per length: BOS and held-out text from the `first`-th text on, repeated to
    that many tokens (each route takes its own `first`, so none reads what another computed)."""
    texts = [p["prompt"] for p in C.load_prompts()]
    out: dict[int, list[list[int]]] = {}
    for length in lengths:
        out[length] = []
        for i in range(first, first + n):
            ids = draft.tokenize(texts[i % len(texts)], add_special=True)
            body = draft.tokenize("\n\n".join(texts[(i + j) % len(texts)] for j in range(len(texts))),
                                  add_special=False)
            while len(ids) < length:
                ids += body
            out[length].append(ids[:length])
    return out


def rounds_through(url: str, draft: LlamaDraftModel, prompts: dict[int, list[list[int]]], tokens: int,
                   vllm_base: str | None = None) -> dict:
    gen = GenerationConfig(max_tokens=tokens, drafting="fixed", draft_k=4, stop_at_eos=False)
    result: dict[int, dict] = {}

    def counters() -> tuple[float, float]:
        if vllm_base is None:
            return 0.0, 0.0
        return (vllm_counter(vllm_base, "vllm:request_success_total"),
                vllm_counter(vllm_base, "vllm:prompt_tokens_by_source_total", source="local_compute"))

    with EdgeClient(url, draft=draft, generation=gen, config=ClientConfig(timeout=600, retry_for=0)) as client:
        client.generate(prompts[min(prompts)][0][:8], max_tokens=2).until_done()  # warm: first requests are slow
        for length, group in prompts.items():
            ms, later, outputs, requests, computed = [], [], [], 0.0, 0.0
            for ids in group:
                before = counters()
                final = client.generate(ids).until_done()
                after = counters()
                requests, computed = requests + after[0] - before[0], computed + after[1] - before[1]
                ms += [r.round_trip_ms for r in final.stats.rounds_detail]
                later += [r.round_trip_ms for r in final.stats.rounds_detail[1:]]
                outputs.append(list(final.token_ids))
            # a prompt's first round also computes the prompt's tail past its last whole KV block; how
            # many rounds a prompt takes (its acceptance) decides their share: the later rounds alone too
            result[length] = {"round_ms": ms, "median_round_ms": statistics.median(ms), "outputs": outputs,
                              "rounds": len(ms), "median_later_round_ms": statistics.median(later or ms)}
            if vllm_base is not None:  # the first round of each prompt prefills it: counted in
                result[length] |= {"requests_per_round": requests / len(ms),
                                   "computed_tokens_per_round": computed / len(ms)}
            median = result[length]["median_round_ms"]
            C.progress(f"{url.split('?')[-1]:28s} context {length:5d}: {median:8.1f} ms a round")
    return result


def plot(payload: dict, png: Path) -> None:
    fig, axes = C.subplots(2, width=5.2, height=3.8)
    lengths = payload["contexts"]
    for i, (name, r) in enumerate(payload["systems"].items()):
        y = [r[str(n)]["median_round_ms"] for n in lengths]
        axes[0].plot(lengths, y, marker="o", color=f"C{i}", label=name)
        axes[1].plot(lengths, [v / y[0] for v in y], marker="o", color=f"C{i}", label=name)
    axes[0].set(xlabel="tokens of context", ylabel="ms a round (median)", yscale="log",
                title="a K=4 round against the context")
    axes[1].set(xlabel="tokens of context", ylabel=f"x the round at {lengths[0]} tokens",
                title="growth with the context")
    axes[1].axhline(2.0, color="grey", lw=0.8, ls="--")
    for ax in axes:
        ax.legend(fontsize=7)
    C.save_figure(fig, png)


def main() -> None:
    ap = C.arguments(__doc__, whole_doc=True, threads=None)  # one thread each, always (below)
    ap.add_argument("--contexts", default="64,127,128,256,512,1024,2048")
    ap.add_argument("--prompts", type=int, default=2)  # per context length: not the shared --prompts
    ap.add_argument("--tokens", type=int, default=12)
    ap.add_argument("--routes", default=",".join(ROUTES))  # some of them: the result is named after them
    args = C.parse(ap, machine=False)
    routes = C.csv_list(args.routes)
    if not routes or set(routes) - set(ROUTES):
        raise SystemExit(f"--routes takes some of {', '.join(ROUTES)}")
    missing = prepared()
    if missing:
        raise SystemExit(f"vLLM is not prepared ({', '.join(map(str, missing))}); run make vllm")
    lengths = C.csv_list(args.contexts, int)
    spec = get_pair("gemma-270m")
    draft = LlamaDraftModel(model_path(spec.draft), name=spec.draft, n_threads=1)
    # Each route its own prompts: vLLM's prefix cache would serve one route what another computed (a
    # generate round whose block was decoded before goes by the prefixes, see the transport)
    prompts = {route: contexts_of(draft, lengths, args.prompts, first=r * args.prompts)
               for r, route in enumerate(routes)}
    systems: dict[str, dict] = {}
    identical: dict[str, bool] = {}
    log = C.RESULTS_DIR / "vllm_rounds_server.log"
    with VllmServer(C.free_port(), log) as vllm:
        t0 = time.monotonic()
        post(vllm.base, "/completions", {"model": SERVED, "prompt": [2, 9259], "max_tokens": 1})
        C.progress(f"vLLM ready; a first completion took {time.monotonic() - t0:.1f} s")
        for route in routes:
            systems[f"vLLM, {route}"] = rounds_through(f"openai+{vllm.base}?route={route}", draft, prompts[route],
                                                       args.tokens, vllm.base)
        for route in routes:  # vLLM's own greedy decoding of each route's prompts, once the routes are done
            reference = {n: [[int(t.removeprefix("token_id:")) for t in post(vllm.base, "/completions", {
                "model": SERVED, "prompt": ids, "max_tokens": args.tokens, "temperature": 0, "logprobs": 1,
                "return_tokens_as_token_ids": True})["choices"][0]["logprobs"]["tokens"]] for ids in group]
                for n, group in prompts[route].items()}
            identical[f"vLLM, {route}"] = all(systems[f"vLLM, {route}"][n]["outputs"] == reference[n] for n in lengths)
    with serve_process(["--model", str(model_path(spec.target)), "--threads", "1", "--max-sessions", "2"],
                       C.RESULTS_DIR / "vllm_rounds_edgekit.log") as served:
        systems["edgekit serve"] = rounds_through(served.address, draft, prompts[routes[-1]], args.tokens)
    payload = {"contexts": lengths, "tokens": args.tokens, "prompts_per_context": args.prompts,
               "identical_to_vllm_greedy": identical,
               "systems": {name: {str(n): v for n, v in r.items()} for name, r in systems.items()}}
    for name, r in systems.items():
        first, last = r[lengths[0]]["median_round_ms"], r[lengths[-1]]["median_round_ms"]
        payload.setdefault("growth", {})[name] = last / first
        if 256 in r:  # issue 67's measure: a round at the longest context against one at 256 tokens
            payload.setdefault("over_256", {})[name] = last / r[256]["median_round_ms"]
            payload.setdefault("later_over_256", {})[name] = (r[lengths[-1]]["median_later_round_ms"]
                                                              / r[256]["median_later_round_ms"])
    name = "vllm_rounds" if routes == list(ROUTES) else "vllm_rounds_" + "-".join(routes)
    path = C.write_result(name, payload)
    plot(payload, path.with_suffix(".png"))
    print(C.table(["system", *[f"{n} tokens" for n in lengths], "growth", "identical to vLLM"],
                  [[name, *[C.fmt(r[n]["median_round_ms"], 0) for n in lengths], C.fmt(payload["growth"][name]),
                    identical.get(name, "-")] for name, r in systems.items()]))


if __name__ == "__main__":
    main()
