"""`edgekit api`: an OpenAI- and Ollama-compatible endpoint on this device (drafts here, verifies there)."""

from __future__ import annotations

import typer

from ._common import _DRAFT, _INSECURE, _TARGET, _TOKEN, PAIR_HELP, VERIFIER_HELP, note, timeout_option

MAX_BODY_BYTES = 4 << 20  # edgekit.api's default, not imported: the extra may be missing when the help is shown


def api(
    verifier: str | None = typer.Option(None, "--verifier", help=VERIFIER_HELP),
    draft: str | None = _DRAFT,
    target: str | None = _TARGET,
    pair: str | None = typer.Option(None, "--pair", help=PAIR_HELP),
    host: str = typer.Option(
        "127.0.0.1", "--host",
        help="Address to listen on (0.0.0.0 or ::: every interface, where any Host name is answered unless "
             "--allowed-hosts names them).",
    ),
    port: int = typer.Option(8080, "--port", min=0, max=65535, help="Port to listen on."),
    api_key: str | None = typer.Option(
        None, "--api-key", envvar="EDGEKIT_API_KEY", help="Require `Authorization: Bearer KEY` of every request."
    ),
    slots: int = typer.Option(
        2, "--slots", min=1, max=32, help="Requests generating at once, each on a draft sequence of its own."
    ),
    queue: int = typer.Option(
        16, "--queue", min=0, max=30, help="Requests waiting beyond those; more are answered 429 (at most 32 in all)."
    ),
    max_tokens: int = typer.Option(4096, "--max-tokens", min=1, help="Most tokens a request may ask for."),
    allowed_hosts: str = typer.Option(
        "", "--allowed-hosts", envvar="EDGEKIT_ALLOWED_HOSTS",
        help="Host names answered besides localhost, 127.0.0.1, ::1 and --host, comma-separated (*.example.com: "
             "its subdomains; *: any); requests naming another Host are refused 403, as a web page rebound to "
             "this device by DNS would name its own.",
    ),
    origins: str = typer.Option(
        "", "--origins", envvar="EDGEKIT_ORIGINS",
        help="Web origins whose pages may call the API, besides http(s)://localhost, 127.0.0.1 and [::1] on any "
             "port, comma-separated, * a wildcard (http://192.168.1.5:*, https://*.example.com; *: any page). "
             "Requests from other origins (a browser sends Origin) are refused 403.",
    ),
    max_body_bytes: int = typer.Option(
        MAX_BODY_BYTES, "--max-body-bytes", min=1,
        help="Largest request body; larger ones are refused 413 before they are read. Bodies must be "
             "Content-Type: application/json (415 otherwise).",
    ),
    token: str | None = _TOKEN,
    insecure: bool = _INSECURE,
    timeout: float = timeout_option(60.0),
) -> None:
    """Serve the OpenAI API (/v1/models, /v1/completions, /v1/chat/completions, streaming or not) and
    Ollama's (/api/generate, /api/chat, /api/tags, /api/show, /api/ps, /api/version) on this device:
    point any OpenAI client at http://HOST:PORT/v1, any Ollama client at http://HOST:PORT.
    Speculation figures come with the OpenAI usage."""
    from edgekit import ClientConfig, EdgeClient, ServerConfig
    from edgekit.api import create_app

    try:
        import uvicorn
    except ImportError as exc:
        from edgekit.errors import DependencyMissingError

        raise DependencyMissingError("uvicorn", "api") from exc
    config = ClientConfig.from_env(timeout=timeout, connect_timeout=min(10.0, timeout), token=token, insecure=insecure)
    local = ServerConfig(port=0, max_sessions=slots + 2)  # when no --verifier: room for every slot's session
    with EdgeClient(verifier, pair=pair if verifier else pair or "qwen-coder", draft=draft, target=target,
                    config=config, draft_slots=slots + 1, local_server=local) as client:
        app = create_app(client, api_key=api_key, concurrency=slots, queue=queue, max_tokens=max_tokens,
                         allowed_hosts=_answered_hosts(host, allowed_hosts), origins=_split(origins),
                         max_body_bytes=max_body_bytes)
        info = client.server_info()
        where = client.local_verifier_address or client.transport.address
        note(f"edgekit api: {info.target_model} verified at {where}, drafted with {client.draft.name}; "
             f"OpenAI API on http://{host}:{port}/v1, Ollama's on http://{host}:{port}"
             + (" (API key required)" if api_key else ""))
        uvicorn.run(app, host=host, port=port, log_level="warning")


def _answered_hosts(host: str, allowed: str) -> list[str]:
    """The Host names answered besides loopback ones: the bound address and the operator's;
    bound to every interface, the operator exposes the API: any name, unless they are given."""
    names = _split(allowed)
    if host not in ("0.0.0.0", "::", ""):
        return [*names, host]
    return names or ["*"]


def _split(values: str) -> list[str]:
    return [v.strip() for v in values.split(",") if v.strip()]
