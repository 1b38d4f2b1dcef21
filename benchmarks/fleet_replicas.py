"""Capacity against replicas: 1, 2, 3 verifiers behind HAProxy (or nginx) with deploy/'s config,
loaded by the fleet simulator (issue 38, item 5).

For each replica count R, R `edgekit serve` processes start on the same machine (each with room
for every device), the proxy balances them by consistent hash on each device's client id, and
N simulated devices (`benchmarks/fleet.py`: traces of the real draft replayed, real rounds
against the real target) run for --duration seconds per N. Per R: goodput against N and the
devices served within each SLO class (WISP eq. 20, Cap(tau) at --epsilon); ideal scaling is
R times R=1's capacity.

    python -m benchmarks fleet_replicas [--replicas 1,2,3] [--devices 4,8,16,32] [--systems fcfs]
        [--proxy haproxy] [--gpu-layers -1] [--out benchmarks/results]

What limits it: the replicas share this machine. On a 2-core CPU box three replicas share two
cores with the simulator, so the curve says how the hash spreads devices and what a proxy
costs, not what three machines would serve; on a GPU machine the replicas share one GPU (a
small target leaves it mostly idle: a replica is bound by its own Python work per token).
Writes OUT/fleet_replicas_<pair>[_TAG].json and .png.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from benchmarks import harness as C
from benchmarks.rigs import peers as P

PAIR = "gemma-270m"
NAMES = ("gemma-3-270m-q4_0", "gemma-3-270m")


def plot(payload: dict, png: Path) -> None:
    from edgekit.config import DEFAULT_SLO_CLASSES

    fig, axes = C.subplots(3, nrows=1, width=4.6, height=3.6)
    runs = payload["replicas"]
    counts = sorted(int(r) for r in runs)
    system = payload["systems"][0]
    for i, cls in enumerate(DEFAULT_SLO_CLASSES):
        caps = [runs[str(r)]["systems"][system]["capacity"][cls] for r in counts]
        axes[0].plot(counts, caps, marker="o", color=f"C{i}", label=cls)
        axes[0].plot(counts, [caps[0] * r / counts[0] for r in counts], ls=":", color=f"C{i}", lw=1)
    axes[0].set(xlabel="replicas", ylabel="devices within SLO (Cap)", title=f"capacity ({system}; dotted: linear)")
    axes[0].set_xticks(counts)
    axes[0].legend(fontsize=7)
    peaks = [runs[str(r)]["systems"][system]["peak_goodput"] for r in counts]
    axes[1].plot(counts, peaks, marker="o", label="measured")
    axes[1].plot(counts, [peaks[0] * r / counts[0] for r in counts], ls=":", color="grey", label="linear")
    axes[1].set(xlabel="replicas", ylabel="committed tokens/s", title="peak goodput")
    axes[1].set_xticks(counts)
    axes[1].legend(fontsize=7)
    for i, r in enumerate(counts):
        pts = runs[str(r)]["systems"][system]["points"]
        axes[2].plot([p["devices"] for p in pts], [p["goodput_tokens_per_s"] for p in pts], marker="o",
                     color=f"C{i}", label=f"{r} replica{'s' if r > 1 else ''}")
    axes[2].set(xlabel="devices N", ylabel="committed tokens/s", title=f"goodput behind {payload['proxy']}")
    axes[2].legend(fontsize=7)
    fig.suptitle(payload.get("label", ""), fontsize=9)
    C.save_figure(fig, png)


def main(argv: list[str] | None = None) -> None:
    # --out is a folder here (OUT/fleet_replicas_<pair>[_TAG].json), not the common result name.
    ap = C.arguments(__doc__, whole_doc=True, replot=True, threads=None, prompts=8)
    ap.add_argument("--replicas", default="1,2,3")
    ap.add_argument("--devices", default="4,8,16,32")
    ap.add_argument("--systems", default="fcfs", help="fleet systems (benchmarks/fleet.py), the first is plotted")
    ap.add_argument("--proxy", default="haproxy", choices=["haproxy", "nginx"])
    ap.add_argument("--duration", type=float, default=12.0, help="seconds per point")
    ap.add_argument("--gpu-layers", type=int, default=0)
    ap.add_argument("--numerics", default=None, help="exact (default on the CPU) or fast (default on a GPU)")
    ap.add_argument("--epsilon", type=float, default=0.05)
    ap.add_argument("--dry-run", action="store_true", help="1 and 2 replicas, 2 devices, a few seconds")
    ap.add_argument("--out", default=str(C.RESULTS_DIR))
    ap.add_argument("--tag", default="")
    ap.add_argument("--logs", default="build/fleet_replicas")
    args = C.parse(ap, argv, plot=plot, machine=False)
    from edgekit.models import get_pair, model_path

    if args.dry_run:
        args.replicas, args.devices, args.duration, args.prompts = "1,2", "2", 4.0, 2
    spec = get_pair(PAIR)
    draft, target = model_path(spec.draft), model_path(spec.target)
    fa = argparse.Namespace(fleet_devices=C.csv_list(args.devices, int), fleet_systems=C.csv_list(args.systems),
                            fleet_duration=args.duration, fleet_prompts=args.prompts, gpu_layers=args.gpu_layers,
                            numerics=args.numerics or ("fast" if args.gpu_layers else "exact"),
                            logs=args.logs, epsilon=args.epsilon)
    Path(args.logs).mkdir(parents=True, exist_ok=True)
    started = time.time()
    payload: dict = {"benchmark": "fleet_replicas", "command": " ".join(sys.argv), "machine": C.machine(),
                     "pair": PAIR, "proxy": args.proxy, "systems": fa.fleet_systems, "devices": fa.fleet_devices,
                     "duration_s": args.duration, "numerics": fa.numerics, "gpu_layers": args.gpu_layers,
                     "epsilon": args.epsilon, "replicas": {}}
    for r in C.csv_list(args.replicas, int):
        C.progress(f"{r} replica(s) behind {args.proxy}")
        payload["replicas"][str(r)] = P.fleet(fa, draft, target, pair=PAIR, names=NAMES, replicas=r, proxy=args.proxy)
    payload["wall_s"] = time.time() - started
    payload["label"] = f"{PAIR}, {payload['machine']['cpu']}, {payload['machine']['cores']} cores" + (
        f", GPU layers {args.gpu_layers}" if args.gpu_layers else "")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = f"fleet_replicas_{PAIR}" + (f"_{args.tag}" if args.tag else "")
    with open(out / f"{name}.json", "w", encoding="utf-8") as f:
        json.dump(payload, f, indent=2, default=C.json_default)
    plot(payload, out / f"{name}.png")
    system = fa.fleet_systems[0]
    print(C.table(["replicas", "capacity per class", "peak goodput tok/s"],
                  [[r, v["systems"][system]["capacity"], C.fmt(v["systems"][system]["peak_goodput"])]
                   for r, v in payload["replicas"].items()]))
    print(f"wrote {out / name}.json in {payload['wall_s']:.0f} s")


if __name__ == "__main__":
    main()
