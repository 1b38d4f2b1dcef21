"""The client's footprint on a device (issue 19): memory beyond the model, cold start, and a
run under a memory limit.

Each measurement is a fresh client process (`python footprint.py client ...`) talking to a
verifier in another process (`edgekit serve`, loopback), so nothing of the verifier counts:

- memory: resident set after `import edgekit` (Python, numpy, grpc, onnxruntime, llama.cpp's
  library), after loading the draft (weights and KV cache), and at the end of a generation
  with the shipped predictor (ru_maxrss, the peak); "beyond the model" is the peak minus
  what loading the draft added.
- cold start, pinned to one core (taskset, EDGEKIT_THREADS=1): from the process's start to
  the first drafted token of the first generation, and the model load inside it, so that
  the time beyond the load is what the client costs.
- a memory limit: the same client in a cgroup (v1 memory controller) of `--limit-mb`
  (default 1024), generating to the end; whether it finished and its peak. Needs root.

    sudo python -m benchmarks footprint --pair gemma-270m --runs 5
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import harness as C

CGROUP_V1 = Path("/sys/fs/cgroup/memory")


def client(args: argparse.Namespace) -> None:
    """One client process: its milestones (seconds since its start) and resident sets (MB)."""
    import psutil

    start = psutil.Process().create_time()
    proc = psutil.Process()
    out: dict = {}

    def rss() -> float:
        return proc.memory_info().rss / (1 << 20)

    from edgekit import EdgeClient, GenerationConfig, LlamaDraftModel
    from edgekit.models import get_pair, model_path
    from edgekit.transport import GrpcTransport

    out["imported_s"], out["rss_imported_mb"] = time.time() - start, rss()
    spec = get_pair(args.pair)
    t = time.time()
    draft = LlamaDraftModel(model_path(spec.draft), name=spec.draft, n_ctx=args.context)
    out["load_s"], out["rss_loaded_mb"] = time.time() - t, rss()
    first: list[float] = []
    real_eval = draft.eval

    def eval_and_note(tokens, **kw):  # type: ignore[no-untyped-def]
        result = real_eval(tokens, **kw)
        if not first:
            first.append(time.time() - start)
        return result

    draft.eval = eval_and_note  # type: ignore[method-assign]
    gen = GenerationConfig(max_tokens=args.max_tokens, stop_at_eos=False, drafting="auto")
    with EdgeClient(GrpcTransport(args.address), draft=draft, generation=gen) as c:
        final = c.generate(args.prompt).until_done()
    out["first_draft_s"] = first[0] if first else None
    out["tokens"] = len(final.token_ids)
    out["drafting"] = final.stats.drafting
    out["rss_end_mb"] = rss()
    out["rss_peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out["weights_mb"] = os.path.getsize(model_path(spec.draft)) / (1 << 20)
    print(json.dumps(out))


def run_client(address: str, args: argparse.Namespace, *, one_core: bool, cgroup: Path | None = None) -> dict:
    cmd = C.module_command("benchmarks.footprint", "client", "--address", address, "--pair", args.pair, "--prompt",
                           args.prompt, "--max-tokens", str(args.max_tokens), "--context", str(args.context))
    env = C.module_env()
    if one_core:
        cmd = ["taskset", "-c", "0", *cmd]
        env["EDGEKIT_THREADS"] = "1"
    if cgroup is not None:  # the shell joins the cgroup, then becomes the client
        cmd = ["sh", "-c", f'echo $$ > {cgroup / "cgroup.procs"} && exec "$@"', "sh", *cmd]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    if done.returncode != 0:
        return {"ok": False, "returncode": done.returncode, "stderr": done.stderr[-2000:]}
    return {"ok": True, **json.loads(done.stdout.strip().splitlines()[-1])}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "client":
        # The measured client (run_client): its one output line is read back, so no machine line.
        ap = C.arguments(None, threads=None, max_tokens=128)
        ap.add_argument("client")
        for name in ("--address", "--pair", "--prompt"):
            ap.add_argument(name, required=True)
        ap.add_argument("--context", type=int, default=4096)
        client(C.parse(ap, machine=False))
        return
    ap = C.arguments(__doc__, threads=None, pair="gemma-270m", max_tokens=128, out=None)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--context", type=int, default=4096, help="the draft context, as EdgeClient's default")
    ap.add_argument("--limit-mb", type=int, default=1024)
    args = C.parse(ap)
    args.prompt = C.load_prompts("eval")[0]["prompt"]
    port = C.free_port()
    log = open(C.RESULTS_DIR / f"footprint_{args.pair}-verifier.log", "w")  # noqa: SIM115
    server = subprocess.Popen([sys.executable, "-m", "edgekit.cli.app", "serve", "--pair", args.pair,
                               "--port", str(port), "--threads", "1"], stdout=log, stderr=subprocess.STDOUT)
    address = f"127.0.0.1:{port}"
    try:
        from edgekit.transport import GrpcTransport

        deadline = time.time() + 120
        while True:
            try:
                GrpcTransport(address).health()
                break
            except Exception:
                if time.time() > deadline or server.poll() is not None:
                    raise SystemExit("the verifier did not start; see its log") from None
                time.sleep(0.5)
        runs = []
        for i in range(args.runs):
            r = run_client(address, args, one_core=True)
            runs.append(r)
            C.progress(f"run {i}: {json.dumps(r)[:300]}")
        limited = None
        if os.geteuid() == 0 and (CGROUP_V1 / "cgroup.procs").is_file():
            group = CGROUP_V1 / f"edgekit-footprint-{os.getpid()}"
            group.mkdir()
            try:
                (group / "memory.limit_in_bytes").write_text(str(args.limit_mb << 20))
                limited = run_client(address, args, one_core=False, cgroup=group)
                limited["limit_mb"] = args.limit_mb
                limited["failcnt"] = int((group / "memory.failcnt").read_text())
                limited["cgroup_peak_mb"] = int((group / "memory.max_usage_in_bytes").read_text()) / (1 << 20)
            finally:
                group.rmdir()
            C.progress(f"under {args.limit_mb} MB: {json.dumps(limited)[:300]}")
        else:
            C.progress("not root, or no cgroup v1 memory controller: the memory-limit run is skipped")
    finally:
        server.terminate()
        server.wait(30)
        log.close()
    ok = [r for r in runs if r["ok"]]
    summary = {
        "rss_imported_mb": C.median([r["rss_imported_mb"] for r in ok]),
        "model_mb": C.median([r["rss_loaded_mb"] - r["rss_imported_mb"] for r in ok]),
        "rss_peak_mb": C.median([r["rss_peak_mb"] for r in ok]),
        "beyond_model_mb": C.median([r["rss_peak_mb"] - (r["rss_loaded_mb"] - r["rss_imported_mb"]) for r in ok]),
        "import_s": C.median([r["imported_s"] for r in ok]),
        "load_s": C.median([r["load_s"] for r in ok]),
        "first_draft_s": C.median([r["first_draft_s"] for r in ok]),
        "beyond_load_s": C.median([r["first_draft_s"] - r["load_s"] for r in ok]),
        "runs_ok": len(ok),
    }
    print(C.table(["figure", "median"], [[k, v] for k, v in summary.items()], digits=3))
    path = C.write_result(args.out or f"footprint_{args.pair}", {"settings": vars(args), "runs": runs,
                                                                  "summary": summary, "limited": limited})
    plot(ok, limited, path.with_suffix(".png"))


def plot(runs: list[dict], limited: dict | None, path: Path) -> None:
    fig, (mem, cold) = C.subplots(2, width=4.6)
    stages = [("imported", "rss_imported_mb"), ("draft loaded", "rss_loaded_mb"), ("end of generation", "rss_end_mb"),
              ("peak", "rss_peak_mb")]
    values = [C.median([r[k] for r in runs]) for _, k in stages]
    bars = mem.bar([s for s, _ in stages], values, color=["#888", "#4a7", "#47a", "#a47"])
    mem.bar_label(bars, fmt="%.0f")
    mem.axhline(C.median([r["weights_mb"] for r in runs]), color="k", linestyle=":", label="draft weights (file)")
    if limited and limited.get("ok"):
        mem.axhline(limited["limit_mb"], color="r", linestyle="--", label=f"cgroup limit (ran: {limited['ok']})")
    mem.set_ylabel("client resident set (MB)")
    mem.set_title("Memory of the client process")
    mem.legend(fontsize=7)
    mem.tick_params(axis="x", labelsize=7)
    parts = [("import edgekit", [r["imported_s"] for r in runs]), ("load the draft", [r["load_s"] for r in runs]),
             ("to the first drafted token", [r["first_draft_s"] - r["imported_s"] - r["load_s"] for r in runs])]
    left = 0.0
    for name, xs in parts:
        m = C.median(xs)
        cold.barh(["cold start"], [m], left=left, label=f"{name}: {m:.2f} s")
        left += m
    cold.set_xlabel("seconds from process start (one core)")
    cold.set_title("Cold start")
    cold.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.25))
    print(f"figure: {C.save_figure(fig, path)}")


if __name__ == "__main__":
    main()
