"""Drafting through an outage: time to the end of an answer when the link is lost mid-answer.

The verifier (`edgekit serve`) runs behind the link emulator (a network namespace,
tbf rates and the delay proxy). Once an answer has `--outage-after` tokens, the
proxy loses the link for 1, 5 or 30 s: "reset" cuts the connection and refuses new
ones (a restarted verifier, an interface going down), "silent" holds every byte
until the link is back (out of range; TCP delivers what was sent once the path
returns). Each answer runs with `on_disconnect="wait"` (retry only) and "draft"
(the device drafts ahead through the outage), the order alternating per prompt.

Per run: time from the answer's start to its end (and that time less the outage:
what the outage cost beyond its own length), provisional tokens shown and kept,
outages reported (`Resumed` events), and whether the output equals target-only
decoding (it must, token for token).

    python -m benchmarks outage --prompts 3 --max-tokens 160
"""

from __future__ import annotations

import threading
import time

from benchmarks import harness as C
from benchmarks.rigs.linkemu import LinkProfile, Testbed
from edgekit import ClientConfig, EdgeClient, GenerationConfig, Provisional, Resumed, TextDelta
from edgekit.models import get_pair, model_path
from edgekit.runtime import LlamaDraftModel
from edgekit.transport import GrpcTransport

MODES = ("wait", "draft")


def run_one(
    bed: Testbed, draft, prompt: str, gen: GenerationConfig, *, mode: str, kind: str, seconds: float, after: int
) -> dict:  # type: ignore[no-untyped-def]
    config = ClientConfig(on_disconnect=mode, retry_for=120.0, timeout=30.0)  # type: ignore[arg-type]
    assert bed.proxy is not None
    proxy = bed.proxy
    out: list[int] = []
    timer: threading.Timer | None = None
    outage_at: float | None = None
    resumed: list[dict] = []
    shown_max = 0
    with EdgeClient(GrpcTransport(bed.address, config), draft=draft, generation=gen, config=config) as client:
        client.server_info()
        start = time.perf_counter()
        stream = client.generate(prompt)
        for event in stream:
            if isinstance(event, TextDelta):
                out += event.token_ids
                if outage_at is None and len(out) >= after:
                    outage_at = time.perf_counter()
                    proxy.outage(kind)
                    timer = threading.Timer(seconds, proxy.restore)
                    timer.start()
            elif isinstance(event, Provisional):
                shown_max = max(shown_max, len(event.token_ids))
            elif isinstance(event, Resumed):
                resumed.append({"outage_ms": event.outage_ms, "attempts": event.attempts,
                                "reprefilled": event.reprefilled_tokens, "causes": list(event.causes)})
        end = time.perf_counter()
        if timer is not None:
            timer.join()
        proxy.restore()
    final = stream.final
    assert final is not None
    s = final.stats
    return {
        "mode": mode,
        "kind": kind,
        "outage_s": seconds,
        "tokens": list(final.token_ids),
        "elapsed_s": end - start,
        "after_outage_start_s": end - outage_at if outage_at is not None else None,
        "provisional_tokens": s.provisional_tokens,
        "provisional_kept": s.provisional_kept,
        "provisional_max_shown": shown_max,
        "resumed": resumed,
        "rounds": s.rounds,
        "draft_ms": s.draft_ms,
        "finish_reason": s.finish_reason,
    }


def main() -> None:
    ap = C.arguments(__doc__, pair="gemma-270m", prompts=2, max_tokens=160, out="outage")
    ap.add_argument("--outages", default="1,5,30", help="outage lengths, seconds")
    ap.add_argument("--kinds", default="reset,silent")
    ap.add_argument("--outage-after", type=int, default=24, help="output tokens before the link goes")
    ap.add_argument("--rtt-ms", type=float, default=40.0)
    ap.add_argument("--mbps", type=float, default=20.0)
    args = C.parse(ap)
    spec = get_pair(args.pair)
    prompts = C.load_prompts("eval", args.prompts)
    draft = LlamaDraftModel(model_path(spec.draft), name=spec.draft, n_ctx=2048)
    outages = C.csv_list(args.outages, float)
    kinds = C.csv_list(args.kinds)
    serve = ["--pair", args.pair, "--max-sessions", "8", "--threads", str(args.threads)]
    runs: list[dict] = []
    clean_runs: list[dict] = []
    with Testbed(serve, log=str(C.RESULTS_DIR / f"{args.out}-verifier.log")) as bed:
        bed.shape(LinkProfile(args.rtt_ms, args.mbps))
        for pi, p in enumerate(prompts):
            gen = GenerationConfig(max_tokens=args.max_tokens, stop_at_eos=False)
            with EdgeClient(GrpcTransport(bed.address), draft=draft, generation=gen) as client:
                reference = list(client.generate_target_only(p["prompt"]).until_done().token_ids)
            clean: dict[str, float] = {}
            for mode in MODES if pi % 2 == 0 else MODES[::-1]:  # the price of the verify call's own thread
                config = ClientConfig(on_disconnect=mode)  # type: ignore[arg-type]
                with EdgeClient(GrpcTransport(bed.address, config), draft=draft, generation=gen,
                                config=config) as client:
                    t0 = time.perf_counter()
                    client.generate(p["prompt"]).until_done()
                    clean[mode] = time.perf_counter() - t0
            clean_s = clean["wait"]
            clean_runs.append({"prompt": p["id"], **clean})
            C.progress(f"[{p['id']}] no outage: wait {clean['wait']:.2f} s, draft {clean['draft']:.2f} s")
            for kind in kinds:
                for seconds in outages:
                    order = MODES if pi % 2 == 0 else MODES[::-1]
                    for mode in order:
                        r = run_one(bed, draft, p["prompt"], gen, mode=mode, kind=kind, seconds=seconds,
                                    after=args.outage_after)
                        r.update(prompt=p["id"], clean_s=clean_s, lossless=r["tokens"] == reference)
                        r["cost_s"] = r["elapsed_s"] - seconds - clean_s  # what it cost beyond its own length
                        runs.append(r)
                        C.progress(
                            f"[{p['id']}] {kind} {seconds:g} s {mode}: {r['elapsed_s']:.1f} s "
                            f"(+{r['cost_s']:.1f} beyond the outage), provisional {r['provisional_kept']}/"
                            f"{r['provisional_tokens']} kept, resumed {len(r['resumed'])}, lossless {r['lossless']}"
                        )
    summary = []
    for kind in kinds:
        for seconds in outages:
            row: dict = {"kind": kind, "outage_s": seconds}
            for mode in MODES:
                rs = [r for r in runs if r["kind"] == kind and r["outage_s"] == seconds and r["mode"] == mode]
                row[mode] = {
                    "elapsed_s": C.median([r["elapsed_s"] for r in rs]),
                    "cost_s": C.median([r["cost_s"] for r in rs]),
                    "provisional_tokens": sum(r["provisional_tokens"] for r in rs),
                    "provisional_kept": sum(r["provisional_kept"] for r in rs),
                    "lossless": all(r["lossless"] for r in rs),
                }
            row["draft_vs_wait"] = C.ratio(row["draft"]["elapsed_s"], row["wait"]["elapsed_s"])
            summary.append(row)
    no_outage = {m: sum(r[m] for r in clean_runs) for m in MODES}
    no_outage["draft_vs_wait"] = C.ratio(no_outage["draft"], no_outage["wait"])
    C.write_result(args.out, {"settings": vars(args), "machine": C.machine(), "summary": summary,
                              "no_outage": no_outage, "clean_runs": clean_runs, "runs": runs})
    print(f"no outage: draft/wait time {no_outage['draft_vs_wait']:.3f}")
    for row in summary:
        print(
            f"{row['kind']:>6} {row['outage_s']:>4g} s: wait {row['wait']['elapsed_s']:.1f} s, draft "
            f"{row['draft']['elapsed_s']:.1f} s (x{row['draft_vs_wait']:.3f}); provisional kept "
            f"{row['draft']['provisional_kept']}/{row['draft']['provisional_tokens']}"
        )
    plot(summary, runs, C.RESULTS_DIR / f"{args.out}.png")


def plot(summary: list[dict], runs: list[dict], path) -> None:  # type: ignore[no-untyped-def]
    kinds = sorted({r["kind"] for r in summary})
    fig, axes = C.subplots(2, width=5.5)
    ax = axes[0]
    width = 0.2
    labels = [f"{r['kind']}\n{r['outage_s']:g} s" for r in summary]
    xs = range(len(summary))
    for i, mode in enumerate(MODES):
        ax.bar([x + (i - 0.5) * width for x in xs], [r[mode]["cost_s"] for r in summary], width, label=mode)
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xticks(list(xs), labels)
    ax.set_ylabel("answer time - outage - clean answer time (s)")
    ax.set_title("What an outage costs beyond its own length (median)")
    ax.legend()
    ax = axes[1]
    for kind in kinds:
        rows = [r for r in summary if r["kind"] == kind]
        ax.plot([r["outage_s"] for r in rows], [r["draft"]["provisional_tokens"] for r in rows], "o-",
                label=f"{kind}: shown")
        ax.plot([r["outage_s"] for r in rows], [r["draft"]["provisional_kept"] for r in rows], "s--",
                label=f"{kind}: kept")
    ax.set_xscale("log")
    ax.set_xlabel("outage (s)")
    ax.set_ylabel("provisional tokens (all prompts)")
    ax.set_title("Drafted through the outage, and kept")
    ax.legend()
    print(f"figure: {C.save_figure(fig, path)}")


if __name__ == "__main__":
    main()
