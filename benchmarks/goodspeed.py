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

With --sim the same devices run in benchmarks/gpu_sim.py's discrete-event simulation
instead (A SIMULATION: WISP's A100 coefficients for Qwen3-32B, virtual time, the
verifier's own `Budgets` and scheduler code, the 128-token recordings), where --duration
is virtual seconds and --repeats seeds are cheap. `summary` draws every configuration's
utility curves side by side and checks GOODSPEED against the baselines in each.

    python -m benchmarks goodspeed --devices 4 --duration 300 --switch
    python -m benchmarks goodspeed --sim --devices 8 --duration 600 --repeats 5
    python -m benchmarks goodspeed summary benchmarks/results/goodspeed_*.json
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from pathlib import Path

import numpy as np

from benchmarks import harness as C
from benchmarks.rigs.fleet_runs import (
    controller_factory,
    draft_fingerprint,
    goodspeed_figures,
    machine_traces,
    verifier,
)
from benchmarks.rigs.fleet_sim import DeviceSpec, Fleet, weakened
from edgekit.config import ServerConfig

SYSTEMS = {"goodspeed": "fcfs+goodspeed", "fixed-s": "fcfs+fixed", "random-s": "fcfs+random"}
CODE, OTHER = tuple(range(0, 5)), tuple(range(5, 12))  # the first 12 evaluation prompts: 5 code, then the rest


def pools(n: int, switch: bool, weak: bool) -> list[tuple[tuple[int, ...], tuple[int, ...] | None]]:
    """Each device's traces and those after the switch: code and the other kinds alternate, and
    with `weak` every other pair of devices drafts with the weakened traces (indices past the
    first 12, see `with_weak`)."""
    out = []
    for i in range(n):
        first, then = (CODE, OTHER) if i % 2 == 0 else (OTHER, CODE)
        if weak and (i // 2) % 2:
            first, then = tuple(t + 12 for t in first), tuple(t + 12 for t in then)
        out.append((first, then if switch else None))
    return out


def with_weak(traces: list, p: float) -> list:  # type: ignore[type-arg]
    """The traces, then each as a draft that misses a share p of its tokens more would draft it."""
    if not p:
        return traces
    vocab = 1 + max(max(t.target) for t in traces)
    return traces + [weakened(t, p, vocab, seed=k) for k, t in enumerate(traces)]


def specs(n: int, seed: int, switch_s: float | None, weak: bool = False) -> list[DeviceSpec]:
    rng = random.Random(seed)
    return [DeviceSpec(None, None, speed_factor=rng.uniform(1.0, 1.5), rtt_ms=rng.uniform(10, 40), traces=first,
                       switch_s=switch_s, traces_after=then) for first, then in pools(n, switch_s is not None, weak)]


def run_fleet(name: str, args: argparse.Namespace, seed: int) -> Fleet:
    """One system on the real verifier (`edgekit serve`) with simulated devices."""
    traces, meta = machine_traces(args.pair, threads=args.threads)
    traces = with_weak(traces, args.weak)
    capacity = args.token_budget or 4 * args.devices
    log = C.RESULTS_DIR / f"{args.out}-{name}-verifier.log"
    extra = ["--budget-eta", str(args.eta), "--budget-beta", str(args.beta)]
    with verifier(args.pair, SYSTEMS[name], max(args.devices, 2), args.threads, "exact", log, capacity,
                  extra) as addr:
        return Fleet(addr, draft_fingerprint(meta), traces,
                     specs(args.devices, seed, args.duration / 2 if args.switch else None, args.weak > 0),
                     controller=controller_factory("budget", args.pair, meta["window"], 4),
                     duration=args.duration, max_window=meta["window"], seed=seed).run()


class Simulated:
    """One system in the discrete-event simulation (rigs/event_sim.py), its rounds as a Fleet's."""

    def __init__(self, name: str, args: argparse.Namespace, seed: int) -> None:
        from benchmarks.rigs import event_sim
        from benchmarks.rigs.fleet_runs import traces_path
        from benchmarks.rigs.fleet_sim import load_traces

        sim_args = event_sim.settings()
        traces, meta = load_traces(traces_path(args.pair, 128))
        traces = with_weak(traces, args.weak)
        sim_args.window, sim_args.seed, sim_args.horizon, sim_args.warmup = meta["window"], seed, args.duration, 0.0
        sim_args.token_budget = args.token_budget or 4 * args.devices
        sim_args.budget_eta, sim_args.budget_beta = args.eta, args.beta
        sim = event_sim.Simulation(name, args.devices, traces, sim_args,
                                 controller_factory("budget", args.pair, meta["window"], 4),
                                 pools=pools(args.devices, args.switch, args.weak > 0),
                                 switch_s=args.duration / 2 if args.switch else None, log_rounds=True).run()
        self.rounds = sim.log or []
        self.errors: list = []


def main() -> None:
    if sys.argv[1:2] == ["summary"]:
        summary(sys.argv[2:])
        return
    if sys.argv[1:2] == ["sweep"]:
        sweep(sys.argv[2:])
        return
    ap = C.arguments(__doc__, threads=None, pair="gemma-270m", repeats=1, out=None)
    ap.add_argument("--devices", type=int, default=4)
    ap.add_argument("--duration", type=float, default=300.0, help="seconds per system (virtual with --sim)")
    ap.add_argument("--rounds", type=int, default=600, help="rounds per device the utility is followed over")
    ap.add_argument("--token-budget", type=int, default=0, help="C (0: 4 per device)")
    ap.add_argument("--switch", action="store_true", help="every device's prompts change kind halfway")
    ap.add_argument("--weak", type=float, default=0.0,
                    help="every other pair of devices drafts with a weaker draft: each token missed with this "
                    "probability more (heterogeneous drafts, as GOODSPEED's clients)")
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--sim", action="store_true", help="in the GPU-scale discrete-event simulation (gpu_sim.py)")
    ap.add_argument("--seed", type=int, default=0, help="the first run's seed; --repeats runs: seed, seed+1, ...")
    ap.add_argument("--eta", type=float, default=ServerConfig().budget_eta, help="the verifier's budget_eta (eq. 3)")
    ap.add_argument("--beta", type=float, default=ServerConfig().budget_beta, help="the verifier's budget_beta (eq. 4)")
    # Its own --threads, default None (the harness's is an int): unset, the verifier and any
    # recording keep edgekit's default (EDGEKIT_THREADS, or all cores).
    ap.add_argument("--threads", type=int, default=None)
    args = C.parse(ap)
    beta = args.beta
    args.out = args.out or (f"goodspeed_{'sim_' if args.sim else ''}{args.pair}_n{args.devices}"
                            f"{'_switch' if args.switch else ''}{f'_weak{args.weak:g}' if args.weak else ''}")
    results: dict[str, dict] = {}
    repeats: dict[str, list[dict]] = {}
    for name in C.csv_list(args.systems):
        for seed in range(args.seed, args.seed + args.repeats):
            run = Simulated(name, args, seed) if args.sim else run_fleet(name, args, seed)
            r = goodspeed_figures(run, args.devices, args.rounds, beta)
            results.setdefault(name, r)  # the figures of the first seed; the others' headlines below
            repeats.setdefault(name, []).append({"seed": seed, **{k: r[k] for k in HEADLINE}})
            C.progress(f"{name} seed {seed}: utility {r['utility_final']:.3f} after {r['horizon']} rounds "
                       f"(converged at {r['converged_round']}), goodput {r['goodput_tokens_per_s']:.1f} tok/s, "
                       f"Jain {r['jain']:.3f}, mean block {r['drafted_mean']:.1f}, errors: {r['errors'] or 'none'}")
    C.write_result(args.out, {"settings": vars(args), "simulation": args.sim, "machine": C.machine(),
                              "capacity": args.token_budget or 4 * args.devices, "results": results,
                              "repeats": repeats})
    plot(results, C.RESULTS_DIR / f"{args.out}.png", args)


def sweep(argv: list[str]) -> None:
    """The defaults of eta and beta, measured: GOODSPEED's utility after --rounds rounds per device
    in the simulation, over seeds, for each (eta, beta), beside Fixed-S's and Random-S's."""
    ap = C.arguments(None, threads=None, pair="gemma-270m", repeats=8)
    ap.prog, ap.description = "goodspeed.py sweep", sweep.__doc__  # all of it, reflowed
    ap.add_argument("--devices", default="4,8")
    ap.add_argument("--weak", default="0,0.3")
    ap.add_argument("--beta", default="0.5,0.2,0.1,0.05")
    ap.add_argument("--eta", default="0.05,0.2")
    ap.add_argument("--duration", type=float, default=75.0, help="virtual seconds (the switch at half)")
    ap.add_argument("--rounds", type=int, default=600)
    a = C.parse(ap, argv)
    grid: list[dict] = []

    def mean_utility(system: str, n: int, weak: float, eta: float, beta: float) -> float:
        run_args = argparse.Namespace(pair=a.pair, devices=n, duration=a.duration, switch=True, weak=weak,
                                      token_budget=0, eta=eta, beta=beta)
        return float(np.mean([goodspeed_figures(Simulated(system, run_args, seed), n, a.rounds, beta)["utility_final"]
                              for seed in range(a.repeats)]))

    configs = [(n, w) for n in C.csv_list(a.devices, int) for w in C.csv_list(a.weak, float)]
    for n, w in configs:
        base = {name: mean_utility(name, n, w, 0.05, 0.5) for name in ("fixed-s", "random-s")}
        for eta in C.csv_list(a.eta, float):
            for beta in C.csv_list(a.beta, float):
                u = mean_utility("goodspeed", n, w, eta, beta)
                grid.append({"devices": n, "weak": w, "eta": eta, "beta": beta, "utility": u, **base})
                C.progress(f"n={n} weak={w:g} eta={eta:g} beta={beta:g}: goodspeed {u:.3f}, fixed-s "
                           f"{base['fixed-s']:.3f}, random-s {base['random-s']:.3f}")
    C.write_result("goodspeed_sweep", {"settings": vars(a), "simulation": True, "grid": grid})
    fig, axes = C.subplots(len(configs), width=3.6)
    for ax, (n, w) in zip(axes, configs, strict=True):
        rows = [g for g in grid if g["devices"] == n and g["weak"] == w]
        for eta in sorted({g["eta"] for g in rows}):
            pts = sorted((g["beta"], g["utility"]) for g in rows if g["eta"] == eta)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"goodspeed, eta {eta:g}")
        for name, style in (("fixed-s", "--"), ("random-s", ":")):
            ax.axhline(rows[0][name], linestyle=style, color="grey", label=name)
        betas = sorted({g["beta"] for g in rows})
        ax.set_xscale("log")
        ax.minorticks_off()
        ax.set_xticks(betas, [f"{b:g}" for b in betas])
        ax.set_xlabel("beta (eq. 4)")
        ax.set_ylabel(f"utility after {a.rounds} rounds")
        ax.set_title(f"SIM n={n}, kinds switch{f', weak {w:g}' if w else ''}")
    axes[0].legend(fontsize=7)
    print(f"figure: {C.save_figure(fig, C.RESULTS_DIR / 'goodspeed_sweep.png')}")


HEADLINE = ("utility_final", "horizon", "converged_round", "goodput_tokens_per_s", "jain", "drafted_mean")


def summary(paths: list[str]) -> None:
    """Every configuration's utility curves side by side, and GOODSPEED against each baseline in each
    (over its repeats where it has them: the mean, and in how many seeds it is ahead)."""
    runs = [json.loads(Path(p).read_text()) for p in paths]
    runs = [r for r in runs if "results" in r and "goodspeed" in r["results"]]
    if not runs:
        raise SystemExit("no goodspeed results among those files")
    runs.sort(key=lambda r: (r.get("simulation", False), r["settings"]["devices"], r["settings"]["switch"],
                             r["settings"].get("weak", 0.0)))
    rows, verdicts = [], []
    cols = min(len(runs), 4)
    fig, axes = C.subplots(cols, nrows=-(-len(runs) // cols), width=3.6, height=3.2)
    for ax in axes[len(runs):]:
        ax.set_visible(False)
    for ax, run in zip(axes, runs, strict=False):
        st = run["settings"]
        label = (f"{'SIM ' if run.get('simulation') else 'CPU '}n={st['devices']}"
                 f"{' switch' if st['switch'] else ''}{' weak' if st.get('weak') else ''}")
        for name, r in run["results"].items():
            ax.plot(range(1, len(r["utility"]) + 1), r["utility"], label=name)
        ax.set_title(label)
        ax.set_xlabel("rounds per device (T)")
        ax.set_ylabel("sum_i log x_bar_i(T)")
        reps = run.get("repeats") or {k: [{k2: v[k2] for k2 in HEADLINE}] for k, v in run["results"].items()}
        mean = {k: {h: float(np.mean([x[h] for x in v if x[h] is not None] or [math.nan])) for h in HEADLINE}
                for k, v in reps.items()}
        for name, m in mean.items():
            rows.append([label, name, len(reps[name]), m["utility_final"], m["goodput_tokens_per_s"], m["jain"],
                         m["converged_round"], m["drafted_mean"]])
        ours = reps["goodspeed"]
        for base in (b for b in reps if b != "goodspeed"):
            ahead = sum(a["utility_final"] > b["utility_final"] for a, b in zip(ours, reps[base], strict=False))
            gp = C.ratio(mean["goodspeed"]["goodput_tokens_per_s"], mean[base]["goodput_tokens_per_s"])
            verdicts.append([label, base, mean["goodspeed"]["utility_final"] - mean[base]["utility_final"],
                             f"{ahead}/{min(len(ours), len(reps[base]))}", gp])
    axes[0].legend()
    print(C.table(["configuration", "system", "runs", "utility", "goodput tok/s", "Jain", "converged", "mean block"],
                  rows, digits=3))
    print()
    print(C.table(["configuration", "baseline", "utility: goodspeed - baseline", "seeds goodspeed ahead",
                   "goodput goodspeed / baseline"], verdicts, digits=3))
    C.write_result("goodspeed_summary", {"inputs": paths, "rows": rows, "verdicts": verdicts})
    print(f"figure: {C.save_figure(fig, C.RESULTS_DIR / 'goodspeed_summary.png')}")


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
