"""From a verifier URL to its transport: the scheme names the backend."""

from __future__ import annotations

from dataclasses import replace

from ..config import ClientConfig
from ..errors import ConfigError
from ..link import host_of, is_local
from ..runtime import DraftModel
from ._base import VerifierTransport

__all__ = ["SCHEMES", "connect", "needs_tokenizer"]

SCHEMES = {
    "grpc": "an edgekit verifier (edgekit serve), plain gRPC; also a bare HOST:PORT",
    "grpcs": "an edgekit verifier over TLS",
    "openai+http": "an OpenAI-compatible completions server with prompt logprobs (llama-cpp-python, vLLM)",
    "openai+https": "the same over TLS",
    "sglang+http": "SGLang's native /generate",
    "sglang+https": "the same over TLS",
    "trtllm+http": "TensorRT-LLM's tensorrt_llm model on Triton (?model=NAME&max_draft_len=N): greedy",
    "trtllm+https": "the same over TLS",
}


def needs_tokenizer(url: str) -> bool:
    """Whether a verifier URL (or any of a comma-separated set) is a stock server, whose transport is
    driven through the draft's tokenizer: it cannot be reached before a draft is loaded."""
    return any("+" in u.strip().partition("://")[0] for u in url.split(",") if "://" in u)


def connect(url: str, config: ClientConfig, tokenizer: DraftModel | None = None) -> VerifierTransport:
    """`grpc://HOST:PORT` (or bare `HOST:PORT`), `grpcs://`, `openai+http(s)://HOST:PORT[/v1]`,
    `sglang+http(s)://HOST:PORT`, `trtllm+http(s)://HOST:PORT[?model=NAME&max_draft_len=N]`. The HTTP
    backends need the draft's tokenizer (shared with the target).
    Several URLs, comma-separated, are verifiers of one target to fail over between (`FailoverTransport`)."""
    urls = [u.strip() for u in url.split(",") if u.strip()]
    if len(urls) > 1:
        from ._failover import FailoverTransport

        return FailoverTransport([connect(u, config, tokenizer) for u in urls], config)
    scheme, sep, rest = url.strip().partition("://")
    if not sep:
        scheme, rest = "grpc", url
    _check_token_channel(scheme, rest, config)
    if scheme in ("grpc", "grpcs"):
        from ._grpc import GrpcTransport

        return GrpcTransport(rest, replace(config, tls=True) if scheme == "grpcs" else config)
    backend, _, http = scheme.partition("+")
    if http not in ("http", "https") or backend not in ("openai", "sglang", "trtllm"):
        raise ConfigError(
            f"unknown verifier scheme {scheme!r} in {url!r}; use one of: "
            + "; ".join(f"{s}:// ({what})" for s, what in SCHEMES.items())
        )
    if tokenizer is None:
        raise ConfigError(f"a {backend} verifier is driven through the draft's tokenizer; load the draft model first")
    if backend == "openai":
        from ._openai import ROUTES as OPENAI_ROUTES
        from ._openai import OpenAITransport

        # Options: ?max_logprobs=N, the server's cap on log-probabilities per position, when raised
        # (vLLM's --max-logprobs); &route=auto|prefixes|prompt-logprobs, how a round reads the target.
        rest, _, query = rest.partition("?")
        options = dict(opt.partition("=")[::2] for opt in query.split("&") if opt)
        cap, route = options.pop("max_logprobs", "20"), options.pop("route", "auto")
        if options or not cap.isdigit() or not 1 <= int(cap) <= 100_000 or route not in OPENAI_ROUTES:
            raise ConfigError(f"{url!r}: an openai verifier takes ?max_logprobs=N (N >= 1) and "
                              f"route={'|'.join(OPENAI_ROUTES)}, nothing else")
        return OpenAITransport(f"{http}://{rest}", tokenizer, timeout=config.timeout, token=config.token,
                               max_logprobs=int(cap), route=route)
    if backend == "trtllm":
        from ._triton import triton_transport

        return triton_transport(f"{http}://{rest}", tokenizer, timeout=config.timeout, token=config.token)
    from ._sglang import SGLangTransport

    return SGLangTransport(f"{http}://{rest}", tokenizer, timeout=config.timeout, token=config.token)


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

