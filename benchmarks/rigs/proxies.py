"""HAProxy or nginx in front of several verifiers, with the configs deploy/ ships (only their
replicas' addresses and the listening port changed): the fleet-behind-a-proxy test
(tests/system/test_fleet_proxy.py) and the capacity-against-replicas benchmark (fleet_replicas.py).

Binaries: from PATH, else build/proxies/bin (deploy/fetch-proxies.sh unpacks Debian's packages
there without root)."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = {"haproxy": ROOT / "deploy" / "haproxy" / "haproxy.cfg", "nginx": ROOT / "deploy" / "nginx" / "nginx.conf"}


def binary(kind: str) -> str | None:
    """The proxy's binary (EDGEKIT_HAPROXY / EDGEKIT_NGINX, PATH, build/proxies/bin), or None."""
    for candidate in (os.environ.get(f"EDGEKIT_{kind.upper()}"), shutil.which(kind),
                      ROOT / "build" / "proxies" / "bin" / kind):
        if candidate and Path(candidate).exists():
            return str(candidate)
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


RATE_RULE = re.compile(r"(sc_http_req_rate\(0\) gt )(\d+)")  # HAProxy's per-client call limit


def render(kind: str, replicas: Sequence[str], listen: int, folder: Path, *, client_rate: int | None = None) -> Path:
    """deploy/'s config for `kind`, serving on 127.0.0.1:`listen` and balancing over `replicas`
    (host:port each; the shipped config names three, verifier1..3, and keeps as many as given).
    `client_rate`: HAProxy's per-client limit in calls a second in place of the shipped one
    (0: none); None: as shipped."""
    text = CONFIGS[kind].read_text()
    if client_rate is not None:
        if kind != "haproxy" or len(RATE_RULE.findall(text)) != 1:
            raise ValueError(f"{CONFIGS[kind]} has no per-client rate limit to change")
        if client_rate:
            text = RATE_RULE.sub(rf"\g<1>{client_rate}", text)
        else:
            text = re.sub(r"(?m)^.*sc_http_req_rate\(0\) gt \d+.*\n", "", text)
    if not 1 <= len(replicas) <= 3:
        raise ValueError("the shipped configs name three replicas: give 1 to 3")
    for i in range(1, 4):
        line = re.compile(rf"(?m)^.*\bverifier{i}:50051\b.*\n")
        if len(line.findall(text)) != 1:
            raise ValueError(f"{CONFIGS[kind]} must name verifier{i}:50051 on one line")
        keep = i <= len(replicas)
        text = text.replace(f"verifier{i}:50051", replicas[i - 1]) if keep else line.sub("", text)
    bind = r"(?m)^(\s*)bind :50051 " if kind == "haproxy" else r"(?m)^(\s*)listen 50051 "
    word = "bind" if kind == "haproxy" else "listen"
    text, n = re.subn(bind, rf"\g<1>{word} 127.0.0.1:{listen} ", text)
    if n != 1:
        raise ValueError(f"{CONFIGS[kind]} must listen on 50051 once")
    text = text.replace("/tmp/edgekit-nginx", str(folder / "nginx"))
    path = folder / CONFIGS[kind].name
    path.write_text(text)
    return path


def command(kind: str, config: Path, folder: Path) -> tuple[list[str], list[str]]:
    """(the proxy's config check, the proxy in the foreground)."""
    exe = binary(kind)
    if exe is None:
        raise FileNotFoundError(f"{kind} not found on PATH nor in build/proxies/bin (bash deploy/fetch-proxies.sh)")
    if kind == "haproxy":
        return [exe, "-c", "-f", str(config)], [exe, "-db", "-f", str(config)]
    return [exe, "-t", "-p", str(folder), "-c", str(config)], [exe, "-p", str(folder), "-c", str(config),
                                                               "-g", "daemon off;"]


def _answers(address: str) -> bool:
    from edgekit import ClientConfig
    from edgekit.errors import EdgekitError
    from edgekit.transport import GrpcTransport

    try:
        with GrpcTransport(address, ClientConfig(timeout=2, connect_timeout=2)) as t:
            t.ping()
        return True
    except EdgekitError:
        return False


@contextmanager
def proxied(kind: str, replicas: Sequence[str], folder: Path, *, ready_s: float = 30.0,
            client_rate: int | None = None, prefix: Sequence[str] = ()) -> Iterator[str]:
    """`kind` in front of `replicas` until the block ends; its address once a ping through it
    is answered. Its log is folder/KIND.log. `client_rate`: as `render`; `prefix`: a command
    the proxy runs under (taskset, to keep it off a core)."""
    folder.mkdir(parents=True, exist_ok=True)
    listen = free_port()
    config = render(kind, replicas, listen, folder, client_rate=client_rate)
    check, run = command(kind, config, folder)
    run = [*prefix, *run]
    checked = subprocess.run(check, capture_output=True, text=True)
    if checked.returncode != 0:
        raise RuntimeError(f"{kind} refuses its config {config}: {checked.stderr[-2000:]}")
    log = open(folder / f"{kind}.log", "w")  # noqa: SIM115  (closed below)
    proc = subprocess.Popen(run, stdout=subprocess.DEVNULL, stderr=log)
    address = f"127.0.0.1:{listen}"
    try:
        end = time.monotonic() + ready_s
        while not _answers(address):
            if proc.poll() is not None or time.monotonic() > end:
                tail = (folder / f"{kind}.log").read_text()[-2000:]
                raise RuntimeError(f"{kind} did not answer on {address}: {tail}")
            time.sleep(0.2)
        yield address
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log.close()
