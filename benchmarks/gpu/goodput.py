"""Where distributed speculation pays (issue 51): a 7B-class target on a GPU serving N devices that
draft for free, against the same GPU and GGUF decoding plainly under llama.cpp's own batching.

One command, in four parts, every figure from the same target file on the same machine:

1. **The engine's cost curve.** llama.cpp's step time for B sequences x T new tokens (T = 1:
   plain decoding; T = K + 1: a block of K drafts), through edgekit's `LlamaEngine` as the
   verifier runs it (greedy rows reduced to their argmax where they are made), at the traces'
   context length. With the traces' acceptance a it gives the roofline of *this* engine: the most
   goodput drafts can add at B devices, max over K of E(a, K) t(B, 1) / t(B, K + 1), E(a, K) =
   (1 - a^(K+1)) / (1 - a). Beside it, where `--roofline JSON` is given (`verify_roofline.py`'s
   output: bf16 in PyTorch, CUDA graphs, fused attention), the same gain from that curve.
2. **The baseline.** llama.cpp's `llama-server -np N` (continuous batching of N slots, each slot
   its own KV stream) and N concurrent streams of plain greedy completions of the traces' prompts,
   each as many tokens as a drafting session commits (`rigs/streams.py`): committed tokens/s, and
   each stream's tokens/s. Then edgekit's own target-only stream (`edgekit serve`'s Generate) at N
   devices, as `serve_load.py --generate` drives it.
3. **edgekit.** `serve_load.py --kinds replayed`: one `edgekit serve` process (the verifier as
   shipped; only its engine's greedy rows are answered from the traces, `rigs/replayed.py`), and
   N devices (`rigs/loadgen.py`: processes pinned to their own cores, each an asyncio loop)
   sending the real draft's recorded blocks, every verdict checked against the real target's
   recorded output. Systems (`--systems`): `kK`, blocks of a fixed K; `goodspeed`, draft budgets
   the verifier assigns by GOODSPEED's gradient scheduling, its token budget C (draft tokens per
   target pass) set from the measured step curve (N x the best K of this engine's roofline at N),
   the devices drafting what they are given up to 8; `predictor`, blocks of up to 8 cut by the
   pair's shipped rejection predictor (reading the recorded draft's features); `wisp`, WISP's
   scheduler over devices holding its four SLO classes in turn, the predictor drafting; `centralized`,
   edgekit's target-only Generate streams. Per system and N: committed tokens/s, each device's
   tokens/s and how many reach each SLO class's speed, the engine's busy share, and the
   generator's own ceiling beside them. Devices draft instantly (the GPU is the only limit, as in the roofline) unless
   `--draft-ms` paces them (a Raspberry Pi 5 class device drafts the 0.5B draft at ~40 ms a
   token, a laptop at ~10), and wait `--rtt-ms` (a range, drawn per device) before each call.
4. **The result.** Per N: edgekit's best system over llama-server, next to each roofline's gain
   for the traces' acceptance (the issue's bar: at least 80% of it, never under 0.95x), engine
   time per committed token (the verifier's engine thread busy), and GPU time per committed
   token for every system (nvidia-smi's busy share of the window, `harness/gpu.py`). JSON and a
   figure.

What is replayed: a random target (`make_target.py`) costs the GPU what the real one would, but
accepts nothing; the acceptance is the real pair's, recorded on a CPU (the traces). Greedy only:
a sampling round's acceptance would be the random target's.

    python -m benchmarks gpu.goodput --target /tmp/t/qwen2.5-7b-random-f16.gguf \\
        --traces benchmarks/results/fleet_traces_qwen-coder.json --llama-server "$(command -v llama-server)" \\
        --devices 8,32,64,128 --systems centralized,k2,k4,goodspeed --server-cores 0-1 --loadgen-cores 2-15 --out DIR
    python -m benchmarks gpu.goodput --dry-run --out DIR     # CI: the same code on the CPU, a toy target

The dry run makes a toy target with gemma's tokenizer, replays gemma's traces, and stands
llama-cpp-python's OpenAI server (one slot) in for llama-server where no binary is given: the
baseline's code path, not its figures.
"""

from __future__ import annotations

import argparse
import functools
import json
import shutil
import statistics
import subprocess
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import benchmarks
from benchmarks import harness as C
from benchmarks.rigs import peers as P
from benchmarks.rigs import streams
from benchmarks.rigs.loadgen import Tables, Workload
from benchmarks.rigs.roofline import ROOFLINE_KS, acceptance_for, best_gain, curve_lookup

HERE = Path(__file__).resolve().parent

BUDGET_WINDOW = 8  # the most a device drafts under budgets (the traces' window)
LABELS = {"centralized": "target-only streams", "goodspeed": "GOODSPEED budgets", "predictor": "rejection predictor",
          "wisp": "WISP, SLO classes"}


# -- acceptance and rooflines -------------------------------------------------------------------


def traces_acceptance(tables: Tables) -> dict[str, float]:
    """The traces' blocks of K as the devices send them: accepted per drafted token, tokens a round
    commits, and the per-token acceptance a that E(a, K) gives for it."""
    k = tables.workload.k
    accepted = [a for row in tables.accepted for a in row]
    per_round = 1 + statistics.mean(accepted)
    return {"k": k, "accepted_per_drafted": sum(accepted) / (k * len(accepted)), "committed_per_round": per_round,
            "a": acceptance_for(per_round, k)}


def torch_roofline(path: Path, model: str) -> list[dict]:
    """`verify_roofline.py`'s rows for `model` (its first context measured)."""
    data = json.loads(path.read_text())
    for m in data["models"]:
        if m["model"] == model:
            return [{"batch": r["batch"], "tokens": r["tokens"], "ms": r["ms"]} for r in m["rows"]]
    raise SystemExit(f"{path} has no rows for {model}")


# -- 1. the engine's cost curve ---------------------------------------------------------------


def step_curve(target: Path, batches: Sequence[int], tokens: Sequence[int], context: int, *, exact: bool,
               gpu_layers: int | None, threads: int | None, repeats: int, max_batch_rows: int,
               reduce_rows: str = "host") -> list[dict]:
    """llama.cpp's time for one batch of B sequences x T new tokens (each sequence `context` tokens
    deep, its T rows reduced to their argmax, as a greedy verify round asks), the median of
    `repeats`, rolled back after each (a feed cuts its sequence to its start). `reduce_rows`: where
    the rows become argmaxes (`LlamaEngine`'s: llama.cpp's backend sampling, or the host)."""
    from edgekit.verifier import Feed, LlamaEngine

    n = max(batches)
    engine = LlamaEngine(str(target), name=target.stem, max_context=context + max(tokens) + 8, n_seq=n,
                         max_block=max(tokens), exact=exact, threads=threads, gpu_layers=gpu_layers,
                         max_batch_rows=max_batch_rows, reduce_rows=reduce_rows)  # type: ignore[arg-type]
    try:
        vocab = engine.n_vocab
        for s in range(n):  # each sequence its own tokens (the values do not change a step's time)
            engine.run_batch([Feed(s, 0, tuple((7 * s + 3 * i) % (vocab - 10) + 5 for i in range(context)), 0)])
        rows = []
        for t in tokens:
            for b in batches:
                feeds = [Feed(s, context, tuple((11 * s + j) % (vocab - 10) + 5 for j in range(t)), t, argmax=vocab)
                         for s in range(b)]
                engine.run_batch(feeds)  # warm: a new shape's first run builds its graph
                times = []
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    engine.run_batch(feeds)
                    times.append((time.perf_counter() - t0) * 1e3)
                rows.append({"batch": b, "tokens": t, "ms": statistics.median(times), "ms_min": min(times)})
                C.progress(f"step B={b:4d} T={t}: {rows[-1]['ms']:8.2f} ms")
    finally:
        engine.close()
    return rows


# -- 2. the baseline ----------------------------------------------------------------------------


def baseline(args: argparse.Namespace, target: Path, prompts: list[tuple[str, int]]) -> dict[str, Any]:
    """llama-server -np N (or the dry run's stand-in) at each N: `rigs/streams.py`'s figures."""
    logs = Path(args.logs)
    points = []
    for n in args.devices:
        server: AbstractContextManager[Any]
        if args.llama_server:
            server = P.llama_server(args.llama_server, target, None, (), logs / f"llama-server-{n}.log",
                                    gpu=args.gpu_layers != 0, parallel=n, slot_context=args.slot_context,
                                    threads=args.threads)
        else:  # the stand-in: llama-cpp-python's OpenAI server, one slot, CPU
            server = P.llama_cpp_python_server(target, logs / f"llama-cpp-python-{n}.log", threads=args.threads or 1)
        try:
            with server as started:
                base, model = ((f"http://{started[0]}/v1", "target") if args.llama_server else started[:2])
                streams.complete(base, model, *prompts[0])  # the first kernels and graphs, before any clock
                point = streams.measure(base, model, prompts, n, duration=args.duration, warmup=args.warmup)
        except (OSError, RuntimeError, ValueError, KeyError) as exc:  # a server that would not start or answer
            points.append({"devices": n, "failed": f"{type(exc).__name__}: {exc}"})
            C.progress(f"baseline N={n:4d}: FAILED {points[-1]['failed']}")
            continue
        point["devices"] = n
        points.append(point)
        C.progress(f"baseline N={n:4d}: {point['committed_tokens_per_s']:9.1f} tok/s, per stream "
                   f"{C.fmt(point['per_stream_tokens_per_s']['median'], 1)} tok/s"
                   + (f", errors {point['errors'][:1]}" if point["errors"] else ""))
    return {"server": args.llama_server or "llama-cpp-python's server (stand-in: --dry-run without --llama-server)",
            "label": "llama-server -np N (plain)" if args.llama_server else "stand-in: llama-cpp-python's server",
            "points": points}


# -- 3. edgekit (serve_load.py) -------------------------------------------------------------------


def edgekit_points(args: argparse.Namespace, target: Path, system: str, devices: Sequence[int], *,
                   kinds: str = "replayed", token_budget: int = 0) -> list[dict[str, Any]]:
    """serve_load.py's points for edgekit serve on `target`, `system`'s devices (module docstring)."""
    argv = ["--traces", str(args.traces), "--target", str(target), "--kinds", kinds,
            "--devices", ",".join(map(str, devices)), "--duration", str(args.duration), "--warmup", str(args.warmup),
            "--numerics", args.numerics, "--server-cores", args.server_cores, "--results-dir", str(args.logs),
            "--out", f"serve_load_{system}_{'-'.join(map(str, devices))}", "--no-plot", "--profile", "",
            "--one-verifier", "--max-batch-rows", str(args.max_batch_rows), "--draft-ms", str(args.draft_ms),
            "--rtt-ms", args.rtt_ms]
    if system == "centralized":
        argv += ["--generate", "--k", "4"]  # k: how many tokens a stream asks for, as a session of blocks of 4 commits
    elif system == "predictor":
        argv += ["--drafting", "predictor", "--k", str(BUDGET_WINDOW)]
    elif system == "wisp":  # WISP's scheduler over devices holding SLO classes, the predictor drafting
        argv += ["--policy", "wisp", "--slo", "--drafting", "predictor", "--k", str(BUDGET_WINDOW)]
    elif system == "goodspeed":
        argv += ["--budgets", "goodspeed", "--token-budget", str(token_budget), "--k", str(BUDGET_WINDOW)]
    else:
        argv += ["--k", system[1:]]
    if args.loadgen_cores:
        argv += ["--loadgen-cores", args.loadgen_cores]
    if args.gpu_layers is not None:
        argv += ["--gpu-layers", str(args.gpu_layers)]
    if args.threads:
        argv += ["--threads", str(args.threads)]
    argv += ["--reduce-rows", args.reduce_rows, "--frontends", str(args.frontends)]
    return list(benchmarks.run("serve_load", argv)["points"])


def run_system(args: argparse.Namespace, target: Path, system: str, payload: dict[str, Any], first: bool) -> dict:
    """A system's points at every N (goodspeed: a verifier per N, each with its own C)."""
    kinds = "instant,replayed" if first else "replayed"  # the generator's ceiling, once
    if system != "goodspeed":
        return {"points": edgekit_points(args, target, system, args.devices, kinds=kinds)}
    points, budgets = [], {}
    for n in args.devices:
        best = best_gain(curve_lookup(payload["step_curve"]), n, payload["acceptance"]["a"],
                         curve_blocks(payload["step_curve"])) if payload.get("step_curve") else None
        budgets[n] = n * best["k"] if best else 0  # 0: the verifier's own (from its estimator)
        points += edgekit_points(args, target, system, [n], kinds=kinds, token_budget=budgets[n])
    return {"points": points, "token_budget": budgets}


def curve_blocks(curve: Sequence[dict]) -> list[int]:
    """The K of ROOFLINE_KS whose T = K + 1 the step curve measured."""
    return [k for k in ROOFLINE_KS if k + 1 in {r["tokens"] for r in curve}]


# -- 4. the result -------------------------------------------------------------------------------


def compare(payload: dict[str, Any], args: argparse.Namespace) -> list[dict[str, Any]]:
    """Per N: each system's figures, edgekit's best speculative system over the baseline, the rooflines'."""
    base = {p["devices"]: p for p in payload["baseline"]["points"]}
    skipped = {"failed": "not run"}
    a = payload["acceptance"]["a"]
    curve = payload.get("step_curve")
    engine = curve_lookup(curve) if curve else None
    torch = curve_lookup(payload["torch_roofline"]["rows"]) if payload.get("torch_roofline") else None
    rows = []
    for n in args.devices:
        plain = base.get(n, skipped)
        ok = "failed" not in plain
        row: dict[str, Any] = {
            "devices": n, "baseline_tokens_per_s": plain["committed_tokens_per_s"] if ok else None,
            "baseline_per_stream": plain["per_stream_tokens_per_s"]["median"] if ok else None,
            "baseline_gpu_ms_per_token": _gpu_ms(plain) if ok else None, "edgekit": {}}
        for system, run in payload["edgekit"].items():
            p = next(p for p in run["points"] if p["kind"] == "replayed" and p["devices"] == n)
            if "failed" in p:
                row["edgekit"][system] = {"failed": p["failed"], "committed_tokens_per_s": None}
                continue
            busy = p.get("verifier", {}).get("engine_busy_share")
            row["edgekit"][system] = {
                "committed_tokens_per_s": p["committed_tokens_per_s"], "rounds_per_s": p["rounds_per_s"],
                "gain": C.ratio(p["committed_tokens_per_s"], row["baseline_tokens_per_s"]) if ok else None,
                "device_tokens_per_s": p.get("device_tokens_per_s"), "engine_busy_share": busy,
                "engine_ms_per_token": C.ratio(busy * 1e3, p["committed_tokens_per_s"]) if busy else None,
                "gpu_ms_per_token": _gpu_ms(p),
                "acceptance": p["acceptance"], "limit": p.get("limit"), "mismatches": p["mismatches"],
                "errors": p["errors"]}
        speculative = [s for s, v in row["edgekit"].items() if s != "centralized" and v.get("gain")]
        best = max(speculative, key=lambda s: row["edgekit"][s]["committed_tokens_per_s"], default=None)
        row["best"] = best
        row["gain"] = row["edgekit"][best]["gain"] if best else None
        row["roofline_llama_cpp"] = best_gain(engine, n, a, curve_blocks(curve)) if engine else None
        row["roofline_torch_bf16"] = best_gain(torch, n, a, ROOFLINE_KS) if torch else None
        bar = row["roofline_torch_bf16"] or row["roofline_llama_cpp"]
        row["share_of_roofline"] = C.ratio(row["gain"], bar["gain"]) if bar and row["gain"] else None
        rows.append(row)
    return rows


def _gpu_ms(point: dict[str, Any]) -> float | None:
    """GPU time per committed token: nvidia-smi's busy share of the window over the tokens a
    second (harness.gpu: a ceiling, the same instrument for every server); None without a GPU."""
    share = point.get("gpu_busy_share")
    return C.ratio(share * 1e3, point["committed_tokens_per_s"]) if share is not None else None


def _nan(x: float | None) -> float:
    return float("nan") if x is None else x


def plot(payload: dict[str, Any], png: Path) -> None:
    fig, axes = C.subplots(3, width=5.2, height=4.2)
    rows = payload["comparison"]
    ns = [r["devices"] for r in rows]
    replayed = " (acceptance replayed)" if not payload["dry_run"] else " (dry run: CPU, toy target)"
    ax = axes[0]
    ax.plot(ns, [_nan(r["baseline_tokens_per_s"]) for r in rows], "k-o", label=payload["baseline"]["label"])
    for i, system in enumerate(payload["edgekit"]):
        style = dict(ls="--", marker="s", color="grey") if system == "centralized" else dict(marker="^", color=f"C{i}")
        label = "edgekit " + LABELS.get(system, f"fixed K={system[1:]}")
        ax.plot(ns, [_nan(r["edgekit"][system]["committed_tokens_per_s"]) for r in rows], label=label, **style)
    ax.set(xlabel="devices (streams) N", ylabel="committed tokens/s", title=f"goodput{replayed}")
    ax = axes[1]
    ax.plot(ns, [_nan(r["gain"]) for r in rows], "C3-o", label="edgekit's best over the baseline")
    for key, style, label in (("roofline_llama_cpp", "C0--", "roofline, llama.cpp's step curve"),
                              ("roofline_torch_bf16", "C2:", "roofline, bf16 PyTorch (verify_roofline.py)")):
        if any(r[key] for r in rows):
            ax.plot(ns, [r[key]["gain"] if r[key] else float("nan") for r in rows], style, marker=".", label=label)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.axhline(0.95, color="grey", lw=0.8, ls=":")
    ax.set(xlabel="devices N", ylabel="goodput over plain decoding",
           title=f"gain, traces' acceptance a = {payload['acceptance']['a']:.2f}")
    ax = axes[2]
    curve = payload.get("step_curve", [])
    for i, t in enumerate(sorted({r["tokens"] for r in curve})):
        pts = sorted((r["batch"], r["ms"]) for r in curve if r["tokens"] == t)
        ax.plot([b for b, _ in pts], [ms for _, ms in pts], marker="o", color=f"C{i}", label=f"T = {t}")
    also = payload.get("step_curve_also")
    if also:  # the same steps with the rows reduced the other way: dashed, same colours
        for i, t in enumerate(sorted({r["tokens"] for r in curve})):
            pts = sorted((r["batch"], r["ms"]) for r in also["rows"] if r["tokens"] == t)
            ax.plot([b for b, _ in pts], [ms for _, ms in pts], ls="--", marker="x", color=f"C{i}",
                    label=f"T = {t}, rows reduced: {also['reduce_rows']}" if i == 0 else None)
    ax.set(xlabel="sequences B", ylabel="ms per step",
           title=f"llama.cpp step, B x T new tokens (rows reduced: {payload.get('reduce_rows', 'host')})")
    for ax, xs in zip(axes, (ns, ns, sorted({r["batch"] for r in curve}))):
        ax.set_xscale("log", base=2)
        ax.minorticks_off()
        ax.set_xticks(xs, [str(x) for x in xs])
    C.save_figure(fig, png)


# -- the command ----------------------------------------------------------------------------------


def _make_toy_target(out: Path) -> Path:
    from edgekit.models import pair_paths

    done = subprocess.run(C.module_command("benchmarks.gpu.make_target", "--shape", "toy", "--types", "f16",
                                           "--tokenizer", str(pair_paths("gemma-270m")[1]), "--out", str(out)),
                          capture_output=True, text=True, timeout=900, env=C.module_env())
    if done.returncode:
        raise SystemExit(f"make_target.py failed: {done.stderr[-2000:]}")
    made = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return Path(made[0]["path"])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = C.arguments(__doc__, whole_doc=True, replot=True, threads=0)
    ap.add_argument("--out", default=".", help="folder for goodput.json, goodput.png and the logs")
    ap.add_argument("--logs", default=None, help="folder for the servers' logs and serve_load's JSON (default: --out)")
    ap.add_argument("--dry-run", action="store_true", help="the CPU, a toy target, two device counts, short windows")
    ap.add_argument("--target", default=None, help="the target GGUF (gpu/make_target.py makes a random one)")
    ap.add_argument("--traces", default=str(HERE.parent / "results" / "fleet_traces_qwen-coder.json"),
                    help="recorded drafting of a real pair whose tokenizer the target has (fleet.py record)")
    ap.add_argument("--llama-server", default=shutil.which("llama-server"), help="llama.cpp's server binary")
    ap.add_argument("--devices", default="8,32,64,128", help="device (stream) counts N")
    ap.add_argument("--systems", default="centralized,k2,k4,predictor,goodspeed,wisp",
                    help="edgekit's: kK (fixed blocks of K), predictor, goodspeed (budgets), wisp, centralized "
                         "(target-only streams)")
    ap.add_argument("--draft-ms", type=float, default=0.0, help="the devices' drafting time per token (0: instant)")
    ap.add_argument("--rtt-ms", default="0", metavar="MS[-MS]", help="the devices' round trips, drawn per device")
    ap.add_argument("--curve-batches", default=None, help="B of the step curve (default: --devices)")
    ap.add_argument("--curve-ks", default="1,2,4,8", help="K of the step curve's T = K + 1 (and T = 1)")
    ap.add_argument("--roofline", default=None, metavar="JSON", help="verify_roofline.py's output, for its gain")
    ap.add_argument("--roofline-model", default="qwen2.5-7b")
    ap.add_argument("--duration", type=float, default=8.0, help="seconds measured per point")
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--numerics", default=None, help="the verifier's (default: fast on a GPU, exact on the CPU)")
    ap.add_argument("--server-cores", default="0", help="the verifier's cores")
    ap.add_argument("--loadgen-cores", default=None, help="the devices' cores (default: every other core)")
    ap.add_argument("--max-batch-rows", type=int, default=2048, help="the verifier's --max-batch-rows")
    ap.add_argument("--frontends", type=int, default=1,
                    help="the verifier's --frontends: processes over one engine, on --server-cores")
    ap.add_argument("--slot-context", type=int, default=512, help="llama-server's context per slot")
    ap.add_argument("--reduce-rows", default="host", choices=("host", "llama"),
                    help="where the verifier's greedy rows become argmaxes (edgekit serve --reduce-rows)")
    ap.add_argument("--curve-also", default=None, choices=("host", "llama"),
                    help="the step curve measured again with the rows reduced this way (step_curve_also)")
    ap.add_argument("--skip", default="", help="parts not to run: curve, baseline (comma-separated); a second "
                    "call's, where the first measured them")
    args = C.parse(ap, argv, plot=plot, machine=False)
    from edgekit.runtime import gpu_offload, llama_build

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    args.logs = Path(args.logs or out)
    args.logs.mkdir(parents=True, exist_ok=True)
    if args.dry_run:
        args.devices, args.duration, args.warmup, args.curve_ks = "2,4", 2.0, 1.0, "1,2,4"
        if args.systems == ap.get_default("systems"):
            args.systems = "centralized,k4,goodspeed,wisp"  # wisp drafts with the predictor
        if args.traces == ap.get_default("traces"):
            args.traces = str(HERE.parent / "results" / "fleet_traces_gemma-270m.json")
        args.target = args.target or str(_make_toy_target(args.logs / "target"))
    elif not args.target:
        raise SystemExit("--target GGUF (benchmarks/gpu/make_target.py writes one), or --dry-run")
    elif not gpu_offload():
        raise SystemExit("this llama.cpp cannot offload to a GPU (a CPU build); --dry-run runs the same code on a CPU")
    args.gpu_layers = -1 if gpu_offload() and not args.dry_run else 0
    args.numerics = args.numerics or ("fast" if args.gpu_layers else "exact")
    args.threads = args.threads or None
    args.devices = C.csv_list(args.devices, int)
    systems = C.csv_list(args.systems)
    unknown = [x for x in systems if x not in LABELS and not (x[0] == "k" and x[1:].isdigit())]
    if unknown:
        raise SystemExit(f"unknown systems {unknown}: kK, {', '.join(LABELS)}")
    if set(C.csv_list(args.skip)) - {"curve", "baseline"}:
        raise SystemExit(f"--skip {args.skip}: curve, baseline")
    skip = set(C.csv_list(args.skip))
    target = Path(args.target)
    started = time.time()
    # The traces' blocks of 4 (the roofline's usual K) give their acceptance a; the baseline's
    # completions are the traces' prompts (they were recorded from these texts), each as many tokens
    # as a drafting session commits on it.
    tables = Tables(Workload(traces=str(Path(args.traces).resolve()), tokenizer=str(target.resolve()), k=4))
    prompts = [(p["prompt"], len(b)) for p, b in zip(C.load_prompts(limit=len(tables.prompts)), tables.blocks)]
    context = round(statistics.mean(len(p) + len(b) / 2 for p, b in zip(tables.prompts, tables.blocks)))
    payload: dict[str, Any] = {
        "benchmark": "gpu_goodput", "dry_run": args.dry_run, "gpu": C.gpu_name(),
        "target": {"path": str(target), "bytes": target.stat().st_size}, "traces": str(args.traces),
        "traces_meta": json.loads(Path(args.traces).read_text())["meta"], "llama_build": llama_build(),
        "numerics": args.numerics, "reduce_rows": args.reduce_rows, "devices": args.devices, "systems": systems,
        "context": context, "draft_ms": args.draft_ms, "rtt_ms": args.rtt_ms,
        "acceptance": traces_acceptance(tables),
        "replayed": "the target's weights are random; every greedy row's token is the traces' real target's "
                    "(rigs/replayed.py): the GPU's work is real, the acceptance is the recorded pair's",
    }
    if "curve" not in skip:
        curve_ks = C.csv_list(args.curve_ks, int)
        batches = C.csv_list(args.curve_batches, int) if args.curve_batches else args.devices
        measure = functools.partial(step_curve, target, batches, sorted({1, *(k + 1 for k in curve_ks)}), context,
                                    exact=args.numerics == "exact", gpu_layers=args.gpu_layers, threads=args.threads,
                                    repeats=5 if args.dry_run else 9, max_batch_rows=args.max_batch_rows)
        payload["step_curve"] = measure(reduce_rows=args.reduce_rows)
    if args.roofline:
        payload["torch_roofline"] = {"source": args.roofline,
                                     "rows": torch_roofline(Path(args.roofline), args.roofline_model)}
    payload["baseline"] = ({"label": "not run (--skip baseline)", "points": []} if "baseline" in skip
                           else baseline(args, target, prompts))
    C.write_result("goodput", payload, out)  # each part kept as it ends, whatever fails after
    payload["edgekit"] = {}
    for i, system in enumerate(systems):
        payload["edgekit"][system] = run_system(args, target, system, payload, first=i == 0)
        C.write_result("goodput", payload, out)
    payload["comparison"] = compare(payload, args)
    C.write_result("goodput", payload, out)
    if args.curve_also and "curve" not in skip:  # last: llama.cpp's backend sampling is experimental, and an
        # abort there loses nothing measured before it
        payload["step_curve_also"] = {"reduce_rows": args.curve_also, "rows": measure(reduce_rows=args.curve_also)}
    payload["wall_s"] = time.time() - started
    path = C.write_result("goodput", payload, out)
    plot(payload, path.with_suffix(".png"))
    print(C.table(["N", "baseline tok/s", *[f"{x} tok/s" for x in payload["edgekit"]], "gain (best)",
                   "roofline (llama.cpp)", "roofline (bf16)"],
                  [[r["devices"], C.fmt(r["baseline_tokens_per_s"], 1),
                    *[C.fmt(r["edgekit"][x]["committed_tokens_per_s"], 1) for x in payload["edgekit"]],
                    f"{C.fmt(r['gain'])} ({r['best']})", C.fmt((r["roofline_llama_cpp"] or {}).get("gain")),
                    C.fmt((r["roofline_torch_bf16"] or {}).get("gain"))] for r in payload["comparison"]]))
    print(f"wrote {path} in {payload['wall_s']:.0f} s")
    return payload


if __name__ == "__main__":
    main()
