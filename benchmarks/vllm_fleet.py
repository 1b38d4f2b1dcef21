"""A fleet of devices against one vLLM server: rounds a second by each route, and vLLM's own decoding.

N simulated devices (threads of this process, `rigs/fleet_sim.Fleet`) verify against one real vLLM
(its CPU build, engines/vllm/: the gemma target as float32 safetensors, one thread) through
`openai+http://`, each its own transport, as a device would:

    generate     one request a round to vLLM's /inference/v1/generate, reading the prefix cache
    prefixes     K+1 one-token completions a round, sent at once, each reading the prefix cache
    centralized  no drafts: each device asks vLLM for its whole answer (one greedy completion
                 of the trace's length), which vLLM decodes itself in its continuous batch

A device's drafting is recorded, not run (64 draft models would take this machine's cores from the
server): for each prompt, vLLM's greedy output (one completion), and at each of its positions the
gemma draft's greedy block of K = 4 (`record_trace`). A device sleeps the recorded drafting time
and a 20-40 ms round trip, sends its block and checks the verdict against the recording (a verdict
that leaves vLLM's recorded greedy text ends that answer and is counted: vLLM's CPU kernels may
round differently in another batch). Every answer's prompt is its own (the held-out texts in an
order of its own) and the devices take them in turn: a context another device had decoded would
be served from vLLM's prefix cache, which no fleet of distinct conversations sees. vLLM's prefix
cache is emptied before each cell (its dev-mode /reset_prefix_cache).

Per route and N, over the measuring window: rounds a second, committed tokens a second, requests
vLLM finished a round (its /metrics), the CPU seconds its API server and its engine used per round
and per committed token, and the round trip's median and p90.

    python -m benchmarks vllm_fleet [--devices 1,4,16,64] [--duration 30] [--warmup 8] [--prompts 160]

Needs engines/vllm/prepare.sh done (`make vllm`). Writes benchmarks/results/vllm_fleet.{json,png}
(and vllm_fleet_traces.json, the recording, reused while its vLLM, draft and prompts are the same).
"""

from __future__ import annotations

import hashlib
import json
import random
import statistics
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks import harness as C
from benchmarks.rigs.fleet_sim import DeviceSpec, Fleet, load_traces, record_trace, save_traces
from benchmarks.rigs.vllm_server import VllmServer, post, prepared, vllm_counter
from edgekit.drafting import FixedWindow
from edgekit.models import get_pair, model_path
from edgekit.runtime import LlamaDraftModel
from edgekit.transport import OpenAITransport

SERVED = "gemma-3-270m"
SYSTEMS = ("generate", "prefixes", "centralized")
K = 4


def unique_prompts(draft: LlamaDraftModel, n: int, length: int) -> list[list[int]]:
    """n prompts of `length` tokens: BOS, then the held-out texts in an order of each prompt's own
    (a seeded shuffle, the i-th starting with text i mod their number), so no two contexts are the
    same past their first text or two."""
    texts = [draft.tokenize(p["prompt"] + "\n\n", add_special=False) for p in C.load_prompts()]
    bos = draft.tokenize("", add_special=True)
    rng = random.Random(0)
    out: list[list[int]] = []
    seen: set[tuple[int, ...]] = set()
    while len(out) < n:
        first = len(out) % len(texts)
        rest = [t for j, t in enumerate(texts) if j != first]
        rng.shuffle(rest)
        ids = bos + [tok for t in [texts[first], *rest] for tok in t]
        while len(ids) < length:
            ids += ids[len(bos):]
        if tuple(ids[:length]) not in seen:
            seen.add(tuple(ids[:length]))
            out.append(ids[:length])
    return out


def record(draft: LlamaDraftModel, base: str, prompts: list[list[int]], tokens: int, path: Path) -> list:
    """vLLM's greedy output for each prompt, and the draft's blocks along it (reused from `path`
    while the prompts, the length and vLLM's version are the same)."""
    version = json.load(urllib.request.urlopen(base.removesuffix("/v1") + "/version", timeout=30))["version"]
    meta = {"served": SERVED, "vllm": version, "draft": draft.name, "tokens": tokens, "window": K,
            "prompts": len(prompts), "prompt_hash": hashlib.sha256(json.dumps(prompts).encode()).hexdigest()[:16]}
    if path.is_file():
        traces, old = load_traces(path)
        if old == meta:
            C.progress(f"reusing {len(traces)} recorded traces from {path.name}")
            return traces

    def greedy(ids: list[int]) -> list[int]:
        answer = post(base, "/completions", {"model": SERVED, "prompt": ids, "max_tokens": tokens, "temperature": 0,
                                             "logprobs": 1, "return_tokens_as_token_ids": True})
        return [int(t.removeprefix("token_id:")) for t in answer["choices"][0]["logprobs"]["tokens"]]

    t0 = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        targets = list(pool.map(greedy, prompts))
    C.progress(f"vLLM's greedy output for {len(prompts)} prompts in {time.monotonic() - t0:.0f} s")
    traces = []
    for i, (ids, target) in enumerate(zip(prompts, targets)):
        traces.append(record_trace(draft, ids, target, K))
        if i % 20 == 19:
            C.progress(f"recorded {i + 1} of {len(prompts)} traces")
    meta["recorded_s"] = time.monotonic() - t0
    save_traces(path, traces, meta)
    return traces


def reset_cache(base: str) -> None:
    request = urllib.request.Request(base.removesuffix("/v1") + "/reset_prefix_cache", b"", method="POST")
    with urllib.request.urlopen(request, timeout=60) as answer:
        answer.read()


def counters(vllm: VllmServer) -> dict[str, float]:
    return {"requests": vllm_counter(vllm.base, "vllm:request_success_total"),
            "computed": vllm_counter(vllm.base, "vllm:prompt_tokens_by_source_total", source="local_compute"),
            **vllm.cpu_seconds()}


def cell(vllm: VllmServer, draft: LlamaDraftModel, traces: list, system: str, n: int, args) -> dict:  # type: ignore[no-untyped-def]
    reset_cache(vllm.base)
    route = "prefixes" if system == "centralized" else system
    transports: list[OpenAITransport] = []

    def connect(i: int, config) -> OpenAITransport:  # type: ignore[no-untyped-def]
        t = OpenAITransport(vllm.base, draft, timeout=config.timeout, model=SERVED, route=route)
        transports.append(t)
        return t

    specs = [DeviceSpec(None, None, rtt_ms=20.0 + 20.0 * i / max(n - 1, 1)) for i in range(n)]
    fleet = Fleet(vllm.base, draft.fingerprint(), traces, specs,
                  mode="centralized" if system == "centralized" else "speculative",
                  controller=lambda: FixedWindow(K), duration=args.duration, max_window=K, seed=n,
                  timeout=300.0, on_divergence="end", connect=connect, trace_order="unique", cut_at_end=True)
    marks: list[tuple[float, dict]] = []

    def mark_at(delay: float) -> None:
        time.sleep(delay)
        marks.append((time.perf_counter(), counters(vllm)))

    sampler = threading.Thread(target=lambda: (mark_at(args.warmup), mark_at(args.duration - args.warmup)))
    sampler.start()
    fleet.run()
    sampler.join()
    (t_a, a), (t_b, b) = marks
    span = t_b - t_a
    lo, hi = t_a - fleet._t0, t_b - fleet._t0
    rounds = [r for r in fleet.rounds if lo <= r.t < hi]
    if system == "centralized":
        done = [r for r in fleet.responses if lo <= r.started + r.seconds < hi]
        committed = sum(r.tokens for r in done)
    else:
        committed = sum(r.committed for r in rounds)
    trips = [r.round_trip_ms for r in rounds]
    out = {
        "devices": n, "system": system, "window_s": span,
        "rounds": len(rounds), "rounds_per_s": len(rounds) / span,
        "committed_tokens": committed, "committed_tokens_per_s": committed / span,
        "responses": len(fleet.responses), "divergences": fleet.divergences,
        "traces_reused": fleet.traces_reused, "errors": fleet.errors[:5], "n_errors": len(fleet.errors),
        "vllm_requests": b["requests"] - a["requests"],
        "vllm_computed_tokens": b["computed"] - a["computed"],
        "api_server_cpu_s": b["api_server"] - a["api_server"], "engine_cpu_s": b["engine"] - a["engine"],
        "round_trip_ms_median": statistics.median(trips) if trips else None,
        "round_trip_ms_p90": C.percentile(trips, 90) if trips else None,
        "cached_block_rounds": sum(t.cached_block for t in transports),
        "unwritable_rounds": sum(t.unwritable for t in transports),
        "prefills": sum(t.prefills for t in transports),  # whole run, warm-up included
    }
    cpu = out["api_server_cpu_s"] + out["engine_cpu_s"]
    if rounds:
        out |= {"requests_per_round": out["vllm_requests"] / len(rounds), "cpu_ms_per_round": 1e3 * cpu / len(rounds),
                "api_server_cpu_ms_per_round": 1e3 * out["api_server_cpu_s"] / len(rounds)}
    if committed:
        out["cpu_ms_per_token"] = 1e3 * cpu / committed
    C.progress(f"{system:11s} N={n:3d}: {out['rounds_per_s']:6.2f} rounds/s, {out['committed_tokens_per_s']:6.1f} "
               f"tokens/s, {out.get('requests_per_round', 0):.2f} requests a round, "
               f"{out.get('cpu_ms_per_token', 0):.0f} ms CPU a token, {out['divergences']} divergences, "
               f"{out['cached_block_rounds']}+{out['unwritable_rounds']} rounds by the prefixes, "
               f"{out['traces_reused']} traces reused, "
               f"{out['n_errors']} errors" + (f" (the first: {fleet.errors[0]})" if fleet.errors else ""))
    return out


def plot(payload: dict, png: Path) -> None:
    fig, axes = C.subplots(3, width=4.6, height=3.6)
    ns = payload["devices"]
    for i, system in enumerate(SYSTEMS):
        rows = [payload["cells"][system][str(n)] for n in ns]
        if system != "centralized":
            axes[0].plot(ns, [r["rounds_per_s"] for r in rows], marker="o", color=f"C{i}", label=system)
            axes[2].plot(ns, [r.get("cpu_ms_per_round", float("nan")) for r in rows], marker="o", color=f"C{i}",
                         label=f"{system}, all of vLLM")
            axes[2].plot(ns, [r.get("api_server_cpu_ms_per_round", float("nan")) for r in rows], marker="x",
                         ls=":", color=f"C{i}", label=f"{system}, its API server")
        axes[1].plot(ns, [r["committed_tokens_per_s"] for r in rows], marker="o", color=f"C{i}", label=system)
    axes[0].set(xlabel="devices", ylabel="verification rounds a second", xscale="log", title="rounds vLLM carries")
    axes[1].set(xlabel="devices", ylabel="committed tokens a second", xscale="log", title="tokens the fleet gets")
    axes[2].set(xlabel="devices", ylabel="vLLM CPU ms a round", xscale="log", yscale="log",
                title="vLLM's CPU per round")
    for ax in axes:
        ax.set_xticks(ns, [str(n) for n in ns])
        ax.legend(fontsize=7)
    C.save_figure(fig, png)


def main() -> None:
    ap = C.arguments(__doc__, whole_doc=True, threads=None)
    ap.add_argument("--devices", default="1,4,16,64")
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--duration", type=float, default=30.0)
    ap.add_argument("--warmup", type=float, default=8.0)
    ap.add_argument("--prompts", type=int, default=160)  # unique prompts: the devices take them in turn
    ap.add_argument("--length", type=int, default=200)  # tokens of each prompt
    ap.add_argument("--tokens", type=int, default=48)  # vLLM's greedy tokens per answer
    args = C.parse(ap, machine=False)
    missing = prepared()
    if missing:
        raise SystemExit(f"vLLM is not prepared ({', '.join(map(str, missing))}); run make vllm")
    ns, systems = C.csv_list(args.devices, int), C.csv_list(args.systems)
    spec = get_pair("gemma-270m")
    draft = LlamaDraftModel(model_path(spec.draft), name=spec.draft, n_threads=1)
    prompts = unique_prompts(draft, args.prompts, args.length)
    cells: dict[str, dict[str, dict]] = {s: {} for s in systems}
    with VllmServer(C.free_port(), C.RESULTS_DIR / "vllm_fleet_server.log", env={"VLLM_SERVER_DEV_MODE": "1"}) as vllm:
        post(vllm.base, "/completions", {"model": SERVED, "prompt": [2, 9259], "max_tokens": 1})
        traces = record(draft, vllm.base, prompts, args.tokens, C.RESULTS_DIR / "vllm_fleet_traces.json")
        for n in ns:
            for system in systems:
                cells[system][str(n)] = cell(vllm, draft, traces, system, n, args)
    accepted = [len(t.target) for t in traces]
    payload = {"devices": ns, "k": K, "duration_s": args.duration, "warmup_s": args.warmup,
               "prompt_tokens": args.length, "answer_tokens": statistics.mean(accepted), "traces": len(traces),
               "cells": cells}
    if "generate" in cells and "prefixes" in cells:
        payload["generate_over_prefixes_rounds"] = {
            str(n): cells["generate"][str(n)]["rounds_per_s"] / max(cells["prefixes"][str(n)]["rounds_per_s"], 1e-9)
            for n in ns}
    path = C.write_result("vllm_fleet", payload)
    if set(SYSTEMS) <= set(systems):
        plot(payload, path.with_suffix(".png"))
    print(C.table(["system", "devices", "rounds/s", "tokens/s", "requests/round", "CPU ms/round", "CPU ms/token",
                   "RTT p50 ms", "divergences"],
                  [[s, n, C.fmt(c["rounds_per_s"]), C.fmt(c["committed_tokens_per_s"], 1),
                    C.fmt(c.get("requests_per_round")), C.fmt(c.get("cpu_ms_per_round"), 0),
                    C.fmt(c.get("cpu_ms_per_token"), 0), C.fmt(c["round_trip_ms_median"], 0), c["divergences"]]
                   for s in systems for n, c in ((int(k), v) for k, v in cells[s].items())]))


if __name__ == "__main__":
    main()
