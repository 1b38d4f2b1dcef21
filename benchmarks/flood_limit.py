"""One device flooding a verifier, with and without the shipped HAProxy config's per-client limit.

64 honest devices drafting instantly against one verifier at zero model cost (serve_load.py's
`zero` kind, verifier on core 0), through deploy/'s HAProxy config (HAProxy on the generator's
cores), while one more device keeps N Verify calls in flight, each sent again the moment it is
answered or refused. Points: the shipped limit (200 calls a second per client) and none, each at
N = 0, 64, 512; the honest devices' rounds a second, how evenly they are served, and what the
flooder got. serve_load.py without --proxy gives the same flood straight to the verifier.

    python -m benchmarks flood_limit                      # six serve_load.py runs, ~3 min
    python -m benchmarks flood_limit --from-results       # table and figure from their stored JSON
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import benchmarks
from benchmarks import harness as C

FLOODS = (0, 64, 512)
RATES = {200: "shipped limit, 200 calls/s per client", 0: "no limit"}


def _name(rate: int, flood: int) -> str:
    return f"serve_load_proxy_r{rate}_f{flood}"


def run(duration: float) -> None:
    for rate in RATES:
        for flood in FLOODS:
            benchmarks.run("serve_load", ["--devices", "64", "--kinds", "zero", "--duration", str(duration),
                                          "--profile", "", "--proxy", "haproxy", "--client-rate", str(rate),
                                          "--flood", str(flood), "--out", _name(rate, flood)])


def collect() -> list[dict[str, Any]]:
    rows = []
    for rate in RATES:
        for flood in FLOODS:
            (p,) = json.loads((C.RESULTS_DIR / f"{_name(rate, flood)}.json").read_text())["points"]
            f = p.get("flood") or {}
            rows.append({"client_rate": rate, "flood_calls_in_flight": flood, "honest_rounds_per_s": p["rounds_per_s"],
                         "honest_jain": p["device_rounds"]["jain"], "rtt_p50_ms": p["rtt_ms"]["p50"],
                         "flooder_answered_per_s": f.get("calls_per_s", 0.0),
                         "flooder_refused": sum(f.get("refused", {}).values()),
                         "verifier_cpu": p["verifier_cpu_share"], "generator_cpu": max(p["loadgen"]["cpu_share"]),
                         "errors": sum(p["errors"].values())})
    return rows


def plot(result: dict[str, Any], png: Path) -> None:
    fig, (ax,) = C.subplots(width=6.5)
    for rate, label in RATES.items():
        rows = [r for r in result["rows"] if r["client_rate"] == rate]
        ax.plot([str(r["flood_calls_in_flight"]) for r in rows], [r["honest_rounds_per_s"] for r in rows], "o-",
                label=label)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("one device's Verify calls in flight")
    ax.set_ylabel("64 honest devices' rounds / s")
    ax.set_title("A flooding device behind HAProxy, zero model cost")
    ax.legend(fontsize=8)
    C.save_figure(fig, png)


def main() -> None:
    ap = C.arguments(__doc__, threads=None)  # no model here; serve_load.py's runs print their machine
    ap.add_argument("--duration", type=float, default=6.0)
    ap.add_argument("--from-results", action="store_true", help="the stored runs' table and figure, nothing run")
    args = C.parse(ap, machine=False)
    if not args.from_results:
        run(args.duration)
    rows = collect()
    keys = ["client_rate", "flood_calls_in_flight", "honest_rounds_per_s", "honest_jain", "rtt_p50_ms",
            "flooder_answered_per_s", "flooder_refused", "verifier_cpu", "generator_cpu", "errors"]
    print(C.table(keys, [[r[k] for k in keys] for r in rows]))
    path = C.write_result("flood_limit", {"settings": vars(args), "rows": rows})
    plot({"rows": rows}, path.with_suffix(".png"))
    print(f"wrote {path} and {path.with_suffix('.png').name}")


if __name__ == "__main__":
    main()
