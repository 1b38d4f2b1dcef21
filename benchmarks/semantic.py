"""Semantic verification (WISV) on held-out HumanEval with the qwen-coder pair (issue 20 step 7).

Each configuration decodes every held-out HumanEval problem (odd problem numbers; the head
never saw them) as a completion, cut at the usual stop strings, and runs its unit tests:

- target-only: the verifier's target decodes alone (the pass@1 reference);
- greedy: lossless greedy speculative decoding (its text must equal target-only's);
- semantic:LINK[@THRESHOLD]: the shipped CSI-aware head on that link (its own threshold unless
  one is given); nocsi:LINK[@THRESHOLD]: the ablation head trained without CSI (WISV Fig. 5).

Everything runs through edgekit's real client, verifier and engines. By default in this
process, the link between them a `SimulatedLink` (the paper's link-layer abstraction: RTT, rate
and loss give each exchange its time, and the device's link estimate is what it reports).
With a `+bed` suffix (`semantic:poor+bed`) the verifier runs as `edgekit serve` in the link
testbed (`rigs/linkemu`: a network namespace, tc rate limits, a delay proxy; needs root)
and the client talks gRPC over the emulated link: the head then sees the CSI the device
measured, and `seconds` per problem are wall-clock over the link.
Links: good (500 Mbit/s, 5 ms), good50 (500, 50 ms), poor5 (20, 5 ms), poor (20, 50 ms).
Per configuration: pass@1, accepted length per round (AAL, WISV eq. 20, no bonus token), rounds
per problem (eq. 21), mismatches the head accepted, and end-to-end time per token on each link
(draft time + verifier time + the link's time for the round's exchanges and bytes; a greedy
round's bytes do not depend on the link, so one run gives all four). Results accumulate in
results/semantic.json (a run resumes: done problems are skipped; configurations of another head
are dropped, by its identity, whether they run again or not); the figure is redrawn each time.
Each semantic configuration records the threshold it ran at, and the figure's second row plots
pass@1, AAL and rounds against it.

    python -m benchmarks semantic --configs target-only,greedy,semantic:good,semantic:poor,nocsi:poor
    python -m benchmarks semantic --configs semantic:poor@0.2,semantic:poor@0.6 --limit 40
    python -m benchmarks semantic --configs greedy+bed,semantic:good+bed,semantic:poor+bed --limit 20
    python -m benchmarks semantic --configs greedy,semantic:good --rerun greedy,semantic:good  # timings again
    python -m benchmarks semantic --plot-only
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from benchmarks import harness as C
from benchmarks.rigs.linkemu import LinkProfile, Testbed
from edgekit import EdgeClient, GenerationConfig, LlamaDraftModel, ServerConfig
from edgekit.client import FinalStats, RoundEvent, TextDelta
from edgekit.models import pair_paths
from edgekit.semantic.collect import _cut
from edgekit.semantic.tasks import humaneval_tasks
from edgekit.testing import InProcessTransport, SimulatedLink
from edgekit.transport import GrpcTransport
from edgekit.verifier import LlamaEngine, SemanticHead, VerifierService, channel_quality

LINKS = {
    "good": SimulatedLink(rtt_ms=5, uplink_mbps=500, downlink_mbps=500),
    "good50": SimulatedLink(rtt_ms=50, uplink_mbps=500, downlink_mbps=500),
    "poor5": SimulatedLink(rtt_ms=5, uplink_mbps=20, downlink_mbps=20),
    "poor": SimulatedLink(rtt_ms=50, uplink_mbps=20, downlink_mbps=20),
}
BED = "+bed"
SHIPPED = Path(__file__).resolve().parents[1] / "semantic" / "shipped"
RESULT = "semantic"


def _parse(spec: str) -> tuple[str, str, float | None, bool]:
    """'semantic:poor@0.3' -> ('semantic', 'poor', 0.3, False); 'greedy' -> ('greedy', 'good', None, False);
    a '+bed' suffix runs the configuration over the link testbed."""
    body, bed = (spec[: -len(BED)], True) if spec.endswith(BED) else (spec, False)
    kind, _, rest = body.partition(":")
    link, _, thr = (rest or "good").partition("@")
    if kind not in ("target-only", "greedy", "semantic", "nocsi") or link not in LINKS:
        raise SystemExit(f"unknown configuration {spec!r}")
    return kind, link, float(thr) if thr else None, bed


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
                               "semantic": s.server.semantic_accepted, "draft_ms": s.draft_ms,
                               "server_ms": s.server.verify_ms + s.server.queue_ms, "exchanges": s.exchanges,
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
            # wall-clock per committed token: over the testbed's link (+bed), else compute alone
            wall_ms_per_token=1e3 * sum(rec["seconds"] for rec in records) / committed if committed else 0.0,
        )
    estimates = [rec["link_estimate"]["quality"] for rec in records if "link_estimate" in rec]
    if estimates:  # the channel quality the head saw, from the device's own link estimate
        out["measured_quality"] = float(np.mean(estimates))
    if reference:
        same = [rec["text"] == reference[rec["id"]]["text"] for rec in records if rec["id"] in reference]
        out["identical_to_target_only"] = float(np.mean(same)) if same else None
    return out


def plot(payload: dict, path: Path) -> None:
    configs = payload["configs"]
    summary = {name: c["summary"] for name, c in configs.items()}
    ref = summary.get("target-only", {}).get("pass_at_1")
    names = [n for n in configs if n != "target-only"]
    counts = {summary[n]["problems"] for n in configs}
    labels = [f"{n} ({summary[n]['problems']})" for n in names] if len(counts) > 1 else names
    fig, axes = C.subplots(3, nrows=2, width=5.2, height=4.4)
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
    ax.set_xticks(range(len(names)), labels, rotation=30, ha="right", fontsize=8)
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
    ax.set_xticks(range(len(names)), labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("accepted length per round, AAL (blue, tokens)")
    ax2.set_ylabel("rounds per problem (orange)")
    ax.set_ylim(0, max(aal + [1.0]) * 1.15)
    ax2.set_ylim(0, max(rpp + [1.0]) * 1.15)
    ax.set_title("AAL and rounds (WISV Table I)")
    ax = axes[2]
    for i, link in enumerate(LINKS):
        vals = [summary[n].get("ms_per_token", {}).get(link, 0) for n in names]
        ax.bar(np.arange(len(names)) + (i - 1.5) * 0.2, vals, 0.2, label=link)
    ax.set_xticks(range(len(names)), labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("end-to-end ms per token (this CPU)")
    ax.set_title("time per token by link (WISV Fig. 4)")
    ax.legend(fontsize=8, title="link", loc="lower right")
    _plot_sweep(configs, axes[3:], ref)
    C.save_figure(fig, path)


def _plot_sweep(configs: dict, axes: list, ref: float | None) -> None:
    """Each head's pass@1, AAL and rounds against its threshold, one line per link (WISV Figs. 3 and 5):
    threshold 0 is greedy speculative decoding."""
    specs = {name: _parse(name) for name in configs}
    swept = {name: c for name, c in configs.items() if not specs[name][3] and specs[name][0] in ("semantic", "nocsi")
             and c.get("threshold") is not None and c["records"]}
    if "greedy" in configs:
        swept["greedy"] = configs["greedy"]
    # the problems every plotted configuration ran, so that every point counts the same ones
    common = set.intersection(*({r["id"] for r in c["records"]} for c in swept.values())) if swept else set()
    reference = {r["id"]: r for r in configs.get("target-only", {}).get("records", [])}

    def on_common(c: dict) -> dict:
        return summarise([r for r in c["records"] if r["id"] in common], reference)

    greedy = on_common(configs["greedy"]) if "greedy" in swept and common else None
    if reference and common:
        ref = float(np.mean([reference[i]["passed"] for i in common if i in reference]))
    lines: dict[tuple[str, str], list[tuple[float, dict]]] = {}
    for name, c in swept.items():
        if name != "greedy" and common:
            kind, link, _, _ = specs[name]
            lines.setdefault((kind, link), []).append((c["threshold"], on_common(c)))
    panels = (("pass_at_1", 100.0, "pass@1 on held-out HumanEval (%)", "accuracy by threshold (WISV Fig. 3)"),
              ("aal", 1.0, "accepted length per round, AAL", "AAL by threshold"),
              ("rounds_per_problem", 1.0, "rounds per problem", "rounds by threshold"))
    for ax, (key, scale, ylabel, title) in zip(axes, panels):
        for (kind, link), pts in sorted(lines.items()):
            pts = ([(0.0, greedy)] if greedy else []) + sorted(pts, key=lambda t: t[0])
            ax.plot([t for t, _ in pts], [scale * s.get(key, 0.0) for _, s in pts], marker="o",
                    ls="-" if kind == "semantic" else ":", label=f"{'CSI head' if kind == 'semantic' else 'no CSI'}, "
                    f"{link} link")
        if key == "pass_at_1" and ref is not None:
            ax.axhline(100 * ref, ls="--", color="k", label=f"target-only {100 * ref:.1f}%")
        ax.set_xlabel("threshold on P(reject) (0: greedy speculative decoding)")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{title} ({len(common)} problems all ran)")
        if lines:
            ax.legend(fontsize=7)


class _Verifiers:
    """The verifier a configuration talks to: in this process behind a `SimulatedLink`, or in the
    link testbed's namespace behind real (emulated) links. One engine at a time, kept while the
    head stays the same."""

    def __init__(self, draft_k: int, threads: int | None) -> None:
        self.draft_k, self.threads = draft_k, threads
        self._engine: LlamaEngine | None = None
        self._service: tuple[str, VerifierService] | None = None
        self._bed: tuple[str, Testbed] | None = None

    def transport(self, head: str | None, link: str, bed: bool):  # type: ignore[no-untyped-def]
        key = head or ""
        if bed:
            self._close_service()
            if self._bed is None or self._bed[0] != key:
                self._close_bed()
                serve = ["--pair", "qwen-coder", "--max-sessions", "1", "--max-block", str(self.draft_k),
                         "--max-context", "1024"]
                serve += ["--threads", str(self.threads)] if self.threads else []
                serve += ["--semantic-head", head] if head else []
                self._bed = (key, Testbed(serve, log=str(C.RESULTS_DIR / "semantic-verifier.log")).start())
            sim = LINKS[link]
            self._bed[1].shape(LinkProfile(sim.rtt_ms, sim.uplink_mbps, sim.downlink_mbps))
            return GrpcTransport(self._bed[1].address)
        self._close_bed()
        if self._service is None or self._service[0] != key:
            self._close_service()
            if self._engine is None:
                _, target_path = pair_paths("qwen-coder")
                self._engine = LlamaEngine(str(target_path), max_context=1024, n_seq=1, max_block=self.draft_k,
                                           threads=self.threads)
            self._service = (key, VerifierService(self._engine, ServerConfig(
                port=0, max_sessions=1, max_context=1024, max_block=self.draft_k, semantic_head=head)))
        return InProcessTransport(self._service[1], link=LINKS[link])

    def _close_service(self) -> None:
        if self._service is not None:
            self._service[1].close()
            self._service = None

    def _close_bed(self) -> None:
        if self._bed is not None:
            self._bed[1].close()
            self._bed = None

    def close(self) -> None:
        self._close_service()
        self._close_bed()


def _drop_other_heads(payload: dict, heads: dict[str, str]) -> None:
    """Every configuration of a head that is no longer the one named goes, run or not: the figure
    and the tables only ever show the current heads."""
    current = {kind: SemanticHead(path).identity for kind, path in heads.items() if Path(path).is_file()}
    for spec in list(payload["configs"]):
        kind = _parse(spec)[0]
        had = payload["configs"][spec].get("head_identity")
        if kind in current and had != current[kind]:
            C.progress(f"{spec}: dropped, its records came from another head ({had}; now {current[kind]})")
            del payload["configs"][spec]


def _run_config(spec: str, payload: dict, tasks: list, draft: LlamaDraftModel, verifiers: _Verifiers,
                args: argparse.Namespace) -> None:
    kind, link, threshold, bed = _parse(spec)
    head = {"semantic": args.head, "nocsi": args.nocsi_head}.get(kind)
    gen = GenerationConfig(max_tokens=320, drafting="fixed", draft_k=args.draft_k, mode="greedy")
    if kind in ("semantic", "nocsi"):
        gen = GenerationConfig(max_tokens=320, drafting="fixed", draft_k=args.draft_k, mode="semantic",
                               upload="fh", semantic_threshold=threshold)
    entry = payload["configs"].setdefault(spec, {"records": []})
    identity = SemanticHead(head).identity if head else None  # records of another head: gone (_drop_other_heads)
    if spec in args.rerun and entry["records"]:  # measured again from the first problem (resume: no --rerun)
        C.progress(f"{spec}: dropping its {len(entry['records'])} records to measure it again")
        entry["records"] = []
    entry["head_identity"] = identity
    if head:
        entry["head"] = head
        entry["threshold"] = threshold if threshold is not None else SemanticHead(head).threshold
    done = {r["id"] for r in entry["records"]}
    todo = [t for t in tasks if t.id not in done]
    if not todo:
        return
    with EdgeClient(verifiers.transport(head, link, bed), draft=draft, generation=gen) as client:
        for task in todo:
            rec = run_problem(client, task, kind)
            if bed:  # what the device measured of its link, and so the CSI the head saw
                est = client.link.state()
                rec["link_estimate"] = {"rtt_ms": est.rtt_ms, "uplink_mbps": est.uplink_mbps,
                                        "quality": channel_quality(est)}
            entry["records"].append(rec)
            C.progress(f"{spec} {task.id}: {'pass' if rec['passed'] else 'fail'}, {rec['tokens']} tokens, "
                       f"{len(rec['rounds'])} rounds, {rec['seconds']:.1f} s")
            ref = payload["configs"].get("target-only", {}).get("records", [])
            entry["summary"] = summarise(entry["records"], {r["id"]: r for r in ref})
            C.write_result(args.out, payload)


def main() -> None:
    ap = C.arguments(__doc__, threads=0, draft_k=8, out=RESULT)
    ap.add_argument("--configs", default="target-only,greedy,semantic:good,semantic:poor,nocsi:good,nocsi:poor")
    ap.add_argument("--head", default=str(SHIPPED / "qwen-coder.onnx"))
    ap.add_argument("--nocsi-head", default=str(SHIPPED.parent / "ablation" / "qwen-coder-nocsi.onnx"))
    ap.add_argument("--limit", type=int, default=0, help="Only the first N held-out problems (0: all 82).")
    ap.add_argument("--plot-only", action="store_true")
    ap.add_argument("--rerun", default="", help="Configurations to measure again from the start (their records "
                    "are dropped), e.g. for timings on an idle machine; resume an interrupted one without it.")
    args = C.parse(ap, machine=False)  # the machine is printed below, when something is measured
    args.rerun = set(C.csv_list(args.rerun))
    out = C.RESULTS_DIR / f"{args.out}.json"
    payload = {"configs": json.loads(out.read_text())["configs"] if out.is_file() else {}}
    _drop_other_heads(payload, {"semantic": args.head, "nocsi": args.nocsi_head})
    if not args.plot_only:
        threads = args.threads if args.threads > 0 else None  # None: edgekit's default
        C.print_machine()
        tasks = humaneval_tasks("heldout")[: args.limit or None]
        draft_path, _ = pair_paths("qwen-coder")
        draft = LlamaDraftModel(draft_path, n_ctx=1024, n_threads=threads)
        verifiers = _Verifiers(args.draft_k, threads)
        try:
            for spec in C.csv_list(args.configs):
                _run_config(spec, payload, tasks, draft, verifiers, args)
        finally:
            verifiers.close()
    ref_records = {r["id"]: r for r in payload["configs"].get("target-only", {}).get("records", [])}
    for entry in payload["configs"].values():
        entry["summary"] = summarise(entry["records"], ref_records)
    written = C.write_result(args.out, payload)
    plot(payload, written.with_suffix(".png"))
    rows = []
    for name, e in payload["configs"].items():
        s = e["summary"]
        rows.append([name, s["problems"], 100 * s["pass_at_1"], s.get("aal", "-"), s.get("rounds_per_problem", "-"),
                     s.get("semantic_accepted", "-"), s.get("identical_to_target_only", "-"),
                     s.get("ms_per_token", {}).get("good", "-"), s.get("ms_per_token", {}).get("poor", "-"),
                   s.get("wall_ms_per_token", "-"), s.get("measured_quality", "-")])
    print(C.table(["config", "problems", "pass@1 %", "AAL", "rounds/problem", "accepted mismatches",
                   "same text as target-only", "ms/token good", "ms/token poor", "wall ms/token",
                   "measured q"], rows))


if __name__ == "__main__":
    main()
