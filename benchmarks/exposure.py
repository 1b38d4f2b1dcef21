"""The verifier under a connection flood (issue 66): honest devices' rounds a second with and without it.

`edgekit serve` on the pair's target, in a process of its own on a loopback port with a token, and
`--devices` honest devices (threads here, each its own `GrpcTransport`) that handshake, open a greedy
session on a prompt and verify blocks of `--draft-k` draft tokens taken from the target's own greedy answer
to it (its target-only `Generate` stream, asked once before the run), a token of a block in
`--perturb` of them replaced by another to force a rejection. Each verdict's committed tokens
(the accepted prefix, then the correction or bonus token) are checked against that answer: a
device whose text would differ from target-only decoding is reported and fails the run. The
devices go session after session for the whole run; their rounds are counted by when they end.

The run alternates `--repeats` pairs of phases of `--phase-seconds` each: A, no attack; B, the
attack: `--unauthenticated` calls that send their headers and never a message (Verify, no token)
and `--authenticated` Rounds streams with the token that send nothing, all opened at once, from a
process of its own over `--attack-channels` connections, each opened again `--reopen-after`
seconds after it ends so the attack lasts the phase. Expected: the calls without a token refused
from their headers (UNAUTHENTICATED), the streams past `--max-streams` refused at once
(RESOURCE_EXHAUSTED), the admitted ones ended once idle for `--stream-idle-timeout` (shorter than
a phase so it shows). After the last B, `--after-seconds` without an attack.

Throughout, every `--sample-every` seconds: a grpc.health.v1 check of the verifier's service and
its latency (its own connection, no token), and the verifier's threads and resident memory
(/proc/PID/status).

    python -m benchmarks exposure                       # gemma-270m, 4 x (20 s + 20 s), ~4 minutes on 2 cores
    python -m benchmarks exposure --replot benchmarks/results/exposure.json

Writes benchmarks/results/exposure.json and exposure.png (the honest devices' rounds a second per
phase; health check latency, the verifier's threads and memory over time, the attack shaded).
"""

from __future__ import annotations

import heapq
import multiprocessing as mp
import os
import random
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import grpc

from benchmarks import harness as C
from benchmarks.rigs.verifier_process import serve_process
from edgekit import ClientConfig, ServerConfig
from edgekit.errors import EdgekitError
from edgekit.models import get_pair, model_path
from edgekit.protocol import SERVICE_NAME, BlockRequest, GenerateRequest, OpenRequest
from edgekit.transport import GrpcTransport

TOKEN = "exposure-benchmark-token-0123456789"
VERIFY = f"/{SERVICE_NAME}/Verify"
ROUNDS = f"/{SERVICE_NAME}/Rounds"


def proc_status(pid: int) -> tuple[int, float, float]:
    """The process's threads, resident memory (MB) and CPU time so far (s), from /proc."""
    threads, rss = 0, float("nan")
    with open(f"/proc/{pid}/status", encoding="utf-8") as f:
        for line in f:
            if line.startswith("Threads:"):
                threads = int(line.split()[1])
            elif line.startswith("VmRSS:"):
                rss = int(line.split()[1]) / 1024
    with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
        fields = f.read().rsplit(")", 1)[1].split()  # after the name, which may hold spaces
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime
    return threads, rss, cpu


# -- the attack: a process of its own, so its hundreds of threads take nothing from the devices' GIL ---


def attack_process(address: str, token: str, unauthenticated: int, authenticated: int, channels: int,
                   reopen_after: float, conn: Any) -> None:
    """Waits for the attack windows [(start, stop), ...] (time.monotonic, system-wide on Linux) over
    `conn`; in each, opens the calls at once and opens each again `reopen_after` s after it ends;
    sends back, per window and kind, the statuses counted with the calls' lifetimes."""
    options = [("grpc.use_local_subchannel_pool", 1)]  # a connection per channel, not one shared
    pool = [grpc.insecure_channel(address, options=options) for _ in range(channels)]
    conn.send("ready")
    windows = conn.recv()
    reports = []
    for start, stop in windows:
        time.sleep(max(0.0, start - time.monotonic()))
        reports.append(_attack_window(pool, token, unauthenticated, authenticated, reopen_after, stop))
    for channel in pool:
        channel.close()
    conn.send(reports)


def _attack_window(pool: list[grpc.Channel], token: str, unauthenticated: int, authenticated: int,
                   reopen_after: float, stop: float) -> dict:
    cpu0 = time.process_time()  # this process's, all its threads
    lock = threading.Lock()
    ended: dict[str, list[tuple[str, float]]] = {"unauthenticated": [], "authenticated": []}
    live: dict[int, tuple[grpc.Future, threading.Event]] = {}
    due: list[tuple[float, int, str]] = []  # (when, slot, kind): calls to open again
    over = threading.Event()
    serial = [0]

    def open_call(slot: int, kind: str) -> None:
        channel = pool[slot % len(pool)]
        method, metadata = ((VERIFY, ()) if kind == "unauthenticated"
                            else (ROUNDS, (("authorization", f"Bearer {token}"),)))
        done = threading.Event()

        def nothing():  # the request stream: no message, ever; it returns once the call is over
            done.wait()
            return
            yield

        t0 = time.monotonic()
        call = channel.stream_stream(method)(nothing(), metadata=metadata, timeout=max(1.0, stop - t0 + 5))
        with lock:
            serial[0] += 1
            key = serial[0]
            live[key] = (call, done)

        def finished(c: grpc.Future) -> None:
            done.set()
            now = time.monotonic()
            with lock:
                live.pop(key, None)
                if over.is_set():
                    return  # cancelled by us at the window's end: not the verifier's answer
                ended[kind].append((c.code().name, now - t0))
                if now + reopen_after < stop:
                    heapq.heappush(due, (now + reopen_after, slot, kind))

        call.add_done_callback(finished)

    for slot in range(unauthenticated):
        open_call(slot, "unauthenticated")
    for slot in range(authenticated):
        open_call(slot, "authenticated")
    opened = {"unauthenticated": unauthenticated, "authenticated": authenticated}
    # gRPC runs the done callbacks on its own threads: calls are opened again from here
    while time.monotonic() < stop:
        now = time.monotonic()
        with lock:
            ready = []
            while due and due[0][0] <= now:
                ready.append(heapq.heappop(due))
        for _, slot, kind in ready:
            open_call(slot, kind)
            opened[kind] += 1
        time.sleep(0.02)
    over.set()
    with lock:
        calls = list(live.values())
    for call, done in calls:
        call.cancel()
        done.set()
    out: dict[str, Any] = {"open_at_the_end": len(calls),  # cancelled by us, not counted in the codes
                           "cpu_s": time.process_time() - cpu0}
    for kind, rows in ended.items():
        by_code: dict[str, list[float]] = defaultdict(list)
        for code, life in rows:
            by_code[code].append(life)
        out[kind] = {
            "opened": opened[kind],
            "codes": {code: len(lives) for code, lives in sorted(by_code.items())},
            "lifetime_s": {code: {"p50": C.median(lives), "max": max(lives)} for code, lives in by_code.items()},
        }
    return out


# -- the honest devices -------------------------------------------------------------------------------


class Devices:
    """`n` devices on threads, each going session after session over its own transport."""

    def __init__(self, address: str, n: int, fingerprint: Any, draft_name: str, prompts: list[list[int]],
                 answers: list[list[int]], args: Any) -> None:
        self.address, self.n, self.fp, self.draft_name = address, n, fingerprint, draft_name
        self.prompts, self.answers, self.args = prompts, answers, args
        self.stop = threading.Event()
        self.rounds: list[tuple[float, float, int]] = []  # (ended at, latency s, device)
        self.errors: list[tuple[float, int, str]] = []  # (when, device, what) of calls tried again
        self.mismatches: list[dict] = []
        self.sessions = [0] * n  # sessions finished and checked whole, per device
        self.crashed: list[str] = []
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(n)]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def join(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(120)

    def _again(self, device: int, what: Callable[[], Any]) -> Any:
        """`what()`, tried again on an edgekit error (a round sent again is recognised by its key and
        answered as before), for up to a minute: an honest device backs off rather than give up."""
        deadline = time.monotonic() + 60
        while True:
            try:
                return what()
            except EdgekitError as exc:
                self.errors.append((time.monotonic(), device, f"{type(exc).__name__}: {exc}"[:300]))
                if time.monotonic() > deadline or self.stop.is_set():
                    raise
                time.sleep(0.2)

    def _run(self, i: int) -> None:
        a = self.args
        rng = random.Random(a.seed * 1000 + i)
        prompt, answer = self.prompts[i % len(self.prompts)], self.answers[i % len(self.prompts)]
        others = sorted(set(answer) | set(prompt[1:]))  # ordinary tokens to put in a block's place
        config = ClientConfig(token=TOKEN, timeout=a.timeout, client_id=f"device-{i}", round_streams=a.round_streams)
        try:
            with GrpcTransport(self.address, config) as t:
                self._again(i, lambda: t.handshake(self.fp, draft_model=self.draft_name, draft_hidden_size=0))
                while not self.stop.is_set():
                    request = OpenRequest(prompt, mode="greedy", seed=0, draft=self.fp, client_id=f"device-{i}")
                    opened = self._again(i, partial(t.open_session, request))
                    if self._session(i, t, opened, answer, others, rng):
                        self.sessions[i] += 1
                    self._again(i, partial(t.close_session, opened.session_id))
        except Exception as exc:  # reported, and the run fails
            self.crashed.append(f"device {i}: {type(exc).__name__}: {exc}"[:500])

    def _session(self, i: int, t: GrpcTransport, opened: Any, answer: list[int], others: list[int],
                 rng: random.Random) -> bool:
        """One session's rounds; True when it reached the end of the answer identical to it."""
        base, out, r = opened.committed_length, [], 0
        while len(out) < len(answer):
            if self.stop.is_set():
                return False
            block = list(answer[len(out):len(out) + self.args.draft_k])
            if rng.random() < self.args.perturb:
                j = rng.randrange(len(block))
                block[j] = rng.choice([x for x in others if x != block[j]])
            request = BlockRequest(opened.session_id, base, block, round_index=r)
            t0 = time.perf_counter()
            verdict = self._again(i, partial(t.verify, request))
            self.rounds.append((time.monotonic(), time.perf_counter() - t0, i))
            committed = block[:verdict.accepted] + ([verdict.next_token] if verdict.next_token is not None else [])
            expected = answer[len(out):len(out) + len(committed)]
            if committed[:len(expected)] != expected or verdict.committed_length != base + len(committed):
                self.mismatches.append({"device": i, "round": r, "at": len(out), "block": block,
                                        "committed": committed, "expected": expected})
                return False
            out += committed
            base, r = verdict.committed_length, r + 1
            if verdict.next_token is None:  # the text ended
                break
        return out[:len(answer)] == answer


def target_answers(address: str, prompts: list[list[int]], max_tokens: int, timeout: float) -> list[list[int]]:
    """The target's greedy answer to each prompt, from its target-only stream (in parallel: the
    verifier batches them)."""
    answers: list[list[int]] = [[] for _ in prompts]

    def one(k: int) -> None:
        with GrpcTransport(address, ClientConfig(token=TOKEN, timeout=timeout)) as t:
            request = GenerateRequest(prompts[k], "greedy", seed=0, max_tokens=max_tokens)
            answers[k] = [g.token for g in t.generate(request)]

    threads = [threading.Thread(target=one, args=(k,)) for k in range(len(prompts))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if not all(answers):
        raise SystemExit("a target-only answer came back empty")
    return answers


# -- the run ----------------------------------------------------------------------------------------


def run(args: Any) -> dict:
    pair = get_pair(args.pair)
    from edgekit.runtime import LlamaModel

    vocab = LlamaModel(str(model_path(pair.draft)), name=pair.draft, vocab_only=True)  # no weights: tokens alone
    fp = vocab.fingerprint()
    texts = C.load_prompts(limit=args.prompts)
    prompts = [vocab.tokenize(p["prompt"]) for p in texts]
    vocab.close()
    serve = ["--pair", args.pair, "--token", TOKEN, "--max-sessions", str(args.max_sessions),
             "--max-context", str(args.max_context), "--stream-idle-timeout", str(args.stream_idle_timeout),
             "--max-streams", str(args.max_streams)] + (["--threads", str(args.threads)] if args.threads else [])
    log = Path(tempfile.mkdtemp(prefix="exposure-")) / "verifier.log"
    ctx = mp.get_context("spawn")  # gRPC does not survive a fork of a process that has used it
    here, attacker_end = ctx.Pipe()
    with serve_process(serve, log) as served:
        C.progress(f"verifier pid {served.pid} on {served.address}; its log: {log}")
        time.sleep(1.0)
        idle_threads, idle_rss, _ = proc_status(served.pid)
        answers = target_answers(served.address, prompts, args.max_tokens, args.timeout)
        C.progress(f"target-only answers: {[len(a) for a in answers]} tokens")
        attacker = ctx.Process(target=attack_process, daemon=True,
                               args=(served.address, TOKEN, args.unauthenticated, args.authenticated,
                                     args.attack_channels, args.reopen_after, attacker_end))
        attacker.start()
        if not here.poll(120):
            raise SystemExit("the attacking process did not start")
        here.recv()

        t0 = time.monotonic()
        health: list[tuple[float, float, str]] = []  # (t, ms, status or error code)
        resources: list[tuple[float, int, float, float]] = []  # (t, threads, MB, CPU s)
        watching = threading.Event()

        def watch_health() -> None:
            with grpc.insecure_channel(served.address, options=[("grpc.use_local_subchannel_pool", 1)]) as ch:
                from grpc_health.v1 import health_pb2, health_pb2_grpc

                stub = health_pb2_grpc.HealthStub(ch)
                ask = health_pb2.HealthCheckRequest(service=SERVICE_NAME)
                while not watching.wait(args.sample_every):
                    s = time.perf_counter()
                    try:
                        r = stub.Check(ask, timeout=10)
                        status = health_pb2.HealthCheckResponse.ServingStatus.Name(r.status)
                    except grpc.RpcError as exc:
                        status = exc.code().name
                    health.append((time.monotonic() - t0, (time.perf_counter() - s) * 1e3, status))

        def watch_resources() -> None:
            while not watching.wait(args.sample_every):
                try:
                    sample = proc_status(served.pid)
                except OSError:
                    return
                resources.append((time.monotonic() - t0, *sample))

        watchers = [threading.Thread(target=f, daemon=True) for f in (watch_health, watch_resources)]
        for w in watchers:
            w.start()
        devices = Devices(served.address, args.devices, fp, pair.draft, prompts, answers, args)
        devices.start()
        # the windows, from the end of the warm-up: A, B, A, B, ..., then the quiet tail
        begin = t0 + args.warmup
        windows: list[dict] = []
        for rep in range(args.repeats):
            for phase in ("A", "B"):
                start = begin + (2 * rep + (phase == "B")) * args.phase_seconds
                windows.append({"phase": phase, "repeat": rep, "start": start, "stop": start + args.phase_seconds})
        end = windows[-1]["stop"]
        windows.append({"phase": "after", "repeat": 0, "start": end, "stop": end + args.after_seconds})
        here.send([(w["start"], w["stop"]) for w in windows if w["phase"] == "B"])
        total = windows[-1]["stop"] - t0
        C.progress(f"{args.devices} devices; {args.warmup:.0f} s warm-up, then {args.repeats} x "
                   f"(A {args.phase_seconds:.0f} s + B {args.phase_seconds:.0f} s), {args.after_seconds:.0f} s after: "
                   f"{total:.0f} s in all")
        for w in windows:
            time.sleep(max(0.0, w["stop"] - time.monotonic()))
            n = sum(1 for end_t, _, _ in devices.rounds if w["start"] <= end_t < w["stop"])
            last = health[-1][1] if health else float("nan")
            C.progress(f"  {w['phase']}{w['repeat'] + 1}: {n / (w['stop'] - w['start']):.1f} rounds/s, "
                       f"last health {last:.0f} ms, {len(devices.mismatches)} mismatches, {len(devices.errors)} errors")
        devices.join()
        attacks = here.recv() if here.poll(60) else []
        attacker.join(10)
        watching.set()
        for w in watchers:
            w.join(15)
        alive = Path(f"/proc/{served.pid}").exists()
    for w, report in zip([w for w in windows if w["phase"] == "B"], attacks):
        w["attack"] = report
    return summarize(args, pair, devices, windows, health, resources, t0, idle_threads, idle_rss, alive, answers)


def _window_of(windows: list[dict], t: float) -> dict | None:
    for w in windows:
        if w["start"] <= t < w["stop"]:
            return w
    return None


def summarize(args: Any, pair: Any, devices: Devices, windows: list[dict], health: list, resources: list,
              t0: float, idle_threads: int, idle_rss: float, alive: bool, answers: list[list[int]]) -> dict:
    # times as seconds since the devices began
    for w in windows:
        w["start"], w["stop"] = w["start"] - t0, w["stop"] - t0
    rounds = [(end - t0, lat, dev) for end, lat, dev in devices.rounds]
    errors = [(when - t0, dev, what) for when, dev, what in devices.errors]
    for w in windows:
        w["rounds"] = sum(1 for end, _, _ in rounds if w["start"] <= end < w["stop"])
        w["rounds_per_s"] = sum(_share(end, lat, [w]) for end, lat, _ in rounds) / (w["stop"] - w["start"])
    phases = {}
    for phase in ("A", "B", "after"):
        ws = [w for w in windows if w["phase"] == phase]
        seconds = sum(w["stop"] - w["start"] for w in ws)
        inside = [(lat, dev) for end, lat, dev in rounds if _window_of(ws, end) is not None]
        per_device: Counter = Counter()
        for end, lat, dev in rounds:
            per_device[dev] += _share(end, lat, ws)
        lats = [lat * 1e3 for lat, _ in inside]
        hs = [(ms, status) for t, ms, status in health if _window_of(ws, t) is not None]
        rs = [(th, mb) for t, th, mb, _ in resources if _window_of(ws, t) is not None]
        cpu = sum(_cpu_between(resources, w["start"], w["stop"]) for w in ws)
        attacker_cpu = sum(w["attack"]["cpu_s"] for w in ws if "attack" in w)
        codes: dict[str, Counter] = {"unauthenticated": Counter(), "authenticated": Counter()}
        opened = Counter()
        for w in ws:
            for kind in codes:
                if "attack" in w:
                    codes[kind].update(w["attack"][kind]["codes"])
                    opened[kind] += w["attack"][kind]["opened"]
        phases[phase] = {
            "seconds": seconds,
            "rounds": len(inside),  # ended inside the phase
            "rounds_per_s": sum(per_device.values()) / seconds if seconds else None,
            "rounds_per_s_per_device": [per_device.get(d, 0) / seconds for d in range(devices.n)] if seconds else [],
            "round_ms": {"p50": C.percentile(lats, 50) if lats else None,
                         "p99": C.percentile(lats, 99) if lats else None},
            "health_checks": len(hs),
            "health_not_serving": sum(status != "SERVING" for _, status in hs),
            "health_ms": {"p50": C.percentile([m for m, _ in hs], 50) if hs else None,
                          "p99": C.percentile([m for m, _ in hs], 99) if hs else None,
                          "max": max((m for m, _ in hs), default=None)},
            "threads_max": max((th for th, _ in rs), default=None),
            "rss_mb_max": max((mb for _, mb in rs), default=None),
            # of one core: the verifier's, and (B) the attacking process's on the same two cores
            "verifier_cpu_share": cpu / seconds if seconds else None,
            "attacker_cpu_share": attacker_cpu / seconds if phase == "B" and seconds else None,
            "errors_tried_again": sum(1 for t, _, _ in errors if _window_of(ws, t) is not None),
            "attack_codes": {k: dict(v) for k, v in codes.items()} if phase == "B" else None,
            "attack_calls_opened": dict(opened) if phase == "B" else None,
        }
    # every round's committed tokens were checked as it came: a device is identical when none differed
    checked = Counter(dev for _, _, dev in rounds)
    identical = {d: d not in {m["device"] for m in devices.mismatches} and checked[d] > 0 for d in range(devices.n)}
    a, b = phases["A"]["rounds_per_s"], phases["B"]["rounds_per_s"]
    pool = max(ServerConfig().workers, args.max_sessions + 8) + (args.max_streams or args.max_sessions)
    return {
        "settings": {k: v for k, v in vars(args).items() if k != "replot"},
        "pair": args.pair, "draft": pair.draft, "target": pair.target,
        "verifier": {"alive_at_the_end": bool(alive), "handler_threads_at_most": pool,
                     "idle_threads": idle_threads, "idle_rss_mb": idle_rss},
        "answer_tokens": [len(x) for x in answers],
        "phases": phases,
        "ratio_rounds_per_s_B_over_A": C.ratio(b, a),
        # each B against the A just before it: how far the machine's other load moved the figure
        "ratio_per_repeat": [C.ratio(wb["rounds_per_s"], wa["rounds_per_s"])
                             for wa, wb in zip(windows[0:-1:2], windows[1:-1:2])],
        "windows": windows,
        "identical": identical,
        "all_identical": all(identical.values()) and not devices.mismatches and not devices.crashed,
        "rounds_checked_per_device": [checked[d] for d in range(devices.n)],
        "sessions_checked_per_device": devices.sessions,  # reached the end of the answer, identical
        "mismatches": devices.mismatches[:20],
        "crashed": devices.crashed,
        "errors_tried_again": len(errors),
        "error_samples": errors[:10],
        "health": [(round(t, 3), round(ms, 2), s) for t, ms, s in health],
        "resources": [(round(t, 3), th, round(mb, 1), round(cpu, 2)) for t, th, mb, cpu in resources],
        "rounds_timeline": _per_second(rounds, windows[-1]["stop"]),
    }


def _share(end: float, latency: float, windows: list[dict]) -> float:
    """The share of a round's time inside `windows`: each device has a round in flight nearly all
    the time and the engine verifies them together, so rounds end in bursts, one every engine pass
    (seconds apart on a CPU); counting shares rather than ends takes the phase's edges out of the
    figure."""
    start = end - latency
    inside = sum(max(0.0, min(end, w["stop"]) - max(start, w["start"])) for w in windows)
    return inside / latency if latency > 0 else float(_window_of(windows, end) is not None)


def _per_second(rounds: list[tuple[float, float, int]], until: float) -> list[float]:
    """The rounds in each second since the devices began, as shares (`_share`)."""
    counts = [0.0] * (int(until) + 1)
    for end, lat, _ in rounds:
        start = max(0.0, end - lat)
        for sec in range(int(start), min(int(end), len(counts) - 1) + 1):
            counts[sec] += _share(end, lat, [{"start": sec, "stop": sec + 1}])
    return [round(c, 3) for c in counts]


def _cpu_between(resources: list[tuple[float, int, float, float]], start: float, stop: float) -> float:
    """The verifier's CPU seconds between two times, from the samples nearest inside them."""
    inside = [cpu for t, _, _, cpu in resources if start <= t < stop]
    return inside[-1] - inside[0] if len(inside) > 1 else 0.0


# -- the figure -------------------------------------------------------------------------------------


def plot(result: dict, path: Path) -> Path:
    fig, axes = C.subplots(2, nrows=2, width=6.5, height=4.0)
    ax1, ax2, ax3, ax4 = axes
    s = result["settings"]
    windows = result["windows"]
    colors = {"A": "tab:blue", "B": "tab:red", "after": "tab:gray"}
    labels = [f"{w['phase']}{w['repeat'] + 1}" if w["phase"] != "after" else "after" for w in windows]
    ax1.bar(labels, [w["rounds_per_s"] for w in windows], color=[colors[w["phase"]] for w in windows])
    for phase in ("A", "B"):
        ax1.axhline(result["phases"][phase]["rounds_per_s"], color=colors[phase], ls="--", lw=1,
                    label=f"{phase}: {result['phases'][phase]['rounds_per_s']:.1f} rounds/s")
    ax1.set_ylabel("honest rounds / s")
    ax1.set_ylim(0, 1.3 * max(w["rounds_per_s"] for w in windows))
    ax1.legend(loc="upper left", ncol=2, fontsize=8)
    ratio = result["ratio_rounds_per_s_B_over_A"]
    ax1.set_title(f"{s['devices']} honest devices ({s['pair']}): B/A = {ratio:.2f}"
                  f" ({'identical' if result['all_identical'] else 'NOT identical'} to target-only)", fontsize=10)

    def shade(ax: Any) -> None:
        for k, w in enumerate(w for w in windows if w["phase"] == "B"):
            ax.axvspan(w["start"], w["stop"], color="tab:red", alpha=0.12, label="attack" if k == 0 else None)

    t = [h[0] for h in result["health"]]
    ax2.plot(t, [h[1] for h in result["health"]], ".", ms=3, color="tab:green", label="health check")
    ax2.axhline(1000, color="black", ls=":", lw=1, label="1 s")
    ax2.set_yscale("log")
    shade(ax2)
    ax2.set_xlabel("seconds since the devices began")
    ax2.set_ylabel("health check latency, ms")
    hb = result["phases"]["B"]["health_ms"]
    ax2.set_title(f"health: max {hb['max']:.0f} ms under attack (p99 {hb['p99']:.0f} ms)", fontsize=10)

    tr = [r[0] for r in result["resources"]]
    ax3.plot(tr, [r[1] for r in result["resources"]], color="tab:purple", label="threads")
    bound = result["verifier"]["idle_threads"] + result["verifier"]["handler_threads_at_most"]
    ax3.axhline(bound, color="tab:purple", ls=":", lw=1, label="idle + the handler pool's most")
    ax3.set_ylabel("verifier threads")
    ax3.set_xlabel("seconds since the devices began")
    shade(ax3)
    twin = ax3.twinx()
    twin.plot(tr, [r[2] for r in result["resources"]], color="tab:orange", label="RSS")
    twin.set_ylabel("verifier RSS, MB", color="tab:orange")
    lo = min(r[2] for r in result["resources"])
    twin.set_ylim(0, max(r[2] for r in result["resources"]) * 1.15 if lo > 0 else None)
    ax3.set_ylim(0, max(max(r[1] for r in result["resources"]), bound) * 1.2)
    ax3.legend(loc="lower left", fontsize=8)
    twin.legend(loc="lower right", fontsize=8)
    ax3.set_title(f"the verifier: threads max {result['phases']['B']['threads_max']} under attack "
                  f"(idle {result['verifier']['idle_threads']})", fontsize=10)

    per_s = result["rounds_timeline"]
    span = 5
    around = [per_s[max(0, i - span // 2):i + span // 2 + 1] for i in range(len(per_s))]
    ax4.plot([i + 0.5 for i in range(len(per_s))], [sum(x) / len(x) for x in around], color="tab:blue", lw=1.2,
             label=f"honest rounds / s, over {span} s around")
    shade(ax4)
    ax4.set_ylim(0, None)
    ax4.set_xlabel("seconds since the devices began")
    ax4.set_ylabel("rounds / s")
    codes = result["phases"]["B"]["attack_codes"] or {}
    text = "; ".join(f"{k}: " + ", ".join(f"{c} {n}" for c, n in sorted(v.items())) for k, v in codes.items())
    ax4.set_title("attack calls answered: " + text, fontsize=7, wrap=True)
    return C.save_figure(fig, path)


def main() -> None:
    ap = C.arguments(__doc__, replot=True, pair="gemma-270m", prompts=8, max_tokens=48, draft_k=4, repeats=4,
                     out="exposure")
    ap.add_argument("--devices", type=int, default=16, help="honest devices")
    ap.add_argument("--perturb", type=float, default=0.5,
                    help="share of blocks with one token replaced, to force a rejection")
    ap.add_argument("--phase-seconds", type=float, default=20.0, help="each phase's length (A and B alike)")
    ap.add_argument("--warmup", type=float, default=10.0, help="seconds of devices' rounds before the first A")
    ap.add_argument("--after-seconds", type=float, default=5.0, help="seconds without an attack after the last B")
    ap.add_argument("--unauthenticated", type=int, default=200, help="calls without a token, open at once")
    ap.add_argument("--authenticated", type=int, default=200, help="idle Rounds streams with the token, at once")
    ap.add_argument("--attack-channels", type=int, default=8, help="connections the attack's calls spread over")
    ap.add_argument("--reopen-after", type=float, default=1.0,
                    help="seconds before an ended attack call is opened again")
    ap.add_argument("--max-sessions", type=int, default=24, help="edgekit serve --max-sessions")
    ap.add_argument("--max-streams", type=int, default=0, help="edgekit serve --max-streams (0: --max-sessions)")
    ap.add_argument("--stream-idle-timeout", type=float, default=5.0, help="edgekit serve --stream-idle-timeout")
    ap.add_argument("--max-context", type=int, default=512, help="edgekit serve --max-context")
    ap.add_argument("--round-streams", action="store_true",
                    help="the honest devices' rounds on a Rounds stream each (ClientConfig.round_streams), "
                         "not Verify calls (the default)")
    ap.add_argument("--timeout", type=float, default=60.0, help="the devices' deadline per call")
    ap.add_argument("--sample-every", type=float, default=0.25, help="seconds between health checks and samples")
    ap.add_argument("--seed", type=int, default=0)
    args = C.parse(ap, plot=plot)
    result = run(args)
    json_path = C.write_result(args.out, result)
    png = plot(result, json_path.with_suffix(".png"))
    A, B = result["phases"]["A"], result["phases"]["B"]
    print(C.table(
        ["phase", "rounds/s", "round p50 ms", "round p99 ms", "health p50/p99/max ms", "threads max", "RSS max MB",
         "errors"],
        [[name, p["rounds_per_s"], p["round_ms"]["p50"], p["round_ms"]["p99"],
          "/".join(C.fmt(p["health_ms"][q], 0) for q in ("p50", "p99", "max")), p["threads_max"], p["rss_mb_max"],
          p["errors_tried_again"]] for name, p in result["phases"].items()], digits=1))
    print(f"B/A rounds/s: {result['ratio_rounds_per_s_B_over_A']:.3f} "
          f"(per repeat: {', '.join(f'{r:.2f}' for r in result['ratio_per_repeat'])}); attack: {B['attack_codes']}; "
          f"identical: {result['all_identical']} (sessions checked: {sum(result['sessions_checked_per_device'])})")
    print(f"A: {A['rounds_per_s']:.2f} rounds/s; {json_path}; {png}")
    os._exit(0 if result["all_identical"] and result["verifier"]["alive_at_the_end"] else 1)


if __name__ == "__main__":
    main()
