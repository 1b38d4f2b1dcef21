"""JSON over HTTP for the stock-server transports: one keep-alive connection,
a deadline on every call, and every failure mapped into the edgekit error tree
with the server's address and what to do; `many` sends several requests at once,
each on a keep-alive connection of its own, for a server to batch them."""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

from ..errors import (
    AuthenticationError,
    ConfigError,
    LimitExceededError,
    ProtocolError,
    VerifierError,
    VerifierUnavailableError,
)

__all__ = ["HttpJson"]


class HttpJson:
    def __init__(self, base_url: str, *, timeout: float, token: str | None = None, kind: str = "server") -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"not an http(s) URL: {base_url!r}")
        self.base = parts.path.rstrip("/")
        self._url = base_url
        self.host, self.port = parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)
        self.https = parts.scheme == "https"
        self.address = f"{parts.scheme}://{parts.netloc}{self.base}"
        self.kind = kind  # "OpenAI-compatible server", "SGLang server": named in messages
        self.timeout = timeout
        self._headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._conn: http.client.HTTPConnection | None = None
        self._lock = threading.Lock()  # one request at a time on the connection
        self.last_sizes = (0, 0)  # bytes of the last request body and answer body
        self._siblings: list[HttpJson] = []  # more connections to the same server, for `many`
        self._pool: ThreadPoolExecutor | None = None
        self._pool_size = 0

    def many(self, method: str, path: str, bodies: Sequence[dict], *, during: str) -> list[dict]:
        """The requests at once, each on a connection of its own (kept alive for the next call);
        their answers in order. The first failure is raised once all have ended; last_sizes sums them."""
        if len(bodies) <= 1:
            return [self.request(method, path, b, during=during) for b in bodies]
        while len(self._siblings) < len(bodies) - 1:
            self._siblings.append(self._sibling())
        if self._pool is None or len(self._siblings) + 1 > self._pool_size:
            if self._pool is not None:
                self._pool.shutdown(wait=False)
            self._pool_size = len(self._siblings) + 1
            self._pool = ThreadPoolExecutor(max_workers=self._pool_size, thread_name_prefix="edgekit-http")
        clients = [self, *self._siblings[: len(bodies) - 1]]
        futures = [self._pool.submit(c.request, method, path, b, during=during) for c, b in zip(clients, bodies)]
        errors = [f.exception() for f in futures]
        first = next((e for e in errors if e is not None), None)
        if first is not None:
            raise first
        self.last_sizes = (sum(c.last_sizes[0] for c in clients), sum(c.last_sizes[1] for c in clients))
        return [f.result() for f in futures]

    def _sibling(self) -> HttpJson:
        """Another client of the same server with the same settings, on a connection of its own."""
        sibling = HttpJson(self._url, timeout=self.timeout, kind=self.kind)
        sibling._headers = dict(self._headers)  # the token too
        return sibling

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        if self._conn is None:
            cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
            self._conn = cls(self.host, self.port, timeout=timeout)
        self._conn.timeout = timeout
        if self._conn.sock is not None:
            self._conn.sock.settimeout(timeout)
        return self._conn

    def request(
        self, method: str, path: str, body: dict | None = None, *, during: str, timeout: float | None = None,
        from_root: bool = False,
    ) -> dict:
        """One call; the parsed JSON answer. Raises VerifierError subclasses only. `from_root`: `path`
        from the server's root, not under the base URL's path (vLLM's /tokenize beside its /v1)."""
        deadline = timeout or self.timeout
        payload = json.dumps(body).encode() if body is not None else None
        with self._lock:
            for attempt in (0, 1):  # a keep-alive connection the server closed meanwhile is reopened once
                conn = self._connection(deadline)
                try:
                    conn.request(method, path if from_root else self.base + path, body=payload, headers=self._headers)
                    resp = conn.getresponse()
                    raw = resp.read()
                    break
                except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as exc:
                    self._drop()
                    if attempt:
                        raise VerifierUnavailableError(
                            f"{self.kind} at {self.address} dropped the connection {during} ({exc})",
                            address=self.address,
                        ) from None
                except TimeoutError:
                    self._drop()
                    raise VerifierUnavailableError(
                        f"{self.kind} at {self.address} did not answer {during} within {deadline:g} s; "
                        "is it overloaded, or the address wrong?",
                        address=self.address,
                        code="DEADLINE_EXCEEDED",
                    ) from None
                except OSError as exc:
                    self._drop()
                    raise VerifierUnavailableError(
                        f"{self.kind} at {self.address} is unavailable ({exc.strerror or exc}); is it running there?",
                        address=self.address,
                        code="UNAVAILABLE",
                    ) from None
        self.last_sizes = (len(payload or b""), len(raw))
        return self._parse(resp.status, raw, during)

    def _parse(self, status: int, raw: bytes, during: str) -> dict:
        text = raw.decode("utf-8", errors="replace")
        try:
            data = json.loads(text) if text.strip() else None
        except json.JSONDecodeError:
            data = None
        if status >= 400:
            detail = _error_detail(data) or text.strip()[:300] or f"HTTP {status}"
            msg = f"{self.kind} at {self.address} answered {during} with HTTP {status}: {detail}"
            if status in (401, 403):
                raise AuthenticationError(
                    msg + "; pass its API key as the token", address=self.address, code=str(status)
                )
            if status == 404:
                raise ProtocolError(
                    msg + "; check the URL's path (the API root, e.g. /v1)", address=self.address, code="404"
                )
            if status in (413, 429):
                raise LimitExceededError(msg, address=self.address, code=str(status))
            if status in (502, 503, 504):
                raise VerifierUnavailableError(msg, address=self.address, code=str(status))
            if 400 <= status < 500:
                raise ProtocolError(msg + "; the server refused the request as edgekit sent it", address=self.address,
                                    code=str(status))
            raise VerifierError(msg + "; the server failed: see its log", address=self.address, code=str(status))
        if not isinstance(data, dict):
            raise ProtocolError(
                f"{self.kind} at {self.address} answered {during} with something that is not a JSON object: "
                f"{text.strip()[:200]!r}; is the URL the server's API root, not a proxy or a web page?",
                address=self.address,
            )
        return data

    def _drop(self) -> None:
        """This connection only: the next request opens another."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def close(self) -> None:
        self._drop()
        for sibling in self._siblings:
            sibling.close()
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None


def _error_detail(data: object) -> str | None:
    """The message in the error bodies servers send: OpenAI's {"error": {"message"}}, FastAPI's {"detail"}."""
    if not isinstance(data, dict):
        return None
    err = data.get("error")
    if isinstance(err, dict) and err.get("message"):
        return str(err["message"])
    if isinstance(err, str):
        return err
    detail = data.get("detail") or data.get("message")
    return json.dumps(detail)[:300] if detail is not None and not isinstance(detail, str) else detail
