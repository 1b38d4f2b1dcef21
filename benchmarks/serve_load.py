"""Serving at scale: rounds per second through one verifier process, and where a round's time goes.

One verifier process (the reference verifier, `VerifierServer`, over a `ToyEngine` of a toy
target) pinned to `--server-cores`, and the load generator (`rigs/loadgen.py`: devices spread over
worker processes, one per `--loadgen-cores` core, each one lean asyncio loop over grpc.aio)
pinned to the other cores. Each device opens a session, sends verify rounds back to back
(blocks from a noisy toy draft of the toy target: a realistic acceptance), closes it after
`--tokens` tokens and opens the next; every verdict is checked token for token against the
toy target's greedy decoding (mismatches are counted, and must be none).

The engine, by `--kinds`:
- `zero`: the toy engine as it is (its logits memoized: next to no time a batch);
- `7b`: the toy engine taking, per batch, the time of a 7B target's step on an H200 as a
  function of the batch's rows (`step_ms`, the roofline table below), in `time.sleep`, which
  releases the GIL as a GPU engine waiting on its kernels does. With `--device-step sync` (the
  default) the sleep follows the toy's own Python, as a llama.cpp decode follows the host's work
  on the batch and the rows' reduction follows it: the device's busy share of wall time
  (`device_busy_share`) is then what a GPU would be busy. With `overlap` (the figures measured
  before 2026-11-29) the toy's Python ran inside the modelled time, which hid the host's part;
- `replayed` (with `--traces` and `--target`): llama.cpp's engine on a real GGUF, a GPU's where
  `--gpu-layers` puts it there, each greedy row answered as the traces' real target answered it
  (`rigs/replayed.py`; a random target of a real shape from `gpu/make_target.py` costs what the
  real one does and accepts what the real one did); the devices replay the traces' prompts and
  the real draft's blocks (`rigs.loadgen.Tables`), and every verdict is checked against them;
- `instant`: no verifier, a stub on a gRPC server built as the verifier's is, answering every
  call at once from the same tables (`rigs.loadgen.instant_main`): what gRPC alone allows, and what
  a round costs the generator with nothing else in the way.

Reported per (kind, devices), over a `--duration` window after `--warmup`: rounds and committed
tokens per second (the devices' count), round trip p50/p90/p99, acceptance; from the verifier
(its `ServingStats` and `StageTimes`, read over stdin at both ends of the window): the
engine's busy share of wall time, batches and their size, the mean round's time by stage
(`edgekit/verifier/_stages.py`: decode, checks, submit, queue, engine, handoff, accept, answer;
"grpc" is the devices' mean round trip less the verifier's mean call: gRPC at both ends, the
loopback and the generator's own loop), the engine thread's time by stage, the CPU share of
the verifier's core(s) and of each generator core. Beside every figure, the generator's
ceiling at that device count: the rounds/s at which all its cores would be busy at the CPU a
round cost it against the instant verifier (on one core a side, that stub's core saturated
before the generator's, so what it drove is a floor of the ceiling, also given, with the zero
cost verifier's); a figure within 80% of the ceiling, or with a generator core 80% busy, is
flagged: the generator, not the verifier, may have set the pace. With `--profile KIND:DEVICES`, one
more run of that point with the verifier under py-spy (`pip install py-spy`, or
`pip install -e '.[bench]'`; it starts the verifier: attaching to a running process is refused
on some machines), and a summary of the flame graph (top frames by own and total samples, and
by thread) in the JSON.

    python -m benchmarks serve_load                                   # 64,128,256,1024 devices
    python -m benchmarks serve_load --devices 8 --kinds zero --duration 2 --profile ""
    python -m benchmarks serve_load --server-cores 0-3 --loadgen-cores 4-15   # a 16-core machine
    python -m benchmarks serve_load --draft-ms 40 --out serve_load_paced     # Pi-class drafting
    python -m benchmarks serve_load --traces results/fleet_traces_qwen-coder.json --target 7B.gguf --gpu-layers -1 \
        --numerics fast --devices 8,32,64,128 --server-cores 0-3 --loadgen-cores 4-15   # issue 51
    python -m benchmarks serve_load --replot benchmarks/results/serve_load.json

Writes `results/<out>.json` and `results/<out>.png` (rounds/s against devices, the engine's busy
share, the round's time by stage as stacked bars).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benchmarks import harness as C
from benchmarks.rigs import proxies as _proxies
from benchmarks.rigs.loadgen import (
    LineProcess,
    Tally,
    Workload,
    cpu_seconds,
    parse_cores,
    prepare_process,
    spawn,
    toy_target,
)
from benchmarks.rigs.roofline import ROOFLINE_7B, rows_ms, step_ms

# py-spy: only the thread holding the GIL is sampled (the verifier's Python runs one thread at a
# time, so these samples are where its Python time goes; gRPC's C core outside the GIL is not in
# them), without pausing the process. Here, pausing it cut the rounds 4x at 100 Hz (2x at 50 Hz, 1.3x
# at 20 Hz) and biased the samples to where threads hand the GIL over; without pausing, a stack is read
# while it runs and now and then mixes frames of two moments (a few % of samples: read shares of 1-2%
# loosely). Without --gil, py-spy counted threads blocked in Condition.wait as busy on this VM.
PY_SPY_FLAGS = ("--gil", "--nonblocking", "--rate", "100")
STAGES = ("grpc", "decode", "checks", "submit", "queue", "engine", "handoff", "accept", "answer")
ENGINE_STEP_STAGES = ("idle", "schedule", "plan", "run", "record", "update")


def engine_bound(devices: int, k: int, max_rows: int) -> dict[str, float]:
    """Rounds/s with the engine the only limit: every device's round in one batch, and with batches
    cut at the scheduler's row cap (`max_rows`), as a reference for the `7b` runs."""
    rows = k + 1
    one = devices / (rows_ms(devices * rows, devices) / 1e3)
    per = max(max_rows // rows, 1)
    full, rest = divmod(devices, per)
    ms = full * rows_ms(per * rows, per) + (rows_ms(rest * rows, rest) if rest else 0.0)
    return {"one_batch": one, "fcfs_row_cap": devices / (ms / 1e3)}


# -- the verifier's process ------------------------------------------------------------------


def serve_main() -> None:
    """The verifier process: its spec on stdin, then "stats" (a JSON line of its counters) and "quit"."""
    from edgekit import ServerConfig
    from edgekit.verifier import FrontEnds, ToyEngine, VerifierServer

    spec = json.loads(sys.stdin.readline())
    prepare_process(spec.get("cores"))
    w = Workload(**spec["workload"])
    frontends = spec.get("frontends", 1)
    n = spec["max_sessions"] * frontends  # the engine's sequences: each front end may hold every device
    if spec["kind"] == "replayed":
        engine, max_context = _replayed_engine(spec, w, n)
    elif spec["kind"] == "7b" and spec["device_step"] == "sync":
        max_context = w.max_context
        engine = _device_step_engine(ToyEngine)(toy_target(w), n_seq=n, max_context=max_context)
    else:
        max_context = w.max_context
        engine = ToyEngine(toy_target(w), n_seq=n, max_context=max_context,
                           cost=step_ms if spec["kind"] == "7b" else None)
    # calibrate off: no timing run before serving; the queue bound above the devices: no refusal
    per = spec["max_sessions"]
    config = ServerConfig(port=0, max_sessions=per, max_context=max_context, max_block=max(w.k, 8),
                          calibrate="off", max_queue=max(256, per + 8), max_batch_rows=spec["max_batch_rows"],
                          policy=spec["policy"], budgets=spec["budgets"], token_budget=spec["token_budget"],
                          frontends=frontends)
    server: Any = (FrontEnds(engine, config) if frontends > 1 else VerifierServer(engine, config)).start()
    print(json.dumps({"ready": True, "address": server.address, "pid": os.getpid()}), flush=True)
    for line in sys.stdin:
        if json.loads(line)["command"] == "quit":
            break
        print(json.dumps(_server_stats(server)), flush=True)
    server.stop()


def _device_step_engine(toy: type) -> type:
    """`--kinds 7b --device-step sync`: the toy engine as a GPU engine over llama.cpp runs a step,
    the host's part (the toy's Python, standing for building the batch and reducing its rows),
    then the device's modelled time (`step_ms`, in `time.sleep`), one after the other: a decode
    returns when the device is done, and the host waits for the GIL after it. `device_s` sums the
    device's time, so that its busy share of wall time is known."""

    class DeviceStep(toy):  # type: ignore[misc, valid-type]
        device_s = 0.0

        def run_batch(self, feeds: Sequence[Any]) -> list[Any]:
            out = super().run_batch(feeds)
            device = step_ms(feeds) / 1e3
            time.sleep(device)
            self.device_s += device
            return out

    return DeviceStep


def _replayed_engine(spec: dict[str, Any], w: Workload, n: int) -> tuple[Any, int]:
    """`--kinds replayed`: llama.cpp's engine on the target GGUF (its layers on a GPU where there is
    one), each greedy row answered as the traces' real target answered it (rigs/replayed.py)."""
    from benchmarks.rigs.fleet_sim import load_traces
    from benchmarks.rigs.replayed import Replay, ReplayedLlamaEngine

    traces, _ = load_traces(Path(w.traces))
    ReplayedLlamaEngine.replay = Replay(traces)
    max_context = max(len(t.prompt) + len(t.target) for t in traces) + 2  # as `Tables.max_context`
    engine = ReplayedLlamaEngine(spec["target"], name=Path(spec["target"]).stem, max_context=max_context, n_seq=n,
                                 max_block=max(w.k, 8), exact=spec["numerics"] == "exact", threads=spec["threads"],
                                 gpu_layers=spec["gpu_layers"], max_batch_rows=spec["max_batch_rows"],
                                 reduce_rows=spec["reduce_rows"])
    return engine, max_context


def _server_stats(server: Any) -> dict[str, Any]:
    """The verifier's counters: one `VerifierServer`'s, or the sum of `FrontEnds`' (the engine's
    busy time, calls and CPU then the host process's, with its front ends')."""
    split = hasattr(server, "host")
    snapshots = server.stats() if split else [server.service.stats.snapshot()]
    classes = [c for s in snapshots for c in s.classes.values()]
    pids = ["self", *server.pids] if split else ["self"]  # every process's threads and memory
    out = {
        "t": time.monotonic(),
        "cpu_s": sum(os.times()[:2]),
        "threads": _proc_status("Threads", pids),
        "rss_mb": _proc_status("VmRSS", pids) / 1024,
        "sessions_open": sum(s.sessions for s in snapshots),
        "engine_s": server.host.busy_s if split else snapshots[0].engine_s,
        "device_s": getattr(server.engine, "device_s", 0.0),  # the modelled device's time (--device-step sync)
        "batches": server.host.calls if split else snapshots[0].batches,  # engine calls
        "works": sum(k * v for s in snapshots for k, v in s.batch_sizes.items()),
        "rows": sum(k * v for s in snapshots for k, v in s.batch_rows.items()),
        "rounds": sum(c.rounds for c in classes),
        "queue_s": sum(c.queue_s.sum for c in classes),
        "verify_s": sum(c.verify_s.sum for c in classes),
        "stages": functools.reduce(_add, (s.stages for s in snapshots)),
    }
    if split:  # every process's CPU: the front ends are this one's children
        out["proc_cpu_s"] = cpu_seconds(os.getpid()) + sum(cpu_seconds(pid) for pid in server.pids)
    return out


def _add(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """a + b, field by field, nested dicts too."""
    out = dict(a)
    for key, value in b.items():
        out[key] = _add(a.get(key, {}), value) if isinstance(value, dict) else a.get(key, 0) + value
    return out


def _proc_status(key: str, pids: Sequence[int | str] = ("self",)) -> int:
    """`key` of /proc/PID/status (its number), summed over `pids` (a front end gone counts 0)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status", encoding="ascii") as f:
                total += next((int(line.split()[1]) for line in f if line.startswith(key + ":")), 0)
        except OSError:
            pass
    return total


def _shares(rounds: list[int]) -> dict[str, float]:
    """How evenly the devices were served: their rounds in the window (min, median, max) and
    Jain's fairness index, (sum x)^2 / (n sum x^2): 1 when every device got as many rounds,
    1/n when one got them all."""
    if not rounds:
        return {}
    xs = sorted(rounds)
    squares = sum(x * x for x in xs)
    return {"devices": len(xs), "min": xs[0], "median": xs[len(xs) // 2], "max": xs[-1],
            "jain": sum(xs) ** 2 / (len(xs) * squares) if squares else 1.0}


def _speeds(speeds: list[float], classes: list[str]) -> dict[str, Any]:
    """Devices' token speeds over the window: quartiles, how many reached each SLO class's speed
    (WISP's four), and where devices held classes (`--slo`), each class's share of its devices short
    of its speed (WISP's violation rate, counted over devices' windows, not responses)."""
    from edgekit.config import DEFAULT_SLO_CLASSES

    if not speeds:
        return {}
    xs = sorted(speeds)
    out: dict[str, Any] = {
        "min": xs[0], "p25": C.percentile(xs, 25), "median": C.percentile(xs, 50), "max": xs[-1],
        "reaching": {name: sum(x >= speed for x in xs) for name, speed in DEFAULT_SLO_CLASSES.items()}}
    held = {c for c in classes if c}
    if held:
        out["classes"] = {}
        for name in sorted(held):
            mine = [x for x, c in zip(speeds, classes) if c == name]
            short = sum(x < DEFAULT_SLO_CLASSES[name] for x in mine)
            out["classes"][name] = {"devices": len(mine), "short": short, "violation_rate": short / len(mine)}
    return out


def _delta(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """b - a, field by field, nested dicts too (counters only grow)."""
    out: dict[str, Any] = {}
    for key, value in b.items():
        if isinstance(value, dict):
            out[key] = _delta(a.get(key, {}), value)
        elif isinstance(value, (int, float)):
            out[key] = value - a.get(key, 0)
    return out


# -- one load point ----------------------------------------------------------------------------


def run_point(kind: str, devices: int, args: argparse.Namespace, workload: Workload,
              profile: Path | None = None) -> dict[str, Any]:
    """`devices` devices against a verifier of `kind` for the window; the point's figures."""
    return run_points(kind, [devices], args, workload, profile)[0]


def run_points(kind: str, counts: Sequence[int], args: argparse.Namespace, workload: Workload,
               profile: Path | None = None) -> list[dict[str, Any]]:
    """Each of `counts` devices in turn against one verifier of `kind` (sessions for the most of
    them; a target loaded once); each point's figures."""
    logs = Path(tempfile.mkdtemp(prefix="serve_load-"))
    spec = {"workload": asdict(workload), "kind": kind, "max_sessions": max(counts) + 16, "cores": args.server_cores,
            "max_batch_rows": args.max_batch_rows, "rounds": args.rounds, "target": args.target,
            "numerics": args.numerics, "gpu_layers": args.gpu_layers, "threads": args.threads,
            "reduce_rows": args.reduce_rows, "device_step": args.device_step,
            "policy": args.policy, "budgets": args.budgets, "token_budget": args.token_budget,
            "frontends": args.frontends}
    if kind == "instant":
        server = spawn("instant", spec, cores=args.server_cores, log=logs / "verifier.log")
    else:
        cmd = C.module_command("benchmarks.serve_load", "serve")
        if profile is not None:  # py-spy starts the verifier, which pins itself; py-spy stays on the generator's cores
            cmd = [_py_spy(), "record", "--format", "raw", *PY_SPY_FLAGS, "-o", str(profile), "--", *cmd]
        server = LineProcess(cmd, cores=args.loadgen_cores if profile is not None else args.server_cores,
                             log=logs / "verifier.log")
        server.send(spec)
    points: list[dict[str, Any]] = []
    stack = contextlib.ExitStack()
    try:
        ready = server.recv()
        address = ready["address"]
        if args.proxy != "none":  # the devices call through the shipped proxy config, on the generator's cores
            cores = ",".join(str(c) for c in args.loadgen_cores)
            address = stack.enter_context(_proxies.proxied(args.proxy, [address], logs / "proxy",
                                                           client_rate=args.client_rate,
                                                           prefix=["taskset", "-c", cores]))
        for devices in counts:
            points.append(_measure(kind, devices, args, workload, server, ready["pid"], address, logs))
    except Exception as exc:  # the verifier or a worker failed: say how, with its log's last lines
        failed = f"{type(exc).__name__}: {exc}"
        tails = {p.name: p.read_text()[-3000:] for p in sorted(logs.glob("*.log"))}
        points += [{"kind": kind, "devices": n, "failed": failed, "logs": tails} for n in counts[len(points):]]
    finally:
        stack.close()
        if server.proc.poll() is None:
            try:
                server.send({"command": "quit"})
            except OSError:  # it is going already
                pass
        server.wait()
    return points


def _measure(kind: str, devices: int, args: argparse.Namespace, workload: Workload, server: LineProcess, pid: int,
             address: str, logs: Path) -> dict[str, Any]:
    """One point: `devices` devices spread over the generator's workers, for the window."""
    workers: list[LineProcess] = []
    try:
        n_workers = min(args.workers, devices)
        for i in range(n_workers):
            core = args.loadgen_cores[i % len(args.loadgen_cores)]
            workers.append(spawn("worker", {
                "address": address, "devices": list(range(i, devices, n_workers)),
                "workload": asdict(workload), "mode": args.mode, "channels": args.channels,
                "rounds": args.rounds, "flood": args.flood if i == 0 else 0,
            }, cores=[core], log=logs / f"worker{i}.log"))
        readies = [w.recv() for w in workers]  # every worker's: its tables built
        acceptance = readies[0]["acceptance"]
        warmup = args.warmup if args.warmup is not None else max(3.0, devices / 200)
        go = time.monotonic() + 0.2
        start, end = go + warmup, go + warmup + args.duration
        for w in workers:
            w.send({"start": start, "end": end})
        _sleep_until(start)
        with C.GpuUtilization() as gpu:
            s0, g0 = _sample(server, pid, workers)
            _sleep_until(end)
            s1, g1 = _sample(server, pid, workers)
        tally = Tally()
        for w in workers:
            tally.merge(w.recv()["tally"])
    finally:
        for w in workers:
            w.wait()
    point = _summary(kind, devices, args, workload, acceptance, tally, s0, s1, g0, g1, end - start)
    point["gpu_busy_share"] = gpu.mean  # nvidia-smi's utilization over the window; None without a GPU
    return point


def _sample(server: LineProcess, pid: int, workers: list[LineProcess]) -> tuple[dict[str, Any], list[float]]:
    server.send({"command": "stats"})
    stats = server.recv()
    stats.setdefault("proc_cpu_s", cpu_seconds(pid))  # every thread, gRPC's own included (front ends: summed)
    return stats, [cpu_seconds(w.proc.pid) for w in workers]


def _sleep_until(t: float) -> None:
    time.sleep(max(0.0, t - time.monotonic()))


def _summary(kind: str, devices: int, args: argparse.Namespace, workload: Workload, table_acceptance: float,
             tally: Tally, s0: dict[str, Any], s1: dict[str, Any], g0: list[float], g1: list[float],
             window: float) -> dict[str, Any]:
    rtt = list(tally.rtt_ms)
    rtt_mean = sum(rtt) / len(rtt) if rtt else float("nan")
    out: dict[str, Any] = {
        "kind": kind,
        "devices": devices,
        "window_s": window,
        "rounds": tally.rounds,
        "rounds_per_s": tally.rounds / window,
        "committed_tokens_per_s": tally.committed / window,
        "sessions_opened": tally.sessions,
        "acceptance": C.ratio(tally.accepted, tally.drafted),
        "acceptance_of_the_tables": table_acceptance,
        "aal": C.ratio(tally.accepted, tally.rounds),  # accepted draft tokens per round, without the bonus
        "rtt_ms": {"mean": rtt_mean, **{f"p{q}": C.percentile(rtt, q) for q in (50, 90, 99)}},
        "device_rounds": _shares(tally.device_rounds),
        # a device's mean seconds in the window waiting on each kind of call (the rest: its modelled
        # drafting and link): where the starved ones waited
        "device_waits_s": {call: s / devices for call, s in sorted(tally.waits_s.items())},
        # each device's committed tokens/s over the window, and how many devices reached each SLO class's speed
        "device_tokens_per_s": _speeds([t / window for t in tally.device_tokens], tally.device_classes),
        "flood": {"calls_in_flight": args.flood, "calls_per_s": tally.flood_calls / window,
                  "refused": dict(tally.flood_refusals)} if args.flood else None,
        # what the verdicts said of themselves (ServerTimings), per round
        "verdict_ms": {"queue": C.ratio(tally.server_queue_ms, tally.rounds),
                       "verify": C.ratio(tally.server_verify_ms, tally.rounds),
                       "batch_size": C.ratio(tally.batch_size, tally.rounds)},
        "mismatches": tally.mismatches,
        "mismatch_examples": tally.mismatch_examples,
        "errors": dict(tally.errors),
        "error_examples": tally.error_examples,
        "rounds_all": tally.rounds_all,
        "loadgen": {
            "workers": len(g0),
            "cpu_share": _core_shares(args.loadgen_cores, g0, g1, window),  # per core it ran on, of that core
            # CPU a round costs the generator: what one of its cores can drive is 1e6 / this
            "cpu_us_per_round": C.ratio(sum(g1) - sum(g0), tally.rounds) * 1e6,
        },
    }
    # the rate at which every generator core would be busy, at this point's CPU per round
    cores = len(out["loadgen"]["cpu_share"])
    out["loadgen"]["cpu_bound_rounds_per_s"] = C.ratio(cores * 1e6, out["loadgen"]["cpu_us_per_round"])
    d = _delta(s0, s1)
    span = d["t"]
    out["verifier_cpu_share"] = d["proc_cpu_s"] / span / len(args.server_cores)  # of its cores
    out["verifier_cpu_us_per_round"] = C.ratio(d["proc_cpu_s"], tally.rounds * span / window) * 1e6
    if kind == "instant":
        return out
    verify = d["stages"].get("Verify", {})
    calls = verify.get("calls", 0)
    per_round = {s: verify.get(s, 0.0) / calls * 1e3 for s in STAGES if s != "grpc"} if calls else {}
    call_ms = sum(per_round.values())
    step = d["stages"].get("engine step", {})
    out["verifier"] = {
        "engine_busy_share": d["engine_s"] / span,
        # the modelled device's own time (its steps' roofline ms) over wall time: what a GPU would be
        # busy, where the engine's busy share also counts the host's part of each step
        "device_busy_share": d["device_s"] / span if d.get("device_s") else None,
        "rounds_per_s": d["rounds"] / span,  # as the verifier counted them: a cross-check
        "batches_per_s": d["batches"] / span,
        "works_per_batch": C.ratio(d["works"], d["batches"]),
        "rows_per_batch": C.ratio(d["rows"], d["batches"]),
        "queue_ms": C.ratio(d["queue_s"] * 1e3, d["rounds"]),  # its own per-round figures (server_queue_ms)
        "verify_ms": C.ratio(d["verify_s"] * 1e3, d["rounds"]),
        "call_ms": call_ms,
        "threads": s1["threads"],
        "rss_mb": s1["rss_mb"],
        "sessions_open": s1["sessions_open"],
        "calls_per_s": {m: v.get("calls", 0) / span for m, v in d["stages"].items()},
    }
    out["round_ms"] = {"grpc": rtt_mean - call_ms, **per_round} if calls else {}
    out["engine_step_share"] = {s: step.get(s, 0.0) / span for s in ENGINE_STEP_STAGES}  # of wall time
    out["engine_step_ms"] = {s: C.ratio(step.get(s, 0.0) * 1e3, step.get("calls", 0)) for s in ENGINE_STEP_STAGES}
    if kind == "7b":
        out["engine_bound_rounds_per_s"] = engine_bound(devices, workload.k, args.max_batch_rows)
        # the cost model's time for the mean batch, beside the run measured: what the engine thread
        # adds (the toy's own Python, the sleep's overshoot, waiting for the GIL after it)
        if d["batches"]:
            out["engine_step_ms"]["modelled_run"] = rows_ms(d["rows"] / d["batches"], d["works"] / d["batches"])
    return out


def _core_shares(cores: Sequence[int], g0: Sequence[float], g1: Sequence[float], window: float) -> list[float]:
    """The generator's CPU share of each core it ran on (worker i on cores[i % len(cores)])."""
    used: dict[int, float] = {}
    for i, (a, b) in enumerate(zip(g0, g1)):
        core = cores[i % len(cores)]
        used[core] = used.get(core, 0.0) + (b - a) / window
    return list(used.values())


def _limit(point: dict[str, Any]) -> str:
    """What most likely set the pace: a saturated core or engine, else the devices themselves."""
    if point.get("verifier", {}).get("engine_busy_share", 0) >= 0.9:
        return "engine"
    if max(point["loadgen"]["cpu_share"], default=0) >= 0.9:
        return "generator CPU"
    if point["verifier_cpu_share"] >= 0.9:
        return "verifier CPU"
    return "none saturated (latency-bound: too few devices, or they draft)"


# -- profiling -------------------------------------------------------------------------------


def _py_spy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(found).exists():
        raise SystemExit("--profile needs py-spy: pip install py-spy (or pip install -e '.[bench]'); "
                         "--profile '' skips it")
    return found


def _frame(text: str) -> str:
    """'func (path/to/file.py:123)' -> 'func (to/file.py)': one name per function, not per line."""
    name, _, where = text.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    return f"{name} ({'/'.join(Path(path).parts[-2:])})" if path else name


def _role(stack: str) -> str:
    """Which thread of the verifier a stack is from."""
    if "_loop (edgekit/verifier/_core.py" in stack:
        return "engine thread"
    if "concurrent/futures/thread.py" in stack:
        return "gRPC handler threads (the service)"
    if "grpc/_server.py" in stack:
        return "gRPC server loop"
    if "_find_and_load" in stack:
        return "start-up (imports)"
    return "other"


# Leaves where a thread blocks with the GIL released: py-spy --gil names the GIL's last holder, so
# while the GIL is free (every thread waiting) the sample lands on one of these.
_WAITS = ("Condition.wait (threading.py)", "Event.wait (threading.py)", "_worker (futures/thread.py)")


def profile_summary(path: Path, top: int = 20) -> dict[str, Any]:
    """From py-spy's raw output (collapsed stacks, `f1;f2;...;leaf count`): samples by thread,
    the share waiting (a blocked leaf: the GIL free), and the others' top frames by own samples
    (where the time went) and by total (under which call), start-up left out, as shares of the
    samples that ran."""
    own: Counter[str] = Counter()
    total: Counter[str] = Counter()
    roles: Counter[str] = Counter()
    waiting = 0
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        c = int(count)
        role = _role(stack)
        roles[role] += c
        frames = [_frame(f) for f in stack.split(";")]
        if role == "start-up (imports)":
            continue
        if frames[-1] in _WAITS:
            waiting += c
            continue
        own[frames[-1]] += c
        for f in set(frames):
            total[f] += c
    n, ran = sum(roles.values()), sum(own.values())

    def share(counter: Counter[str]) -> list[dict[str, Any]]:
        return [{"frame": f, "share": c / ran} for f, c in counter.most_common(top)]

    return {"samples": n, "by_thread": {r: c / n for r, c in roles.most_common()} if n else {},
            "waiting_share": waiting / n if n else None, "samples_ran": ran,
            "top_own": share(own) if ran else [], "top_total": share(total) if ran else []}


# -- the sweep -------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    from edgekit import ServerConfig

    ap = C.arguments(__doc__, replot=True, threads=0, out="serve_load")
    ap.add_argument("--devices", default="64,128,256,1024", help="device counts, comma-separated")
    ap.add_argument("--kinds", default=None,
                    help="instant (the generator's ceiling), zero (toy engine), 7b (the roofline's step times), "
                         "replayed (--target on llama.cpp, rows from --traces); default instant,zero,7b, or "
                         "instant,replayed with --traces")
    ap.add_argument("--traces", default=None, metavar="JSON",
                    help="devices replay these recorded traces (benchmarks/fleet.py record) instead of the toy pair")
    ap.add_argument("--target", default=None, metavar="GGUF",
                    help="replayed: the target llama.cpp runs (a random one of a real shape: gpu/make_target.py); "
                         "its vocabulary is the devices' tokenizer")
    ap.add_argument("--gpu-layers", type=int, default=None, help="replayed: the target's layers on a GPU (-1: all)")
    ap.add_argument("--numerics", default="exact", choices=("exact", "fast"), help="replayed: the verifier's numerics")
    ap.add_argument("--reduce-rows", default="host", choices=("host", "llama"),
                    help="replayed: where greedy rows become argmaxes (edgekit serve --reduce-rows)")
    ap.add_argument("--frontends", type=int, default=1,
                    help="verifier processes on the port over one engine (edgekit serve --frontends), all on "
                         "--server-cores")
    ap.add_argument("--device-step", default="sync", choices=("sync", "overlap"),
                    help="7b: the host's part of a step, then the device's modelled time (sync: as llama.cpp's "
                         "decode runs), or the device's time with the host's part inside it (overlap: figures "
                         "before 2026-11-29)")
    ap.add_argument("--duration", type=float, default=10.0, help="seconds measured per point")
    ap.add_argument("--warmup", type=float, default=None,
                    help="seconds before the window, while sessions open (default: 3, or devices / 200 if more)")
    ap.add_argument("--server-cores", default="0", help="cores of the verifier process, e.g. 0 or 0-3")
    ap.add_argument("--loadgen-cores", default=None, help="cores of the generator (default: every other core)")
    ap.add_argument("--workers", type=int, default=0, help="generator processes (default: one per core)")
    ap.add_argument("--mode", default="aio", choices=("aio", "threads"),
                    help="a worker's devices: coroutines or threads")
    ap.add_argument("--rounds", default="unary", choices=("unary", "stream"),
                    help="a Verify call per round, as edgekit's client sends them by default, or a session's "
                         "rounds on one Rounds stream (ClientConfig.round_streams)")
    ap.add_argument("--flood", type=int, default=0, metavar="CALLS",
                    help="one abusive device more, keeping CALLS Verify calls of one round in flight (0: none)")
    ap.add_argument("--proxy", default="none", choices=("none", "haproxy"),
                    help="devices call through deploy/'s HAProxy config (on the generator's cores)")
    ap.add_argument("--client-rate", type=int, default=None, metavar="CALLS",
                    help="HAProxy's per-client limit, calls a second (0: none; default: as shipped)")
    ap.add_argument("--channels", default="device", choices=("device", "worker"),
                    help="a gRPC channel (connection) per device, or one per worker (which gRPC caps at 100 "
                         "calls in flight: more devices than that queue in the worker)")
    ap.add_argument("--generate", action="store_true",
                    help="devices draft nothing: each session is a target-only Generate stream (centralized serving)")
    ap.add_argument("--draft-ms", type=float, default=0.0, help="drafting time per token (0: instant devices)")
    ap.add_argument("--rtt-ms", default="0", metavar="MS[-MS]",
                    help="each device's round trip, waited before each call, drawn per device from a range")
    ap.add_argument("--policy", default="fcfs", help="the verifier's scheduler (its --policy)")
    ap.add_argument("--slo", action="store_true",
                    help="devices hold WISP's SLO classes in turn, sessions opened with the speed (--policy wisp)")
    ap.add_argument("--drafting", default="fixed", choices=("fixed", "predictor"),
                    help="blocks of --k, or cut by the traces' pair's shipped rejection predictor (with --traces)")
    ap.add_argument("--budgets", default="none",
                    help="draft budgets the verifier assigns (its --budgets: goodspeed, fixed, random); the devices "
                         "draft them, up to --k")
    ap.add_argument("--token-budget", type=int, default=0,
                    help="C of the budgets, draft tokens per target pass over all sessions (0: the verifier's auto)")
    ap.add_argument("--max-batch-rows", type=int, default=ServerConfig.max_batch_rows,
                    help="the verifier's cap on a batch's rows (its --max-batch-rows)")
    ap.add_argument("--k", type=int, default=4, help="draft tokens per round")
    ap.add_argument("--tokens", type=int, default=128, help="tokens per session before the next opens")
    ap.add_argument("--noise", type=float, default=Workload.noise, help="the toy draft's noise (acceptance)")
    ap.add_argument("--vocab", type=int, default=64, help="the toy's vocabulary")
    ap.add_argument("--profile", default=None,
                    help="KIND:DEVICES to run once more under py-spy; '' none (default 7b:128, none with --traces)")
    ap.add_argument("--results-dir", default=None, help="where the JSON and PNG go (default benchmarks/results)")
    ap.add_argument("--one-verifier", action="store_true",
                    help="one verifier per kind for every device count (a large target loaded once), not one per point")
    ap.add_argument("--no-plot", action="store_true")
    args = C.parse(ap, argv, plot=plot)  # --replot: the figure redrawn, and the end
    results = Path(args.results_dir) if args.results_dir else C.RESULTS_DIR
    mine = sorted(os.sched_getaffinity(0))
    args.server_cores = parse_cores(args.server_cores)
    args.loadgen_cores = (parse_cores(args.loadgen_cores) if args.loadgen_cores
                          else [c for c in mine if c not in args.server_cores] or args.server_cores)
    args.workers = args.workers or len(args.loadgen_cores)
    if args.profile is None:
        args.profile = "" if args.traces else "7b:128"
    if args.profile:
        _py_spy()  # missing: say so now, not after the sweep
    device_counts = C.csv_list(args.devices, int)
    kinds = C.csv_list(args.kinds or ("instant,replayed" if args.traces else "instant,zero,7b"))
    if args.traces and set(kinds) - {"instant", "replayed"}:
        ap.error("with --traces the kinds are instant and replayed (the toy engine knows no recorded target)")
    if "replayed" in kinds and not (args.traces and args.target):
        ap.error("--kinds replayed needs --traces and --target")
    args.threads = args.threads or None
    rtt = [float(x) for x in args.rtt_ms.split("-")]
    workload = Workload(vocab=args.vocab, noise=args.noise, k=args.k, tokens=args.tokens, draft_ms=args.draft_ms,
                        traces=str(Path(args.traces).resolve()) if args.traces else "",
                        tokenizer=str(Path(args.target).resolve()) if args.target else "", generate=args.generate,
                        rtt_min_ms=rtt[0], rtt_max_ms=rtt[-1], follow_budgets=args.budgets != "none",
                        drafting=args.drafting, slo=args.slo)
    C.progress(f"verifier on cores {args.server_cores}, rounds by {args.rounds}, "
               f"generator: {args.workers} {args.mode} worker(s) on "
               f"cores {args.loadgen_cores}")
    points = []
    if args.one_verifier:  # a verifier per kind, every count against it
        for kind in kinds:
            C.progress(f"{kind}, {', '.join(map(str, device_counts))} devices ...")
            for point in run_points(kind, device_counts, args, workload):
                points.append(point)
                C.progress("  " + _line(point))
    else:
        for devices in device_counts:
            for kind in kinds:
                C.progress(f"{kind}, {devices} devices ...")
                points.append(run_point(kind, devices, args, workload))
                C.progress("  " + _line(points[-1]))
    _against_ceiling(points)
    result: dict[str, Any] = {
        "settings": {k: v for k, v in vars(args).items() if k != "replot"},
        "workload": asdict(workload),
        "roofline_7b_ms": {str(b): {"plain_T1": p, "verify_T5": v} for b, (p, v) in ROOFLINE_7B.items()},
        "roofline_source": "/work/shared/gpu/roofline_h200.md, qwen2.5-7b shape, 1024-token context, H200",
        "max_batch_rows": args.max_batch_rows,
        "stages": {
            "grpc": "the devices' mean round trip less the verifier's mean call: gRPC at both ends, the loopback, "
                    "the generator's own event loop",
            "decode": "the request parsed and converted (protobuf in)",
            "checks": "the session found and locked, the block checked, the round's objective",
            "submit": "the scheduler's admission and the engine thread woken",
            "queue": "waiting for a batch to take the round, until it is dispatched",
            "engine": "the batch it ran in, on the engine",
            "handoff": "the engine thread's work around the run (forecast, statistics, scheduler update) and the "
                       "switch back to the handler thread",
            "accept": "the verdict: acceptance, the session's tokens, statistics",
            "answer": "the answer converted (protobuf out)",
        },
        "points": points,
    }
    if args.profile:
        kind, _, devices = args.profile.partition(":")
        raw = results / f"{args.out}-pyspy.txt"
        results.mkdir(parents=True, exist_ok=True)
        C.progress(f"profile: {kind}, {devices} devices, the verifier under py-spy ...")
        point = run_point(kind, int(devices), args, workload, profile=raw)
        result["profile"] = {"point": point, "raw": raw.name,
                             "tool": f"py-spy record --format raw {' '.join(PY_SPY_FLAGS)} over the verifier's life "
                                     "(start-up and the warm-up included; shares of frames leave start-up out)",
                             **(profile_summary(raw) if raw.exists() else {"failed": "py-spy wrote nothing"})}
    result["done_when"] = _done_when(points)
    path = C.write_result(args.out, result, results)
    print(_table(points))
    if result.get("profile", {}).get("top_own"):
        print("profile, top frames by own samples:")
        for row in result["profile"]["top_own"][:10]:
            print(f"  {row['share']:6.1%}  {row['frame']}")
    print(f"result: {path}")
    if not args.no_plot:
        plot(result, path.with_suffix(".png"))
    return result


def _against_ceiling(points: list[dict[str, Any]]) -> None:
    """Each point beside the generator's ceiling at its device count: what it drove against the
    instant verifier (`instant`: a floor of the ceiling where that verifier's core was the busier),
    against the zero-cost toy verifier (`zero`), and the rate at which its cores would all be busy at
    the CPU a round cost it there (`generator_cpu`, from the instant run, else the point's own): the
    ceiling a figure is compared with. Within 80% of it, or with a generator core 80% busy, the
    generator may be what set the pace."""
    ok = [p for p in points if "failed" not in p]
    by = {(p["kind"], p["devices"]): p for p in ok}
    for p in ok:
        instant, zero = by.get(("instant", p["devices"])), by.get(("zero", p["devices"]))
        cpu_bound = (instant or p)["loadgen"]["cpu_bound_rounds_per_s"]
        p["ceiling_rounds_per_s"] = {"instant": instant and instant["rounds_per_s"],
                                     "zero": zero and zero["rounds_per_s"], "generator_cpu": cpu_bound}
        p["share_of_ceiling"] = C.ratio(p["rounds_per_s"], cpu_bound)
        p["within_80pct_of_ceiling"] = (p["share_of_ceiling"] >= 0.8
                                        or max(p["loadgen"]["cpu_share"], default=0.0) >= 0.8)
        p["limit"] = _limit(p)


def _done_when(points: list[dict[str, Any]]) -> dict[str, Any]:
    """The issue's figure: 7B step times, 128 instant devices: engine busy >= 90%, >= 6,000 rounds/s
    (16 cores); on 2 cores, >= 5,000 rounds/s with the verifier on one."""
    p = next((p for p in points if p["kind"] == "7b" and p["devices"] == 128 and "failed" not in p), None)
    if p is None:
        return {"measured": False}
    engine = p["verifier"]["engine_busy_share"]
    device = p["verifier"].get("device_busy_share")
    busy = device if device is not None else engine  # the GPU's share where the device is modelled apart
    return {"measured": True, "rounds_per_s": p["rounds_per_s"], "engine_busy_share": engine,
            "device_busy_share": device,
            "ceiling_rounds_per_s": p["ceiling_rounds_per_s"],
            "engine_bound_rounds_per_s": p["engine_bound_rounds_per_s"],
            "busy_90pct": busy >= 0.9, "rounds_6000": p["rounds_per_s"] >= 6000,
            "rounds_5000": p["rounds_per_s"] >= 5000}


def _line(p: dict[str, Any]) -> str:
    if "failed" in p:
        return f"FAILED: {p['failed']}"
    busy = p.get("verifier", {}).get("engine_busy_share")
    device = p.get("verifier", {}).get("device_busy_share")
    device_share = f" (device {device:.2f})" if device is not None else ""
    return (f"{p['rounds_per_s']:.0f} rounds/s, rtt p50 {p['rtt_ms']['p50']:.1f} ms, engine busy "
            f"{C.fmt(busy)}{device_share}, fairness {C.fmt(p.get('device_rounds', {}).get('jain'))}, "
            f"verifier cpu {p['verifier_cpu_share']:.2f}, generator cpu "
            f"{', '.join(f'{x:.2f}' for x in p['loadgen']['cpu_share'])}, mismatches {p['mismatches']}, "
            f"errors {p['errors'] or 0}; a device's seconds waiting on "
            f"{', '.join(f'{call} {s:.2f}' for call, s in p.get('device_waits_s', {}).items()) or '-'}")


def _table(points: list[dict[str, Any]]) -> str:
    rows = []
    for p in points:
        if "failed" in p:
            rows.append([p["kind"], p["devices"], "FAILED", *[None] * 10])
            continue
        v = p.get("verifier", {})
        rows.append([p["kind"], p["devices"], p["rounds_per_s"], p.get("share_of_ceiling"), v.get("engine_busy_share"),
                     p["rtt_ms"]["p50"], p["rtt_ms"]["p99"], p.get("device_rounds", {}).get("jain"),
                     v.get("works_per_batch"), p["verifier_cpu_share"],
                     max(p["loadgen"]["cpu_share"]), p["mismatches"], sum(p["errors"].values())])
    return C.table(["kind", "devices", "rounds/s", "of ceiling", "engine busy", "rtt p50", "rtt p99",
                    "fairness (Jain)", "works/batch",
                    "verifier cpu", "generator cpu (max)", "mismatches", "errors"], rows)


# -- the figure --------------------------------------------------------------------------------


COLORS = {"instant": "C0", "zero": "C1", "7b": "C2"}


def plot(result: dict[str, Any], path: Path) -> None:
    points = [p for p in result["points"] if "failed" not in p]
    kinds = list(dict.fromkeys(p["kind"] for p in points))
    fair = [p for p in points if p.get("device_rounds")]
    waits = [p for p in points if p.get("device_waits_s")]
    fig, axes = C.subplots(3 + bool(fair) + bool(waits), width=5.2)
    ax = axes[0]
    labels = {"instant": "instant verifier (gRPC alone)", "zero": "verifier, toy engine at zero cost",
              "7b": "verifier, 7B step times"}
    names = labels  # (the bars below rebind `labels`)
    for kind in kinds:
        ps = sorted((p for p in points if p["kind"] == kind), key=lambda p: p["devices"])
        x = [p["devices"] for p in ps]
        ax.plot(x, [p["rounds_per_s"] for p in ps], "o-", color=COLORS.get(kind), label=labels.get(kind, kind))
        if kind == "instant":
            ax.plot(x, [p["loadgen"]["cpu_bound_rounds_per_s"] for p in ps], "v:", color="grey",
                    label="generator's ceiling (its cores all busy)")
        if kind == "7b":
            ax.plot(x, [p["engine_bound_rounds_per_s"]["one_batch"] for p in ps], "^--", color="black", lw=0.8,
                    label="7B engine-bound (one batch)")
    ax.set_xscale("log", base=2)
    ax.set_ylim(0, ax.get_ylim()[1] * 1.35)  # room for the legend above the lines
    ax.legend(fontsize=7, loc="upper left")
    ax.set_xlabel("devices (instant)" if not result["workload"]["draft_ms"] else "devices (paced)")
    ax.set_ylabel("rounds / s")
    frontends = result.get("settings", {}).get("frontends", 1)
    ax.set_title("Rounds per second, one verifier process" if frontends == 1
                 else f"Rounds per second, {frontends} front ends over one engine")
    ax = axes[1]
    for kind in kinds:
        if kind == "instant":
            continue
        ps = sorted((p for p in points if p["kind"] == kind), key=lambda p: p["devices"])
        ax.plot([p["devices"] for p in ps], [p["verifier"]["engine_busy_share"] for p in ps], "o-",
                color=COLORS.get(kind), label=labels.get(kind, kind))
        device = [(p["devices"], p["verifier"]["device_busy_share"]) for p in ps
                  if p["verifier"].get("device_busy_share") is not None]
        if device:  # the modelled GPU's own share: the engine's busy time less the host's part of each step
            ax.plot(*zip(*device), "s--", color=COLORS.get(kind), label=f"{labels.get(kind, kind)}: the device alone")
    ax.axhline(0.9, color="grey", ls="--", lw=0.8, label="90%")
    ax.set_xscale("log", base=2)
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("devices")
    ax.set_ylabel("engine busy share of wall time")
    ax.set_title("Engine busy")
    ax = axes[2]
    bars = [p for p in points if p.get("round_ms")]
    labels = [f"{p['kind']}\n{p['devices']}" for p in bars]
    bottom = [0.0] * len(bars)
    for stage in STAGES:
        heights = [max(p["round_ms"].get(stage, 0.0), 0.0) for p in bars]
        ax.bar(labels, heights, bottom=bottom, label=stage)
        bottom = [b + h for b, h in zip(bottom, heights)]
    ax.set_ylabel("ms per round (mean)")
    ax.set_title("Where a round's time goes")
    ax.tick_params(axis="x", labelsize=7)
    ax.legend(fontsize=7, ncol=2)
    if fair:
        ax = axes[3]
        for kind in kinds:
            ps = sorted((p for p in fair if p["kind"] == kind), key=lambda p: p["devices"])
            ax.plot([p["devices"] for p in ps], [p["device_rounds"]["jain"] for p in ps], "o-",
                    color=COLORS.get(kind), label=names.get(kind, kind))
        ax.set_xscale("log", base=2)
        ax.set_ylim(0, 1.05)
        ax.set_xlabel("devices")
        ax.set_ylabel("Jain's index of rounds per device")
        ax.set_title(f"How evenly devices are served ({result['settings'].get('rounds', 'unary')} rounds)")
        ax.legend(fontsize=7, loc="lower left")
    if waits:
        _plot_waits(axes[-1], waits)
    print(f"figure: {C.save_figure(fig, path)}")


def _plot_waits(ax: Any, points: list[dict[str, Any]]) -> None:
    """A device's mean seconds in the window on each kind of call, the rest its own (modelled
    drafting and link), stacked: the waits that starved some devices show as their own colour."""
    calls = sorted({call for p in points for call in p["device_waits_s"]})
    labels = [f"{p['kind']}\n{p['devices']}" for p in points]
    bottom = [0.0] * len(points)
    for call in calls:
        heights = [p["device_waits_s"].get(call, 0.0) for p in points]
        ax.bar(labels, heights, bottom=bottom, label=f"waiting on {call}")
        bottom = [b + h for b, h in zip(bottom, heights)]
    ax.bar(labels, [max(p["window_s"] - b, 0.0) for p, b in zip(points, bottom)], bottom=bottom, color="lightgrey",
           label="its own drafting and link")
    ax.set_ylabel("seconds of the window, per device (mean)")
    ax.set_title("Where a device's time goes")
    ax.tick_params(axis="x", labelsize=7)
    ax.legend(fontsize=7)


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        serve_main()
    else:
        main()
