"""The fleet simulator's runs (`fleet.py`, `goodspeed.py`, `load.py`, `gpu_sim.py`, the peers'
capacity): the systems compared, the pair's traces as this machine's target decodes them, the
verifier under a system's policy, N devices drawn, a run and its capacity (WISP eq. 20) and
attribution (eq. 21), GOODSPEED's figures of a run, and the sweep's figure."""

from __future__ import annotations

import argparse
import math
import random
import sys
from collections.abc import Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import harness as C
from benchmarks.rigs.fleet_sim import DeviceSpec, Fleet, load_traces, record_trace, save_traces
from benchmarks.rigs.verifier_process import serve_process
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


def traces_path(pair: str, tokens: int = 48) -> Path:
    return C.RESULTS_DIR / (f"fleet_traces_{pair}.json" if tokens == 48 else f"fleet_traces_{pair}_{tokens}.json")


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
    fp = draft_fingerprint(meta)
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


def draft_fingerprint(meta: dict):  # type: ignore[no-untyped-def]
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


def capacity(curve: list[tuple[int, float]], epsilon: float) -> int:
    """Cap(tau) (eq. 20): the largest N of the sweep whose violation rate is within epsilon
    (and every smaller N's too: a sweep that recovers above its knee is noise)."""
    cap = 0
    for n, rate in sorted(curve):
        if rate > epsilon:
            break
        cap = n
    return cap


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


def goodspeed_figures(fleet: Fleet | Any, n: int, rounds: int, beta: float) -> dict:
    """GOODSPEED's figures of one run of `n` devices (`goodspeed.py`): the log-utility over the first
    `rounds` rounds and when it converged, goodput and Jain's index, the budgets' estimate at `beta`.
    `fleet` has `rounds` (RoundLog) and `errors`, as a Fleet or a simulation."""
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
