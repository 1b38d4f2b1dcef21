"""The side-by-side comparison with the verifier on a GPU (issue 37, item 5), from one command.

One box plays both machines. The device is this process, pinned to one CPU core: the draft runs
there on llama.cpp's CPU kernels with one thread (EDGEKIT_GPU_LAYERS=0). The verifier is
`edgekit serve` with every target layer on the GPU (`--gpu-layers -1`, fast numerics: a GPU has
no batch-invariant kernels), reached through `rigs/linkemu`'s `DelayProxy` at each RTT (a
user-space relay that delays each direction by half of it; no rate limit). Systems, each on the
same prompts, greedy, the same GGUF files:

    local             the target alone on the device core (llama.cpp CPU, one thread)
    centralized       the GPU verifier decodes every token and streams it (edgekit's target-only Generate)
    llama-server      the same from llama.cpp's own server on the GPU (a stock centralized server)
    co-located        llama.cpp's own draft-model speculation on the GPU (llama-server -md --spec-type
                      draft-simple: without --spec-type it loads the draft and never drafts), its defaults
    co-located-8      the same drafting up to 8 tokens a round (--spec-draft-n-max 8; the default is 3)
    co-located-tuned  up to 8, with --spec-draft-p-min at the value that replayed best on the pair's
                      traces (the default p-min is 0)
    edgekit-fixed-4   distributed speculation, a fixed window of 4
    edgekit-auto      distributed speculation, the default policy (drafting="auto")

Per system and RTT: time per token and time to first token as the user sees them, and the
verifier's busy time per committed token (what the operator pays; where the verifier reports it).
Every lossless system's text is compared with centralized decoding's on every prompt.

Then the fleet: N simulated devices (benchmarks/fleet.py, traces recorded here against the same
GPU verifier) against centralized serving, fcfs and wisp on the GPU verifier; capacity per SLO
class (WISP eq. 20) and goodput against N.

    python -m benchmarks gpu.suite --out DIR [--llama-server PATH]   # on a GPU machine
    python -m benchmarks gpu.suite --dry-run --out DIR                # CI: the same code on the CPU, tiny

Needs the gemma-270m pair in the model cache (`edgekit models pull gemma-270m`); a llama.cpp
built with CUDA in the Python environment (else it says so, and runs on the CPU only with
--dry-run). Writes DIR/gpu_suite.json and DIR/gpu_suite.png.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

# The device's draft stays on the CPU whatever the build; the verifier is told otherwise explicitly.
os.environ.setdefault("EDGEKIT_GPU_LAYERS", "0")

from benchmarks import harness as C  # noqa: E402
from benchmarks.rigs import peers as P  # noqa: E402

PAIR = "gemma-270m"
LOSSLESS = ("local", "centralized", "llama-server", "co-located", "co-located-8", "co-located-tuned", "edgekit-fixed-4",
            "edgekit-auto")


# -- the side-by-side runs --------------------------------------------------------------------


def side_by_side(args: argparse.Namespace, draft: Path, target: Path, prompts: list[dict]) -> dict:
    from edgekit import EdgeClient, GenerationConfig

    gen = GenerationConfig(max_tokens=args.tokens, mode="greedy", stop_at_eos=True)
    core = P.pin_to_device_core()
    runs: list[dict] = []
    logs = Path(args.logs)

    def record(system: str, rtt: float, i: int, r: dict, cpu_s: float | None = None) -> None:
        r.update(system=system, rtt_ms=rtt, prompt=prompts[i]["id"], kind=prompts[i]["kind"])
        if cpu_s is not None:  # local: the device decodes, no verifier
            r["verifier_cpu_s_per_token"] = cpu_s / max(r["tokens"], 1)
        runs.append(r)
        C.progress(f"{system:16s} rtt {rtt:5.0f} [{i + 1}/{len(prompts)}] {r['ms_per_token']:6.1f} ms/token")

    if "local" in args.systems:  # the target on the device core, decoding everything itself (no link)
        with P.serve(target, numerics=args.numerics, cores={core}, gpu_layers=0, threads=1, sessions=2,
                     log=logs / "local.log") as served:
            with EdgeClient(served.address, draft=draft, generation=gen, draft_threads=1) as client:
                client.server_info()
                for i, p in enumerate(prompts):
                    record("local", 0.0, i, P.run_edgekit(client, p["prompt"], "centralized"))
    ours = [s for s in ("centralized", "edgekit-fixed-4", "edgekit-auto") if s in args.systems]
    with P.serve(target, numerics=args.numerics, cores=P.verifier_cores(core), gpu_layers=args.gpu_layers, sessions=4,
               log=logs / "verifier.log") if ours else nullcontext() as served, \
            P.proxy_to(served.address) if ours else nullcontext() as proxy:
        with EdgeClient(proxy.address, draft=draft, generation=gen, draft_threads=1) if ours else nullcontext() \
                as client:
            if ours:
                client.server_info()
            for rtt in args.rtts if ours else ():
                proxy.impairment.rtt_ms = rtt
                for i, p in enumerate(prompts):
                    for system in ours:
                        before = P.cpu_seconds(served.pid)
                        r = P.run_edgekit(client, p["prompt"], system)
                        record(system, rtt, i, r, P.cpu_seconds(served.pid) - before)
    errors: dict[str, str] = {}

    def stock(system: str) -> None:
        server = P.llama_server(args.llama_server, target, draft, P.stock_flags(system, PAIR), logs / f"{system}.log")
        with server as (address, pid), P.proxy_to(address) as proxy:
            P.run_llama_server(address, prompts[0]["prompt"], 4)  # warm-up: the first CUDA kernels
            for rtt in args.rtts:
                proxy.impairment.rtt_ms = rtt
                for i, p in enumerate(prompts):
                    before = P.cpu_seconds(pid)
                    r = P.run_llama_server(proxy.address, p["prompt"], args.tokens)
                    record(system, rtt, i, r, P.cpu_seconds(pid) - before)

    for system in [s for s in P.STOCK if s in args.systems] if args.llama_server else ():
        try:
            stock(system)
        except Exception as exc:  # a stock server that fails is reported; the rest stands
            errors[system] = f"{type(exc).__name__}: {exc}"
            C.progress(f"{system}: {errors[system]}")
    return {"device_core": core, "runs": runs, "identity": P.identity(runs), "summary": P.summarize(runs),
            "errors": errors}


# -- the fleet ----------------------------------------------------------------------------------


def fleet(args: argparse.Namespace, draft: Path, target: Path) -> dict:
    """Fleet capacity on the GPU verifier: traces recorded against it, then a sweep per system."""
    return P.fleet(args, draft, target, pair=PAIR, names=("gemma-3-270m-q4_0", "gemma-3-270m"))


# -- the figure ---------------------------------------------------------------------------------


def plot(payload: dict, png: Path) -> None:
    fl = payload.get("fleet")
    fig, axes = C.subplots(4 if fl else 3, nrows=1, width=4.6, height=3.6)
    summary = payload["side_by_side"]["summary"]
    systems = [s for s in LOSSLESS if any(v["system"] == s for v in summary.values())]
    on_gpu = payload.get("verifier_on_gpu", not payload.get("dry_run"))  # results from before the key: GPU unless dry
    label = payload.get("gpu") if on_gpu else "verifier on the CPU" + (" (dry run)" if payload.get("dry_run") else "")
    for i, system in enumerate(systems):
        pts = sorted((v["rtt_ms"], v) for v in summary.values() if v["system"] == system)
        style = {"color": f"C{i}", "marker": "o", "label": system}
        axes[0].plot([r for r, _ in pts], [v["ms_per_token"] for _, v in pts], **style)
        axes[1].plot([r for r, _ in pts], [v["ttft_ms"] or float("nan") for _, v in pts], **style)
    axes[0].set(xlabel="RTT ms", ylabel="ms per token (as the user sees it)", title=f"time per token\n{label}",
                yscale="log")
    axes[1].set(xlabel="RTT ms", ylabel="ms to first token", title="time to first token", yscale="log")
    axes[0].legend(fontsize=7)
    cost = [(s, C.median([v["verifier_cpu_ms_per_token"] for v in summary.values() if v["system"] == s]))
            for s in systems if s != "local"]  # the local target has no verifier
    axes[2].bar(range(len(cost)), [c for _, c in cost], color=[f"C{systems.index(s)}" for s, _ in cost])
    axes[2].set_xticks(range(len(cost)), [s for s, _ in cost], rotation=30, ha="right", fontsize=7)
    axes[2].set(ylabel="verifier CPU ms per token", title="verifier process CPU time per token")
    if fl:
        for i, (system, r) in enumerate(fl["systems"].items()):
            axes[3].plot([p["devices"] for p in r["points"]], [p["goodput_tokens_per_s"] for p in r["points"]],
                         marker="o", color=f"C{i}", label=f"{system} (cap {min(r['capacity'].values())}-"
                         f"{max(r['capacity'].values())})")
        axes[3].set(xlabel="devices N", ylabel="committed tokens/s", title="fleet goodput (cap: devices within SLO)")
        axes[3].legend(fontsize=7)
    C.save_figure(fig, png)


def write(payload: dict, out: Path, started: float) -> None:
    payload["wall_s"] = time.time() - started
    with open(out / "gpu_suite.json", "w", encoding="utf-8") as f:
        json.dump(payload, f, indent=2, default=C.json_default)


def main(argv: list[str] | None = None) -> None:
    # No --threads: one thread each, always (below); --out is a folder here, not the shared result's name.
    ap = C.arguments(__doc__, whole_doc=True, replot=True, threads=None, prompts=8)
    ap.add_argument("--out", default=".", help="folder for gpu_suite.json and gpu_suite.png")
    ap.add_argument("--logs", default=None, help="folder for the servers' logs and the fleet's traces (default: --out)")
    ap.add_argument("--dry-run", action="store_true", help="the CPU, two prompts, a few tokens, a tiny fleet")
    ap.add_argument("--cpu-verifier", action="store_true",
                    help="the verifier on the CPU cores the device leaves (two machines on one CPU box), full size")
    ap.add_argument("--llama-server", default=shutil.which("llama-server"), help="llama.cpp's server binary")
    ap.add_argument("--systems", default=",".join(LOSSLESS), help="which of the side-by-side systems run")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--rtts", default="0,25,100")
    ap.add_argument("--numerics", default=None,
                    help="the verifier's (default: fast on a GPU, whose kernels are not batch-invariant; exact on "
                    "the CPU, where every lossless system's text must then match)")
    ap.add_argument("--fleet-systems", default="centralized,fcfs,wisp")
    ap.add_argument("--fleet-devices", default="16,64,128")
    ap.add_argument("--fleet-duration", type=float, default=12.0)
    ap.add_argument("--fleet-prompts", type=int, default=8)
    ap.add_argument("--epsilon", type=float, default=0.05)
    args = C.parse(ap, argv, plot=plot, machine=False)  # --replot: the figure redrawn, and the end
    from edgekit.models import get_pair, model_path
    from edgekit.runtime import gpu_offload, llama_build

    if args.dry_run:
        args.prompts, args.tokens, args.rtts, args.fleet_devices = 2, 12, "0,20", "2"
        args.fleet_duration, args.fleet_prompts, args.fleet_systems = 8.0, 2, "centralized,fcfs"
    elif not gpu_offload() and not args.cpu_verifier:
        raise SystemExit("this llama.cpp cannot offload to a GPU (a CPU build); use --cpu-verifier or --dry-run")
    args.gpu_layers = -1 if gpu_offload() and not (args.dry_run or args.cpu_verifier) else 0
    args.numerics = args.numerics or ("fast" if args.gpu_layers else "exact")
    args.rtts = C.csv_list(args.rtts, float)
    args.systems = C.csv_list(args.systems)
    unknown = set(args.systems) - set(LOSSLESS)
    if unknown:
        raise SystemExit(f"unknown systems {sorted(unknown)}; choose from {', '.join(LOSSLESS)}")
    args.fleet_devices = C.csv_list(args.fleet_devices, int) if args.fleet_devices else []
    args.fleet_systems = C.csv_list(args.fleet_systems)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    args.logs = args.logs or args.out
    Path(args.logs).mkdir(parents=True, exist_ok=True)
    spec = get_pair(PAIR)
    draft, target = model_path(spec.draft), model_path(spec.target)
    kinds: dict[str, list[dict]] = {}
    for p in C.load_prompts():
        kinds.setdefault(p["kind"], []).append(p)
    # the kinds in turn, each until it runs out (zip would stop at the smallest kind's count)
    turns = itertools.zip_longest(*kinds.values())
    prompts = [p for group in turns for p in group if p is not None][: args.prompts]
    if len(prompts) < args.prompts:
        C.progress(f"--prompts {args.prompts}: the prompt set has {len(prompts)}; running those")
    started = time.time()
    payload: dict[str, Any] = {
        "benchmark": "gpu_suite", "command": " ".join(sys.argv), "dry_run": args.dry_run, "gpu": C.gpu_name(),
        "verifier_on_gpu": bool(args.gpu_layers),
        "machine": C.machine(), "llama_build": llama_build(), "pair": PAIR, "tokens": args.tokens,
        "rtts_ms": args.rtts, "numerics": args.numerics, "llama_server": args.llama_server,
        "prompts": [p["id"] for p in prompts],
    }
    payload["side_by_side"] = side_by_side(args, draft, target, prompts)
    payload["fleet"] = None
    write(payload, out, started)  # kept if the fleet fails
    try:
        payload["fleet"] = fleet(args, draft, target) if args.fleet_devices else None
    except Exception as exc:
        payload["fleet_error"] = f"{type(exc).__name__}: {exc}"
        C.progress(f"fleet: {payload['fleet_error']}")
    write(payload, out, started)
    plot(payload, out / "gpu_suite.png")
    s = payload["side_by_side"]["summary"]
    print(C.table(["system", "RTT ms", "ms/token", "TTFT ms", "verifier CPU ms/token"],
                  [[v["system"], C.fmt(v["rtt_ms"], 0), C.fmt(v["ms_per_token"]), C.fmt(v["ttft_ms"]),
                    C.fmt(v["verifier_cpu_ms_per_token"])] for v in s.values()]))
    if payload["fleet"]:
        print(C.table(["fleet system", "capacity per class", "peak goodput tok/s", "divergences", "errors"],
                      [[k, v["capacity"], C.fmt(v["peak_goodput"]), sum(p["divergences"] for p in v["points"]),
                        sum(len(p["errors"]) for p in v["points"])] for k, v in payload["fleet"]["systems"].items()]))
    print("identical to centralized:", {k: f"{v['identical']}/{v['runs']}" for k, v in
                                         payload["side_by_side"]["identity"].items()})
    print(f"wrote {out / 'gpu_suite.json'} in {payload['wall_s']:.0f} s")


if __name__ == "__main__":
    main()
