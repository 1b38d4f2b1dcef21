"""`edgekit serve` in a process of its own, on a free loopback port, until a block ends: the verifier
a benchmark loads (the fleet's, the fuzzer's, the flood's), ready once gRPC health says SERVING."""

from __future__ import annotations

import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from benchmarks import harness as C


@dataclass(frozen=True)
class Served:
    address: str
    pid: int


@contextmanager
def serve_process(serve_args: list[str], log: Path | None, replay: Path | None = None):
    """`edgekit serve SERVE_ARGS` on a free loopback port, in a process of its own, until the block ends;
    with `replay` (a traces JSON), served by `rigs/replayed.py`: greedy rows answered as those traces'
    target answered them."""
    port = C.free_port()
    launcher = (["-c", "from edgekit.cli.app import main; main()", "serve"] if replay is None
                else ["-m", "benchmarks.rigs.replayed", str(replay)])
    cmd = [sys.executable, *launcher, "--port", str(port), *serve_args]
    out = open(log, "w") if log else subprocess.DEVNULL  # noqa: SIM115  (closed below)
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env={**C.module_env(), "PYTHONUNBUFFERED": "1"})
    try:
        wait_ready(f"127.0.0.1:{port}", proc, timeout=600)
        yield Served(f"127.0.0.1:{port}", proc.pid)
    finally:
        C.stop_process(proc)
        if log:
            out.close()  # type: ignore[union-attr]


def wait_ready(address: str, proc: subprocess.Popen, timeout: float) -> None:
    """Returns once the verifier at `address` says SERVING on gRPC health; raises if `proc` exits first
    or `timeout` seconds pass."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"edgekit serve exited with {proc.returncode}")
        try:
            with grpc.insecure_channel(address) as ch:
                r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=2)
                if r.status == health_pb2.HealthCheckResponse.SERVING:
                    return
        except grpc.RpcError:
            pass
        time.sleep(1.0)
    raise RuntimeError(f"the verifier at {address} was not serving within {timeout:.0f} s")
