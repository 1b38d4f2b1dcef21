"""From a verifier URL to its transport: the scheme names the backend, a lookup in `TRANSPORTS`."""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

from ..config import ClientConfig
from ..errors import ConfigError
from ..link import host_of, is_local
from ..registry import TRANSPORTS
from ..runtime import DraftModel
from ._base import VerifierTransport

__all__ = ["connect", "needs_tokenizer"]


def _split(url: str) -> tuple[str, str]:
    """(scheme, the rest): a bare HOST:PORT is an edgekit verifier's, `grpc`."""
    scheme, sep, rest = url.strip().partition("://")
    return (scheme, rest) if sep else ("grpc", url.strip())


def _builder(scheme: str, url: str) -> Callable[..., VerifierTransport]:
    if scheme not in TRANSPORTS:
        raise ConfigError(
            f"unknown verifier scheme {scheme!r} in {url!r}; use one of: "
            + "; ".join(f"{e.name}:// ({e.doc})" for e in TRANSPORTS.entries())
        )
    return cast(Callable[..., VerifierTransport], TRANSPORTS.load(scheme))


def needs_tokenizer(url: str) -> bool:
    """Whether a verifier URL (or any of a comma-separated set) is reached through the draft's
    tokenizer (a stock server's transport): it cannot be reached before a draft is loaded."""
    urls = [u.strip() for u in url.split(",") if u.strip()]
    return any(getattr(_builder(_split(u)[0], u), "needs_tokenizer", False) for u in urls)


def connect(url: str, config: ClientConfig, tokenizer: DraftModel | None = None) -> VerifierTransport:
    """The transport a URL's scheme is registered for (`edgekit.registry.TRANSPORTS`): `grpc://HOST:PORT`
    (or bare `HOST:PORT`), `grpcs://`, `openai+http(s)://HOST:PORT[/v1]`, `sglang+http(s)://HOST:PORT`,
    `trtllm+http(s)://HOST:PORT[?model=NAME&max_draft_len=N]`, and any a package adds. The HTTP
    backends need the draft's tokenizer (shared with the target).
    Several URLs, comma-separated, are verifiers of one target to fail over between (`FailoverTransport`)."""
    urls = [u.strip() for u in url.split(",") if u.strip()]
    if len(urls) > 1:
        from ._failover import FailoverTransport

        return FailoverTransport([connect(u, config, tokenizer) for u in urls], config)
    scheme, rest = _split(url)
    build = _builder(scheme, url)
    _check_token_channel(scheme, rest, config)
    if tokenizer is None and getattr(build, "needs_tokenizer", False):
        raise ConfigError(f"a {scheme} verifier is driven through the draft's tokenizer; load the draft model first")
    return build(url.strip() if "://" in url else f"grpc://{rest}", config, tokenizer)


def _check_token_channel(scheme: str, rest: str, config: ClientConfig) -> None:
    """Refuses to send a token in plaintext off this machine, unless the config says `insecure`."""
    encrypted = scheme == "grpcs" or scheme.endswith("+https") or (scheme == "grpc" and config.tls)
    if not config.token or config.insecure or encrypted:
        return
    host = host_of(rest)
    if is_local(host):
        return
    raise ConfigError(
        f"refusing to send the verifier's token in plaintext to {host}: anyone on the path could read it. "
        f"Reach it over TLS (grpcs://{rest}, openai+https://, sglang+https://, trtllm+https://; "
        "edgekit serve --tls-cert/--tls-key), "
        "or pass --insecure (EDGEKIT_INSECURE=1, ClientConfig(insecure=True)) on a link you trust"
    )

