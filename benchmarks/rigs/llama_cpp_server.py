"""llama-cpp-python's OpenAI-compatible server (`python -m llama_cpp.server`) on a target, as a stock
stateless verifier: `backends.py` sets it beside ours, `llama_server_flags.py` prices its flags."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence

from benchmarks import harness as C


def start_llama_server(target: str, threads: int, log: str, flags: Sequence[str] = ()) -> tuple[subprocess.Popen, str]:
    """llama-cpp-python's server on `target` with `flags` after the ones set here; its edgekit URL."""
    port = C.free_port()
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", target, "--host", "127.0.0.1", "--port", str(port),
           "--n_ctx", "2048", "--n_threads", str(threads), "--n_threads_batch", str(threads), "--logits_all", "true",
           *flags]
    with open(log, "w") as out:  # the child keeps its own descriptor
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    C.wait_listening(port, proc, timeout=120.0, what=f"llama-cpp-python's server (log: {log})")
    return proc, f"openai+http://127.0.0.1:{port}/v1"
