"""Process control: free ports, waiting for a server to listen, stopping a child, pinning to cores,
the package's own modules run in a child (`module_command`)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# The folder `benchmarks` was imported from, links left as they are: on the GPU machine a tree of
# links (benchmarks/gpu/device.sh) that must not be swapped for the checkout, whose edgekit/ lacks cli/.
CHECKOUT = Path(os.path.abspath(__file__)).parents[2]


def module_command(module: str, *args: str) -> list[str]:
    """`python -m MODULE ARGS` with this interpreter: a module of the package (`benchmarks.rigs.loadgen`)
    run in a process of its own; start it with `module_env()`."""
    return [sys.executable, "-m", module, *args]


def module_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """`env` (default: this process's) with the checkout first on PYTHONPATH: a child run by
    `module_command` finds the `benchmarks` package from any working directory."""
    out = dict(os.environ if env is None else env)
    paths = [p for p in out.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(CHECKOUT) not in paths:
        out["PYTHONPATH"] = os.pathsep.join([str(CHECKOUT), *paths])
    return out


def stop_process(proc: Any, grace: float = 30.0) -> None:
    """SIGTERM, then SIGKILL if `proc` (a subprocess.Popen) has not exited within `grace` seconds."""
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()


def free_port() -> int:
    """A loopback port nobody listens on now (the usual bind-to-0 race: a server that loses it fails loudly)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_listening(port: int, proc: Any, *, timeout: float = 120.0, what: str = "the server") -> None:
    """Returns once something accepts connections on 127.0.0.1:`port`; SystemExit if `proc` (its
    subprocess.Popen) exits first or `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            if proc.poll() is not None:
                raise SystemExit(f"{what} exited (status {proc.returncode}) before listening") from None
            time.sleep(0.2)
    raise SystemExit(f"{what} did not listen on port {port} within {timeout:.0f} s")


@contextmanager
def pinned(cores: set[int] | None) -> Iterator[None]:
    """This process's affinity set to `cores` for the block (a child started in it inherits them)."""
    previous = os.sched_getaffinity(0)
    if cores:
        os.sched_setaffinity(0, cores)
    try:
        yield
    finally:
        os.sched_setaffinity(0, previous)
