"""The long fuzz run (issue 16, item 5): thousands of hostile messages across every
RPC of a real `edgekit serve` (the pair's target, in a process of its own) while a
well-behaved client generates beside them; the verifier must answer each with a
status and a message (never UNKNOWN or INTERNAL), keep serving the client
losslessly, and after the fuzzer's sessions close come back to within 10% of the
memory it started with.

    python -m benchmarks fuzz --messages 10000          # gemma-270m, about ten minutes on 2 cores
    python -m benchmarks fuzz --replot

Writes benchmarks/results/fuzz.json and fuzz.png (statuses per RPC; the
verifier's resident memory over the run).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import grpc
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from benchmarks import harness as C
from benchmarks.rigs.fuzz_messages import ALLOWED, METHODS, Aim, call, mutated, requests
from benchmarks.rigs.verifier_process import wait_ready
from edgekit import ClientConfig, EdgeClient, GenerationConfig, LlamaDraftModel
from edgekit.models import get_pair, model_path
from edgekit.protocol import fingerprint_to_pb, pb

TOKENS = {"fuzz": "fuzz-token-0123456789", "good": "good-token-0123456789"}
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Three reasons to learn Python:", "Once upon a time"]


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def good_client(address: str, draft_file: str, draft_name: str, stop: threading.Event, out: dict) -> None:
    draft = LlamaDraftModel(draft_file, name=draft_name, n_ctx=1024)
    config = ClientConfig(token=TOKENS["good"], timeout=60, retry_for=120)
    gen = GenerationConfig(max_tokens=32, draft_k=4)
    with EdgeClient(address, draft=draft, config=config, generation=gen) as client:
        refs = {p: client.generate_target_only(p).until_done().token_ids for p in PROMPTS}
        n = 0
        while not stop.is_set():
            p = PROMPTS[n % len(PROMPTS)]
            try:
                ok = client.generate(p).until_done().token_ids == refs[p]
                out["answers"] += 1
                out["identical"] += int(ok)
            except Exception as exc:
                out["errors"].append(f"{type(exc).__name__}: {exc}"[:300])
            n += 1
    draft.close()


def run(args: argparse.Namespace) -> dict:
    pair = get_pair(args.pair)
    port = C.free_port()
    address = f"127.0.0.1:{port}"
    tokens = Path(tempfile.mkdtemp()) / "tokens"
    tokens.write_text("".join(f"{n} {t}\n" for n, t in TOKENS.items()))
    cmd = [sys.executable, "-c", "from edgekit.cli.app import main; main()", "serve", "--pair", args.pair,
           "--port", str(port), "--max-sessions", "8", "--max-context", "2048", "--threads", str(args.verifier_threads),
           "--tokens-file", str(tokens)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_ready(address, proc, timeout=600)
        channel = grpc.insecure_channel(address, options=[("grpc.max_send_message_length", 64 << 20)])
        auth = (("authorization", f"Bearer {TOKENS['fuzz']}"),)
        # Warm: a session opened and closed, so the baseline holds what serving needs anyway.
        draft_file = str(model_path(pair.draft))
        probe_draft = LlamaDraftModel(draft_file, name=pair.draft, n_ctx=256)
        fp = probe_draft.fingerprint()
        vocab = probe_draft.n_vocab
        hs = pb.HandshakeRequest(protocol_version=2, draft_hidden_size=probe_draft.n_embd)

        hs.draft_tokenizer.CopyFrom(fingerprint_to_pb(fp))
        probe_draft.close()
        opened: list[str] = []
        aim = Aim()

        def open_one(prompt: list[int]) -> None:
            req = pb.OpenSessionRequest(prompt_tokens=prompt, draft_tokenizer=hs.draft_tokenizer,
                                        sampling=pb.SamplingParams(mode=pb.ACCEPTANCE_MODE_GREEDY))
            code, _, answer = call(channel, "OpenSession", req.SerializeToString(), auth, timeout=120)
            if code == grpc.StatusCode.OK:
                opened.append(pb.OpenSessionResponse.FromString(answer).session_id)

        open_one([2, 818, 5279, 563])
        for sid in opened:
            call(channel, "CloseSession", pb.CloseSessionRequest(session_id=sid).SerializeToString(), auth)
        opened.clear()
        time.sleep(1.0)
        rss0 = rss_mb(proc.pid)
        open_one([2, 818, 5279, 563, 7001])  # sessions for the fuzz to aim at
        open_one([2, 3689, 1917, 235269])

        stop = threading.Event()
        good = {"answers": 0, "identical": 0, "errors": []}
        client = threading.Thread(target=good_client, args=(address, draft_file, pair.draft, stop, good), daemon=True)
        client.start()
        codes: dict[str, Counter] = {m: Counter() for m in METHODS}
        bad: list[tuple[str, str, str]] = []
        memory: list[tuple[float, float]] = [(0.0, rss0)]
        t0 = time.monotonic()
        count = [0]

        @settings(max_examples=args.messages, deadline=None, suppress_health_check=list(HealthCheck), database=None,
                  phases=[Phase.generate])
        @given(st.data())
        def fuzz(data: st.DataObject) -> None:
            aim.replenish(channel, auth, fingerprint=hs.draft_tokenizer, hidden=hs.draft_hidden_size,
                          prompt=[2, 818, 5279, 563], timeout=120)
            method = data.draw(st.sampled_from(sorted(METHODS)))
            payload = data.draw(
                requests(method, vocab=vocab, sessions=lambda: opened, near=lambda: [4, 5, 6, 40],
                         long_lists=args.long_lists)
                | mutated(method, vocab=vocab, fingerprint=hs.draft_tokenizer, hidden=hs.draft_hidden_size, aim=aim,
                          long_lists=args.long_lists)
            )
            code, details, answer = call(channel, method, payload, auth, timeout=120)
            aim.learn(method, payload, code, answer)
            codes[method][code.name] += 1
            if method == "OpenSession" and code == grpc.StatusCode.OK:
                opened.append(pb.OpenSessionResponse.FromString(answer).session_id)
            if code not in ALLOWED or (code != grpc.StatusCode.OK and not 0 < len(details) < 1000):
                bad.append((method, code.name, details[:300]))
            count[0] += 1
            if count[0] % 250 == 0:
                memory.append((time.monotonic() - t0, rss_mb(proc.pid)))
                C.progress(f"{count[0]} messages, {len(bad)} bad, verifier {memory[-1][1]:.0f} MB")

        fuzz()
        elapsed = time.monotonic() - t0
        stop.set()
        client.join(300)
        peak = max(m for _, m in memory)
        for sid in {*opened, *aim.lengths}:  # the fuzzer's sessions close; the well-behaved client closed its own
            call(channel, "CloseSession", pb.CloseSessionRequest(session_id=sid).SerializeToString(), auth)
        time.sleep(2.0)
        rss1 = rss_mb(proc.pid)
        memory.append((time.monotonic() - t0, rss1))
        with grpc.insecure_channel(address) as ch:
            from grpc_health.v1 import health_pb2, health_pb2_grpc

            health = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
        alive = proc.poll() is None and health.status == health_pb2.HealthCheckResponse.SERVING
        channel.close()
    finally:
        proc.terminate()
        proc.wait(30)
    return {
        "settings": vars(args),
        "pair": args.pair,
        "messages": count[0],
        "seconds": elapsed,
        "codes": {m: dict(c) for m, c in codes.items()},
        "bad_answers": bad,
        "alive_and_serving": alive,
        "good_client": good,
        "rss_mb": {"start": rss0, "peak": peak, "after_close": rss1, "change_pct": 100 * (rss1 - rss0) / rss0},
        "memory": memory,
    }


def plot(result: dict, path: Path) -> Path:
    fig, (ax1, ax2) = C.subplots(2, width=6.5)
    methods = sorted(result["codes"])
    names = sorted({n for c in result["codes"].values() for n in c})
    bottom = [0] * len(methods)
    for name in names:
        vals = [result["codes"][m].get(name, 0) for m in methods]
        ax1.bar(methods, vals, bottom=bottom, label=name)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax1.set_ylabel("messages")
    ax1.set_title(f"{result['messages']} fuzzed messages by answer ({len(result['bad_answers'])} bad)")
    ax1.tick_params(axis="x", rotation=30)
    t, m = zip(*result["memory"])
    ax2.plot(t, m, marker=".", label="verifier RSS")
    ax2.axhline(result["rss_mb"]["start"] * 1.1, color="gray", ls="--", label="start + 10%")
    ax2.set_xlabel("seconds into the fuzz run")
    ax2.set_ylabel("MB")
    ax2.set_title(f"memory: {result['rss_mb']['change_pct']:+.1f}% after the sessions closed")
    return C.save_figure(fig, path)


def main() -> None:
    ap = C.arguments(__doc__, whole_doc=True, threads=None, pair="gemma-270m")
    ap.add_argument("--messages", type=int, default=10_000)
    ap.add_argument("--long-lists", type=int, default=600, help="longest list in a message (prompts cost prefills)")
    # Not the harness's --threads and --replot (other dests, so C.parse leaves them alone): --threads is
    # the verifier's alone (this process's draft models keep edgekit's default), and --replot takes no
    # JSON (it redraws results/fuzz.json and exits on its verdict, as a run does).
    ap.add_argument("--threads", dest="verifier_threads", type=int, default=1,
                    help="the verifier's threads (edgekit serve --threads)")
    ap.add_argument("--replot", dest="replot_stored", action="store_true",
                    help="redraw benchmarks/results/fuzz.json's figure and print its summary; measure nothing")
    args = C.parse(ap)
    out = C.RESULTS_DIR / "fuzz.json"
    if args.replot_stored:
        result = json.loads(out.read_text())
    else:
        result = run(args)
        C.write_result("fuzz", result)
    print(plot(result, out.with_suffix(".png")))
    summary = {k: result[k] for k in ("messages", "alive_and_serving", "rss_mb", "good_client")}
    print(json.dumps(summary, indent=1)[:2000])
    os._exit(0 if result["alive_and_serving"] and not result["bad_answers"] else 1)


if __name__ == "__main__":
    main()
