"""A device that never waits (issue 18): proactive drafting and pipelined tasks on emulated links.

The verifier (`edgekit serve`, one thread) runs behind the link emulator (a network
namespace, tbf rates, the delay proxy) at RTT 5, 25 and 50 ms; the device drafts with
one thread, so the two sides share the machine's two cores as two machines would not
contend. Every output is checked against target-only decoding of its prompt.

- One task: time per committed token with and without proactive drafting (fixed
  window and the shipped predictor; the order alternating per prompt), and how many
  tokens drafted ahead were used.
- N tasks (1, 2, 4, 8 prompts): total completion time and mean per-task latency run
  one after another (one draft sequence), pipelined (`generate_many` with a draft slot
  per task, every step in a decode of its own), pipelined with batched drafting
  (steps of tasks drafting together in one decode), and as the plan says
  (`edgekit.plan`: eq. 17 fitted for the draft here and from the verifier's reported
  times, the acceptance measured, the DP's batches and window), with the plan's
  predicted total beside the measured one, and the DP's prediction against exhaustive
  search over every ordered partition (N <= 4) on the same fitted model.

    sudo python -m benchmarks pipeline --max-tokens 64
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from benchmarks import harness as C
from benchmarks.rigs.linkemu import LinkProfile, Testbed
from edgekit import EdgeClient, GenerationConfig
from edgekit.models import get_pair, model_path
from edgekit.plan import Plan, ServingModel, calibrate_draft, calibrate_verify, exhaustive, plan, verifier_shape
from edgekit.runtime import DraftPool, LlamaDraftModel, LlamaPoolBackend
from edgekit.transport import GrpcTransport

WAYS = ("one after another", "pipelined", "pipelined, batched drafting", "planned")


def one_task(address: str, draft: LlamaDraftModel, prompt: str, gen: GenerationConfig) -> dict:
    with EdgeClient(GrpcTransport(address), draft=draft, generation=gen) as client:
        t0 = time.perf_counter()
        final = client.generate(prompt).until_done()
        elapsed = time.perf_counter() - t0
    s = final.stats
    return {"tokens": list(final.token_ids), "elapsed_s": elapsed, "ms_per_token": elapsed * 1e3 / len(final.token_ids),
            "proactive_drafted": s.proactive_drafted, "proactive_used": s.proactive_used, "rounds": s.rounds}


def many(address: str, path: str, name: str, prompts: list[str], gen: GenerationConfig, way: str,
         draft: LlamaDraftModel, the_plan: Plan | None = None) -> dict:
    n = len(prompts)
    t0 = time.perf_counter()
    ends: list[float] = []
    if way == "one after another":
        outs = []
        with EdgeClient(GrpcTransport(address), draft=draft, generation=gen) as client:
            for p in prompts:
                outs.append(list(client.generate(p).until_done().token_ids))
                ends.append(time.perf_counter() - t0)
        return {"total_s": ends[-1], "mean_latency_s": float(np.mean(ends)), "tokens": outs}
    pool = DraftPool(LlamaPoolBackend(path, slots=n + 1, n_ctx_seq=1024, name=name, n_threads=1),
                     coalesce=way != "pipelined")
    with EdgeClient(GrpcTransport(address), draft=pool, generation=gen) as client:
        client.server_info()
        if way == "planned":
            assert the_plan is not None
            t0 = time.perf_counter()
            finals = client.generate_many(prompts, plan=the_plan)
            total = time.perf_counter() - t0
            pool_steps = pool.steps / max(pool.decodes, 1)
            pool.close()
            latency = float(np.mean([f.stats.elapsed_s for f in finals]))  # each from its own start, ~t0
            return {"total_s": total, "mean_latency_s": latency, "steps_per_decode": pool_steps,
                    "tokens": [list(f.token_ids) for f in finals], "predicted_s": the_plan.predicted_s,
                    "window": the_plan.window, "batches": [list(b) for b in the_plan.batches]}
        t0 = time.perf_counter()

        def timed(p: str):  # type: ignore[no-untyped-def]
            final = client.generate(p).until_done()
            ends.append(time.perf_counter() - t0)
            return final

        with ThreadPoolExecutor(max_workers=n) as ex:
            finals = list(ex.map(timed, prompts))
        total = time.perf_counter() - t0
    batched = pool.steps / max(pool.decodes, 1)
    pool.close()
    return {"total_s": total, "mean_latency_s": float(np.mean(ends)), "tokens": [list(f.token_ids) for f in finals],
            "steps_per_decode": batched}


def measured_acceptance(client: EdgeClient, prompts: list[str], max_tokens: int) -> float:
    """Per-token acceptance of fixed-window-4 drafting over the prompts (a geometric MLE)."""
    accepted = rejections = 0
    for p in prompts:
        stats = client.generate(p, drafting="fixed", draft_k=4, max_tokens=max_tokens, stop_at_eos=False,
                                plain_when_faster=False).until_done().stats
        accepted += stats.accepted
        rejections += sum(r.accepted < r.drafted for r in stats.rounds_detail)
    return accepted / max(accepted + rejections, 1)


def serving_model(address: str, draft: LlamaDraftModel, draft_rt, draft_shape, prompt: str,  # type: ignore[no-untyped-def]
                  max_tokens: int, acceptance: float, rtt_ms: float) -> ServingModel:
    """The latency model on this link: the verifier's runtime fitted from its reported times."""
    transport = GrpcTransport(address)
    try:
        info = transport.handshake(draft.fingerprint(), draft_model=draft.name, draft_hidden_size=draft.n_embd)
        vshape = verifier_shape(info.target_hidden_size)
        verify_rt, samples = calibrate_verify(transport, draft.fingerprint(), draft.tokenize(prompt), vshape)
    finally:
        transport.close()
    C.progress(f"verify runtime fit: c1 {verify_rt.c1:.3g}, c2 {verify_rt.c2 * 1e3:.2f} ms, "
               f"MAPE {verify_rt.error(samples):.1%}")
    return ServingModel(draft_shape, vshape, draft_rt, verify_rt, acceptance, max_tokens, link_s=rtt_ms / 1e3)


def main() -> None:
    # --prompts: those of the one-task runs. No --threads: one thread each side, always (below).
    ap = C.arguments(__doc__, threads=None, pair="gemma-270m", prompts=3, max_tokens=64, out="pipeline")
    ap.add_argument("--rtts", default="5,25,50")
    ap.add_argument("--mbps", type=float, default=50.0)
    ap.add_argument("--tasks", default="1,2,4,8")
    ap.add_argument("--draftings", default="fixed,predictor", help="for the one-task runs; empty: none")
    ap.add_argument("--ways", default=",".join(WAYS), help="comma-separated, of: " + ", ".join(WAYS))
    ap.add_argument("--plot-only", action="store_true", help="redraw the figure from the JSON of an earlier run")
    args = C.parse(ap, machine=False)  # the machine is printed below, when something is measured
    if args.plot_only:
        import json

        done = json.loads((C.RESULTS_DIR / f"{args.out}.json").read_text())
        plot(done["single"], done["multi"], done["summary"], C.csv_list(args.tasks, int),
             C.RESULTS_DIR / f"{args.out}.png")
        return
    ways = [w for w in WAYS if w in C.csv_list(args.ways)]
    C.apply_threads(1)
    C.print_machine()
    spec = get_pair(args.pair)
    path = str(model_path(spec.draft))
    draft = LlamaDraftModel(path, name=spec.draft, n_ctx=2048, n_threads=1)
    all_prompts = [p["prompt"] for p in C.load_prompts("eval")]
    tasks = C.csv_list(args.tasks, int)
    serve = ["--pair", args.pair, "--max-sessions", "16", "--threads", "1"]
    single: list[dict] = []
    multi: list[dict] = []
    planning: list[dict] = []
    draft_shape, draft_rt, draft_samples = calibrate_draft(path, threads=1)
    C.progress(f"draft runtime fit: c1 {draft_rt.c1:.3g} s/FLOP, c2 {draft_rt.c2 * 1e3:.2f} ms, "
               f"MAPE {draft_rt.error(draft_samples):.1%}")
    with Testbed(serve, log=str(C.RESULTS_DIR / f"{args.out}-verifier.log")) as bed:
        refs: dict[str, list[int]] = {}
        base = GenerationConfig(max_tokens=args.max_tokens, stop_at_eos=False)
        with EdgeClient(GrpcTransport(bed.address), draft=draft, generation=base) as client:
            for p in all_prompts[: max(args.prompts, max(tasks))]:
                refs[p] = list(client.generate_target_only(p).until_done().token_ids)
            acceptance = measured_acceptance(client, all_prompts[: max(tasks)], args.max_tokens)
            C.progress(f"acceptance (fixed window 4): {acceptance:.3f}")
        for rtt in C.csv_list(args.rtts, float):
            bed.shape(LinkProfile(rtt, args.mbps))
            for drafting in C.csv_list(args.draftings):
                for i, p in enumerate(all_prompts[: args.prompts]):
                    order = (False, True) if i % 2 == 0 else (True, False)
                    for proactive in order:
                        gen = GenerationConfig(max_tokens=args.max_tokens, stop_at_eos=False, drafting=drafting,
                                               draft_k=4, proactive=proactive)  # type: ignore[arg-type]
                        r = one_task(bed.address, draft, p, gen)
                        r.update(rtt_ms=rtt, drafting=drafting, proactive=proactive, prompt=i,
                                 lossless=r.pop("tokens") == refs[p])
                        single.append(r)
                        C.progress(f"RTT {rtt:g} ms, {drafting}, prompt {i}, proactive {proactive}: "
                                   f"{r['ms_per_token']:.1f} ms/token, ahead used {r['proactive_used']}/"
                                   f"{r['proactive_drafted']}, lossless {r['lossless']}")
            gen = GenerationConfig(max_tokens=args.max_tokens, stop_at_eos=False, drafting="fixed", draft_k=4)
            model = serving_model(bed.address, draft, draft_rt, draft_shape, all_prompts[0], args.max_tokens,
                                  acceptance, rtt)
            for n in tasks:
                prompts = all_prompts[:n]
                inputs = [len(draft.tokenize(p)) for p in prompts]
                the_plan = plan(model, inputs, 8)
                if n <= 4:
                    brute = exhaustive(model, inputs, 8)
                    planning.append({"rtt_ms": rtt, "tasks": n, "dp_s": the_plan.predicted_s,
                                     "exhaustive_s": brute.predicted_s})
                for way in ways:
                    r = many(bed.address, path, spec.draft, prompts, gen, way, draft, the_plan)
                    lossless = all(t == refs[p] for t, p in zip(r.pop("tokens"), prompts, strict=True))
                    r.update(rtt_ms=rtt, tasks=n, way=way, lossless=lossless)
                    multi.append(r)
                    C.progress(f"RTT {rtt:g} ms, {n} tasks, {way}: total {r['total_s']:.2f} s, mean latency "
                               f"{r['mean_latency_s']:.2f} s, lossless {lossless}")
    draft.close()
    summary = []
    for rtt in C.csv_list(args.rtts, float):
        for drafting in C.csv_list(args.draftings) if single else []:
            rows = [r for r in single if r["rtt_ms"] == rtt and r["drafting"] == drafting]
            off = np.mean([r["ms_per_token"] for r in rows if not r["proactive"]])
            on = np.mean([r["ms_per_token"] for r in rows if r["proactive"]])
            summary.append({"rtt_ms": rtt, "drafting": drafting, "ms_per_token_off": off, "ms_per_token_on": on,
                            "cut": 1 - on / off})
    print(C.table(["RTT ms", "drafting", "ms/token", "ms/token proactive", "cut"],
                  [[s["rtt_ms"], s["drafting"], s["ms_per_token_off"], s["ms_per_token_on"], f"{s['cut']:.1%}"]
                   for s in summary]))
    print()
    print(C.table(["RTT ms", "tasks", *ways],
                  [[rtt, n, *[next(r["total_s"] for r in multi if r["rtt_ms"] == rtt and r["tasks"] == n
                                   and r["way"] == w) for w in ways]]
                   for rtt in C.csv_list(args.rtts, float) for n in tasks]))
    if planning:
        print()
        print(C.table(["RTT ms", "tasks", "DP predicted s", "exhaustive s", "DP / exhaustive"],
                      [[p["rtt_ms"], p["tasks"], p["dp_s"], p["exhaustive_s"], p["dp_s"] / p["exhaustive_s"]]
                       for p in planning], digits=3))
    planned = [r for r in multi if r["way"] == "planned"]
    if planned:
        print()
        print(C.table(["RTT ms", "tasks", "window", "batches", "predicted s", "measured s", "error"],
                      [[r["rtt_ms"], r["tasks"], r["window"], r["batches"], r["predicted_s"], r["total_s"],
                        f"{r['predicted_s'] / r['total_s'] - 1:+.1%}"] for r in planned]))
    path_out = C.write_result(args.out, {"settings": vars(args), "single": single, "multi": multi,
                                         "summary": summary, "planning": planning,
                                         "draft_runtime": vars(draft_rt), "acceptance": acceptance})
    plot(single, multi, summary, tasks, path_out.with_suffix(".png"))


def plot(single: list[dict], multi: list[dict], summary: list[dict], tasks: list[int], path) -> None:  # type: ignore[no-untyped-def]
    rtts = sorted({r["rtt_ms"] for r in multi})
    ways = [w for w in WAYS if any(r["way"] == w for r in multi)]
    first = 1 if summary else 0  # the proactive panel, when there were one-task runs
    fig, axes = C.subplots(first + 1 + len(rtts), width=4.2)
    if summary:
        for drafting in sorted({s["drafting"] for s in summary}):
            rows = [s for s in summary if s["drafting"] == drafting]
            axes[0].plot([s["rtt_ms"] for s in rows], [s["ms_per_token_off"] for s in rows], marker="o",
                         label=f"{drafting}")
            axes[0].plot([s["rtt_ms"] for s in rows], [s["ms_per_token_on"] for s in rows], marker="s",
                         linestyle="--", label=f"{drafting}, proactive")
        axes[0].set_xlabel("RTT (ms)")
        axes[0].set_ylabel("ms per committed token (one task)")
        axes[0].set_title("Proactive drafting")
        axes[0].legend(fontsize=7)
        axes[0].set_ylim(bottom=0)
    for ax, rtt in zip(axes[first:-1], rtts, strict=True):
        for way in ways:
            rows = sorted((r["tasks"], r["total_s"]) for r in multi if r["rtt_ms"] == rtt and r["way"] == way)
            ax.plot([x[0] for x in rows], [x[1] for x in rows], marker="o", label=way,
                    color=f"C{WAYS.index(way)}")
        ax.set_xscale("log", base=2)
        ax.set_xticks(tasks, [str(t) for t in tasks])
        ax.set_xlabel("tasks")
        ax.set_ylabel("total completion time (s)")
        ax.set_title(f"RTT {rtt:g} ms")
        ax.set_ylim(bottom=0)
    axes[first].legend(fontsize=7)
    planned = [r for r in multi if r["way"] == "planned" and r.get("predicted_s")]
    ax = axes[-1]
    for rtt in rtts:
        rows = [r for r in planned if r["rtt_ms"] == rtt]
        ax.scatter([r["total_s"] for r in rows], [r["predicted_s"] for r in rows], label=f"RTT {rtt:g} ms")
    top = max([r["total_s"] for r in planned] + [1.0]) * 1.05
    ax.plot([0, top], [0, top], color="k", linewidth=0.8)
    ax.fill_between([0, top], [0, 0.85 * top], [0, 1.15 * top], color="k", alpha=0.08, label="within 15%")
    ax.set_xlabel("measured total (s)")
    ax.set_ylabel("predicted total (s)")
    ax.set_title("The plan's prediction")
    ax.legend(fontsize=7)
    print(f"figure: {C.save_figure(fig, path)}")


if __name__ == "__main__":
    main()
