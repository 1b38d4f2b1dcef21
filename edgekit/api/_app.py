"""The device's OpenAI-compatible and Ollama-compatible endpoints: an ASGI app (Starlette) over
an `EdgeClient`.

Each request drafts on this device and verifies on the client's verifier, on a worker
thread (llama.cpp and gRPC calls block); requests run `concurrency` at a time, on draft
slots of their own when the client has them (their drafting batched), and up to `queue`
more wait; past that a request is answered 429. Both APIs share that path (`_answer`); each
reads its requests and frames its answers (`_openai`: /v1, server-sent events; `_ollama`:
/api, JSON lines). Greedy text equals `edgekit generate`'s.
"""

from __future__ import annotations

import hmac
import json
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.concurrency import iterate_in_threadpool, run_in_threadpool
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..client import EdgeClient, GenerationStats
from . import _ollama, _openai
from ._answer import Gate, Job, Piece, pieces
from ._openai import ApiError

__all__ = ["MAX_IN_FLIGHT", "create_app"]

MAX_IN_FLIGHT = 32
"""Most requests generating and waiting at once (each holds one of anyio's 40 worker threads)."""

Frames = Callable[[str, "GenerationStats | None"], list[dict]]  # a piece of the answer as the objects to stream


@dataclass(frozen=True)
class _Api:
    """How one API speaks: its requests read (each with a `job` and a `stream` flag), its
    errors, the whole answer, and a streamed one's objects, each framed as bytes."""

    read: Callable[[Any], Any]
    error: Callable[[ApiError], dict]
    whole: Callable[[Any, str, GenerationStats | None], dict]
    frames: Callable[[Any], Frames]
    frame: Callable[[dict], bytes]
    media_type: str
    end: bytes = b""  # after the last object


def create_app(
    client: EdgeClient,
    *,
    api_key: str | None = None,
    concurrency: int = 1,
    queue: int = 16,
    max_tokens: int = 4096,
) -> Starlette:
    """The app; `client` stays the caller's (close it after the server stops)."""
    info = client.server_info()
    models = tuple(dict.fromkeys([info.target_model, client.pair]))  # the target's name first
    template = client.chat_template()
    since = _ollama.timestamp()
    # every request in flight holds a worker thread (anyio's pool has 40): keep them fewer
    concurrency = max(1, min(concurrency, MAX_IN_FLIGHT))
    gate = Gate(concurrency, max(0, min(queue, MAX_IN_FLIGHT - concurrency)))

    def text_of(token: int) -> str:
        return client.draft.detokenize([token])

    def check_key(request: HttpRequest) -> None:
        if api_key is None:
            return
        given = request.headers.get("authorization", "")
        token = given[7:] if given.lower().startswith("bearer ") else ""
        if not hmac.compare_digest(token.encode(), api_key.encode()):
            raise ApiError(401, "invalid or missing API key (Authorization: Bearer ...)", kind="authentication_error",
                           code="invalid_api_key")

    def openai(kind: str) -> _Api:
        return _Api(read=partial(_openai.parse, kind, models=models, max_tokens_limit=max_tokens,
                                 vocab_size=client.draft.n_vocab),
                    error=_openai.error_body, whole=partial(_openai.completion, text_of=text_of),
                    frames=partial(_openai.Chunks, text_of=text_of), frame=_sse,
                    media_type="text/event-stream", end=b"data: [DONE]\n\n")

    def ollama(kind: str) -> _Api:
        return _Api(read=partial(_ollama.parse, kind, models=models, max_tokens_limit=max_tokens, template=template),
                    error=_ollama.error_body, whole=_ollama.reply, frames=lambda req: partial(_ollama.lines, req),
                    frame=_json_line, media_type="application/x-ndjson")

    def answering(api: _Api) -> Callable[[HttpRequest], Awaitable[Response]]:
        async def handle(request: HttpRequest) -> Response:
            try:
                check_key(request)
                req = api.read(await _body(request))
                if req.job is None:  # nothing to generate (Ollama's way to load a model)
                    return JSONResponse(api.whole(req, "", None))
                gate.admit()
            except ApiError as e:
                return _error(api, e)
            if req.stream:
                answer = pieces(client, gate, req.job)
                try:  # the first piece before the status: a verifier that is gone is still a 503
                    head = await run_in_threadpool(next, answer)
                except ApiError as e:
                    return _error(api, e)
                except Exception as e:
                    return _error(api, ApiError(500, f"internal error: {e!r}", kind="server_error"))
                return StreamingResponse(_relay(api, api.frames(req), answer, head), media_type=api.media_type,
                                         headers={"Cache-Control": "no-cache"})
            try:
                text, stats = await run_in_threadpool(_run_whole, client, gate, req.job)
            except ApiError as e:
                return _error(api, e)
            except Exception as e:  # a bug of ours: the API's shape still, and the server goes on
                return _error(api, ApiError(500, f"internal error: {e!r}", kind="server_error"))
            return JSONResponse(api.whole(req, text, stats))

        return handle

    def listing(api: _Api, answer: Callable[[dict], dict], *, body: bool = False
                ) -> Callable[[HttpRequest], Awaitable[Response]]:
        """A route that generates nothing: `answer` of the request's body (or of {})."""
        async def handle(request: HttpRequest) -> Response:
            try:
                check_key(request)
                asked = await _body(request) if body else {}
                if not isinstance(asked, dict):
                    raise ApiError(400, "the request body must be a JSON object")
                return JSONResponse(answer(asked))
            except ApiError as e:
                return _error(api, e)

        return handle

    def show(asked: dict) -> dict:
        _ollama.served_model(asked.get("model") or asked.get("name"), models)  # older clients send "name"
        return _ollama.show(target=info.target_model, draft=client.draft.name,
                            context=info.max_context, since=since)

    v1, ol = openai("completion"), ollama("generate")
    data = [{"id": m, "object": "model", "created": 0, "owned_by": "edgekit"} for m in models]
    routes = [
        Route("/v1/models", listing(v1, lambda _: {"object": "list", "data": data}), methods=["GET"]),
        Route("/v1/completions", answering(v1), methods=["POST"]),
        Route("/v1/chat/completions", answering(openai("chat")), methods=["POST"]),
        Route("/api/generate", answering(ol), methods=["POST"]),
        Route("/api/chat", answering(ollama("chat")), methods=["POST"]),
        Route("/api/tags", listing(ol, lambda _: _ollama.models(models, since)), methods=["GET"]),
        Route("/api/ps", listing(ol, lambda _: _ollama.ps(models, info.max_context)), methods=["GET"]),
        Route("/api/show", listing(ol, show, body=True), methods=["POST"]),
        Route("/api/version", listing(ol, lambda _: _ollama.version()), methods=["GET"]),
    ]
    return Starlette(routes=routes)


def _run_whole(client: EdgeClient, gate: Gate, job: Job) -> tuple[str, GenerationStats | None]:
    parts, stats = [], None
    for piece, done in pieces(client, gate, job):
        parts.append(piece)
        stats = done or stats
    return "".join(parts), stats


async def _relay(api: _Api, frames: Frames, answer: Iterator[Piece], head: Piece) -> AsyncIterator[bytes]:
    """A streamed answer: its pieces framed as they come, an error in the stream (the status is
    sent already, as OpenAI's and Ollama's servers do), and the API's end."""
    try:
        async for piece, stats in _chain(head, answer):
            for obj in frames(piece, stats):
                yield api.frame(obj)
    except ApiError as e:
        yield api.frame(api.error(e))
    except Exception as e:
        yield api.frame(api.error(ApiError(500, f"internal error: {e!r}", kind="server_error")))
    finally:  # a client gone mid-answer: its generation stops and gives back its session and slot,
        with anyio.CancelScope(shield=True):  # even while the response's task is being cancelled
            await run_in_threadpool(answer.close)  # type: ignore[attr-defined]
    yield api.end


async def _chain(head: Piece, rest: Iterator[Piece]) -> AsyncIterator[Piece]:
    """The first item, then the rest of a blocking iterator on worker threads."""
    yield head
    async for item in iterate_in_threadpool(rest):
        yield item


async def _body(request: HttpRequest) -> Any:
    try:
        return await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ApiError(400, "the request body is not valid JSON") from None


def _sse(data: dict) -> bytes:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


def _json_line(data: dict) -> bytes:
    return (json.dumps(data, ensure_ascii=False) + "\n").encode()


def _error(api: _Api, e: ApiError) -> JSONResponse:
    headers = {"Retry-After": str(math.ceil(e.retry_after))} if e.retry_after else None
    return JSONResponse(api.error(e), status_code=e.status, headers=headers)
