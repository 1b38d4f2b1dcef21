"""Two machines on one box, and the systems a user could pick instead of edgekit (issue 37).

The device is the benchmark's own process, pinned to one core (`pin_to_device_core`); the
verifier is a server process pinned to the cores left (`verifier_cores`), reached through
`rigs/linkemu`'s `DelayProxy` (a user-space relay delaying each direction by half the RTT).
Each system's generation is timed as its user sees it, and the verifier process's CPU time
around it is what the operator pays. Shared by `side_by_side.py` (CPU) and `gpu/suite.py`.

Systems, by name:

    local                  the target alone on the device core (through `edgekit serve` there, no link)
    centralized            edgekit serve's target-only stream (the verifier decodes every token)
    llama-server           llama.cpp's own server decoding every token (a stock centralized server)
    llama-cpp-python       llama-cpp-python's OpenAI server decoding every token (another stock one)
    vllm                   vLLM's CPU build decoding every token, on the target's weights converted to
                           float32 (engines/vllm): another model's numbers than the GGUF's
    co-located[-N]         llama.cpp's own draft-model speculation on the verifier (`-md --spec-type
                           draft-simple`; without --spec-type it loads the draft and never drafts),
                           drafting its default of up to 3 tokens, or up to N
    co-located-tuned       the same, up to 8 tokens, with --spec-draft-p-min at the value that
                           replayed best on the pair's traces (llama.cpp's default p-min is 0)
    edgekit-POLICY[-K][+proactive]
                           distributed speculation: POLICY is fixed (K tokens), p-min, predictor
                           (its threshold following its delay schedule), predictor-static (its
                           one operating threshold), latency, auto-draft ("auto" drafting only: it
                           never takes the target-only stream) or auto (the defaults); +proactive
                           drafts the next block while one is verified
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from benchmarks import harness as C
from benchmarks.rigs import fleet_runs as F
from benchmarks.rigs.verifier_process import serve_process

CORES = frozenset(os.sched_getaffinity(0))  # before the device pins itself to one of them


def pin_to_device_core() -> int:
    """Pins this process (the device) to one core, the first it may use; returns it."""
    core = min(CORES)
    os.sched_setaffinity(0, {core})
    return core


def verifier_cores(device_core: int) -> set[int]:
    """The others: the verifier's machine (on a 1-core box it shares the device's)."""
    return set(CORES - {device_core}) or {device_core}


@contextmanager
def serve(target: Path, *, numerics: str, policy: str = "fcfs", cores: set[int] | None = None, gpu_layers: int = -1,
          threads: int | None = None, sessions: int = 4, log: Path | None = None):
    """`edgekit serve` on a free port, pinned to `cores`; its address and process id."""
    serve_args = ["--model", str(target), *F.serve_flags(policy), "--max-sessions", str(sessions),
                  "--numerics", numerics, "--gpu-layers", str(gpu_layers), "--max-context", "2048"]
    if threads:
        serve_args += ["--threads", str(threads)]
    with ExitStack() as stack:
        with C.pinned(cores):  # the server's process inherits them; this one is back on its own after
            served = stack.enter_context(serve_process(serve_args, log))
        yield served


@contextmanager
def proxy_to(address: str):
    from benchmarks.rigs.linkemu import DelayProxy

    host, port = address.rsplit(":", 1)
    with DelayProxy((host, int(port))) as p:
        yield p


def cpu_seconds(pid: int) -> float:
    """CPU seconds of `pid` and its descendants (vLLM runs its engine in a child process)."""
    import psutil

    try:
        p = psutil.Process(pid)
        procs = [p, *p.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0.0
    for q in procs:
        try:
            t = q.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


# -- edgekit ------------------------------------------------------------------------------


def edgekit_overrides(system: str) -> dict[str, Any] | None:
    """GenerationConfig fields of an `edgekit-...` system; None for the target-only stream."""
    if system == "centralized":
        return None
    name, _, extra = system.removeprefix("edgekit-").partition("+")
    if extra not in ("", "proactive"):
        raise ValueError(f"unknown system {system!r}")
    fields: dict[str, Any] = {"proactive": extra == "proactive"}
    policy, _, k = name.partition("-") if name.startswith("fixed-") else (name, "", "")
    if policy == "fixed":
        fields.update(drafting="fixed", draft_k=int(k))
    elif policy == "auto-draft":
        fields.update(drafting="auto", stream_when_faster=False)
    elif policy == "predictor-static":
        fields.update(drafting="predictor", predictor_schedule=False)
    elif policy in ("p-min", "predictor", "latency", "auto"):
        fields["drafting"] = policy
    else:
        raise ValueError(f"unknown system {system!r}")
    return fields


def run_edgekit(client: Any, prompt: str, system: str) -> dict:
    """One greedy generation by `system` (see the module's list), timed as its user sees it."""
    overrides = edgekit_overrides(system)
    if overrides is None:
        final = client.generate_target_only(prompt).until_done()
    else:
        final = client.generate(prompt, **overrides).until_done()
    s = final.stats
    n = max(s.completion_tokens, 1)
    return {"text": final.text, "tokens": s.completion_tokens, "elapsed_s": s.elapsed_s,
            "ttft_ms": s.time_to_first_token_ms, "ms_per_token": 1e3 * s.elapsed_s / n,
            "verify_ms_per_token": s.server.verify_ms / n if s.server.verify_ms else None,
            "rounds": s.rounds, "accepted": s.accepted, "drafted": s.drafted, "route": s.drafting,
            "plain_rounds": s.plain_rounds}


# -- llama.cpp's server ---------------------------------------------------------------------

# llama-server's flags for each stock system it plays ("co-located-tuned" adds its p-min, per pair)
STOCK = {"llama-server": (), "co-located": ("--spec-type", "draft-simple"),
         "co-located-8": ("--spec-type", "draft-simple", "--spec-draft-n-max", "8"),
         "co-located-tuned": ("--spec-type", "draft-simple", "--spec-draft-n-max", "8")}


def stock_flags(system: str, pair: str) -> tuple[str, ...]:
    """llama-server's flags for `system`. "co-located-tuned" drafts up to 8 tokens while the draft's
    top probability is at least the p-min that replayed best as llama.cpp runs it (the unsure token
    dropped) on the pair's predictor traces (its card's `best_p_min_llama`; llama.cpp's default is 0)."""
    flags = STOCK[system]
    if system == "co-located-tuned":
        from edgekit.drafting import shipped_cards

        card = next((c for c in shipped_cards() if c["pair"] == pair), None)
        if card is None:
            raise RuntimeError(f"no shipped predictor card for {pair}: no tuned p-min")
        flags += ("--spec-draft-p-min", f"{card['best_p_min_llama']['p_min']:.3f}")
    return flags



@contextmanager
def llama_server(binary: str, target: Path, draft: Path | None, flags: tuple[str, ...], log: Path, *,
                 gpu: bool = True, threads: int | None = None, cores: set[int] | None = None, parallel: int = 1,
                 slot_context: int = 4096):
    """llama.cpp's server on `target` (with `flags` naming speculation, the draft beside it), on
    the GPU or on `threads` CPU threads pinned to `cores`, with `parallel` slots of `slot_context`
    tokens each (continuous batching of their streams; `-c` is all slots' together); its address
    and process id."""
    port = C.free_port()
    cmd = [binary, "-m", str(target), "-ngl", "99" if gpu else "0", "--host", "127.0.0.1", "--port", str(port),
           "-c", str(slot_context * parallel), "-np", str(parallel), "--no-warmup"]
    if threads:
        cmd += ["-t", str(threads), "-tb", str(threads)]
    if flags and draft is not None:  # speculation: the draft beside the target
        cmd += ["-md", str(draft), "-ngld", "99" if gpu else "0", *flags]
        if threads:
            cmd += ["-td", str(threads), "-tbd", str(threads)]
    with open(log, "w") as out, C.pinned(cores):
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    try:
        _ready(f"http://127.0.0.1:{port}/health", proc, "llama-server", log, 180)
        yield f"127.0.0.1:{port}", proc.pid
    finally:
        C.stop_process(proc, 20)


def run_llama_server(address: str, prompt: str, max_tokens: int) -> dict:
    """One streamed greedy completion; times as the client sees them."""
    body = json.dumps({"prompt": prompt, "n_predict": max_tokens, "temperature": 0.0, "top_k": 1, "stream": True,
                       "cache_prompt": False, "seed": 0}).encode()
    req = urllib.request.Request(f"http://{address}/completion", data=body,
                                 headers={"Content-Type": "application/json"})
    start = time.perf_counter()
    first = None
    text, timings = [], {}
    with urllib.request.urlopen(req, timeout=300) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            msg = json.loads(line[5:])
            if msg.get("content"):
                first = first or time.perf_counter()
                text.append(msg["content"])
            if msg.get("stop"):
                timings = msg.get("timings", {})
                break
    elapsed = time.perf_counter() - start
    n = int(timings.get("predicted_n") or 0) or max(len(text), 1)
    return {"text": "".join(text), "tokens": n, "elapsed_s": elapsed,
            "ttft_ms": 1e3 * (first - start) if first else None, "ms_per_token": 1e3 * elapsed / n,
            "verify_ms_per_token": timings.get("predicted_per_token_ms"),
            "drafted": timings.get("draft_n"), "accepted": timings.get("draft_n_accepted")}


# -- servers that speak OpenAI's API: llama-cpp-python's, vLLM's -------------------------------


def _ready(url: str, proc: subprocess.Popen, what: str, log: Path, deadline_s: float) -> None:
    """Waits until `url` answers 200 (a server's health), failing where `proc` exits or the deadline passes."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}; see {log}")
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"{what} was not ready within {deadline_s:.0f} s; see {log}")


@contextmanager
def llama_cpp_python_server(target: Path, log: Path, *, threads: int = 1, cores: set[int] | None = None):
    """llama-cpp-python's OpenAI server (`python -m llama_cpp.server`) on `target`, CPU only,
    `threads` threads pinned to `cores`; its OpenAI base URL (…/v1), model name and process id."""
    port = C.free_port()
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(target), "--host", "127.0.0.1", "--port",
           str(port), "--n_threads", str(threads), "--n_threads_batch", str(threads), "--n_ctx", "4096",
           "--n_gpu_layers", "0", "--n_ubatch", "1"]  # the verifiers guide's: AMX CPUs crash without it
    with open(log, "w") as out, C.pinned(cores):
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}/v1"
        _ready(base + "/models", proc, "llama-cpp-python's server", log, 180)
        yield base, str(target), proc.pid
    finally:
        C.stop_process(proc, 20)


@contextmanager
def vllm_server(log: Path, *, cores: set[int] | None = None):
    """vLLM's CPU build serving the converted gemma target (engines/vllm: prepare.sh first),
    pinned to `cores`, one OpenMP thread; its OpenAI base URL, model name and engine process ids."""
    from benchmarks.rigs.vllm_server import VllmServer, prepared

    missing = prepared()
    if missing:
        raise RuntimeError(f"vLLM is not prepared ({', '.join(map(str, missing))}): run make vllm")
    server = VllmServer(C.free_port(), log)
    with C.pinned(cores):
        server.start()
    try:
        server.wait_ready()
        with urllib.request.urlopen(server.base + "/models", timeout=10) as r:
            model = json.load(r)["data"][0]["id"]
        assert server.proc is not None
        yield server.base, model, server.proc.pid
    finally:
        server.stop()


def run_openai(base: str, model: str, prompt: str | list[int], max_tokens: int) -> dict:
    """One streamed greedy completion from an OpenAI-compatible server (`prompt`: text, or token
    ids as edgekit's client makes them); times as the client sees them."""
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
                       "stream": True, "stream_options": {"include_usage": True}, "seed": 0}).encode()
    req = urllib.request.Request(f"{base}/completions", data=body, headers={"Content-Type": "application/json"})
    start = time.perf_counter()
    first = None
    text, chunks, usage = [], 0, None
    with urllib.request.urlopen(req, timeout=300) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            msg = json.loads(line[5:])
            usage = msg.get("usage") or usage
            for choice in msg.get("choices") or ():
                if choice.get("text"):
                    first = first or time.perf_counter()
                    text.append(choice["text"])
                    chunks += 1
    elapsed = time.perf_counter() - start
    n = int((usage or {}).get("completion_tokens") or 0) or max(chunks, 1)
    return {"text": "".join(text), "tokens": n, "elapsed_s": elapsed,
            "ttft_ms": 1e3 * (first - start) if first else None, "ms_per_token": 1e3 * elapsed / n}


# -- a fleet ----------------------------------------------------------------------------------


def fleet(args: argparse.Namespace, draft: Path, target: Path, *, pair: str, names: tuple[str, str],
          cores: set[int] | None = None, replicas: int = 1, proxy: str = "haproxy") -> dict:
    """Fleet capacity: traces recorded against the verifier (`args.numerics`, `args.gpu_layers`, on
    `cores`), then a sweep of `args.fleet_devices` simulated devices per system of
    `args.fleet_systems`; capacity per SLO class (WISP eq. 20) and goodput. `names`: the draft's
    and the target's, for the traces. With `replicas` > 1, that many verifiers (each on `cores`,
    each with room for every device) behind `proxy` with deploy/'s config (`_proxies`)."""
    from benchmarks.rigs import proxies as _proxies
    from benchmarks.rigs.fleet_sim import load_traces, record_trace, save_traces
    from edgekit import ClientConfig
    from edgekit.protocol import GenerateRequest
    from edgekit.runtime import LlamaDraftModel
    from edgekit.transport import connect

    # The simulated devices and the recording use every core the verifier leaves (every core, where it has none).
    os.sched_setaffinity(0, set(CORES - cores) if cores and CORES - cores else CORES)
    draft_model = LlamaDraftModel(draft, name=draft.stem, n_threads=1)
    traces = []
    path = Path(args.logs) / f"side_fleet_traces_{pair}.json"
    logs = Path(args.logs)
    results: dict[str, Any] = {}
    # A verifier without batch-invariant kernels may leave a trace at a near tie: that response ends there.
    fa = argparse.Namespace(on_divergence="fail" if args.numerics == "exact" else "end", seed=0, speed_min=1.0,
                            speed_max=2.0, rtt_min=10.0, rtt_max=60.0, k=4,
                            duration=args.fleet_duration, warmup=min(3.0, args.fleet_duration / 4))
    for system in args.fleet_systems:
        policy = F.SYSTEMS[system][0]
        with ExitStack() as stack:
            served = [stack.enter_context(serve(
                target, numerics=args.numerics, policy=policy, gpu_layers=args.gpu_layers, cores=cores,
                sessions=max(args.fleet_devices), log=logs / f"fleet-{system}-{j}.log")) for j in range(replicas)]
            address = served[0].address if replicas == 1 else stack.enter_context(
                _proxies.proxied(proxy, [s.address for s in served], logs / f"fleet-{system}-{proxy}"))
            if not traces:  # the target's output as this verifier decodes it
                transport = connect(served[0].address, ClientConfig())
                transport.handshake(draft_model.fingerprint(), draft_model=draft.stem, draft_hidden_size=0)
                for p in C.load_prompts(limit=args.fleet_prompts):
                    prompt = draft_model.tokenize(p["prompt"])
                    request = GenerateRequest(prompt, "greedy", seed=0, max_tokens=48)
                    out = [t.token for t in transport.generate(request)]
                    traces.append(record_trace(draft_model, prompt, out, 8))
                transport.close()
                save_traces(path, traces, {"pair": pair, "draft": names[0], "target": names[1],
                                           "window": 8, "tokens": 48, "machine": C.machine()})
                traces, meta = load_traces(path)
            points = []
            for n in args.fleet_devices:
                f = F.run_fleet(address, system, n, fa, traces, meta)
                s = f.summary(fa.warmup)
                points.append({"devices": n, **s})
                C.progress(f"fleet {system:12s} N={n:4d} goodput {s['goodput_tokens_per_s']:7.1f} tok/s " + " ".join(
                    f"{k} {v['violation_rate']:.2f}" for k, v in s["classes"].items()) + (
                    f" errors {len(s['errors'])}" if s["errors"] else ""))
            results[system] = {"points": points}
    from edgekit.config import DEFAULT_SLO_CLASSES

    for r in results.values():
        r["capacity"] = {cls: F.capacity([(p["devices"], p["classes"][cls]["violation_rate"]) for p in r["points"]
                                          if cls in p["classes"]], args.epsilon) for cls in DEFAULT_SLO_CLASSES}
        r["peak_goodput"] = max(p["goodput_tokens_per_s"] for p in r["points"])
    draft_model.close()
    return {"systems": results, "devices": args.fleet_devices, "epsilon": args.epsilon,
            "duration_s": args.fleet_duration}


# -- what the runs say ----------------------------------------------------------------------


def identity(runs: list[dict]) -> dict:
    """Per system, prompts whose text equals centralized decoding's (at the same RTT, else any)."""
    ref = {(r["prompt"], r["rtt_ms"]): r["text"] for r in runs if r["system"] == "centralized"}
    any_ref = {r["prompt"]: r["text"] for r in runs if r["system"] == "centralized"}
    out: dict[str, dict] = {}
    for r in runs:
        want = ref.get((r["prompt"], r["rtt_ms"]), any_ref.get(r["prompt"]))
        if want is None:
            continue
        d = out.setdefault(r["system"], {"identical": 0, "runs": 0, "differ": []})
        d["runs"] += 1
        if r["text"] == want:
            d["identical"] += 1
        elif r["prompt"] not in d["differ"]:
            d["differ"].append(r["prompt"])
    return out


def summarize(runs: list[dict]) -> dict:
    """Per system and RTT: tokens, time per token, median time to first token, verifier time
    and the verifier process's CPU time per token."""
    out: dict[str, dict] = {}
    for r in runs:
        key = f"{r['system']}@{r['rtt_ms']:g}"
        out.setdefault(key, {"system": r["system"], "rtt_ms": r["rtt_ms"], "tokens": 0, "elapsed_s": 0.0,
                             "ttft_ms": [], "verify_ms": 0.0, "verify_tokens": 0, "cpu_s": None})
        s = out[key]
        s["tokens"] += r["tokens"]
        s["elapsed_s"] += r["elapsed_s"]
        if r.get("ttft_ms") is not None:
            s["ttft_ms"].append(r["ttft_ms"])
        if r.get("verify_ms_per_token") is not None:
            s["verify_ms"] += r["verify_ms_per_token"] * r["tokens"]
            s["verify_tokens"] += r["tokens"]
        if r.get("verifier_cpu_s_per_token") is not None:
            s["cpu_s"] = (s["cpu_s"] or 0.0) + r["verifier_cpu_s_per_token"] * r["tokens"]
    for s in out.values():
        s["ms_per_token"] = 1e3 * s["elapsed_s"] / max(s["tokens"], 1)
        s["ttft_ms"] = C.median(s["ttft_ms"]) if s["ttft_ms"] else None
        s["verify_ms_per_token"] = s.pop("verify_ms") / s["verify_tokens"] if s["verify_tokens"] else None
        cpu = s.pop("cpu_s")
        s["verifier_cpu_ms_per_token"] = None if cpu is None else 1e3 * cpu / max(s["tokens"], 1)
        del s["verify_tokens"]
    return out
