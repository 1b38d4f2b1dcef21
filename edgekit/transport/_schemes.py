"""The transports edgekit ships, one builder per URL scheme (`edgekit.registry.TRANSPORTS` names them).

A builder takes the whole URL as given (`scheme://rest`), the client's config and the draft's
tokenizer (None until a draft is loaded), and returns a `VerifierTransport`. One that drives the
server through the draft's tokenizer (every stock engine: they speak token ids or text, not
edgekit's protocol) says so with `needs_tokenizer = True`, and `connect` refuses it a missing
tokenizer. A package adds a scheme with a builder of this shape under the entry-point group
`edgekit.transports` (see `edgekit.registry`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from ..config import ClientConfig
from ..errors import ConfigError

if TYPE_CHECKING:
    from ..runtime import DraftModel
    from ._base import VerifierTransport

__all__ = ["grpc", "grpcs", "openai", "sglang", "trtllm"]


def _rest(url: str) -> str:
    return url.partition("://")[2] if "://" in url else url


def _http(url: str) -> str:
    """`openai+https://HOST...` as `https://HOST...`: the carrier named after the backend's `+`."""
    scheme, _, rest = url.partition("://")
    return f"{scheme.partition('+')[2]}://{rest}"


def grpc(url: str, config: ClientConfig, tokenizer: DraftModel | None = None) -> VerifierTransport:
    """An edgekit verifier (`edgekit serve`), `grpc://HOST:PORT` or a bare `HOST:PORT`."""
    from ._grpc import GrpcTransport

    return GrpcTransport(_rest(url), config)


def grpcs(url: str, config: ClientConfig, tokenizer: DraftModel | None = None) -> VerifierTransport:
    """An edgekit verifier over TLS."""
    from ._grpc import GrpcTransport

    return GrpcTransport(_rest(url), replace(config, tls=True))


def openai(url: str, config: ClientConfig, tokenizer: DraftModel | None = None) -> VerifierTransport:
    """An OpenAI-compatible completions server (vLLM, llama-cpp-python's server):
    `openai+http(s)://HOST:PORT[/v1][?max_logprobs=N&route=R]`. `max_logprobs`: the server's cap
    on log-probabilities per position, where raised (vLLM's --max-logprobs); `route`: how a round
    reads the target (`OpenAITransport`)."""
    from ._openai import ROUTES, OpenAITransport

    assert tokenizer is not None
    base, _, query = _http(url).partition("?")
    options = dict(opt.partition("=")[::2] for opt in query.split("&") if opt)
    cap, route = options.pop("max_logprobs", "20"), options.pop("route", "auto")
    if options or not cap.isdigit() or not 1 <= int(cap) <= 100_000 or route not in ROUTES:
        raise ConfigError(f"{url!r}: an openai verifier takes ?max_logprobs=N (N >= 1) and "
                          f"route={'|'.join(ROUTES)}, nothing else")
    return OpenAITransport(base, tokenizer, timeout=config.timeout, token=config.token, max_logprobs=int(cap),
                           route=route)


def sglang(url: str, config: ClientConfig, tokenizer: DraftModel | None = None) -> VerifierTransport:
    """SGLang's native /generate: `sglang+http(s)://HOST:PORT`."""
    from ._sglang import SGLangTransport

    assert tokenizer is not None
    return SGLangTransport(_http(url), tokenizer, timeout=config.timeout, token=config.token)


def trtllm(url: str, config: ClientConfig, tokenizer: DraftModel | None = None) -> VerifierTransport:
    """TensorRT-LLM's tensorrt_llm model on Triton: `trtllm+http(s)://HOST:PORT[?model=NAME&max_draft_len=N]`."""
    from ._triton import triton_transport

    assert tokenizer is not None
    return triton_transport(_http(url), tokenizer, timeout=config.timeout, token=config.token)


for _builder in (openai, sglang, trtllm):
    _builder.needs_tokenizer = True  # type: ignore[attr-defined]
