"""`edgekit api`: an OpenAI- and Ollama-compatible endpoint on this device (drafts here, verifies there)."""

from __future__ import annotations

import typer

from ._common import _DRAFT, _TARGET, PAIR_HELP, VERIFIER_HELP, note


def api(
    verifier: str | None = typer.Option(None, "--verifier", help=VERIFIER_HELP),
    draft: str | None = _DRAFT,
    target: str | None = _TARGET,
    pair: str | None = typer.Option(None, "--pair", help=PAIR_HELP),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (0.0.0.0: every interface)."),
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
    token: str | None = typer.Option(None, "--token", envvar="EDGEKIT_TOKEN", help="Bearer token for the verifier."),
    timeout: float = typer.Option(60.0, "--timeout", help="Deadline of each verifier call, in seconds."),
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
    config = ClientConfig.from_env(timeout=timeout, connect_timeout=min(10.0, timeout), token=token)
    local = ServerConfig(port=0, max_sessions=slots + 2)  # when no --verifier: room for every slot's session
    with EdgeClient(verifier, pair=pair if verifier else pair or "qwen-coder", draft=draft, target=target,
                    config=config, draft_slots=slots + 1, local_server=local) as client:
        app = create_app(client, api_key=api_key, concurrency=slots, queue=queue, max_tokens=max_tokens)
        info = client.server_info()
        where = client.local_verifier_address or client.transport.address
        note(f"edgekit api: {info.target_model} verified at {where}, drafted with {client.draft.name}; "
             f"OpenAI API on http://{host}:{port}/v1, Ollama's on http://{host}:{port}"
             + (" (API key required)" if api_key else ""))
        uvicorn.run(app, host=host, port=port, log_level="warning")
