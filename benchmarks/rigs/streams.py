"""Plain decoding as a stock server does it, at a number of concurrent streams: the baseline a
fleet of drafting devices is measured against (issue 51, item 3).

N streams, each a thread sending one greedy completion after another (no streaming: one HTTP call
per completion, so the client costs next to nothing beside the server) to an OpenAI-compatible
`/v1/completions`, llama.cpp's `llama-server -np N` (continuous batching of N slots) on a GPU, or
any server that speaks it. Every completion asks for a set number of tokens past its prompt, and
the server's `usage.completion_tokens` says how many it made.

Over a measuring window after a warm-up: committed tokens/s of all streams (each completion's
tokens counted in the share of its time that fell inside the window, as if made at an even pace:
a stream is busy from one completion to the next, so the sum is the server's rate), and per
stream tokens/s as a user sees it (a completion's tokens over its whole call, prefill included).
"""

from __future__ import annotations

import json
import statistics
import threading
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass

from benchmarks import harness as C


@dataclass(frozen=True)
class Completion:
    stream: int
    sent: float  # time.monotonic()
    done: float
    tokens: int


def complete(base: str, model: str, prompt: str, max_tokens: int, timeout: float = 300.0) -> int:
    """One greedy completion of `max_tokens` tokens (the end of text ignored); the tokens it made."""
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
                       "ignore_eos": True, "seed": 0}).encode()
    req = urllib.request.Request(f"{base}/completions", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        answer = json.load(r)
    return int(answer["usage"]["completion_tokens"])


def measure(base: str, model: str, prompts: Sequence[tuple[str, int]], streams: int, *, duration: float,
            warmup: float, timeout: float = 300.0) -> dict:
    """`streams` concurrent streams against the server at `base` (…/v1), each going round
    `prompts` ((text, tokens to ask for) pairs) from its own offset, until the window
    [warm-up, warm-up + duration] has passed; the window's figures."""
    start = time.monotonic() + warmup
    end = start + duration
    done: list[Completion] = []
    errors: list[str] = []
    lock = threading.Lock()

    def stream(i: int) -> None:
        n = i
        while time.monotonic() < end:
            text, tokens = prompts[n % len(prompts)]
            n += 1
            sent = time.monotonic()
            try:
                made = complete(base, model, text, tokens, timeout)
            except (OSError, ValueError, KeyError) as exc:
                with lock:
                    errors.append(f"stream {i}: {type(exc).__name__}: {exc}"[:300])
                return
            with lock:
                done.append(Completion(i, sent, time.monotonic(), made))

    threads = [threading.Thread(target=stream, args=(i,), daemon=True) for i in range(streams)]
    for t in threads:
        t.start()
    time.sleep(max(0.0, start - time.monotonic()))
    with C.GpuUtilization() as gpu:  # over the window: the GPU's busy share (None without one)
        time.sleep(max(0.0, end - time.monotonic()))
    for t in threads:
        t.join()
    return {**summarize(done, errors, start, end, streams), "gpu_busy_share": gpu.mean}


def summarize(done: Sequence[Completion], errors: Sequence[str], start: float, end: float, streams: int) -> dict:
    """The window's figures from the completions (see the module's docstring)."""
    window = end - start
    committed = 0.0
    for c in done:
        overlap = min(c.done, end) - max(c.sent, start)
        if overlap > 0:
            committed += c.tokens * overlap / max(c.done - c.sent, 1e-9)
    inside = [c for c in done if start <= c.sent and c.done <= end]  # whole calls, for a user's speed
    speeds = [c.tokens / max(c.done - c.sent, 1e-9) for c in inside]
    return {
        "streams": streams,
        "window_s": window,
        "committed_tokens_per_s": committed / window,
        "completions": len(inside),
        # None where no call fell wholly inside the window (a window shorter than a completion)
        "per_stream_tokens_per_s": {"median": statistics.median(speeds) if speeds else None,
                                    "min": min(speeds, default=None), "max": max(speeds, default=None)},
        "tokens_per_completion": statistics.mean(c.tokens for c in inside) if inside else None,
        "errors": list(errors),
    }
