"""Semantic verification (WISV) on held-out HumanEval with the qwen-coder pair (issue 20 step 7).

Each configuration decodes every held-out HumanEval problem (odd problem numbers; the head
never saw them) as a completion, cut at the usual stop strings, and runs its unit tests:

- target-only: the verifier's target decodes alone (the pass@1 reference);
- greedy: lossless greedy speculative decoding (its text must equal target-only's);
- semantic:LINK[@THRESHOLD]: the shipped CSI-aware head on that link (its own threshold unless
  one is given); nocsi:LINK[@THRESHOLD]: the ablation head trained without CSI (WISV Fig. 5).

Everything runs through edgekit's real client, verifier and engines, in this process: the
link between them is `SimulatedLink` (the paper's link-layer abstraction: RTT, rate and loss
give each exchange its time), so what the head decides depends on the link exactly as over a
network. Links: good (500 Mbit/s, 5 ms), good50 (500, 50 ms), poor5 (20, 5 ms), poor (20, 50 ms).
Per configuration: pass@1, accepted length per round (AAL, WISV eq. 20, no bonus token), rounds
per problem (eq. 21), mismatches the head accepted, and end-to-end time per token on each link
(draft time + verifier time + the link's time for the round's exchanges and bytes; a greedy
round's bytes do not depend on the link, so one run gives all four). Results accumulate in
results/semantic.json (a run resumes: done problems are skipped); the figure is redrawn each time.

    python benchmarks/semantic.py --configs target-only,greedy,semantic:good,semantic:poor,nocsi:poor
    python benchmarks/semantic.py --configs semantic:poor@0.2,semantic:poor@0.6 --limit 40
    python benchmarks/semantic.py --plot-only
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C

from edgekit import EdgeClient, GenerationConfig, LlamaDraftModel, ServerConfig
from edgekit.client import FinalStats, RoundEvent, TextDelta
from edgekit.models import pair_paths
from edgekit.semantic.collect import _cut
from edgekit.semantic.tasks import humaneval_tasks
from edgekit.testing import InProcessTransport, SimulatedLink
from edgekit.verifier import LlamaEngine, VerifierService

LINKS = {
    "good": SimulatedLink(rtt_ms=5, uplink_mbps=500, downlink_mbps=500),
    "good50": SimulatedLink(rtt_ms=50, uplink_mbps=500, downlink_mbps=500),
    "poor5": SimulatedLink(rtt_ms=5, uplink_mbps=20, downlink_mbps=20),
    "poor": SimulatedLink(rtt_ms=50, uplink_mbps=20, downlink_mbps=20),
}
SHIPPED = Path(__file__).resolve().parents[1] / "semantic" / "shipped"
RESULT = "semantic"


def _parse(spec: str) -> tuple[str, str, float | None]:
    """'semantic:poor@0.3' -> ('semantic', 'poor', 0.3); 'greedy' -> ('greedy', 'good', None)."""
    kind, _, rest = spec.partition(":")
    link, _, thr = (rest or "good").partition("@")
    if kind not in ("target-only", "greedy", "semantic", "nocsi") or link not in LINKS:
        raise SystemExit(f"unknown configuration {spec!r}")
    return kind, link, float(thr) if thr else None


def _link_ms(link: SimulatedLink, rounds: list[dict]) -> float:
    """The link's time for these rounds' exchanges and bytes (no jitter or loss)."""
    up, down = link.uplink_mbps * 1e3, link.downlink_mbps * 1e3  # bits per ms
    return sum(r["exchanges"] * link.rtt_ms + r["up"] * 8 / up + r["down"] * 8 / down for r in rounds)


def run_problem(client: EdgeClient, task, kind: str) -> dict:
    stream = client.generate_target_only(task.prompt) if kind == "target-only" else client.generate(task.prompt)
    text, rounds = "", []
    t0 = time.perf_counter()
    with stream:
        for ev in stream:
            if isinstance(ev, RoundEvent):
                s = ev.stats
                rounds.append({"drafted": s.drafted, "accepted": s.accepted, "committed": s.committed,
                               "semantic": s.semantic_accepted, "draft_ms": s.draft_ms,
                               "server_ms": s.server_verify_ms + s.server_queue_ms, "exchanges": s.exchanges,
                               "up": s.uplink_bytes, "down": s.downlink_bytes})
                if _cut(text, task.stops)[1]:
                    break  # this round's figures came after its text: done
            elif isinstance(ev, TextDelta):
                text += ev.text
                if kind == "target-only" and _cut(text, task.stops)[1]:
                    break
            elif isinstance(ev, FinalStats):
                break
    answer, _ = _cut(text, task.stops)
    return {"id": task.id, "passed": task.check(answer), "text": answer, "tokens": len(client.tokenize(answer,
            special=False)), "rounds": rounds, "seconds": time.perf_counter() - t0}


def summarise(records: list[dict], reference: dict[str, dict] | None) -> dict:
    rounds = [r for rec in records for r in rec["rounds"]]
    tokens = sum(rec["tokens"] for rec in records)
    out = {
        "problems": len(records),
        "pass_at_1": float(np.mean([rec["passed"] for rec in records])) if records else 0.0,
        "passed": int(sum(rec["passed"] for rec in records)),
        "tokens": tokens,
    }
    if rounds:
        drafted = sum(r["drafted"] for r in rounds)
        accepted = sum(r["accepted"] for r in rounds)
        compute_ms = sum(r["draft_ms"] + r["server_ms"] for r in rounds)
        committed = sum(r["committed"] for r in rounds)
        out.update(
            rounds=len(rounds), rounds_per_problem=len(rounds) / len(records), aal=accepted / len(rounds),
            acceptance=accepted / drafted if drafted else 0.0, semantic_accepted=sum(r["semantic"] for r in rounds),
            committed=committed,
            ms_per_token={name: (compute_ms + _link_ms(link, rounds)) / committed for name, link in LINKS.items()},
        )
    if reference:
        same = [rec["text"] == reference[rec["id"]]["text"] for rec in records if rec["id"] in reference]
        out["identical_to_target_only"] = float(np.mean(same)) if same else None
    return out


def plot(payload: dict, path: Path) -> None:
    configs = payload["configs"]
    summary = {name: c["summary"] for name, c in configs.items()}
    ref = summary.get("target-only", {}).get("pass_at_1")
    names = [n for n in configs if n != "target-only"]
    fig, axes = C.subplots(3, nrows=1, width=5.2, height=4.4)
    ax = axes[0]
    acc = [100 * summary[n]["pass_at_1"] for n in names]
    ax.bar(range(len(names)), acc, color="tab:blue")
    for i, a in enumerate(acc):
        ax.annotate(f"{a:.1f}", (i, a), textcoords="offset points", xytext=(0, 3), ha="center", fontsize=8)
    lo = min(acc + ([100 * ref] if ref is not None else []))
    ax.set_ylim(max(0.0, lo - 15), min(100.0, max(acc + [lo]) + 8))
    if ref is not None:
        ax.axhline(100 * ref, ls="--", color="k", label=f"target-only {100 * ref:.1f}%")
        ax.legend(fontsize=8)
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("pass@1 on held-out HumanEval (%)")
    ax.set_title("accuracy (WISV Fig. 3)")
    ax = axes[1]
    aal = [summary[n].get("aal", 0) for n in names]
    rpp = [summary[n].get("rounds_per_problem", 0) for n in names]
    ax.bar(np.arange(len(names)) - 0.2, aal, 0.4, color="tab:blue")
    ax2 = ax.twinx()
    ax2.bar(np.arange(len(names)) + 0.2, rpp, 0.4, color="tab:orange")
    for i, (a, r) in enumerate(zip(aal, rpp)):
        ax.annotate(f"{a:.2f}", (i - 0.2, a), textcoords="offset points", xytext=(0, 3), ha="center", fontsize=7)
        ax2.annotate(f"{r:.2f}", (i + 0.2, r), textcoords="offset points", xytext=(0, 3), ha="center", fontsize=7)
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("accepted length per round, AAL (blue, tokens)")
    ax2.set_ylabel("rounds per problem (orange)")
    ax.set_ylim(0, max(aal + [1.0]) * 1.15)
    ax2.set_ylim(0, max(rpp + [1.0]) * 1.15)
    ax.set_title("AAL and rounds (WISV Table I)")
    ax = axes[2]
    for i, link in enumerate(LINKS):
        vals = [summary[n].get("ms_per_token", {}).get(link, 0) for n in names]
        ax.bar(np.arange(len(names)) + (i - 1.5) * 0.2, vals, 0.2, label=link)
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("end-to-end ms per token (this CPU)")
    ax.set_title("time per token by link (WISV Fig. 4)")
    ax.legend(fontsize=8, title="link", loc="lower right")
    C.save_figure(fig, path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--configs", default="target-only,greedy,semantic:good,semantic:poor,nocsi:good,nocsi:poor")
    ap.add_argument("--head", default=str(SHIPPED / "qwen-coder.onnx"))
    ap.add_argument("--nocsi-head", default=str(SHIPPED.parent / "ablation" / "qwen-coder-nocsi.onnx"))
    ap.add_argument("--draft-k", type=int, default=8)
    ap.add_argument("--limit", type=int, default=0, help="Only the first N held-out problems (0: all 82).")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--plot-only", action="store_true")
    args = ap.parse_args()
    out = C.RESULTS_DIR / f"{RESULT}.json"
    payload = {"configs": json.loads(out.read_text())["configs"] if out.is_file() else {}}
    if not args.plot_only:
        threads = C.apply_threads(args.threads)
        C.print_machine()
        tasks = humaneval_tasks("heldout")[: args.limit or None]
        draft_path, target_path = pair_paths("qwen-coder")
        engine = LlamaEngine(str(target_path), max_context=1024, n_seq=1, max_block=args.draft_k, threads=threads)
        draft = LlamaDraftModel(draft_path, n_ctx=1024, n_threads=threads)
        services: dict[str, VerifierService] = {}
        for spec in C.csv_list(args.configs):
            kind, link, threshold = _parse(spec)
            head = {"semantic": args.head, "nocsi": args.nocsi_head}.get(kind)
            service = services.get(head or "")
            if service is None:
                for s in services.values():
                    s.close()  # one engine core at a time
                services.clear()
                service = services[head or ""] = VerifierService(
                    engine, ServerConfig(port=0, max_sessions=1, max_context=1024, max_block=args.draft_k,
                                         semantic_head=head)
                )
            gen = GenerationConfig(max_tokens=320, drafting="fixed", draft_k=args.draft_k, mode="greedy")
            if kind in ("semantic", "nocsi"):
                gen = GenerationConfig(max_tokens=320, drafting="fixed", draft_k=args.draft_k, mode="semantic",
                                       upload="fh", semantic_threshold=threshold)
            entry = payload["configs"].setdefault(spec, {"records": []})
            done = {r["id"] for r in entry["records"]}
            transport = InProcessTransport(service, link=LINKS[link])
            with EdgeClient(transport, draft_model=draft, generation=gen) as client:
                for task in tasks:
                    if task.id in done:
                        continue
                    rec = run_problem(client, task, kind)
                    entry["records"].append(rec)
                    C.progress(f"{spec} {task.id}: {'pass' if rec['passed'] else 'fail'}, {rec['tokens']} tokens, "
                               f"{len(rec['rounds'])} rounds, {rec['seconds']:.1f} s")
                    ref = payload["configs"].get("target-only", {}).get("records", [])
                    entry["summary"] = summarise(entry["records"], {r["id"]: r for r in ref})
                    if head:
                        entry["head"] = head
                    C.write_result(RESULT, payload)
    ref_records = {r["id"]: r for r in payload["configs"].get("target-only", {}).get("records", [])}
    for entry in payload["configs"].values():
        entry["summary"] = summarise(entry["records"], ref_records)
    written = C.write_result(RESULT, payload)
    plot(payload, written.with_suffix(".png"))
    rows = []
    for name, e in payload["configs"].items():
        s = e["summary"]
        rows.append([name, s["problems"], 100 * s["pass_at_1"], s.get("aal", "-"), s.get("rounds_per_problem", "-"),
                     s.get("semantic_accepted", "-"), s.get("identical_to_target_only", "-"),
                     s.get("ms_per_token", {}).get("good", "-"), s.get("ms_per_token", {}).get("poor", "-")])
    print(C.table(["config", "problems", "pass@1 %", "AAL", "rounds/problem", "accepted mismatches",
                   "same text as target-only", "ms/token good", "ms/token poor"], rows))


if __name__ == "__main__":
    main()
