"""`Testbed`: a verifier in its own network namespace behind a shaped veth pair and a delay proxy."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass

from edgekit.errors import EdgekitError

from ._proxy import DelayProxy, Impairment

__all__ = ["LinkProfile", "Testbed", "available"]


@dataclass(frozen=True)
class LinkProfile:
    """A link as WISV describes one: RTT, a rate each way, jitter and loss."""

    rtt_ms: float
    uplink_mbps: float
    downlink_mbps: float | None = None  # None: same as the uplink
    jitter_ms: float = 0.0
    loss: float = 0.0  # per TCP segment

    @property
    def name(self) -> str:
        down = self.downlink_mbps or self.uplink_mbps
        rate = f"{self.uplink_mbps:g}" if down == self.uplink_mbps else f"{self.uplink_mbps:g}/{down:g}"
        extra = f" j{self.jitter_ms:g}" if self.jitter_ms else ""
        extra += f" loss{100 * self.loss:g}%" if self.loss else ""
        return f"rtt{self.rtt_ms:g}ms {rate}Mbit{extra}"


def available() -> str | None:
    """None if this machine can build a testbed, else why not."""
    if os.geteuid() != 0:
        return "needs root (network namespaces and tc)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"needs iproute2's `{tool}`"
    return None


def _remove_stale() -> None:
    """Removes testbeds left by processes that died without closing them (their verifier too)."""
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for line in listing.splitlines():
        name = line.split()[0] if line.split() else ""
        if not (name.startswith("ek") and name[2:].isdigit()):
            continue
        owner = int(name[2:])
        if owner != os.getpid() % 100000 and not any(
            p.isdigit() and int(p) % 100000 == owner for p in os.listdir("/proc")
        ):
            pids = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), 9)
                except (OSError, ValueError):
                    pass
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
            subprocess.run(["ip", "link", "del", f"{name}a"], capture_output=True)


def _sh(*args: str) -> None:
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0:
        raise EdgekitError(f"`{' '.join(args)}` failed: {r.stderr.strip() or r.stdout.strip()}")


class Testbed:
    """Creates the namespace and the veth pair, starts `serve_args` (an `edgekit
    serve` command line) inside it, and a proxy in front; `address` is where
    clients connect. `shape(profile)` changes the link while it runs.

        with Testbed(["--pair", "gemma-270m"]) as bed:
            bed.shape(LinkProfile(rtt_ms=50, uplink_mbps=20))
            client = EdgeClient(bed.address, ...)
    """

    __test__ = False  # not a pytest class, whatever its name

    def __init__(
        self, serve_args: list[str], *, port: int = 50551, start_timeout: float = 120.0, log: str | None = None
    ) -> None:
        why = available()
        if why:
            raise EdgekitError(f"the link testbed {why}")
        tag = f"{os.getpid() % 100000}"
        self.netns = f"ek{tag}"
        self._veth = (f"ek{tag}a", f"ek{tag}b")  # host side, namespace side
        subnet = 10 + os.getpid() % 200
        self._ips = (f"10.231.{subnet}.1", f"10.231.{subnet}.2")
        self._serve_args = serve_args
        self._port = port
        self._start_timeout = start_timeout
        self._log = log
        self._server: subprocess.Popen | None = None
        self.proxy: DelayProxy | None = None
        self.profile: LinkProfile | None = None

    @property
    def address(self) -> str:
        assert self.proxy is not None, "the testbed is not started"
        return self.proxy.address

    def start(self) -> Testbed:
        _remove_stale()
        host, peer = self._veth
        try:
            _sh("ip", "netns", "add", self.netns)
            _sh("ip", "link", "add", host, "type", "veth", "peer", "name", peer)
            _sh("ip", "link", "set", peer, "netns", self.netns)
            _sh("ip", "addr", "add", f"{self._ips[0]}/24", "dev", host)
            _sh("ip", "link", "set", host, "up")
            _sh("ip", "netns", "exec", self.netns, "ip", "addr", "add", f"{self._ips[1]}/24", "dev", peer)
            _sh("ip", "netns", "exec", self.netns, "ip", "link", "set", peer, "up")
            _sh("ip", "netns", "exec", self.netns, "ip", "link", "set", "lo", "up")
            self._start_server()
            self.proxy = DelayProxy((self._ips[1], self._port)).start()
        except BaseException:
            self.close()
            raise
        return self

    def _start_server(self) -> None:
        cmd = [
            "ip", "netns", "exec", self.netns, sys.executable, "-m", "edgekit.cli.app", "serve",
            *self._serve_args, "--host", self._ips[1], "--port", str(self._port),
        ]
        out = open(self._log, "w") if self._log else subprocess.DEVNULL  # noqa: SIM115  # the child writes it
        self._server = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + self._start_timeout
        import socket

        while time.monotonic() < deadline:
            if self._server.poll() is not None:
                code = self._server.returncode
                raise EdgekitError(f"the verifier in the testbed exited with {code} (see {self._log})")
            try:
                socket.create_connection((self._ips[1], self._port), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.25)
        raise EdgekitError(f"the verifier in the testbed did not listen within {self._start_timeout:g} s")

    def shape(self, profile: LinkProfile) -> None:
        """Sets the rates (tbf on each end of the pair) and the proxy's delay, jitter and loss."""
        host, peer = self._veth
        down = profile.downlink_mbps or profile.uplink_mbps
        for dev, mbps, prefix in ((host, profile.uplink_mbps, ()), (peer, down, ("ip", "netns", "exec", self.netns))):
            # A small bucket (1 ms of the rate, at least two full frames), so that even a burst of a
            # few KB is serialized at the rate, as on the modelled link; the queue holds 200 ms.
            burst = max(2 * 1514, int(mbps * 1e6 / 8 * 0.001))
            _sh(*prefix, "tc", "qdisc", "replace", "dev", dev, "root", "tbf",
                "rate", f"{mbps:g}mbit", "burst", str(burst), "latency", "200ms")
        assert self.proxy is not None
        self.proxy.impairment = Impairment(profile.rtt_ms, profile.jitter_ms, profile.loss)
        self.profile = profile

    def close(self) -> None:
        if self.proxy is not None:
            self.proxy.close()
            self.proxy = None
        if self._server is not None:
            self._server.terminate()
            try:
                self._server.wait(10)
            except subprocess.TimeoutExpired:
                self._server.kill()
            self._server = None
        subprocess.run(["ip", "netns", "del", self.netns], capture_output=True)
        subprocess.run(["ip", "link", "del", self._veth[0]], capture_output=True)

    def __enter__(self) -> Testbed:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
