"""The fleet simulator: N devices load a real verifier over gRPC without running N
draft models (WISP sec. 5.1's "scalable verification-workload simulator").

    python -m benchmarks fleet record --pair gemma-270m               # traces, once per pair
    python -m benchmarks fleet run --pair gemma-270m --system wisp --devices 8 --duration 60
    python -m benchmarks fleet sweep --pair gemma-270m --devices 2,4,6,8,12 --systems sled,fcfs,centralized,wisp
    python -m benchmarks fleet smoke                                  # CI: a few devices, seconds

`record` runs the real draft model over the pair's evaluation prompts: the
target's greedy output comes from a verifier's target-only decoding, and at
every position of it the draft's greedy continuation (up to --window tokens),
its logit features and its step time are kept (see `rigs/fleet_sim.py`). `run` starts
`edgekit serve` in a process of its own (or uses --verifier) and lets N
simulated devices replay the traces against it: each draws an SLO class at
random (WISP's four: 8/6/4/2 tok/s), a drafting speed factor, an RTT and link
rates, and sends real rounds; every verdict is checked against the trace. A
system is a verifier policy, a device mode and a drafting policy:

    sled            fcfs, every round re-prefills its context (no prefix cache), fixed window 4
    fcfs            fcfs, sessions keep their KV (prefix reuse), fixed window 4
    fcfs-predictor  fcfs, prefix reuse, the pair's WISP rejection predictor
    centralized     fcfs, target-only Generate streams (continuous batching of their steps)
    wisp            wisp (Algorithm 1 with the estimator), prefix reuse, the predictor
    wisp-fixed      wisp, prefix reuse, fixed window 4
    wisp-response   wisp with response budgets (--slo-budget response), prefix reuse, the predictor
    goodspeed       fcfs, draft budgets by GOODSPEED's gradient scheduling (--budgets goodspeed); devices
                    draft what they are given (--token-budget C, else the verifier's)
    fixed-s         the same with C/N each;  random-s  with random shares (GOODSPEED's baselines)

`sweep` runs systems over device counts and reports Cap(tau) per class (WISP
eq. 20: the largest N whose violation rate stays within --epsilon), goodput
(committed tokens/s), violation curves (Fig. 7) and the queue/verify
attribution of violated rounds (Fig. 8, eq. 21), JSON and PNG.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from contextlib import contextmanager
from pathlib import Path

from benchmarks import harness as C
from benchmarks.rigs.fleet_runs import (
    SYSTEMS,
    attribution,
    capacity,
    machine_traces,
    plot_sweep,
    record,
    run_fleet,
    traces_path,
    verifier,
)
from benchmarks.rigs.fleet_sim import Trace, load_traces, save_traces
from edgekit.config import DEFAULT_SLO_CLASSES
from edgekit.models import get_pair, model_path


def cmd_run(args: argparse.Namespace) -> dict:
    traces, meta = machine_traces(args.pair, threads=args.threads)
    policy = SYSTEMS[args.system][0]
    with _maybe_verifier(args, policy, traces, meta) as address:
        fleet = run_fleet(address, args.system, args.devices, args, traces, meta)
    summary = fleet.summary(args.warmup)
    print(C.table(["class", "responses", "violation", "mean tok/s"],
                  [[k, v["responses"], C.fmt(v["violation_rate"]), C.fmt(v["mean_speed"])]
                   for k, v in summary["classes"].items()]))
    print(f"goodput {summary['goodput_tokens_per_s']:.1f} tok/s; errors: {summary['errors'] or 'none'}")
    return {"system": args.system, "devices": args.devices, "summary": summary}


@contextmanager
def _maybe_verifier(args: argparse.Namespace, policy: str, traces: Sequence[Trace] = (), meta: dict | None = None):
    if args.verifier:
        yield args.verifier
        return
    log = C.RESULTS_DIR / f"fleet_serve_{args.pair}_{re.sub(r'[^A-Za-z0-9.+-]+', '-', policy)}.log"
    replay = None
    if args.replay_target:  # the devices' traces, answered by that target (rigs/replayed.py)
        replay = (Path(args.replay_target), log.with_name(log.stem + "_traces.json"))
        save_traces(replay[1], list(traces), meta or {})
    with verifier(args.pair, policy, max(args.max_sessions, 2), args.threads, args.numerics, log,
                  getattr(args, "token_budget", 0), replay=replay) as address:
        yield address


def cmd_sweep(args: argparse.Namespace) -> dict:
    traces, meta = machine_traces(args.pair, threads=args.threads)
    devices = C.csv_list(args.devices, int)
    systems = C.csv_list(args.systems)
    results: dict[str, dict] = {}
    for system in systems:
        policy = SYSTEMS[system][0]
        args.max_sessions = max(devices)
        results[system] = {"points": []}
        with _maybe_verifier(args, policy, traces, meta) as address:
            for n in devices:
                fleet = run_fleet(address, system, n, args, traces, meta)
                s = fleet.summary(args.warmup)
                s["attribution"] = attribution(fleet)
                print(f"{system:15s} N={n:3d} goodput {s['goodput_tokens_per_s']:6.1f} tok/s  " + "  ".join(
                    f"{k} {v['violation_rate']:.2f}" for k, v in s["classes"].items()), file=sys.stderr)
                results[system]["points"].append({"devices": n, **s})
    table = {}
    for system, r in results.items():
        caps = {}
        for cls in DEFAULT_SLO_CLASSES:
            curve = [(p["devices"], p["classes"][cls]["violation_rate"]) for p in r["points"] if cls in p["classes"]]
            caps[cls] = capacity(curve, args.epsilon)
        r["capacity"] = caps
        r["peak_goodput"] = max(p["goodput_tokens_per_s"] for p in r["points"])
        table[system] = caps
    print(C.table(["system", *DEFAULT_SLO_CLASSES, "peak goodput"],
                  [[s, *[table[s][c] for c in DEFAULT_SLO_CLASSES], C.fmt(results[s]["peak_goodput"])]
                   for s in results]))
    return {"systems": results, "devices": devices, "epsilon": args.epsilon}


def cmd_smoke(args: argparse.Namespace) -> dict:
    """CI: two short traces, a local in-process verifier per policy, three devices for a few seconds;
    fails on any unfaithful verdict or text."""
    from edgekit import ServerConfig
    from edgekit.verifier import VerifierServer

    out = Path(args.out_dir)
    path = record(args.pair, 2, 16, 4, None, out / "fleet_traces_smoke.json")
    traces, meta = load_traces(path)
    report = {}
    for system in ("fcfs", "wisp", "sled", "centralized"):
        policy = SYSTEMS[system][0]
        config = ServerConfig(port=0, max_sessions=4, policy=policy, calibrate="off")  # type: ignore[arg-type]
        spec = get_pair(args.pair)
        with VerifierServer(model_path(spec.target), config, name=spec.target) as server:
            args.duration, args.k = 4.0, 3
            fleet = run_fleet(server.address, system, 3, args, traces, meta)
        s = fleet.summary()
        report[system] = s
        if s["errors"] or not s["responses"]:
            raise SystemExit(f"fleet smoke failed for {system}: {s['errors'] or 'no response finished'}")
        print(f"{system}: {s['responses']} responses, {s['rounds']} rounds, goodput {s['goodput_tokens_per_s']:.1f}, "
              f"{s['divergences']} diverged")
    return report


def main(argv: list[str] | None = None) -> None:
    # --threads is each command's own, default None (the harness's is an int): unset, the verifier
    # and the recording keep edgekit's default (EDGEKIT_THREADS, or all cores).
    ap = C.arguments(__doc__, whole_doc=True, threads=None)
    sub = ap.add_subparsers(dest="cmd", required=True)
    rec = C.common(sub.add_parser("record"), threads=None, pair="gemma-270m", prompts=12)
    rec.add_argument("--tokens", type=int, default=48)
    rec.add_argument("--window", type=int, default=8)
    rec.add_argument("--threads", type=int, default=None)
    for name in ("run", "sweep"):
        p = C.common(sub.add_parser(name), threads=None, pair="gemma-270m")
        p.add_argument("--verifier", default=None, help="HOST:PORT of a running verifier (else one is started)")
        p.add_argument("--duration", type=float, default=40.0)
        p.add_argument("--warmup", type=float, default=5.0)
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--k", type=int, default=4, help="fixed window of the fixed-drafting systems")
        p.add_argument("--speed-min", type=float, default=1.0)
        p.add_argument("--speed-max", type=float, default=2.0)
        p.add_argument("--rtt-min", type=float, default=10.0)
        p.add_argument("--rtt-max", type=float, default=60.0)
        p.add_argument("--threads", type=int, default=None)
        p.add_argument("--numerics", default="exact")
        p.add_argument("--max-sessions", type=int, default=16)
        p.add_argument("--token-budget", type=int, default=0, help="C of the budget systems (0: the verifier's auto)")
        p.add_argument("--replay-target", metavar="GGUF", default=None,
                       help="serve this target (a random one: benchmarks/gpu/make_target.py), its greedy rows answered "
                            "as the traces' target answered them (rigs/replayed.py); the figures say so")
    sub.choices["run"].add_argument("--system", default="fcfs", choices=list(SYSTEMS))
    sub.choices["run"].add_argument("--devices", type=int, default=8)
    sub.choices["sweep"].add_argument("--systems", default="sled,fcfs,centralized,wisp")
    sub.choices["sweep"].add_argument("--devices", default="2,4,6,8,12")
    sub.choices["sweep"].add_argument("--epsilon", type=float, default=0.05)
    C.common(sub.choices["sweep"], threads=None, out=None)
    sub.choices["sweep"].add_argument("--replot", default=None, help="redraw a sweep JSON's PNG, measure nothing")
    smoke = C.common(sub.add_parser("smoke"), threads=None, pair="gemma-270m")
    smoke.add_argument("--out-dir", default=str(C.RESULTS_DIR))
    smoke.add_argument("--seed", type=int, default=0)
    args = C.parse(ap, argv, plot=plot_sweep, machine=False)  # sweep --replot: plot_sweep, and no more
    if args.cmd == "smoke":
        for k, v in dict(speed_min=1.0, speed_max=1.5, rtt_min=5.0, rtt_max=20.0).items():
            setattr(args, k, v)
    if args.cmd == "record":
        path = record(args.pair, args.prompts, args.tokens, args.window, args.threads,
                      traces_path(args.pair, args.tokens))
        print(path)
    elif args.cmd == "run":
        payload = cmd_run(args)
        C.write_result(f"fleet_run_{args.pair}_{args.system}_{args.devices}", {"machine": C.machine(), **payload})
    elif args.cmd == "sweep":
        payload = {"machine": C.machine(), "pair": args.pair, "settings": vars(args), **cmd_sweep(args)}
        name = args.out or f"fleet_sweep_{args.pair}"
        path = C.write_result(name, payload)
        plot_sweep(payload, path.with_suffix(".png"))
    else:
        cmd_smoke(args)


if __name__ == "__main__":
    main()
