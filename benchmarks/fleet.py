"""The fleet simulator: N devices load a real verifier over gRPC without running N
draft models (WISP sec. 5.1's "scalable verification-workload simulator").

    python benchmarks/fleet.py record --pair gemma-270m               # traces, once per pair
    python benchmarks/fleet.py run --pair gemma-270m --system wisp --devices 8 --duration 60
    python benchmarks/fleet.py sweep --pair gemma-270m --devices 2,4,6,8,12 --systems sled,fcfs,centralized,wisp
    python benchmarks/fleet.py smoke                                  # CI: a few devices, seconds

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
import os
import random
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness as C
from rigs.fleet_sim import DeviceSpec, Fleet, Trace, load_traces, record_trace, save_traces

from edgekit.config import DEFAULT_SLO_CLASSES
from edgekit.drafting import FixedWindow, PredictorController
from edgekit.models import get_pair, model_path
from edgekit.protocol import GenerateRequest

SYSTEMS: dict[str, tuple[str, str, str]] = {  # name: (verifier policy[/budget], device mode, drafting)
    "sled": ("fcfs", "reprefill", "fixed"),
    "fcfs": ("fcfs", "speculative", "fixed"),
    "fcfs-predictor": ("fcfs", "speculative", "predictor"),
    "centralized": ("fcfs", "centralized", "none"),
    "wisp": ("wisp", "speculative", "predictor"),
    "wisp-fixed": ("wisp", "speculative", "fixed"),
    "wisp-response": ("wisp/response", "speculative", "predictor"),  # response budgets (--slo-budget response)
    # wisp as Algorithm 1 orders late work: first, even a session out of reach (before 2026-11-26)
    "wisp-late-first": ("wisp --unreachable-share 1", "speculative", "predictor"),
    # Draft budgets the verifier assigns (GOODSPEED, issue 17): devices draft what they are given.
    "goodspeed": ("fcfs+goodspeed", "speculative", "budget"),
    "fixed-s": ("fcfs+fixed", "speculative", "budget"),
    "random-s": ("fcfs+random", "speculative", "budget"),
}
HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"


def traces_path(pair: str, tokens: int = 48) -> Path:
    return RESULTS / (f"fleet_traces_{pair}.json" if tokens == 48 else f"fleet_traces_{pair}_{tokens}.json")


def machine_traces(pair: str, tokens: int = 48, threads: int | None = None) -> tuple[list, dict]:
    """The pair's traces as the target decodes on this machine. A trace holds the target's greedy
    output, and greedy output can differ between CPUs (their kernels round differently, and a near
    tie goes the other way): traces recorded on another CPU failed the faithfulness check on an
    Intel Xeon from the 5th target token on. Those are recorded again here, once, beside them."""
    path = traces_path(pair, tokens)
    traces, meta = load_traces(path)
    cpu = C.machine()["cpu"]
    if meta.get("machine", {}).get("cpu") == cpu:
        return traces, meta
    slug = "".join(ch if ch.isalnum() else "-" for ch in cpu.lower()).strip("-")
    here = path.with_name(f"{path.stem}-{slug}.json")
    if not here.exists():
        print(f"the traces in {path.name} were recorded on {meta.get('machine', {}).get('cpu')!r}; recording "
              f"them on this {cpu!r} into {here.name}", file=sys.stderr)
        record(pair, len(traces), tokens, meta.get("window", 8), threads, here)
    return load_traces(here)


# -- recording -------------------------------------------------------------------------------


def record(pair: str, prompts: int, tokens: int, window: int, threads: int | None, out: Path) -> Path:
    """Traces for the pair's first `prompts` evaluation prompts, the target's output from a local verifier."""
    from edgekit import ServerConfig
    from edgekit.runtime import LlamaDraftModel
    from edgekit.testing import InProcessTransport
    from edgekit.verifier import LlamaEngine, VerifierService

    spec = get_pair(pair)
    draft = LlamaDraftModel(model_path(spec.draft), name=spec.draft)
    config = ServerConfig(port=0, max_sessions=2, threads=threads, calibrate="off")
    engine = LlamaEngine(str(model_path(spec.target)), name=spec.target, max_context=config.max_context,
                         n_seq=config.max_sessions, max_block=config.max_block, threads=threads)
    target = InProcessTransport(VerifierService(engine, config))
    target.handshake(draft.fingerprint(), draft_model=spec.draft, draft_hidden_size=0)
    traces = []
    for i, p in enumerate(C.load_prompts(limit=prompts)):
        prompt = draft.tokenize(p["prompt"])
        out_tokens = [t.token for t in target.generate(GenerateRequest(prompt, "greedy", seed=0, max_tokens=tokens))]
        # Stop at the end of the text: a device would (the last token ends it).
        traces.append(record_trace(draft, prompt, out_tokens, window))
        print(f"  trace {i + 1}/{prompts}: {len(prompt)} prompt tokens, {len(out_tokens)} target tokens, "
              f"draft step {traces[-1].step_ms:.1f} ms", file=sys.stderr)
    save_traces(out, traces, {"pair": pair, "draft": spec.draft, "target": spec.target, "window": window,
                              "tokens": tokens, "machine": C.machine()})
    engine.close()
    draft.close()
    return out


# -- the verifier under test -------------------------------------------------------------------


@dataclass(frozen=True)
class Served:
    address: str
    pid: int


@contextmanager
def serve_process(serve_args: list[str], log: Path | None, replay: Path | None = None):
    """`edgekit serve SERVE_ARGS` on a free loopback port, in a process of its own, until the block ends;
    with `replay` (a traces JSON), served by rigs/replayed.py: greedy rows answered as those traces'
    target answered them."""
    port = C.free_port()
    launcher = (["-c", "from edgekit.cli.app import main; main()", "serve"] if replay is None
                else [str(HERE / "rigs" / "replayed.py"), str(replay)])
    cmd = [sys.executable, *launcher, "--port", str(port), *serve_args]
    out = open(log, "w") if log else subprocess.DEVNULL  # noqa: SIM115  (closed below)
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        _wait_ready(f"127.0.0.1:{port}", proc, timeout=600)
        yield Served(f"127.0.0.1:{port}", proc.pid)
    finally:
        C.stop_process(proc)
        if log:
            out.close()  # type: ignore[union-attr]


def serve_flags(policy: str) -> list[str]:
    """`edgekit serve`'s flags for a system's verifier policy: "fcfs" or "wisp", "/response" for
    response budgets, "+goodspeed", "+fixed" or "+random" for draft budgets it assigns, then any
    other flags after a space (`SYSTEMS`)."""
    policy, *flags = policy.split()
    policy, _, budgets = policy.partition("+")
    policy, _, budget = policy.partition("/")
    return ["--policy", policy, "--slo-budget", budget or "round", "--budgets", budgets or "none", *flags]


@contextmanager
def verifier(pair: str, policy: str, max_sessions: int, threads: int | None, numerics: str, log: Path | None,
             token_budget: int = 0, extra: Sequence[str] = (), replay: tuple[Path, Path] | None = None):
    """The pair's verifier under `policy` (`serve_flags`; C = `token_budget` or auto); its address. With
    `replay` (a target GGUF, a traces JSON): that target, its greedy rows answered from the traces
    (`serve_process`)."""
    model = ["--pair", pair] if replay is None else ["--model", str(replay[0])]
    args = [*model, *serve_flags(policy), "--max-sessions", str(max_sessions), "--numerics", numerics,
            "--token-budget", str(token_budget)]
    if threads:
        args += ["--threads", str(threads)]
    with serve_process([*args, *extra], log, replay[1] if replay else None) as served:
        yield served.address


def _wait_ready(address: str, proc: subprocess.Popen, timeout: float) -> None:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"edgekit serve exited with {proc.returncode}")
        try:
            with grpc.insecure_channel(address) as ch:
                r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=2)
                if r.status == health_pb2.HealthCheckResponse.SERVING:
                    return
        except grpc.RpcError:
            pass
        time.sleep(1.0)
    raise RuntimeError(f"the verifier at {address} was not serving within {timeout:.0f} s")


# -- devices ------------------------------------------------------------------------------------


def device_specs(n: int, seed: int, classes: dict[str, float], speed_range: tuple[float, float],
                 rtt_range: tuple[float, float]) -> list[DeviceSpec]:
    """N devices, each with a class (WISP sec. 5.3 draws them at random; here the classes go round a
    shuffled order, so that every class has its share of devices even when N is small), a drafting
    speed, an RTT and rates, all drawn at random. Device i is the same at every N."""
    rng = random.Random(seed)
    names = list(classes)
    rng.shuffle(names)
    out = []
    for i in range(n):
        name = names[i % len(names)]
        out.append(DeviceSpec(name, classes[name], speed_factor=rng.uniform(*speed_range),
                              rtt_ms=rng.uniform(*rtt_range), uplink_mbps=rng.uniform(5, 50),
                              downlink_mbps=rng.uniform(10, 100)))
    return out


def controller_factory(drafting: str, pair: str, max_window: int, k: int):  # type: ignore[no-untyped-def]
    if drafting == "budget":  # the verifier's budget decides: draft all of it
        return lambda: FixedWindow(max_window)
    if drafting != "predictor":
        return lambda: FixedWindow(k)
    from edgekit.drafting import OnnxPredictor, shipped_predictor

    spec = get_pair(pair)
    path = shipped_predictor(spec.draft, spec.target, "greedy")
    if path is None:
        raise SystemExit(f"no predictor is shipped for {pair}; use a fixed-window system")
    return lambda: PredictorController(OnnxPredictor(str(path)), max_window)


def run_fleet(address: str, system: str, n: int, args: argparse.Namespace, traces, meta) -> Fleet:  # type: ignore[no-untyped-def]
    _policy, mode, drafting = SYSTEMS[system]
    specs = device_specs(n, args.seed, dict(DEFAULT_SLO_CLASSES), (args.speed_min, args.speed_max),
                         (args.rtt_min, args.rtt_max))
    fp = _draft_fingerprint(meta)
    # SLED's re-prefill builds the context's KV in prefill batches where the recording built its
    # generated part a row at a time: even with exact numerics a near tie can go the other way there
    # (seen on an AMD EPYC at the smoke's 5th token; a verifier rebuilding each span as it was built
    # is issue 52). Such a response ends where it diverged, counted in `divergences`.
    on_divergence = "end" if mode == "reprefill" else getattr(args, "on_divergence", "fail")
    fleet = Fleet(address, fp, traces, specs, mode=mode,
                  controller=controller_factory(drafting, meta["pair"], meta["window"], args.k),
                  duration=args.duration, max_window=meta["window"], seed=args.seed, on_divergence=on_divergence)
    return fleet.run()


_FINGERPRINTS: dict = {}


def _draft_fingerprint(meta: dict):  # type: ignore[no-untyped-def]
    """The pair's draft tokenizer fingerprint (loads the draft once, vocabulary only)."""
    if meta["draft"] not in _FINGERPRINTS:
        from edgekit.runtime import LlamaDraftModel

        d = LlamaDraftModel(model_path(meta["draft"]), name=meta["draft"])
        _FINGERPRINTS[meta["draft"]] = d.fingerprint()
        d.close()
    return _FINGERPRINTS[meta["draft"]]


def attribution(fleet: Fleet, window: int = 20, rho: float = 1.5) -> dict:
    """WISP eq. 21: a violated round is compute-dominant if its verify time exceeds rho times the
    mean of the last `window` rounds' verify times, else queue-dominant."""
    rounds = sorted(fleet.rounds, key=lambda r: r.t)
    compute = queue = 0
    points = []
    for k, r in enumerate(rounds):
        if r.deadline_met is None:
            continue
        recent = [x.verify_ms for x in rounds[max(0, k - window) : k]] or [r.verify_ms]
        spike = r.verify_ms / max(sum(recent) / len(recent), 1e-9) > rho
        if r.deadline_met is False:
            compute += spike
            queue += not spike
        points.append((r.queue_ms, r.verify_ms, r.deadline_met is False))
    return {"compute_dominant": compute, "queue_dominant": queue, "points": points}


# -- commands ---------------------------------------------------------------------------------


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
    log = RESULTS / f"fleet_serve_{args.pair}_{re.sub(r'[^A-Za-z0-9.+-]+', '-', policy)}.log"
    replay = None
    if args.replay_target:  # the devices' traces, answered by that target (rigs/replayed.py)
        replay = (Path(args.replay_target), log.with_name(log.stem + "_traces.json"))
        save_traces(replay[1], list(traces), meta or {})
    with verifier(args.pair, policy, max(args.max_sessions, 2), args.threads, args.numerics, log,
                  getattr(args, "token_budget", 0), replay=replay) as address:
        yield address


def capacity(curve: list[tuple[int, float]], epsilon: float) -> int:
    """Cap(tau) (eq. 20): the largest N of the sweep whose violation rate is within epsilon
    (and every smaller N's too: a sweep that recovers above its knee is noise)."""
    cap = 0
    for n, rate in sorted(curve):
        if rate > epsilon:
            break
        cap = n
    return cap


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


def plot_sweep(payload: dict, png: Path, label: str = "") -> None:
    """Top row: each class's violation rate against N, one line per system (Fig. 7). Bottom: goodput
    against N, capacity per class, and (where rounds were logged) the queue/verify plane of two
    systems' rounds at the largest N (Fig. 8: violated rounds marked). `label` prefixes every title."""
    classes = list(DEFAULT_SLO_CLASSES)
    fig, axes = C.subplots(4, nrows=2, width=4.6, height=3.8)
    systems = list(payload["systems"])
    colors = {s: f"C{i}" for i, s in enumerate(systems)}
    for ax, cls in zip(axes[:4], classes):
        for system, r in payload["systems"].items():
            pts = [p for p in r["points"] if cls in p["classes"]]
            ax.plot([p["devices"] for p in pts], [p["classes"][cls]["violation_rate"] for p in pts], marker="o",
                    color=colors[system], label=system)
        ax.axhline(payload["epsilon"], color="grey", lw=0.8, ls="--")
        ax.set(xlabel="devices N", ylabel="responses short of their speed", ylim=(-0.03, 1.03),
               title=f"{label}{cls} ({DEFAULT_SLO_CLASSES[cls]:g} tok/s)")
    for system, r in payload["systems"].items():
        axes[4].plot([p["devices"] for p in r["points"]], [p["goodput_tokens_per_s"] for p in r["points"]],
                     marker="o", color=colors[system], label=system)
    axes[4].set(xlabel="devices N", ylabel="committed tokens/s", title=f"{label}system goodput")
    width = 0.8 / max(len(systems), 1)
    for i, system in enumerate(systems):
        caps = payload["systems"][system].get("capacity", {})
        axes[5].bar([c + i * width for c in range(len(classes))], [caps.get(c, 0) for c in classes], width,
                    color=colors[system], label=system)
    axes[5].set_xticks([c + 0.4 - width / 2 for c in range(len(classes))], classes)
    axes[5].set(ylabel="devices", title=f"{label}Cap(tau), epsilon {payload['epsilon']:g}")
    if not any("attribution" in p for r in payload["systems"].values() for p in r["points"]):
        for ax in axes[6:]:
            fig.delaxes(ax)
        C.save_figure(fig, png)
        return
    shown = [s for s in ("fcfs", "wisp") if s in payload["systems"]]
    shown += [s for s in systems if s not in shown][: 2 - len(shown)]  # two systems, FCFS and WISP first
    for ax, system in zip(axes[6:], shown):
        pts = payload["systems"][system]["points"]
        att = pts[-1]["attribution"] if pts else {"points": []}
        ok = [(q, v) for q, v, bad in att["points"] if not bad]
        bad = [(q, v) for q, v, b in att["points"] if b]
        ax.scatter([q for q, _ in ok], [v for _, v in ok], s=5, alpha=0.4, color="C2", label="met")
        ax.scatter([q for q, _ in bad], [v for _, v in bad], s=8, marker="x", color="C3", label="violated")
        ax.set(xlabel="queue ms", ylabel="verify ms",
               title=f"{system}, N={pts[-1]['devices'] if pts else '-'}: {att.get('compute_dominant', 0)} compute-, "
               f"{att.get('queue_dominant', 0)} queue-dominant")
    C.save_figure(fig, png)


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
    smoke.add_argument("--out-dir", default=str(RESULTS))
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
