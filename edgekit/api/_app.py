"""The device's OpenAI-compatible and Ollama-compatible endpoints: an ASGI app (Starlette) over
an `EdgeClient`.

Each request drafts on this device and verifies on the client's verifier, on a worker
thread (llama.cpp and gRPC calls block); requests run `concurrency` at a time, on draft
slots of their own when the client has them (their drafting batched), and up to `queue`
more wait; past that a request is answered 429. Both APIs share that path (`_answer`); each
reads its requests and frames its answers (`_openai`: /v1, server-sent events; `_ollama`:
/api, JSON lines). Greedy text equals `edgekit generate`'s.

Any web page the user visits can send requests to it: `_guard` answers only those from this
server's names and allowed origins, with JSON bodies of a bounded size. A client that leaves
stops its generation, streamed (`_relay`) or not (`_whole`). Errors of ours are logged, not sent.
"""

from __future__ import annotations

import hmac
import json
import logging
import math
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
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
from ._guard import MAX_BODY_BYTES, guards, read_json
from ._openai import ApiError

__all__ = ["MAX_BODY_BYTES", "MAX_IN_FLIGHT", "create_app"]

_log = logging.getLogger(__name__)

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
    allowed_hosts: Iterable[str] = (),
    origins: Iterable[str] = (),
    max_body_bytes: int = MAX_BODY_BYTES,
) -> Starlette:
    """The app; `client` stays the caller's (close it after the server stops).

    It answers requests whose Host is a loopback name (localhost, 127.0.0.1, ::1; any port) or
    one of `allowed_hosts` ("*": any; "*.example.com": its subdomains), others 403: a web page
    rebound by DNS to this device sends its own name. Serving on every interface, pass the
    server's names, or "*" to answer any. A request with an Origin (a browser's, from a web
    page) is refused 403 unless the origin is a loopback one (http(s)://localhost, 127.0.0.1 or
    [::1], any port) or one of `origins` ("http://localhost:*", "https://*.example.com", "*");
    allowed origins get CORS headers and preflight answers. Bodies must be JSON (Content-Type:
    application/json, else 415) of at most `max_body_bytes` (else 413, before more is read).
    A non-streamed answer whose client leaves stops generating (streamed ones too).
    """
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
                req = api.read(await read_json(request, max_body_bytes))
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
                    return _error(api, _internal(e))
                return StreamingResponse(_relay(api, api.frames(req), answer, head), media_type=api.media_type,
                                         headers={"Cache-Control": "no-cache"})
            try:
                whole = await _whole(request, client, gate, req.job)
            except ApiError as e:
                return _error(api, e)
            except Exception as e:  # a bug of ours: the API's shape still, and the server goes on
                return _error(api, _internal(e))
            if whole is None:  # the client has left: nobody reads this
                return Response(status_code=499)
            return JSONResponse(api.whole(req, *whole))

        return handle

    def listing(api: _Api, answer: Callable[[dict], dict], *, body: bool = False
                ) -> Callable[[HttpRequest], Awaitable[Response]]:
        """A route that generates nothing: `answer` of the request's body (or of {})."""
        async def handle(request: HttpRequest) -> Response:
            try:
                check_key(request)
                asked = await read_json(request, max_body_bytes) if body else {}
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

    def refuse(path: str, e: ApiError) -> Response:  # a request refused before any route: the API's error
        return _error(v1 if path.startswith("/v1") else ol, e)

    return Starlette(routes=routes, middleware=guards(hosts=allowed_hosts, origins=origins, refuse=refuse))


async def _whole(request: HttpRequest, client: EdgeClient, gate: Gate, job: Job
                 ) -> tuple[str, GenerationStats | None] | None:
    """The whole answer, generated on a worker thread; None, its generation stopped, if the
    client leaves first (nothing is sent before the end, so nothing else would notice)."""
    gone = threading.Event()
    outcome: list[Any] = []

    async def generate() -> None:
        try:
            outcome.append(await run_in_threadpool(_run_whole, client, gate, job, gone))
        except Exception as e:  # raised below: out of the task group, which would wrap it in a group
            outcome.append(e)
        watching.cancel_scope.cancel()

    async with anyio.create_task_group() as watching:
        watching.start_soon(generate)
        try:  # the body is read: what comes next is the client's disconnect (the server's, at the latest)
            while (await request.receive())["type"] != "http.disconnect":
                pass
        finally:  # gone, or this request cancelled: the generation stops (done already, it is no matter)
            gone.set()
    if isinstance(outcome[0], Exception):
        raise outcome[0]
    return outcome[0]


def _run_whole(client: EdgeClient, gate: Gate, job: Job, gone: threading.Event
               ) -> tuple[str, GenerationStats | None] | None:
    parts, stats = [], None
    answer = pieces(client, gate, job)
    try:
        for piece, done in answer:
            if gone.is_set():
                return None
            parts.append(piece)
            stats = done or stats
    finally:  # here, on this thread: gives back the session and the slot when the client has left
        answer.close()  # type: ignore[attr-defined]
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
        yield api.frame(api.error(_internal(e)))
    finally:  # a client gone mid-answer: its generation stops and gives back its session and slot,
        with anyio.CancelScope(shield=True):  # even while the response's task is being cancelled
            await run_in_threadpool(answer.close)  # type: ignore[attr-defined]
    yield api.end


async def _chain(head: Piece, rest: Iterator[Piece]) -> AsyncIterator[Piece]:
    """The first item, then the rest of a blocking iterator on worker threads."""
    yield head
    async for item in iterate_in_threadpool(rest):
        yield item


def _internal(e: Exception) -> ApiError:
    """A bug of ours, or an error not mapped to the API's, as its answer: logged here with its
    traceback, not sent (its text can show paths, addresses, another request's data)."""
    _log.error("edgekit api: internal error answering a request", exc_info=e)
    return ApiError(500, "internal error; see the server's log", kind="server_error")


def _sse(data: dict) -> bytes:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


def _json_line(data: dict) -> bytes:
    return (json.dumps(data, ensure_ascii=False) + "\n").encode()


def _error(api: _Api, e: ApiError) -> JSONResponse:
    headers = {"Retry-After": str(math.ceil(e.retry_after))} if e.retry_after else None
    return JSONResponse(api.error(e), status_code=e.status, headers=headers)
