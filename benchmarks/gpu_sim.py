"""Capacity at GPU scale, by discrete-event simulation (a SIMULATION: nothing here runs on a GPU).

The verifier's own scheduler code (`FcfsScheduler`, `WispScheduler`, and
`SpeedClasses` for each round's budget and deadline) runs in virtual time: no
sleeping, no model. A batch takes the time WISP's verification-time estimator
gives it with their published A100 coefficients for Qwen3-32B (sec. 4.4:
a = 143.39 us/token, b_compute = 2.53 ns/interaction, b_read = 2.67 us per
cached token; c = 14.86 ms from their appendix C, Table 12), times a lognormal
noise of --noise (their estimator's test MAPE was 4.93%), and the scheduler
plans with the same coefficients (no noise). Devices draft and are accepted as
our recorded traces say (benchmarks/fleet.py record: the real draft model's
continuation at every position of the target's greedy output, replayed by the
same window policies as the fleet simulator), with their recorded draft step
time times a speed factor, and links of random RTT and rates. Prompts are the
recorded ones (16-35 tokens) or padded to --context tokens (a long system
prompt or chat history: the regime WISP profiled, 500-2000 cached tokens,
where re-prefilling every round, as SLED does, is ruinous). A batch holds at most --max-rows tokens
(vLLM's max_num_batched_tokens); KV memory is assumed to hold every session.

Systems, as in WISP Table 2:
    sled         FCFS, fixed window 4, no prefix cache: every round is verified on its whole context
    centralized  FCFS, target-only decoding: one token per device per step, steps batched continuously
    wisp         WISP's Algorithm 1 and the predictor's windows, with the prefix cache

and, for server-assigned draft budgets (GOODSPEED, benchmarks/goodspeed.py --sim), FCFS with
the verifier's budget policy (the verifier's own `Budgets` code, in virtual time) and devices
that draft what they are given: goodspeed, fixed-s, random-s.

For each system the number of devices N is swept; per SLO class (8/6/4/2 tok/s,
devices draw one at random) Cap(tau) is the largest N whose responses fall short
of their speed at most --epsilon of the time (eq. 20). Set beside WISP Table 2
(Qwen3-32B: SLED 83/42/27/21, centralized 97/80/54/41, WISP 164/142/103/86;
WISP/SLED 1.98-4.10x, WISP/centralized 1.69-2.10x).

    python -m benchmarks fleet record --pair gemma-270m --tokens 128   # the traces, once
    python -m benchmarks gpu_sim --pair gemma-270m
    python -m benchmarks gpu_sim --devices 20,40,...,400 --horizon 60
"""

from __future__ import annotations

import argparse
import sys
import time

from benchmarks import harness as C
from benchmarks.rigs.event_sim import SYSTEMS, WISP_A100_QWEN3_32B, Simulation, options
from benchmarks.rigs.fleet_runs import controller_factory, plot_sweep, traces_path
from benchmarks.rigs.fleet_sim import load_traces
from edgekit.config import DEFAULT_SLO_CLASSES

WISP_TABLE2_QWEN3_32B = {
    "sled": (83, 42, 27, 21),
    "centralized": (97, 80, 54, 41),
    "wisp": (164, 142, 103, 86),
}


def capacity(points: list[dict], cls: str, epsilon: float) -> int:
    cap = 0
    for p in sorted(points, key=lambda p: p["devices"]):
        rate = p["classes"][cls]["violation_rate"]
        if not (rate <= epsilon):  # NaN (no response finished) counts as a violation
            break
        cap = p["devices"]
    return cap


def parser() -> argparse.ArgumentParser:
    # --pair: whose recorded traces the devices replay
    ap = C.arguments(__doc__, whole_doc=True, threads=None, pair="gemma-270m", out="gpu_sim")
    ap.add_argument("--tokens", type=int, default=128, help="which recording: responses of this many tokens")
    ap.add_argument("--systems", default="sled,centralized,wisp")
    ap.add_argument("--devices", default=",".join(str(n) for n in range(20, 421, 20)))
    options(ap)  # the simulation's own
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--epsilon", type=float, default=0.05)
    return ap


def main() -> None:
    args = C.parse(parser(), machine=False)
    traces, meta = load_traces(traces_path(args.pair, args.tokens))
    args.window = meta["window"]
    devices = C.csv_list(args.devices, int)
    results: dict[str, dict] = {}
    for system in C.csv_list(args.systems):
        _, _, drafting = SYSTEMS[system]
        factory = controller_factory(drafting, args.pair, args.window, args.k)
        points = []
        for n in devices:
            t0 = time.perf_counter()
            sim = Simulation(system, n, traces, args, factory).run()
            s = {"devices": n, **sim.summary(), "wall_s": time.perf_counter() - t0}
            points.append(s)
            print(f"{system:12s} N={n:4d} goodput {s['goodput_tokens_per_s']:8.1f} tok/s  " + "  ".join(
                f"{c} {v['violation_rate']:.3f}" for c, v in s["classes"].items()), file=sys.stderr)
        results[system] = {"points": points,
                           "capacity": {c: capacity(points, c, args.epsilon) for c in DEFAULT_SLO_CLASSES}}
    classes = list(DEFAULT_SLO_CLASSES)
    rows = []
    for system, r in results.items():
        ours = [r["capacity"][c] for c in classes]
        theirs = WISP_TABLE2_QWEN3_32B.get(system)
        rows.append([f"{system} (simulated)", *ours])
        if theirs:
            rows.append([f"{system} (WISP Table 2)", *theirs])
    for base in ("sled", "centralized"):
        if "wisp" in results and base in results:
            ours = [C.ratio(results["wisp"]["capacity"][c], results[base]["capacity"][c]) for c in classes]
            theirs = [w / b for w, b in zip(WISP_TABLE2_QWEN3_32B["wisp"], WISP_TABLE2_QWEN3_32B[base])]
            rows.append([f"wisp/{base} (simulated)", *[C.fmt(x) for x in ours]])
            rows.append([f"wisp/{base} (WISP)", *[C.fmt(x) for x in theirs]])
    print(C.table(["SIMULATION, capacity (devices)", *[f"{c} {DEFAULT_SLO_CLASSES[c]:g} tok/s" for c in classes]],
                  rows))
    payload = {"simulation": True, "pair_traces": args.pair, "settings": vars(args),
               "coefficients_ms": WISP_A100_QWEN3_32B.__dict__, "wisp_table2_qwen3_32b": WISP_TABLE2_QWEN3_32B,
               "systems": results, "machine": C.machine()}
    path = C.write_result(args.out, payload)
    plot_sweep({"systems": results, "epsilon": args.epsilon}, path.with_suffix(".png"), label="SIMULATION: ")
    print(path)


if __name__ == "__main__":
    main()
