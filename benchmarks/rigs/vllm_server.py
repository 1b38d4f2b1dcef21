"""vLLM's OpenAI server (engines/vllm/serve.sh) started and stopped from Python: the vLLM test
tier (tests/system/test_vllm.py), the vLLM benchmarks (`vllm_rounds`, `vllm_fleet`) and the peers share it.

    from benchmarks.rigs.vllm_server import VllmServer
    with VllmServer(port, log) as vllm:   # returns once /v1/models answers
        ... vllm.base ...               # http://127.0.0.1:PORT/v1
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

ENGINE = Path(__file__).resolve().parents[2] / "engines" / "vllm"  # its shell scripts


def prepared() -> list[Path]:
    """What prepare.sh has not made yet (its stamps in the venv and beside the converted target)."""
    where = subprocess.run(["bash", "-c", f'source "{ENGINE}/env.sh" && echo "$VLLM_VENV" && echo "$VLLM_MODEL_DIR"'],
                           capture_output=True, text=True, check=True).stdout.split("\n")
    stamps = [Path(where[0]) / ".edgekit-prepared", Path(where[1]) / ".edgekit-converted"]
    return [stamp.parent for stamp in stamps if not stamp.is_file()]


def post(base: str, path: str, body: dict, timeout: float = 180.0) -> dict:
    request = urllib.request.Request(base + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        return json.load(answer)


class VllmServer:
    """serve.sh on a loopback port, in a process group of its own (vLLM starts an engine process
    and a worker: stopping the group stops them too)."""

    def __init__(self, port: int, log: Path, *, start_deadline: float = 900.0, flags: tuple[str, ...] = (),
                 env: dict[str, str] | None = None) -> None:
        self.port, self.log, self.start_deadline, self.flags = port, log, start_deadline, flags
        self.env = {**os.environ, **(env or {})}  # e.g. VLLM_SERVER_DEV_MODE=1 for /reset_prefix_cache
        self.base = f"http://127.0.0.1:{port}/v1"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        with open(self.log, "a") as out:
            self.proc = subprocess.Popen([str(ENGINE / "serve.sh"), str(self.port), *self.flags], stdout=out,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                         env=self.env)

    def wait_ready(self) -> float:
        """Seconds until /v1/models answered; RuntimeError with the log's tail if vLLM exits or
        takes longer than the start deadline."""
        assert self.proc is not None
        started = time.monotonic()
        while True:
            if self.proc.poll() is not None:
                tail = self.log.read_text()[-3000:]
                raise RuntimeError(f"vLLM exited ({self.proc.returncode}) while starting: {tail}")
            try:
                with urllib.request.urlopen(self.base + "/models", timeout=5) as answer:
                    if answer.status == 200:
                        return time.monotonic() - started
            except OSError:
                pass
            if time.monotonic() > started + self.start_deadline:
                raise RuntimeError(f"vLLM did not answer /v1/models in {self.start_deadline:.0f} s: "
                                   f"{self.log.read_text()[-3000:]}")
            time.sleep(1.0)

    def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds (user + system) its processes have used so far: the API server (the process
        serve.sh became) and the rest (the engine core and its workers)."""
        import psutil

        assert self.proc is not None
        top = psutil.Process(self.proc.pid)
        def used(p: psutil.Process) -> float:
            try:
                t = p.cpu_times()
                return t.user + t.system
            except psutil.NoSuchProcess:
                return 0.0
        return {"api_server": used(top), "engine": sum(used(c) for c in top.children(recursive=True))}

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, sig)
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        except ProcessLookupError:
            pass
        self.proc = None

    def __enter__(self) -> VllmServer:
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def vllm_counter(base: str, name: str, **labels: str) -> float:
    """One of vLLM's /metrics counters, summed over the series with `labels`."""
    with urllib.request.urlopen(base.removesuffix("/v1") + "/metrics", timeout=60) as r:
        lines = r.read().decode().splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines
               if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()))
