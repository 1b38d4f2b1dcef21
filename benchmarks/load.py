"""Load: 64 concurrent sessions against the real verifier for 10 minutes.

The fleet simulator's devices (`rigs/fleet_sim.py`: recorded drafting traces replayed as
real gRPC rounds, so no 64 draft models) run against `edgekit serve` in a process
of its own. Every verdict is checked against the trace, which holds the target's
own greedy output: a device whose committed text would differ from target-only
decoding stops with an error, and the run reports it. Each device opens a session
per response, drafts, verifies and closes it, and starts the next at once.

Reported: sessions opened and finished, rounds, committed tokens, errors (must be
none), the round latency a device sees (the verify call: queue, verification and
loopback; p50, p90, p99, max) and the verifier's resident memory sampled every few
seconds (start, peak, end; after the devices stop and their sessions close).

    python -m benchmarks load --devices 64 --duration 600
"""

from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path

from benchmarks import harness as C
from benchmarks.rigs.fleet_runs import draft_fingerprint, machine_traces
from benchmarks.rigs.fleet_sim import DeviceSpec, Fleet
from benchmarks.rigs.verifier_process import serve_process
from edgekit.drafting import FixedWindow


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status", encoding="utf-8") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    ap = C.arguments(__doc__, threads=None, pair="gemma-270m", out="load")
    ap.add_argument("--devices", type=int, default=64)
    ap.add_argument("--duration", type=float, default=600.0)
    ap.add_argument("--k", type=int, default=4, help="the devices' fixed draft window")
    ap.add_argument("--max-context", type=int, default=512, help="the verifier's tokens per session")
    ap.add_argument("--policy", default="fcfs")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sample-every", type=float, default=5.0, help="seconds between memory samples")
    ap.add_argument("--threads", type=int, default=None,
                    help="the verifier's threads (edgekit serve --threads) and EDGEKIT_THREADS; default: edgekit's")
    args = C.parse(ap)
    traces, meta = machine_traces(args.pair, threads=args.threads)
    fingerprint = draft_fingerprint(meta)
    serve = ["--pair", args.pair, "--max-sessions", str(args.devices), "--max-context", str(args.max_context),
             "--policy", args.policy] + (["--threads", str(args.threads)] if args.threads else [])
    memory: list[tuple[float, float, str]] = []  # (seconds since the devices began, MB, phase)
    with serve_process(serve, C.RESULTS_DIR / f"{args.out}-verifier.log") as served:
        t0 = time.perf_counter()
        phase = ["idle"]
        memory.append((0.0, rss_mb(served.pid), "before"))
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(args.sample_every):
                memory.append((time.perf_counter() - t0, rss_mb(served.pid), phase[0]))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        rng = random.Random(args.seed)
        specs = [DeviceSpec(None, None, speed_factor=rng.uniform(1.0, 2.0), rtt_ms=rng.uniform(10, 60),
                            uplink_mbps=rng.uniform(5, 50), downlink_mbps=rng.uniform(10, 100))
                 for _ in range(args.devices)]
        phase[0] = "load"
        fleet = Fleet(served.address, fingerprint, traces, specs, controller=lambda: FixedWindow(args.k),
                      duration=args.duration, max_window=meta["window"], seed=args.seed, timeout=300.0).run()
        phase[0] = "after"
        time.sleep(3 * args.sample_every)  # the sessions are closed: what stays resident
        stop.set()
        sampler.join()
        memory.append((time.perf_counter() - t0, rss_mb(served.pid), "after"))
        alive = os.path.exists(f"/proc/{served.pid}")
    calls = [r.round_trip_ms for r in fleet.rounds]
    queue = [r.queue_ms for r in fleet.rounds]
    verify = [r.verify_ms for r in fleet.rounds]
    load_mem = [m for _, m, ph in memory if ph == "load"]
    result = {
        "settings": vars(args),
        "machine": C.machine(),
        "devices": args.devices,
        "sessions_finished": len(fleet.responses),
        "responses_to_the_end": sum(r.tokens == len(traces[0].target) for r in fleet.responses),
        "rounds": len(fleet.rounds),
        "committed_tokens": sum(r.committed for r in fleet.rounds),
        "errors": fleet.errors,
        "verifier_alive": alive,
        "round_ms": {q: C.percentile(calls, q) for q in (50, 90, 99, 100)},
        "queue_ms": {q: C.percentile(queue, q) for q in (50, 99)},
        "verify_ms": {q: C.percentile(verify, q) for q in (50, 99)},
        "memory_mb": {
            "before": memory[0][1],
            "load_peak": max(load_mem) if load_mem else None,
            "load_last": load_mem[-1] if load_mem else None,
            "after": memory[-1][1],
        },
        "memory_samples": memory,
        "round_samples": [(r.t, r.round_trip_ms) for r in fleet.rounds],
    }
    C.write_result(args.out, result)
    m = result["memory_mb"]
    print(f"{args.devices} devices, {args.duration:g} s: {result['sessions_finished']} sessions finished, "
          f"{result['rounds']} rounds, {result['committed_tokens']} tokens, errors: {fleet.errors or 'none'}")
    print("round latency ms: " + ", ".join(f"p{q} {v:.0f}" for q, v in result["round_ms"].items()))
    print(f"verifier RSS MB: before {m['before']:.0f}, peak {m['load_peak']:.0f}, after {m['after']:.0f}")
    plot(result, C.RESULTS_DIR / f"{args.out}.png")


def plot(result: dict, path: Path) -> None:
    fig, axes = C.subplots(2, width=5.5)
    ax = axes[0]
    t = [s[0] for s in result["memory_samples"]]
    mb = [s[1] for s in result["memory_samples"]]
    ax.plot(t, mb, ".-")
    ax.axvline(result["settings"]["duration"], color="grey", ls="--", lw=0.8, label="devices stop")
    ax.set_xlabel("seconds")
    ax.set_ylabel("verifier RSS (MB)")
    ax.set_ylim(0, max(mb) * 1.15)
    ax.set_title(f"Verifier memory, {result['devices']} concurrent sessions")
    ax.legend()
    ax = axes[1]
    rt = result["round_samples"]
    # Per 30 s window: p50 and p99 of the round latency devices saw.
    width = 30.0
    edges = range(0, int(result["settings"]["duration"]) + 1, int(width))
    mids, p50, p99 = [], [], []
    for e in edges:
        xs = [ms for tt, ms in rt if e <= tt < e + width]
        if xs:
            mids.append(e + width / 2)
            p50.append(C.percentile(xs, 50))
            p99.append(C.percentile(xs, 99))
    ax.plot(mids, p50, "o-", label="p50")
    ax.plot(mids, p99, "s-", label="p99")
    ax.set_xlabel("seconds")
    ax.set_ylabel("round latency (ms)")
    ax.set_title("Round latency per 30 s (verify call, device side)")
    ax.legend()
    print(f"figure: {C.save_figure(fig, path)}")


if __name__ == "__main__":
    main()
