"""The device's OpenAI-compatible endpoint: an ASGI app (Starlette) over an `EdgeClient`.

Each request drafts on this device and verifies on the client's verifier, on a worker
thread (llama.cpp and gRPC calls block); requests run `concurrency` at a time, on draft
slots of their own when the client has them (their drafting batched), and up to `queue`
more wait; past that a request is answered 429. Greedy text equals `edgekit generate`'s.
"""

from __future__ import annotations

import hmac
import json
import math
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import anyio
from starlette.applications import Starlette
from starlette.concurrency import iterate_in_threadpool, run_in_threadpool
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..client import EdgeClient, FinalStats, GenerationStats, GenerationStream, RoundEvent, TextDelta
from ..errors import ConfigError, EdgekitError, LimitExceededError, VerifierUnavailableError
from ._openai import ApiError, Request, chunk, completion, error_body, new_id, parse

__all__ = ["MAX_IN_FLIGHT", "create_app"]

MAX_IN_FLIGHT = 32
"""Most requests generating and waiting at once (each holds one of anyio's 40 worker threads)."""

_Piece = tuple[str, "GenerationStats | None"]  # text to send, and the stats once the answer is done


class _Gate:
    """`limit` requests at a time and `queue` waiting; beyond that, refused."""

    def __init__(self, limit: int, queue: int) -> None:
        self._slots = threading.BoundedSemaphore(limit)
        self._lock = threading.Lock()
        self._admitted = 0
        self._cap = limit + queue

    def admit(self) -> None:
        with self._lock:
            if self._admitted >= self._cap:
                raise ApiError(429, "too many requests in flight; try again shortly", kind="rate_limit_error",
                               code="rate_limit_exceeded", retry_after=1.0)
            self._admitted += 1

    def acquire(self) -> None:
        self._slots.acquire()

    def release(self, *, held: bool) -> None:
        if held:
            self._slots.release()
        with self._lock:
            self._admitted -= 1


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
    # every request in flight holds a worker thread (anyio's pool has 40): keep them fewer
    concurrency = max(1, min(concurrency, MAX_IN_FLIGHT))
    gate = _Gate(concurrency, max(0, min(queue, MAX_IN_FLIGHT - concurrency)))

    def check_key(request: HttpRequest) -> None:
        if api_key is None:
            return
        given = request.headers.get("authorization", "")
        token = given[7:] if given.lower().startswith("bearer ") else ""
        if not hmac.compare_digest(token.encode(), api_key.encode()):
            raise ApiError(401, "invalid or missing API key (Authorization: Bearer ...)", kind="authentication_error",
                           code="invalid_api_key")

    async def list_models(request: HttpRequest) -> Response:
        try:
            check_key(request)
        except ApiError as e:
            return _error(e)
        data = [{"id": m, "object": "model", "created": 0, "owned_by": "edgekit"} for m in models]
        return JSONResponse({"object": "list", "data": data})

    def endpoint(kind: str) -> Callable[[HttpRequest], Awaitable[Response]]:
        async def handle(request: HttpRequest) -> Response:
            try:
                check_key(request)
                try:
                    body = await request.json()
                except (json.JSONDecodeError, UnicodeDecodeError):
                    raise ApiError(400, "the request body is not valid JSON") from None
                req = parse(kind, body, models=models, max_tokens_limit=max_tokens, vocab_size=client.draft.n_vocab)
                gate.admit()
            except ApiError as e:
                return _error(e)
            rid = new_id(kind)
            if req.stream:
                pieces = _pieces(req)
                try:  # the first piece before the status: a verifier that is gone is still a 503
                    head = await run_in_threadpool(next, pieces)
                except ApiError as e:
                    return _error(e)
                except Exception as e:
                    return _error(ApiError(500, f"internal error: {e!r}", kind="server_error"))
                return StreamingResponse(_events(req, rid, pieces, head), media_type="text/event-stream",
                                         headers={"Cache-Control": "no-cache"})
            try:
                text, stats = await run_in_threadpool(_run_whole, req)
            except ApiError as e:
                return _error(e)
            except Exception as e:  # a bug of ours: OpenAI's shape still, and the server goes on
                return _error(ApiError(500, f"internal error: {e!r}", kind="server_error"))
            return JSONResponse(completion(req, rid, text, stats.finish_reason if stats else "stop", stats))

        return handle

    def _start(req: Request) -> GenerationStream:
        overrides = req.overrides()
        if req.kind == "chat":
            assert isinstance(req.prompt, list)
            return client.chat(req.prompt, **overrides)  # type: ignore[arg-type]
        assert isinstance(req.prompt, (str, list))
        return client.generate(req.prompt, **overrides)  # type: ignore[arg-type]

    def _prompt_tokens(req: Request) -> int:
        if req.kind == "chat":
            assert isinstance(req.prompt, list)
            text = client.chat_template().render(req.prompt, add_generation_prompt=True)  # type: ignore[arg-type]
            return len(client.tokenize(text))
        return len(client.tokenize(req.prompt))  # type: ignore[arg-type]

    def _pieces(req: Request) -> Iterator[tuple[str, GenerationStats | None]]:
        """The answer's text as it comes, cut at the first stop string; the stats last. Runs on a
        worker thread, holding one of the gate's slots."""
        held = False
        try:
            gate.acquire()
            held = True
            started = time.perf_counter()
            with _mapped():
                stream = _start(req)
                with stream:
                    text, sent, tokens = "", 0, 0
                    rounds = GenerationStats(mode=req.overrides()["mode"], draft_k=0)
                    for ev in stream:
                        if isinstance(ev, RoundEvent):
                            rounds.add_round(ev.stats)
                        elif isinstance(ev, TextDelta):
                            text, tokens = text + ev.text, tokens + len(ev.token_ids)
                            cut = _stop_at(text, req.stop, sent)
                            if cut is not None:  # a stop string: the text before it, and the generation ends
                                yield text[sent:cut], None
                                for rest in stream:  # this round's figures come after its text
                                    if isinstance(rest, RoundEvent):
                                        rounds.add_round(rest.stats)
                                        break
                                stream.close()
                                rounds.prompt_tokens = _prompt_tokens(req)
                                rounds.completion_tokens = len(client.tokenize(text[:cut], special=False))
                                rounds.elapsed_s = time.perf_counter() - started
                                rounds.finish_reason = "stop"
                                yield "", rounds
                                return
                            safe = _safe_end(text, req.stop)  # held back: what may begin a stop string
                            if safe > sent:
                                yield text[sent:safe], None
                                sent = safe
                        elif isinstance(ev, FinalStats):
                            yield text[sent:], ev.stats
        finally:
            gate.release(held=held)

    def _run_whole(req: Request) -> tuple[str, GenerationStats | None]:
        parts, stats = [], None
        for piece, done in _pieces(req):
            parts.append(piece)
            stats = done or stats
        return "".join(parts), stats

    async def _events(req: Request, rid: str, pieces: Iterator[tuple[str, GenerationStats | None]],
                      head: tuple[str, GenerationStats | None]) -> AsyncIterator[bytes]:
        first = True
        try:
            async for piece, stats in _chain(head, pieces):
                if piece or first:  # the first chunk carries the role, even of an empty answer
                    yield _sse(chunk(req, rid, text=piece, first=first))
                    first = False
                if stats is not None:
                    yield _sse(chunk(req, rid, done=True, finish=stats.finish_reason))
                    if req.include_usage:
                        yield _sse(chunk(req, rid, stats=stats))
        except ApiError as e:  # the status is sent already: the error goes in the stream, as OpenAI's does
            yield _sse(error_body(e))
        except Exception as e:
            yield _sse(error_body(ApiError(500, f"internal error: {e!r}", kind="server_error")))
        finally:  # a client gone mid-answer: its generation stops and gives back its session and slot,
            with anyio.CancelScope(shield=True):  # even while the response's task is being cancelled
                await run_in_threadpool(pieces.close)  # type: ignore[attr-defined]
        yield b"data: [DONE]\n\n"

    routes = [
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/v1/completions", endpoint("completion"), methods=["POST"]),
        Route("/v1/chat/completions", endpoint("chat"), methods=["POST"]),
    ]
    return Starlette(routes=routes)


class _mapped:
    """edgekit's errors as the API's: the verifier gone is 503 (retry), limits 400."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type | None, exc: BaseException | None, tb: object) -> None:
        if exc is None or isinstance(exc, (ApiError, GeneratorExit)):
            return
        retry = getattr(exc, "retry_after", None)
        if isinstance(exc, VerifierUnavailableError):
            raise ApiError(503, f"the verifier is unreachable: {exc}", kind="service_unavailable",
                           code="verifier_unavailable", retry_after=retry or 5.0) from exc
        if isinstance(exc, LimitExceededError) and retry is not None:  # the verifier is full for now
            raise ApiError(429, f"the verifier is busy: {exc}", kind="rate_limit_error", code="verifier_busy",
                           retry_after=retry) from exc
        if isinstance(exc, (LimitExceededError, ConfigError)):
            raise ApiError(400, str(exc)) from exc
        if isinstance(exc, EdgekitError):
            raise ApiError(500, str(exc), kind="server_error") from exc


async def _chain(head: _Piece, rest: Iterator[_Piece]) -> AsyncIterator[_Piece]:
    """The first item, then the rest of a blocking iterator on worker threads."""
    yield head
    async for item in iterate_in_threadpool(rest):
        yield item


def _stop_at(text: str, stops: tuple[str, ...], sent: int) -> int | None:
    """Where the first stop string in `text` begins (searching from what may overlap `sent`)."""
    hits = [i for s in stops if (i := text.find(s, max(0, sent - len(s) + 1))) >= 0]
    return min(hits) if hits else None


def _safe_end(text: str, stops: tuple[str, ...]) -> int:
    """How much of `text` can be sent: all but a tail that may be the start of a stop string."""
    hold = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), 0, -1):
            if text.endswith(s[:k]):
                hold = max(hold, k)
                break
    return len(text) - hold


def _sse(data: dict) -> bytes:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


def _error(e: ApiError) -> JSONResponse:
    headers = {"Retry-After": str(math.ceil(e.retry_after))} if e.retry_after else None
    return JSONResponse(error_body(e), status_code=e.status, headers=headers)
