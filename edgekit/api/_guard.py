"""Who may drive `edgekit api`, and how much they may send. The endpoint listens on the user's
device, where any web page the user visits can send it requests; as Ollama does, it answers
only those a page cannot forge:

- Host: a page on a name its author controls, rebound (DNS) to 127.0.0.1, is same-origin with
  the server to the browser, but still sends its own name as Host: only the server's names
  (loopback ones, the address it is bound to, the operator's) are answered, others 403.
- Origin: a browser names the page behind a cross-origin request; pages of origins not allowed
  (loopback ones, the operator's) are answered 403, their CORS preflights too; allowed ones get
  CORS headers (Starlette's CORSMiddleware).
- Content-Type: a page may POST text/plain or a form's types with no preflight, and a refused
  preflight does not stop that request: bodies are read only as application/json (415 otherwise).
- Size: a body beyond the limit is refused (413) from its Content-Length, or once that much of
  it has come (a chunked one has none), never read whole first; an answer sent before the body
  is all read closes the connection, so that the rest is not read either.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from typing import Any

from starlette.datastructures import Headers
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import ApiError

__all__ = ["LOOPBACK_HOSTS", "LOOPBACK_ORIGINS", "MAX_BODY_BYTES", "guards", "read_json"]

MAX_BODY_BYTES = 4 << 20
"""The default limit of a request's body (a long chat's JSON is far less)."""

LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
"""Names always answered in Host (with any port)."""

LOOPBACK_ORIGINS = tuple(f"{scheme}://{name}{port}" for scheme in ("http", "https")
                         for name in ("localhost", "127.0.0.1", "[::1]") for port in ("", ":*"))
"""Origins always allowed: pages served from this device (Ollama's default, less 0.0.0.0)."""


def guards(*, hosts: Iterable[str], origins: Iterable[str],
           refuse: Callable[[str, ApiError], Response]) -> list[Middleware]:
    """The app's middleware: the Host and Origin checks, then CORS headers for allowed origins.
    `hosts` and `origins` are allowed besides the loopback ones ("*" in one: any characters);
    `refuse(path, error)` is the API's answer to a refused request."""
    allowed = _matcher([*LOOPBACK_ORIGINS, *origins])
    return [Middleware(_Guard, hosts=_matcher([*LOOPBACK_HOSTS, *map(_host_name, hosts)]), origins=allowed,
                       refuse=refuse),
            # only allowed origins get this far: CORS adds their headers and answers their preflights
            Middleware(CORSMiddleware, allow_origin_regex=allowed.pattern, allow_methods=["GET", "POST"],
                       allow_headers=["*"], expose_headers=["Retry-After"])]


async def read_json(request: Request, limit: int) -> Any:
    """The request's body as JSON, refused (ApiError) unless it is application/json (415) of at
    most `limit` bytes (413: known from its Content-Length, or as soon as that much has come)."""
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media != "application/json":
        raise ApiError(415, "the request body must be JSON, sent with Content-Type: application/json",
                       code="unsupported_media_type")
    too_large = ApiError(413, f"the request body is larger than this server takes ({limit} bytes)",
                         code="request_too_large")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise too_large
    try:
        return json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ApiError(400, "the request body is not valid JSON") from None


class _Guard:
    """Refuses (403) a request whose Host or Origin is not allowed, before anything else."""

    def __init__(self, app: ASGIApp, *, hosts: re.Pattern[str], origins: re.Pattern[str],
                 refuse: Callable[[str, ApiError], Response]) -> None:
        self.app, self.hosts, self.origins, self.refuse = app, hosts, origins, refuse

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = Headers(scope=scope)
            receive, send = _closing_if_unread(headers, receive, send)
            host, origin = _host_name(headers.get("host", "")), headers.get("origin")
            error = None
            # no Host at all is HTTP/1.0, not a browser (browsers always send one)
            if host and not self.hosts.fullmatch(host):
                error = ApiError(403, f"this server does not answer for the host {host!r} "
                                      "(edgekit api --allowed-hosts adds names)", kind="permission_error",
                                 code="host_not_allowed")
            elif origin is not None and not self.origins.fullmatch(origin):
                error = ApiError(403, f"requests from the origin {origin!r} are not allowed "
                                      "(edgekit api --origins, EDGEKIT_ORIGINS adds origins)",
                                 kind="permission_error", code="origin_not_allowed")
            if error is not None:
                await self.refuse(scope["path"], error)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _closing_if_unread(headers: Headers, receive: Receive, send: Send) -> tuple[Receive, Send]:
    """`receive` and `send` that answer "Connection: close" where the request's body is not all
    read (a refusal, a 413): the server would otherwise read the rest, a gigabyte say, to get to
    the connection's next request."""
    unread = "transfer-encoding" in headers or headers.get("content-length", "0") not in ("", "0")

    async def receiving() -> Message:
        nonlocal unread
        message = await receive()
        unread = unread and message["type"] == "http.request" and message.get("more_body", False)
        return message

    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start" and unread:
            message = {**message, "headers": [*message.get("headers", ()), (b"connection", b"close")]}
        await send(message)

    return receiving, sending


def _host_name(host: str) -> str:
    """A Host header's name, without its port; an IPv6 address without its brackets."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _matcher(allowed: Iterable[str]) -> re.Pattern[str]:
    """One pattern for names or origins: "*" alone matches anything, elsewhere any characters
    but "/" (http://localhost:* is any port, https://*.example.com any subdomain)."""
    entries = [a.strip().rstrip("/") for a in allowed]  # an origin has no path: a "/" after it is no part of it
    parts = [".*" if a == "*" else re.escape(a).replace(r"\*", "[^/]*") for a in entries if a]
    return re.compile("(?i)(?:" + "|".join(parts) + ")")
