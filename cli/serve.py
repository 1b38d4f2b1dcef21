"""`edgekit serve`: run the reference verifier."""

from __future__ import annotations

import logging
import signal
import threading
from enum import Enum
from pathlib import Path
from typing import Any, Literal, cast

import typer

from edgekit.registry import BUDGET_POLICIES, ENGINES, SCHEDULERS

from ._common import note, registered


class Numerics(str, Enum):
    exact = "exact"
    fast = "fast"


class ReduceRows(str, Enum):
    host = "host"
    llama = "llama"


class LogLevel(str, Enum):
    debug = "debug"
    info = "info"
    warning = "warning"
    error = "error"


def serve(
    pair: str = typer.Option("gemma-270m", "--pair", help="Serve this pair's target model."),
    model: str | None = typer.Option(
        None, "--model",
        help="Serve this model instead of a pair's target: hf:ORG/REPO:QUANT or hf:ORG/REPO/FILE.gguf (the Hugging "
        "Face Hub), ollama:NAME[:TAG] (Ollama's store, read in place), a path to a GGUF file, or a registry model.",
    ),
    engine: str = typer.Option(
        "llama", "--engine", help=ENGINES.help("What runs the target (another than llama takes --model as it is)"),
        metavar=ENGINES.metavar(), callback=registered(ENGINES),
    ),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (0.0.0.0 for all interfaces)."),
    port: int = typer.Option(50551, "--port", min=0, max=65535, help="Port to listen on; 0 picks a free one."),
    max_sessions: int = typer.Option(16, "--max-sessions", min=1, help="Concurrent sessions (KV sequences)."),
    resident_sessions: int = typer.Option(
        0, "--resident-sessions", min=0,
        help="Sessions whose KV the target's context holds at once; the rest are parked in host memory "
        "(0: all of --max-sessions, up to llama.cpp's 256).",
    ),
    max_block: int = typer.Option(32, "--max-block", min=1, help="Longest draft block accepted in one round."),
    max_generate_tokens: int = typer.Option(
        4096, "--max-generate-tokens", min=1,
        help="Most tokens one target-only Generate stream may ask for (a long one holds the engine a while).",
    ),
    max_context: int = typer.Option(
        4096, "--max-context", min=256, help="Tokens per session; the KV cache holds max-context x max-sessions."
    ),
    idle_timeout: float = typer.Option(900.0, "--idle-timeout", help="Seconds before an idle session may be evicted."),
    drain_timeout: float = typer.Option(
        10.0, "--drain-timeout", min=0,
        help="On SIGTERM or Ctrl-C, serve open sessions (refusing new ones) for at most this many seconds, then exit.",
    ),
    drain_quiet: float = typer.Option(
        2.0, "--drain-quiet", min=0,
        help="While draining, exit once every session is closed, or none has called for this many seconds.",
    ),
    reclaim_after: float = typer.Option(
        60.0, "--reclaim-after", min=0, help="With every session taken, one idle this many seconds makes room."
    ),
    max_sessions_per_client: int = typer.Option(
        0, "--max-sessions-per-client", min=0,
        help="Most sessions one client (a --tokens-file tenant, else a host) may hold; 0: no hard limit. With every "
        "session taken, a client holding under half of them takes the least recently used one of a client over half.",
    ),
    numerics: Numerics = typer.Option(
        Numerics.exact,
        "--numerics",
        help="exact: greedy output token-identical to target-only decoding (batch-invariant kernels, slower); "
        "fast: every llama.cpp kernel, last-bit differences may flip near-tied argmaxes.",
    ),
    token: str | None = typer.Option(None, "--token", envvar="EDGEKIT_SERVE_TOKEN", help="Require this bearer token."),
    tokens_file: Path | None = typer.Option(
        None, "--tokens-file", exists=True, dir_okay=False,
        help="Take several tokens, one tenant each (lines of NAME TOKEN); a session belongs to its tenant.",
    ),
    tls_cert: Path | None = typer.Option(None, "--tls-cert", exists=True, help="PEM certificate chain for TLS."),
    tls_key: Path | None = typer.Option(None, "--tls-key", exists=True, help="PEM private key for TLS."),
    tls_client_ca: Path | None = typer.Option(
        None, "--tls-client-ca", exists=True, help="Mutual TLS: require client certificates signed by this CA (PEM)."
    ),
    threads: int | None = typer.Option(None, "--threads", min=1, help="llama.cpp threads (default: all cores)."),
    gpu_layers: int | None = typer.Option(
        None, "--gpu-layers", min=-1,
        help="Target layers on the GPU where llama.cpp was built with one: -1 all, 0 none "
        "(default: EDGEKIT_GPU_LAYERS, else all).",
    ),
    reduce_rows: ReduceRows = typer.Option(
        ReduceRows.host, "--reduce-rows",
        help="Where greedy rows become best ids: host (whole rows out of llama.cpp, one argmax per call) or llama "
        "(llama.cpp's backend sampling takes each row's argmax where it is made: on a GPU no vocabulary-wide row "
        "leaves it; not yet measured on one).",
    ),
    prefill_chunk: int = typer.Option(
        128, "--prefill-chunk", min=1,
        help="Prompts and turns go to the engine in chunks of this many tokens, other sessions' rounds between them.",
    ),
    max_batch_rows: int = typer.Option(
        2048, "--max-batch-rows", min=1,
        help="The most tokens one engine batch puts through; the scheduler cuts batches there.",
    ),
    frontends: int = typer.Option(
        1, "--frontends", min=1,
        help="Verifier processes serving the port over one engine: each its own gRPC server, sessions "
        "(--max-sessions each) and scheduler; what they send while the engine is busy runs as one batch. "
        "One process's Python caps it at 1,200-1,700 rounds a second; a GPU target serving hundreds of "
        "devices wants several. Front end i serves metrics on --metrics-port + i.",
    ),
    policy: str = typer.Option(
        "fcfs", "--policy", help=SCHEDULERS.help("Which work runs next"), metavar=SCHEDULERS.metavar(),
        callback=registered(SCHEDULERS),
    ),
    slo_class: list[str] = typer.Option(
        [], "--slo-class", metavar="NAME=TOK/S",
        help="A named token-speed class (repeat for several); replaces the defaults "
        "realtime=8, interactive=6, standard=4, relaxed=2.",
    ),
    guard_ms: float = typer.Option(20.0, "--guard-ms", min=0.0, help="wisp: guard time of the latest start (eq. 17)."),
    slo_budget: str = typer.Option(
        "round", "--slo-budget",
        help="A round's budget: round (WISP eq. 6, this block's tokens at the session's speed) or response "
        "(what keeps the whole response at its speed: credit when ahead).",
    ),
    min_efficiency: float = typer.Option(
        0.75, "--min-efficiency", min=0.0, max=0.99,
        help="wisp: while less than this share of a batch's predicted time is work rather than the per-batch "
        "constant, deadlines do not stop it growing (0: Algorithm 1 as published).",
    ),
    unreachable_share: float = typer.Option(
        0.9, "--unreachable-share", min=0.01, max=1.0,
        help="wisp: a session more than this share of whose recent rounds went to the engine too late for "
        "their deadlines goes after every reachable one until they go in time again (1: Algorithm 1's order).",
    ),
    starvation: float = typer.Option(
        2.0, "--starvation", min=0.01, help="wisp: the longest any work waits before it goes first, in seconds."
    ),
    budgets: str = typer.Option(
        "none", "--budgets", help=BUDGET_POLICIES.help("Draft budgets the verifier assigns each device per round"),
        metavar=BUDGET_POLICIES.metavar(), callback=registered(BUDGET_POLICIES),
    ),
    token_budget: int = typer.Option(
        0, "--token-budget", min=0, metavar="C",
        help="With --budgets: draft tokens per target pass over all sessions (0: the most whose predicted verify "
        "time meets the active SLOs; 4 per session without SLOs).",
    ),
    budget_eta: float | None = typer.Option(
        None, "--budget-eta", min=0.001, max=1.0,
        help="With --budgets: smoothing of each client's acceptance estimate (GOODSPEED eq. 3; default: measured, "
        "see docs/concepts/budgets.md).",
    ),
    budget_beta: float | None = typer.Option(
        None, "--budget-beta", min=0.001, max=1.0,
        help="With --budgets: smoothing of each client's goodput estimate (GOODSPEED eq. 4; default: measured, "
        "see docs/concepts/budgets.md).",
    ),
    calibrate: bool = typer.Option(
        False, "--calibrate",
        help="Measure the verification-time estimator again on this machine (else: the cached calibration, measured "
        "once when the policy needs it).",
    ),
    metrics_port: int | None = typer.Option(
        None, "--metrics-port", min=0, max=65535, metavar="PORT",
        help="Serve Prometheus metrics at http://HOST:PORT/metrics (0 picks a free port); needs "
        "pip install 'edgekit\\[server]'.",  # escaped: rich would read [server] as a tag
    ),
    metrics_host: str = typer.Option(
        "127.0.0.1", "--metrics-host", metavar="ADDRESS",
        help="Address the metrics endpoint listens on: loopback by default (it has no auth); 0.0.0.0 for a "
        "scraper on another host (keep the port off the open network).",
    ),
    trusted_proxies: str = typer.Option(
        "", "--trusted-proxies", metavar="ADDRESSES",
        help="Proxies in front (addresses or networks, comma-separated) whose x-forwarded-for names a call's "
        "host, so that --max-sessions-per-client counts each device behind them, not the proxy.",
    ),
    max_streams: int = typer.Option(
        0, "--max-streams", min=0,
        help="Streams (Rounds, Generate) open at once, each a thread; more are refused (0: --max-sessions).",
    ),
    stream_idle_timeout: float = typer.Option(
        60.0, "--stream-idle-timeout", min=0.1,
        help="Seconds a stream may move no message before it is ended (a device opens another at its next round).",
    ),
    semantic_head: str | None = typer.Option(
        None, "--semantic-head", metavar="FILE|shipped",
        help="Offer semantic verification (WISV, lossy, opt-in per session) with this ONNX decision head; "
        "'shipped' takes the one shipped for --pair. Without it the mode is refused.",
    ),
    log_level: LogLevel = typer.Option(
        LogLevel.warning, "--log-level", envvar="EDGEKIT_LOG_LEVEL",
        help="The verifier's log on stderr: info adds start-up and evictions, debug every engine batch "
        "(works, rows, estimated and measured time).",
    ),
) -> None:
    """Serve a target model as an edgekit verifier (gRPC, edgekit.verifier.v1, with grpc.health.v1)."""
    from edgekit import ServerConfig
    from edgekit.config import DEFAULT_SLO_CLASSES
    from edgekit.verifier import VerifierServer

    _log_to_stderr(log_level.value)
    if semantic_head == "shipped":
        from edgekit.semantic.shipped import shipped_head

        if model is not None:
            raise typer.BadParameter(
                "with --model, name the head's file: --semantic-head FILE", param_hint="--semantic-head"
            )

        semantic_head = str(shipped_head(pair))
    smoothing: dict[str, Any] = {k: v for k, v in (("budget_eta", budget_eta), ("budget_beta", budget_beta)) if v}
    config = ServerConfig(
        host=host,
        port=port,
        max_sessions=max_sessions,
        resident_sessions=resident_sessions,
        max_block=max_block,
        max_generate_tokens=max_generate_tokens,
        max_context=max_context,
        idle_timeout=idle_timeout,
        reclaim_after=reclaim_after,
        max_sessions_per_client=max_sessions_per_client,
        numerics=numerics.value,
        token=token,
        tokens_file=str(tokens_file) if tokens_file else None,
        tls_cert=str(tls_cert) if tls_cert else None,
        tls_key=str(tls_key) if tls_key else None,
        tls_client_ca=str(tls_client_ca) if tls_client_ca else None,
        threads=threads,
        gpu_layers=gpu_layers,
        reduce_rows=reduce_rows.value,
        prefill_chunk=prefill_chunk,
        max_batch_rows=max_batch_rows,
        frontends=frontends,
        policy=policy,
        guard_ms=guard_ms,
        slo_budget=cast(Literal["round", "response"], slo_budget),
        starvation_s=starvation,
        min_efficiency=min_efficiency,
        unreachable_share=unreachable_share,
        budgets=budgets,
        token_budget=token_budget,
        **smoothing,
        calibrate="force" if calibrate else "auto",
        slo_classes=",".join(slo_class) if slo_class else dict(DEFAULT_SLO_CLASSES),
        metrics_port=metrics_port,
        metrics_host=metrics_host,
        max_streams=max_streams,
        trusted_proxies=trusted_proxies,
        stream_idle_timeout=stream_idle_timeout,
        semantic_head=semantic_head,
        engine=engine,
    )
    from edgekit.models import get_pair
    from edgekit.models.refs import resolve_for_use

    path: str | Path
    if engine == "llama":  # a GGUF file, found or fetched as every command finds one
        resolved = resolve_for_use(model if model is not None else get_pair(pair).target, role="target")
        path, name = resolved.path, resolved.name
    elif model is None:
        raise typer.BadParameter(f"the {engine} engine serves the model --model names", param_hint="--model")
    else:  # an engine a package adds takes the model as given
        path, name = model, model
    if frontends > 1:
        _serve_front_ends(path, config, name, drain_timeout, drain_quiet)
        return
    server = VerifierServer(path, config, name=name).start()
    note(f"edgekit verifier: {name} on {server.address} ({_engine_detail(server.engine)}; "
         f"up to {max_sessions} sessions)")
    classes = ", ".join(f"{n} {s:g}" for n, s in server.service.slo.classes.items())
    estimator = server.service.estimator
    fitted = "calibrated" if estimator.calibrated else "learning from live batches"
    budget_note = "" if budgets == "none" else f"; draft budgets: {budgets}, C = {token_budget or 'auto'}"
    note(f"scheduling: {policy}; SLO classes (tok/s): {classes}; time estimator {fitted}{budget_note}")
    semantic = server.service.semantic
    if semantic.offered:
        note(f"semantic mode offered: head {semantic.identity}, threshold {semantic.default_threshold:.3f}")
    if server.metrics_address is not None:
        note(f"metrics: http://{server.metrics_address}/metrics")
    _serve_until_signalled(server, drain_timeout, drain_quiet)


def _serve_until_signalled(server: Any, drain_timeout: float, drain_quiet: float) -> None:
    """Serves until SIGINT or SIGTERM, then drains `server` (a `VerifierServer` or `FrontEnds`)."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    note(f"draining: no new sessions; serving the open ones until they close or go quiet for {drain_quiet:g} s, "
         f"{drain_timeout:g} s at most")
    took = server.drain(timeout=drain_timeout, quiet=drain_quiet)
    note(f"stopped after {took:.1f} s")


def _engine_detail(engine: Any) -> str:
    """How the engine runs, in words: its numerics, and where greedy rows are reduced."""
    if engine.exact:
        together = "sessions batched together" if engine.mixes_sessions else "each session's rows apart"
        detail = f"exact numerics, invariant batch {engine.invariant_batch}, {together}"
    else:
        detail = "fast numerics"
    if getattr(engine, "reduces_in_llama", False):
        detail += "; greedy rows reduced by llama.cpp"
    return detail


def _serve_front_ends(path: Any, config: Any, name: str, drain_timeout: float, drain_quiet: float) -> None:
    """`--frontends N`: N verifier processes over one engine in this one, until SIGINT or SIGTERM."""
    from edgekit.verifier import FrontEnds

    servers = FrontEnds(path, config, name=name).start()
    note(f"edgekit verifier: {name} on {servers.address} ({_engine_detail(servers.engine)}; "
         f"{config.frontends} front ends, up to {config.max_sessions} sessions each)")
    if config.metrics_port is not None:
        note("metrics: " + ", ".join(f"http://{a}/metrics" for a in servers.metrics_addresses))
    _serve_until_signalled(servers, drain_timeout, drain_quiet)


def _log_to_stderr(level: str) -> None:
    """edgekit's own loggers to stderr at `level` (other libraries' stay as they are)."""
    logger = logging.getLogger("edgekit")
    logger.setLevel(level.upper())
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)
