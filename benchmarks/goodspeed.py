"""Server-assigned draft budgets (GOODSPEED sec. IV) on the fleet simulator: GOODSPEED's gradient
scheduling against Fixed-S and Random-S in the same verifier.

Simulated devices replay recorded drafting (so any budget replays exactly) against
`edgekit serve --budgets SYSTEM --token-budget C`; each drafts what it is given. Half
the devices draw code prompts and half the others (prose, arithmetic), so their
acceptance differs; with --switch, every device's prompts change kind halfway
(non-stationary acceptance). Per system:

- the utility sum_i log x_bar_i(T) over each device's first T rounds (x_bar: tokens
  committed per round, GOODSPEED's x_i(t)), for T up to --rounds (Fig. 4), and the
  round from which it stays within 1% of its final value (convergence);
- total goodput (tokens/s) and Jain's fairness index over the devices' tokens/s;
- the smoothed goodput estimate (eq. 4, beta as the verifier's) against the measured
  tokens per round, moving averages of 10 (Fig. 2);
- where a round's time goes: the device drafting and sending ("receiving"), the queue
  and the target pass ("verification"), the verdict's way back ("sending") (Fig. 3).

    python benchmarks/goodspeed.py --devices 4 --duration 300 --switch
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C
import numpy as np
from _fleet import DeviceSpec, Fleet
from fleet import _draft_fingerprint, controller_factory, machine_traces, verifier

from edgekit.config import ServerConfig

SYSTEMS = {"goodspeed": "fcfs+goodspeed", "fixed-s": "fcfs+fixed", "random-s": "fcfs+random"}
CODE, OTHER = tuple(range(0, 5)), tuple(range(5, 12))  # the first 12 evaluation prompts: 5 code, then the rest


def specs(n: int, seed: int, switch_s: float | None) -> list[DeviceSpec]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        first, then = (CODE, OTHER) if i % 2 == 0 else (OTHER, CODE)
        out.append(DeviceSpec(None, None, speed_factor=rng.uniform(1.0, 1.5), rtt_ms=rng.uniform(10, 40),
                              traces=first, switch_s=switch_s, traces_after=then if switch_s else None))
    return out


def analyse(fleet: Fleet, n: int, rounds: int, beta: float) -> dict:
    per = {i: [r for r in sorted(fleet.rounds, key=lambda r: r.t) if r.device == i] for i in range(n)}
    horizon = min([rounds, *(len(v) for v in per.values())])
    utility = []
    for t in range(1, horizon + 1):
        utility.append(sum(math.log(max(np.mean([r.committed for r in per[i][:t]]), 1e-9)) for i in range(n)))
    final = utility[-1] if utility else float("nan")
    converged = next((t + 1 for t in range(len(utility)) if all(abs(u - final) <= 0.01 * abs(final)
                                                                 for u in utility[t:])), None)
    span = max(r.t for r in fleet.rounds) - min(r.t for r in fleet.rounds) if fleet.rounds else 1.0
    speeds = [sum(r.committed for r in per[i]) / span for i in range(n)]
    jain = sum(speeds) ** 2 / (n * sum(s * s for s in speeds)) if any(speeds) else float("nan")
    estimate, measured = [], []
    for i in range(n):
        x, est = 1.0, []
        for r in per[i]:
            x = (1 - beta) * x + beta * r.committed
            est.append(x)
        estimate.append(est)
        measured.append([r.committed for r in per[i]])
    return {
        "rounds_per_device": {i: len(v) for i, v in per.items()},
        "horizon": horizon,
        "utility": utility,
        "utility_final": final,
        "converged_round": converged,
        "goodput_tokens_per_s": sum(speeds),
        "device_tokens_per_s": speeds,
        "jain": jain,
        "drafted_mean": float(np.mean([r.drafted for r in fleet.rounds])) if fleet.rounds else 0.0,
        "time_split_ms": {  # GOODSPEED Fig. 3: until the block is at the verifier, there, and the way back
            "receiving": float(np.mean([r.draft_ms + r.link_ms / 2 for r in fleet.rounds])),
            "verification": float(np.mean([r.round_trip_ms for r in fleet.rounds])),
            "sending": float(np.mean([r.link_ms / 2 for r in fleet.rounds])),
        },
        "estimate": estimate[0][:horizon],
        "measured": measured[0][:horizon],
        "errors": fleet.errors,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", default="gemma-270m")
    ap.add_argument("--devices", type=int, default=4)
    ap.add_argument("--duration", type=float, default=300.0, help="seconds per system")
    ap.add_argument("--rounds", type=int, default=600, help="rounds per device the utility is followed over")
    ap.add_argument("--token-budget", type=int, default=0, help="C (0: 4 per device)")
    ap.add_argument("--switch", action="store_true", help="every device's prompts change kind halfway")
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    C.print_machine()
    traces, meta = machine_traces(args.pair, threads=args.threads)
    fingerprint = _draft_fingerprint(meta)
    capacity = args.token_budget or 4 * args.devices
    beta = ServerConfig().budget_beta
    out = args.out or f"goodspeed_{args.pair}_n{args.devices}{'_switch' if args.switch else ''}"
    results = {}
    for name in C.csv_list(args.systems):
        log = C.RESULTS_DIR / f"{out}-{name}-verifier.log"
        with verifier(args.pair, SYSTEMS[name], max(args.devices, 2), args.threads, "exact", log, capacity) as addr:
            fleet = Fleet(addr, fingerprint, traces, specs(args.devices, args.seed,
                                                           args.duration / 2 if args.switch else None),
                          controller=controller_factory("budget", args.pair, meta["window"], 4),
                          duration=args.duration, max_window=meta["window"], seed=args.seed).run()
        results[name] = analyse(fleet, args.devices, args.rounds, beta)
        r = results[name]
        C.progress(f"{name}: utility {r['utility_final']:.3f} after {r['horizon']} rounds (converged at "
                   f"{r['converged_round']}), goodput {r['goodput_tokens_per_s']:.1f} tok/s, Jain {r['jain']:.3f}, "
                   f"mean block {r['drafted_mean']:.1f}, errors: {r['errors'] or 'none'}")
    C.write_result(out, {"settings": vars(args), "machine": C.machine(), "capacity": capacity, "results": results})
    plot(results, C.RESULTS_DIR / f"{out}.png", args)


def plot(results: dict, path: Path, args: argparse.Namespace) -> None:
    fig, axes = C.subplots(3, width=5.0)
    for name, r in results.items():
        axes[0].plot(range(1, len(r["utility"]) + 1), r["utility"], label=name)
    axes[0].set_xlabel("rounds per device (T)")
    axes[0].set_ylabel("sum_i log x_bar_i(T)")
    axes[0].set_title(f"Utility, {args.devices} devices{' (kinds switch)' if args.switch else ''}")
    r = results.get("goodspeed") or next(iter(results.values()))

    def ma(xs: list[float]) -> np.ndarray:
        return np.convolve(xs, np.ones(10) / 10, mode="valid") if len(xs) >= 10 else np.array(xs)

    axes[1].plot(ma(r["measured"]), label="measured (MA 10)")
    axes[1].plot(ma(r["estimate"]), label="estimate, eq. 4 (MA 10)")
    axes[1].set_xlabel("round of device 0")
    axes[1].set_ylabel("tokens per round")
    axes[1].set_title("Goodput estimate against measured")
    names = list(results)
    bottom = np.zeros(len(names))
    for part in ("receiving", "verification", "sending"):
        vals = np.array([results[n]["time_split_ms"][part] for n in names])
        axes[2].bar(names, vals, bottom=bottom, label=part)
        bottom += vals
    axes[2].set_ylabel("ms per round (mean)")
    axes[2].set_title("Where a round's time goes")
    print(f"figure: {C.save_figure(fig, path)}")


if __name__ == "__main__":
    main()
