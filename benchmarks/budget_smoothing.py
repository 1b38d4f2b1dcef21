"""How fast should a session's acceptance estimate move? GOODSPEED eq. 3's eta, measured on
recorded drafting.

A device replays the pair's recorded traces (`fleet.py record`: the target's greedy output
and, at every position, the draft's continuation), drafting blocks of S tokens, and its
prompts change kind halfway (code, then prose and arithmetic): its acceptance is
non-stationary, as GOODSPEED's devices are. Each round gives the verifier one observation,
the share of the block accepted, and the estimate moves by eta towards it (eq. 3). The
share accepted before the first rejection stands in for eq. 3's mean of min(1, p/q) over
the whole block, which a trace cannot give past the first mismatch (the target never saw
that prefix); both are noisy observations of the same rate, and eta trades their noise
against the lag after a change.

For each eta: the estimate's error against the kind's true acceptance rate (the mean
share over all positions of that kind's traces), in steady state and over the 50 rounds
after the switch, averaged over many shuffled runs.

    python -m benchmarks budget_smoothing
"""

from __future__ import annotations

import random

import numpy as np

from benchmarks import harness as C
from benchmarks.rigs.fleet_runs import traces_path
from benchmarks.rigs.fleet_sim import load_traces

KINDS = {"code": range(0, 5), "other": range(5, 12)}  # the first 12 evaluation prompts: 5 code, 5 prose, 2 math


def shares(trace, s: int) -> list[float]:  # type: ignore[no-untyped-def]
    """At every position of the trace, the share of an S-token block the target accepts."""
    return [trace.accepted(i, trace.drafts[i][:s]) / s for i in range(len(trace.target))]


def run(per_kind: dict[str, list[float]], truth: dict[str, float], etas: list[float], rounds: int,
        rng: random.Random) -> dict[float, np.ndarray]:
    """One device: `rounds` rounds of code, then `rounds` of the other kinds; each eta's error per round."""
    seq = [("code", rng.choice(per_kind["code"])) for _ in range(rounds)]
    seq += [("other", rng.choice(per_kind["other"])) for _ in range(rounds)]
    out = {}
    for eta in etas:
        alpha = 0.5
        err = np.empty(len(seq))
        for t, (kind, obs) in enumerate(seq):
            alpha = (1 - eta) * alpha + eta * obs
            err[t] = abs(alpha - truth[kind])
        out[eta] = err
    return out


def main() -> None:
    ap = C.arguments(__doc__, threads=None, pair="gemma-270m", out="budget_smoothing")
    ap.add_argument("--block", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=300, help="rounds per kind")
    ap.add_argument("--runs", type=int, default=200)
    args = C.parse(ap, machine=False)
    path = traces_path(args.pair)
    here = sorted(path.parent.glob(f"{path.stem}-*.json"))  # this machine's, if recorded (fleet.machine_traces)
    traces, meta = load_traces(here[0] if here else path)
    per_kind = {k: [x for i in idx for x in shares(traces[i], args.block)] for k, idx in KINDS.items()}
    truth = {k: float(np.mean(v)) for k, v in per_kind.items()}
    etas = [0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.8]
    rng = random.Random(0)
    errs = {eta: [] for eta in etas}
    for _ in range(args.runs):
        for eta, e in run(per_kind, truth, etas, args.rounds, rng).items():
            errs[eta].append(e)
    curves = {eta: np.mean(np.stack(v), axis=0) for eta, v in errs.items()}
    r = args.rounds
    summary = []
    for eta in etas:
        c = curves[eta]
        summary.append({
            "eta": eta,
            "steady_error": float(np.mean(np.concatenate([c[r // 2 : r], c[r + r // 2 :]]))),
            "after_switch_error": float(np.mean(c[r : r + 50])),
            "overall_error": float(np.mean(c)),
        })
        print(f"eta {eta:<5}: error steady {summary[-1]['steady_error']:.3f}, 50 rounds after the switch "
              f"{summary[-1]['after_switch_error']:.3f}, overall {summary[-1]['overall_error']:.3f}")
    best = min(summary, key=lambda x: x["overall_error"])
    print(f"true acceptance: code {truth['code']:.2f}, other {truth['other']:.2f}; least overall error at eta "
          f"{best['eta']}")
    C.write_result(args.out, {"settings": vars(args), "machine": C.machine(), "traces_machine": meta.get("machine"),
                              "truth": truth, "summary": summary, "best_eta": best["eta"]})
    fig, axes = C.subplots(2, width=6)
    for eta in (0.05, 0.2, 0.5):
        axes[0].plot(curves[eta], label=f"eta {eta}")
    axes[0].axvline(r, color="grey", ls="--", lw=0.8)
    axes[0].set_xlabel("round (the prompts change kind at the dashed line)")
    axes[0].set_ylabel("|alpha estimate - true acceptance| (mean of runs)")
    axes[0].set_title(f"Eq. 3's estimate, {args.pair}, blocks of {args.block}")
    xs = [s["eta"] for s in summary]
    axes[1].plot(xs, [s["steady_error"] for s in summary], "o-", label="steady state")
    axes[1].plot(xs, [s["after_switch_error"] for s in summary], "s-", label="50 rounds after the switch")
    axes[1].plot(xs, [s["overall_error"] for s in summary], "^-", label="overall")
    axes[1].set_xscale("log")
    axes[1].set_xticks(xs, [f"{x:g}" for x in xs])
    axes[1].minorticks_off()
    axes[1].set_xlabel("eta")
    axes[1].set_ylabel("mean absolute error")
    axes[1].set_title("Noise against lag")
    print(f"figure: {C.save_figure(fig, C.RESULTS_DIR / f'{args.out}.png')}")


if __name__ == "__main__":
    main()
