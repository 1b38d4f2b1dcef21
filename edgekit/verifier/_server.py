"""Running the reference verifier: gRPC server, health, auth, idle-session reaper,
and the Prometheus endpoint when the config asks for one."""

from __future__ import annotations

import hmac
import logging
import threading
import time
from collections.abc import Callable
from concurrent import futures
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from ..config import ServerConfig
from ..errors import ConfigError
from ..link import is_local
from ..protocol import SERVICE_NAME
from ..registry import ENGINES
from ._calibration import DECODE_STEP_CONTEXT, calibrated_estimator, default_calibration_dir, time_decode_step
from ._estimator import VerifyTimeEstimator
from ._metrics import MetricsEndpoint, check_installed
from ._service import VerifierService
from .engine import Engine, LlamaEngine, RemoteEngine

__all__ = ["Tokens", "VerifierServer", "build_engine", "llama_engine"]

log = logging.getLogger("edgekit.verifier")

# Keepalive pings a client may send (gRPC's default policy: one per 5 minutes, GOAWAY after the
# third too early): a third of the devices' interval (edgekit.transport's KEEPALIVE_MS, 30 s).
PINGS_PERMITTED_EVERY_MS = 10_000


class Tokens:
    """The bearer tokens a verifier takes, each naming a tenant: a file of `NAME TOKEN`
    lines (`#` starts a comment), and `--token`, one secret shared by whoever has it
    (tenant ""). Compared in constant time; sessions belong to the tenant whose token
    opened them."""

    def __init__(self, token: str | None = None, file: str | Path | None = None) -> None:
        self._tenants: list[tuple[bytes, str]] = []
        if token:
            self._tenants.append((f"Bearer {token}".encode(), ""))
        if file is not None:
            self._tenants.extend(_read_tokens(Path(file)))

    def __bool__(self) -> bool:
        return bool(self._tenants)

    def tenant(self, metadata: object) -> str | None:
        """The tenant of the call's `authorization` header ("" for `--token`); None if it names none."""
        found = None
        for key, value in metadata or ():  # type: ignore[attr-defined]
            if key != "authorization":
                continue
            raw = value if isinstance(value, bytes) else value.encode()
            for expected, name in self._tenants:  # every token compared, in constant time each
                if hmac.compare_digest(raw, expected) and found is None:
                    found = name
        return found


def _read_tokens(path: Path) -> list[tuple[bytes, str]]:
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise ConfigError(f"cannot read the tokens file {path}: {exc.strerror}") from None
    out: list[tuple[bytes, str]] = []
    names: set[str] = set()
    for n, line in enumerate(lines, 1):
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        if len(fields) != 2 or len(fields[1]) < 16:
            raise ConfigError(f"{path}:{n}: write one tenant per line as NAME TOKEN, the token 16 characters or more")
        if fields[0] in names:
            raise ConfigError(f"{path}:{n}: tenant {fields[0]!r} appears twice")
        names.add(fields[0])
        out.append((f"Bearer {fields[1]}".encode(), fields[0]))
    if not out:
        raise ConfigError(f"the tokens file {path} names no tenant")
    return out


class _TokenAuth(grpc.ServerInterceptor):
    """Requires `authorization: Bearer <token>` with a known token on every call but health checks.

    A call without one is refused from its headers: its handler is a stream handler, which gRPC runs
    without waiting for a request message, so a client that sends headers and never a message holds
    no thread (a unary handler would sit on a worker until the message came)."""

    def __init__(self, tokens: Tokens) -> None:
        self._tokens = tokens
        self.refused = 0
        self._counting = threading.Lock()  # refusals run on the pool's threads at once

        def deny(requests: object, context: grpc.ServicerContext) -> None:
            with self._counting:
                self.refused += 1
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong token: pass the verifier's --token")

        self._deny: grpc.RpcMethodHandler = grpc.stream_stream_rpc_method_handler(deny)

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        # health checks (a load balancer's, an orchestrator's) need no token; reflection does, as
        # every other call: it tells what the verifier serves
        public = details.method.startswith("/grpc.health.v1.")
        if public or self._tokens.tenant(details.invocation_metadata) is not None:
            return continuation(details)
        return self._deny


def build_engine(model: str | Path, config: ServerConfig, *, name: str | None = None) -> Engine:
    """The engine `config.engine` names (`edgekit.registry.ENGINES`) for `model` (for "llama", a GGUF
    file's path; for an engine a package adds, whatever it takes)."""
    engine: Engine = ENGINES.load(config.engine)(model, config, name=name)
    return engine


def llama_engine(path: str | Path, config: ServerConfig, *, name: str | None = None) -> LlamaEngine:
    """The engine of a GGUF target as `config` sets it (its sessions, numerics, layers on a GPU...)."""
    c = config
    return LlamaEngine(
        str(path),
        name=name,
        max_context=c.max_context,
        n_seq=c.max_sessions * c.frontends,
        max_block=c.max_block,
        exact=c.numerics == "exact",
        threads=c.threads,
        cache_dir=Path(c.calibration_dir) if c.calibration_dir else default_calibration_dir(),
        recalibrate=c.calibrate == "force",
        gpu_layers=c.gpu_layers,
        resident=c.resident_sessions or None,
        # front ends' batches merged into one call: room for each one's largest
        max_batch_rows=c.max_batch_rows * c.frontends,
        reduce_rows=c.reduce_rows,
    )


class VerifierServer:
    """The target model behind `edgekit.verifier.v1`.

    >>> server = VerifierServer("target.gguf", ServerConfig(port=0)).start()
    >>> server.address   # '127.0.0.1:43211'
    >>> server.stop()

    `target` is a model for the engine `config.engine` names (a GGUF file for llama.cpp, the
    default; `edgekit.registry.ENGINES`) or an `Engine` (a `ToyEngine` for tests, say), which must
    hold `config.max_sessions` sequences.
    With `config.metrics_port` set, `start` also serves Prometheus metrics over HTTP
    at `metrics_address` (``http://<metrics_address>/metrics``), until `stop`.
    """

    def __init__(
        self,
        target: str | Path | Engine,
        config: ServerConfig | None = None,
        *,
        name: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`clock`: seconds, what session idleness and draining are measured on (tests pass a
        virtual one; see `VerifierService`)."""
        self.config = config or ServerConfig()
        c = self.config
        if c.frontends > 1 and not isinstance(target, RemoteEngine):
            raise ConfigError(f"frontends={c.frontends}: several verifier processes over one engine are started "
                              "by edgekit.verifier.FrontEnds (edgekit serve --frontends), not by one VerifierServer")
        if c.metrics_port is not None:
            check_installed()  # before a model is loaded for nothing
        self.engine = target if not isinstance(target, (str, Path)) else build_engine(target, c, name=name)
        estimator = self._estimator()
        step_ms = self._timed_step(estimator)
        self.service = VerifierService(self.engine, c, estimator=estimator, clock=clock, timed_step_ms=step_ms)
        tokens = Tokens(c.token, c.tokens_file)
        self._auth = _TokenAuth(tokens) if tokens else None
        interceptors: list[grpc.ServerInterceptor] = [self._auth] if self._auth is not None else []
        # gRPC's hard cap sits a little above ours, so a request just over the limit reaches the
        # service and gets INVALID_ARGUMENT with its size; one far over it is refused by gRPC
        # (RESOURCE_EXHAUSTED) before it is read into memory.
        hard_cap = c.max_message_bytes + 64 * 1024
        # A handler per session and a few for handshakes and health: with fewer, calls would queue in
        # gRPC's pool, in arrival order, before the scheduler could see them; and a thread for each
        # stream the service admits (StreamLimits), so open streams never take the unary calls' threads.
        handlers = max(c.workers, c.max_sessions + 8) + self.service.streams.max_open
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=handlers, thread_name_prefix="edgekit-verifier"),
            interceptors=interceptors,
            # calls beyond this (in flight or waiting for a thread) are refused before they are read
            maximum_concurrent_rpcs=c.max_calls or 4 * handlers,
            options=[
                # a connection with no call in it is closed after a while; one with calls is not
                ("grpc.max_connection_idle_ms", int(c.connection_idle_timeout * 1000)),
                # the devices' keepalive pings (every 30 s during a call, edgekit.transport) are let
                # through: gRPC's default policy takes one per 5 minutes and hangs up on the third
                ("grpc.http2.min_ping_interval_without_data_ms", PINGS_PERMITTED_EVERY_MS),
                ("grpc.max_receive_message_length", hard_cap),
                ("grpc.max_send_message_length", hard_cap),
                # several front ends share the port (FrontEnds); one alone has it to itself
                ("grpc.so_reuseport", int(c.frontends > 1)),
                # gRPC Python takes calls from the core one at a time, so with a call in flight per
                # device most wait in the core's pending queue, whose backlog protector cancels calls
                # at random past 1,000 (CANCELLED, seen at 1,024 devices): room for every session's call.
                ("grpc.server.max_pending_requests", 2 * handlers),
                ("grpc.server.max_pending_requests_hard_limit", 4 * handlers),
            ],
        )
        def tenant_of(context: grpc.ServicerContext) -> str:
            return tokens.tenant(context.invocation_metadata()) or ""

        self._server.add_generic_rpc_handlers((self.service.handlers(tenant_of),))
        self._health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        # server reflection: grpcurl, Postman and other explorers call the verifier without the .proto
        # (with tokens required, they pass one: `grpcurl -H 'authorization: Bearer ...'`)
        reflection.enable_server_reflection(
            (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME),
            self._server)
        bind = f"{c.host}:{c.port}"
        if c.tls_cert and c.tls_key:
            client_ca = Path(c.tls_client_ca).read_bytes() if c.tls_client_ca else None
            creds = grpc.ssl_server_credentials(
                [(Path(c.tls_key).read_bytes(), Path(c.tls_cert).read_bytes())],
                root_certificates=client_ca,
                require_client_auth=client_ca is not None,  # mutual TLS
            )
            port = self._server.add_secure_port(bind, creds)
        else:
            port = self._server.add_insecure_port(bind)
            if tokens and not is_local(c.host.strip("[]")):
                log.warning(
                    "tokens are required but %s serves plain gRPC (no --tls-cert/--tls-key): the devices' tokens "
                    "cross the network readable by anyone on the path; serve TLS, or put a TLS-terminating proxy "
                    "in front and keep this port off the open network (docs: Outages and access, Security)", bind)
        if port == 0:
            raise ConfigError(f"cannot listen on {bind}: the port is taken or the address is not local")
        self.port = port
        self.address = f"{c.host}:{port}"
        self._stop = threading.Event()
        self._reaper = threading.Thread(target=self._reap, name="edgekit-reaper", daemon=True)
        self._metrics: MetricsEndpoint | None = None

    @property
    def metrics_address(self) -> str | None:
        """HOST:PORT of the Prometheus endpoint once started; None without one."""
        return self._metrics.address if self._metrics is not None else None

    def _estimator(self) -> VerifyTimeEstimator:
        """The verification-time estimator: calibrated on this machine where the policy
        plans with it (or the config asks), from the cache when it holds one."""
        c = self.config
        if c.calibrate == "off":
            return VerifyTimeEstimator()
        # its batches on sequences the context holds at once: parking would be timed with them (a front
        # end calibrates before the others start, on the sequences the host's engine holds)
        if isinstance(self.engine, LlamaEngine):
            resident = self.engine.slots.resident
        elif isinstance(self.engine, RemoteEngine):
            resident = min(c.max_sessions, self.engine.resident)
        else:
            resident = c.max_sessions
        return calibrated_estimator(
            self.engine,
            n_seq=resident,
            max_context=c.max_context,
            max_block=c.max_block,
            prefill_chunk=c.prefill_chunk,
            threads=c.threads,
            cache_dir=Path(c.calibration_dir) if c.calibration_dir else default_calibration_dir(),
            measure=c.policy == "wisp" or c.calibrate == "force",
            force=c.calibrate == "force",
        )

    def _timed_step(self, estimator: VerifyTimeEstimator) -> float:
        """What a target step takes, for clients to choose their first answer's route by, timed in a
        few steps where the estimator cannot forecast it yet (0: not timed)."""
        c = self.config
        if estimator.settled or c.calibrate == "off":
            return 0.0
        try:
            return time_decode_step(self.engine, context=max(1, min(DECODE_STEP_CONTEXT, c.max_context // 2)))
        except Exception as e:  # (an engine smaller than the config says, one out of memory): serve anyway
            log.warning("could not time a target step (%s: %s); the handshake leaves it unsaid", type(e).__name__, e)
            return 0.0

    def start(self) -> VerifierServer:
        c = self.config
        if c.metrics_port is not None and self._metrics is None:
            self._metrics = MetricsEndpoint(self.service.stats, c.metrics_host, c.metrics_port, self.service.budgets)
            log.info("metrics on http://%s/metrics", self._metrics.address)
        self._server.start()
        for name in ("", SERVICE_NAME):
            self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        self._reaper.start()
        log.info("verifier for %s listening on %s", self.engine.name, self.address)
        return self

    def _reap(self) -> None:
        c = self.config
        interval = max(0.1, min(30.0, c.idle_timeout / 4, c.stream_idle_timeout / 4))
        while not self._stop.wait(interval):
            n = self.service.sessions.reap()
            if n:
                log.info("evicted %d idle session(s)", n)
            n = self.service.streams.reap()
            if n:
                log.info("ended %d stream(s) idle for over %g s", n, c.stream_idle_timeout)

    @property
    def refused_unauthenticated(self) -> int:
        """Calls refused for a missing or wrong token since the start."""
        return self._auth.refused if self._auth is not None else 0

    def wait(self) -> None:
        self._server.wait_for_termination()

    def drain(self, timeout: float = 10.0, *, quiet: float = 2.0, back_in: float = 2.0) -> float:
        """Drains for a restart, then stops: health turns NOT_SERVING, new sessions are refused
        (UNAVAILABLE, with a hint to come back in `back_in` seconds), calls on open sessions are
        served until every session is closed, or none has called for `quiet` seconds since the
        drain began (a device between two rounds when it does, drafting on a busy core, gets
        `quiet` seconds to send the next), or `timeout` has passed; then the calls still in
        flight get a second to finish. Returns the seconds it took."""
        clock = self.service.clock
        t0 = clock()
        for name in ("", SERVICE_NAME):
            self._health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        self.service.drain(back_in=timeout + back_in)
        while clock() - t0 < timeout and min(self.service.quiet_for(), clock() - t0) < quiet:
            if self.service.idle():
                break  # every session closed, no call in flight
            time.sleep(0.05)
        self.stop(grace=1.0)
        return clock() - t0

    def stop(self, grace: float | None = 1.0) -> None:
        self._stop.set()
        self._health.enter_graceful_shutdown()
        self._server.stop(grace).wait()
        self.service.close()
        if self._metrics is not None:
            self._metrics.close()
            self._metrics = None

    def __enter__(self) -> VerifierServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
