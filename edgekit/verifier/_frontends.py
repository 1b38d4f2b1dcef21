"""`FrontEnds`: several verifier processes on one port over one engine (issue 50).

The engine (a GGUF target's `LlamaEngine`, or any `Engine` given) stays in this process behind an
`EngineHost`; each front end is a process of its own (started with `spawn`) running a
`VerifierServer` over a `RemoteEngine`: its gRPC server, sessions, scheduler, acceptance and
statistics. Their gRPC servers share the port (SO_REUSEPORT): the kernel spreads the devices'
connections over them, and a device's channel stays with one. A session lives in the front end
that opened it; a device whose connection lands on another one after a reconnect finds its
session unknown there and reopens it, as after any verifier restart.

Front end i serves Prometheus metrics on `metrics_port` + i (0: each on a free port;
`FrontEnds.metrics_addresses` says where). The first front end measures the
estimator's calibration (where the config asks for one) before the others start, which then
read it from the cache.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import socket
import threading
from dataclasses import replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from ..config import ServerConfig
from ..errors import ConfigError, VerifierUnavailableError
from ._server import build_engine
from .engine import Engine, EngineHost, RemoteEngine

__all__ = ["FrontEnds"]

log = logging.getLogger("edgekit.verifier")

START_TIMEOUT_S = 300.0  # a front end's start: imports, and the first one's calibration


class FrontEnds:
    """`config.frontends` verifier processes serving `config.port` over one engine in this process.

    >>> with FrontEnds("target.gguf", ServerConfig(port=50551, frontends=4)) as servers:
    ...     servers.address   # '127.0.0.1:50551'

    `target`: a GGUF file, or an `Engine` holding `frontends` x `max_sessions` sequences (a
    `ToyEngine` for tests). `stats()` gives each front end's `ServingStats` snapshot."""

    def __init__(self, target: str | Path | Engine, config: ServerConfig, *, name: str | None = None) -> None:
        self.config = config
        self.engine: Engine = target if not isinstance(target, (str, Path)) else build_engine(target, config, name=name)
        self.host = EngineHost(self.engine, clients=config.frontends, seqs=config.max_sessions)
        self._procs: list[Any] = []
        self._pipes: list[Connection] = []
        self._lock = threading.Lock()  # one command at a time on the pipes
        self.port = 0
        self.pids: list[int] = []
        self.metrics_addresses: list[str | None] = []  # each front end's Prometheus endpoint, HOST:PORT

    @property
    def address(self) -> str:
        return f"{self.config.host}:{self.port}"

    def start(self) -> FrontEnds:
        ctx = multiprocessing.get_context("spawn")
        port = self.config.port
        if port:
            _check_free(self.config.host, port)  # the front ends share it: another server there would too
        try:
            for i in range(self.config.frontends):
                port0 = self.config.metrics_port
                metrics = None if port0 is None else 0 if port0 == 0 else port0 + i  # 0: a free one each
                # the first measures what the config asks; the others read it from the cache it left
                calibrate = "auto" if i and self.config.calibrate == "force" else self.config.calibrate
                config = replace(self.config, port=port, metrics_port=metrics, calibrate=calibrate)
                mine, theirs = ctx.Pipe()
                proc = ctx.Process(target=_front_end, args=(self.host.address, self.host.authkey, config, theirs),
                                   name=f"edgekit-frontend-{i}", daemon=True)
                proc.start()
                theirs.close()
                self._procs.append(proc)
                self._pipes.append(mine)
                if not mine.poll(START_TIMEOUT_S):
                    raise VerifierUnavailableError(f"front end {i} did not start within {START_TIMEOUT_S:g} s")
                started = mine.recv()
                if "error" in started:
                    raise ConfigError(f"front end {i} could not start: {started['error']}")
                port = self.port = started["port"]  # the first's (a free one where the config said 0) is everyone's
                self.pids.append(started["pid"])
                self.metrics_addresses.append(started["metrics"])
        except BaseException:
            self.stop()
            raise
        log.info("%d front ends listening on %s over one engine", self.config.frontends, self.address)
        return self

    def _command(self, command: str, **args: Any) -> list[Any]:
        """`command` to every front end at once, and each one's answer (None from one that is gone)."""
        with self._lock:
            sent: list[Connection | None] = []
            for pipe in self._pipes:
                try:
                    pipe.send((command, args))
                    sent.append(pipe)
                except OSError:
                    sent.append(None)
            out: list[Any] = []
            for receiving in sent:
                try:
                    out.append(None if receiving is None else receiving.recv())
                except (EOFError, OSError):
                    out.append(None)
            return out

    def stats(self) -> list[Any]:
        """Each front end's `ServingStats.snapshot()` (None for one that is gone)."""
        return self._command("stats")

    def drain(self, timeout: float = 10.0, *, quiet: float = 2.0) -> float:
        """`VerifierServer.drain` in every front end at once, then stops them all; the longest took."""
        try:
            return float(max((t for t in self._command("drain", timeout=timeout, quiet=quiet) if t is not None),
                             default=0.0))
        finally:
            self.stop()

    def stop(self) -> None:
        """Stops the front ends, then the host; the engine is closed."""
        with self._lock:
            for pipe in self._pipes:
                try:
                    pipe.send(("stop", {}))
                except OSError:  # gone already
                    pass
            for proc in self._procs:
                proc.join(15.0)
                if proc.is_alive():
                    proc.kill()
                    proc.join(5.0)
            for pipe in self._pipes:
                pipe.close()
            self._procs, self._pipes = [], []
        self.host.close()
        close = getattr(self.engine, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> FrontEnds:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _check_free(host: str, port: int) -> None:
    """Refuses a port another server listens on: with SO_REUSEPORT the front ends would share it
    with that server (the kernel splitting the devices between the two) instead of failing."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC binds: a closed server's port is free
        try:
            s.bind((host, port))
        except OSError as exc:
            raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror} (the port is taken?)") from None


def _front_end(address: str, authkey: bytes, config: ServerConfig, pipe: Connection) -> None:
    """A front end's process: a verifier over the host's engine, answering its parent's commands.
    Signals are the parent's: a Ctrl-C or a service manager's SIGTERM to the whole process group
    reaches the parent, which drains every front end; each leaves when the parent's pipe closes."""
    from ._server import VerifierServer

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    try:
        server = VerifierServer(RemoteEngine(address, authkey), config).start()
    except Exception as exc:  # the parent says it
        pipe.send({"error": f"{type(exc).__name__}: {exc}"})
        return
    pipe.send({"port": server.port, "pid": os.getpid(), "metrics": server.metrics_address})
    drained = False
    try:
        while True:
            try:
                command, args = pipe.recv()
            except (EOFError, OSError):  # the parent is gone
                return
            if command == "stats":
                pipe.send(server.service.stats.snapshot())
            elif command == "drain":  # it stops the server when drained
                drained = True
                pipe.send(server.drain(**args))
                return
            else:
                return
    finally:
        if not drained:
            server.stop(grace=1.0)
        server.engine.close()  # type: ignore[attr-defined]
