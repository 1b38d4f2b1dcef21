"""`edgekit serve` in a process of its own: `serving`, for tests of what a package adds to it (a
scheduler, an engine), started with a plugin's folder on its PYTHONPATH and read until it says how it
schedules; `serve_process`, `wait_serving` and `kill_group`, for tests that kill a verifier as a
crash would and start it again."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from edgekit import ClientConfig
from edgekit.transport import GrpcTransport


@contextmanager
def serving(args: list[str], plugin: Path) -> Iterator[tuple[str, list[str]]]:
    """(its address, the lines it printed up to its scheduling line); on leaving, SIGTERM and a clean
    exit (asserted), or a kill if it never got that far."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "edgekit.cli.app", "serve", "--port", "0", *args],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL, text=True,
        env={**os.environ, "PYTHONPATH": str(plugin)},
    )
    try:
        lines: list[str] = []
        while not any(line.startswith("scheduling: ") for line in lines) and len(lines) < 20:
            lines.append(proc.stderr.readline())  # type: ignore[union-attr]
            assert lines[-1], "".join(lines)  # not the end of the output
        found = re.search(r"edgekit verifier: .* on (127\.0\.0\.1:\d+) \(", "".join(lines))
        assert found, "".join(lines)
        yield found.group(1), lines
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def free_port() -> int:
    """A port free on loopback now (for a process told to listen on it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_process(model: str, port: int, *extra: str) -> subprocess.Popen:
    """`edgekit serve` of `model` on `port`, in a session of its own (`kill_group` stops it as a crash would)."""
    cmd = [sys.executable, "-c", "from edgekit.cli.app import main; main()", "serve", "--model", model,
           "--port", str(port), "--max-sessions", "4", "--max-context", "2048", "--threads", "1", *extra]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)


def wait_serving(port: int, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    """Until the verifier on `port` answers its health check SERVING; a failure if `proc` exits first."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            pytest.fail(f"the verifier exited: {proc.stderr.read().decode()[-2000:]}", pytrace=False)
        try:
            with GrpcTransport(f"127.0.0.1:{port}", ClientConfig(timeout=2, connect_timeout=2)) as t:
                if t.health() == "SERVING":
                    return
        except Exception:
            time.sleep(0.2)
    pytest.fail("the verifier did not start serving", pytrace=False)


def kill_group(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
