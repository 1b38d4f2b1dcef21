"""JSON over HTTP for the stock-server transports: one keep-alive connection,
a deadline on every call, and every failure mapped into the edgekit error tree
with the server's address and what to do."""

from __future__ import annotations

import http.client
import json
import threading
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

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        if self._conn is None:
            cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
            self._conn = cls(self.host, self.port, timeout=timeout)
        self._conn.timeout = timeout
        if self._conn.sock is not None:
            self._conn.sock.settimeout(timeout)
        return self._conn

    def request(
        self, method: str, path: str, body: dict | None = None, *, during: str, timeout: float | None = None
    ) -> dict:
        """One call; the parsed JSON answer. Raises VerifierError subclasses only."""
        deadline = timeout or self.timeout
        payload = json.dumps(body).encode() if body is not None else None
        with self._lock:
            for attempt in (0, 1):  # a keep-alive connection the server closed meanwhile is reopened once
                conn = self._connection(deadline)
                try:
                    conn.request(method, self.base + path, body=payload, headers=self._headers)
                    resp = conn.getresponse()
                    raw = resp.read()
                    break
                except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as exc:
                    self.close()
                    if attempt:
                        raise VerifierUnavailableError(
                            f"{self.kind} at {self.address} dropped the connection {during} ({exc})",
                            address=self.address,
                        ) from None
                except TimeoutError:
                    self.close()
                    raise VerifierUnavailableError(
                        f"{self.kind} at {self.address} did not answer {during} within {deadline:g} s; "
                        "is it overloaded, or the address wrong?",
                        address=self.address,
                        code="DEADLINE_EXCEEDED",
                    ) from None
                except OSError as exc:
                    self.close()
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

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


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
