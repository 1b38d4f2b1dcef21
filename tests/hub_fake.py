"""A Hugging Face Hub on loopback, for the real `huggingface_hub` client (tests/unit/models/test_hub.py),
and its fixtures (a plugin of tests/conftest.py): `tiny`, small GGUFs, and `hub`, a hub serving them.

It serves what the client calls to find and fetch a file (seen in huggingface_hub 2.4.0's
hf_api.py and file_download.py, and in the requests logged here):

- ``GET /api/models/{repo}[/revision/{rev}]``: the repo's commit (``sha``) and its files
  (``siblings``); with ``?blobs=true`` each file's size, git blob id and, for an LFS file, its
  ``lfs`` sha256, size and pointer size, as ``HfApi.model_info(files_metadata=True)`` reads them;
- ``HEAD``/``GET /{repo}/resolve/{rev}/{path}``: for an LFS file a 302 to the CDN with
  ``X-Repo-Commit``, ``X-Linked-Etag`` (the sha256) and ``X-Linked-Size``, as the Hub answers; for
  a file kept in git, the file itself with its blob id as ``ETag``;
- the CDN, a second server (another origin, so the client drops its token there, as it does for
  the real CDN): ``GET /{repo}/{sha256}`` with ``Range`` requests for a resumed download.

Private repos answer only a bearer token they were given (no token: 401 RepoNotFound; a token the
hub does not know: 401 "Invalid credentials"; another user's token: 404), gated ones 403 GatedRepo;
a missing repo, revision or file answers the Hub's X-Error-Code. Files are served from where they
lie (real GGUFs are not copied). ``faults[path]`` makes the serving of a file misbehave:
``"cut"`` (its first download stops halfway and the connection closes), ``"cut-then-503"``
(then every resumed request answers 503), ``"corrupt"`` (other bytes than the sha256 announced,
same size), ``"stall"`` (the CDN sends the headers and then nothing until the hub closes), ``"huge"`` (the
listing announces it as `HUGE` bytes);
``stall_api`` holds every API answer until the hub closes; ``after_listing`` runs once, as the next
listing is answered (a push to the repo between the client's looks). ``requests`` records every request.
"""

from __future__ import annotations

import functools
import hashlib
import http.server
import json
import socket
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import gguf
import numpy as np
import pytest

_CHUNK = 1 << 20
HUGE = 1 << 60  # bytes: more than any disk holds


@dataclass(frozen=True)
class Seen:
    """One request the hub received: on which server ("hub" or "cdn"), its method, path and headers."""

    server: str
    method: str
    path: str
    headers: dict[str, str]

    @property
    def kind(self) -> str:
        """"api", "resolve" or "cdn"."""
        if self.server == "cdn":
            return "cdn"
        return "api" if self.path.startswith("/api/") else "resolve"


@dataclass
class HubFile:
    """A file of a repo: its bytes (a path on disk or bytes) and what the Hub says of them."""

    path: str
    source: Path | bytes
    lfs: bool = True
    size: int = field(init=False)
    sha256: str = field(init=False)
    blob_id: str = field(init=False)

    def __post_init__(self) -> None:
        if isinstance(self.source, bytes):
            self.size, self.sha256 = len(self.source), hashlib.sha256(self.source).hexdigest()
        else:
            stat = self.source.stat()
            self.size, self.sha256 = stat.st_size, _sha256_of(str(self.source), stat.st_mtime)
        self.blob_id = _git_blob_id(self.pointer() if self.lfs else self.read(0, self.size))

    def pointer(self) -> bytes:
        """The git LFS pointer git keeps in place of an LFS file."""
        return f"version https://git-lfs.github.com/spec/v1\noid sha256:{self.sha256}\nsize {self.size}\n".encode()

    def read(self, start: int, end: int) -> bytes:
        if isinstance(self.source, bytes):
            return self.source[start:end]
        with open(self.source, "rb") as f:
            f.seek(start)
            return f.read(end - start)

    def chunks(self, start: int, end: int) -> Iterator[bytes]:
        for at in range(start, end, _CHUNK):
            yield self.read(at, min(at + _CHUNK, end))

    def sibling(self, blobs: bool, size: int) -> dict[str, Any]:
        """The file in the repo's listing, announced as `size` bytes."""
        entry: dict[str, Any] = {"rfilename": self.path}
        if blobs:
            entry.update(size=size, blobId=self.blob_id)
            if self.lfs:
                entry["lfs"] = {"sha256": self.sha256, "size": size, "pointerSize": len(self.pointer())}
        return entry


@dataclass
class HubRepo:
    """A model repo at one commit; `token`: private, readable with that bearer token only."""

    name: str
    files: dict[str, HubFile]
    token: str | None = None
    gated: bool = False
    commit: str = field(init=False)

    def __post_init__(self) -> None:
        digest = hashlib.sha1(self.name.encode())
        for f in self.files.values():
            digest.update(f"{f.path}\0{f.sha256}\0".encode())
        self.commit = digest.hexdigest()


@functools.cache
def _sha256_of(path: str, mtime: float) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_CHUNK * 8):
            digest.update(block)
    return digest.hexdigest()


def _git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class FakeHub:
    """The hub and its CDN on two loopback ports (use as a context manager)."""

    def __init__(self) -> None:
        self.repos: dict[str, HubRepo] = {}
        self.faults: dict[str, str] = {}
        self.stall_api = False
        self.after_listing: Callable[[], None] | None = None
        self.requests: list[Seen] = []
        self.closing = threading.Event()
        self._cut: set[str] = set()
        self._connections: set[socket.socket] = set()
        self._hub = self._server("hub")
        self._cdn = self._server("cdn")
        self.url = f"http://127.0.0.1:{self._hub.server_address[1]}"
        self.cdn_url = f"http://127.0.0.1:{self._cdn.server_address[1]}"

    def add_repo(self, name: str, files: Mapping[str, Path | bytes], *, token: str | None = None,
                 gated: bool = False, lfs: bool = True) -> HubRepo:
        """Serve `files` (repo path -> a file on disk or bytes) as the repo `name` ("org/model")."""
        repo = HubRepo(name, {p: HubFile(p, src, lfs) for p, src in files.items()}, token, gated)
        self.repos[name] = repo
        return repo

    def seen(self, method: str | None = None, kind: str | None = None) -> list[Seen]:
        """The requests received, of one method and kind ("api", "resolve", "cdn") if given."""
        return [r for r in self.requests if (method is None or r.method == method) and (kind is None or r.kind == kind)]

    def __enter__(self) -> FakeHub:
        for server in (self._hub, self._cdn):
            threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.closing.is_set():
            return
        self.closing.set()
        for server in (self._hub, self._cdn):
            server.shutdown()
            server.server_close()
        # The client keeps connections open for its next request: closed here, none of them can reach
        # this hub's handlers once another test's hub listens on the same port.
        for conn in list(self._connections):
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    # -- answers ------------------------------------------------------------------------------

    def _repo(self, org: str, name: str) -> HubRepo | None:
        """The repo so named, in any case, as the Hub finds it (its answers spell it its own way)."""
        wanted = f"{org}/{name}".lower()
        return next((r for key, r in self.repos.items() if key.lower() == wanted), None)

    def _access(self, repo: HubRepo | None, headers: Mapping[str, str]) -> tuple[int, dict[str, str]] | None:
        """The Hub's refusal of a request for `repo`, or None if it may read it."""
        auth = headers.get("authorization", "")
        token = auth[len("Bearer "):] if auth.startswith("Bearer ") else None
        known = {r.token for r in self.repos.values() if r.token}
        if token is not None and token not in known:
            return 401, {"X-Error-Message": "Invalid credentials in Authorization header"}
        if repo is None or (repo.token is not None and token != repo.token):
            # the Hub does not tell a private repo from a missing one
            return (401 if token is None else 404), {"X-Error-Code": "RepoNotFound",
                                                     "X-Error-Message": "Repository not found"}
        if repo.gated and token is None:
            return 403, {"X-Error-Code": "GatedRepo",
                         "X-Error-Message": f"Access to model {repo.name} is restricted. You must have access to it"}
        return None

    def _api(self, handler: _Handler, parts: list[str], query: dict[str, list[str]]) -> None:
        # /api/models/{org}/{name}[/revision/{rev}]
        if self.stall_api:
            self.closing.wait()
        if len(parts) not in (3, 5) or parts[0] != "models" or (len(parts) == 5 and parts[3] != "revision"):
            return handler.answer(404, {"error": "Not Found"})
        repo = self._repo(parts[1], parts[2])
        if (refused := self._access(repo, handler.lower_headers())) is not None:
            return handler.answer(refused[0], {"error": refused[1]["X-Error-Message"]}, refused[1])
        assert repo is not None
        rev = unquote(parts[4]) if len(parts) == 5 else "main"
        if rev not in ("main", repo.commit):
            return handler.answer(404, {"error": f"Invalid rev id: {rev}"}, {"X-Error-Code": "RevisionNotFound"})
        blobs = query.get("blobs", ["false"])[0].lower() == "true"
        listing = {
            "_id": repo.commit[:24], "id": repo.name, "modelId": repo.name, "sha": repo.commit,
            "private": repo.token is not None, "gated": "manual" if repo.gated else False, "disabled": False,
            "tags": ["gguf"], "library_name": "gguf", "lastModified": "2026-11-01T00:00:00.000Z",
            "siblings": [f.sibling(blobs, self._announced_size(f)) for f in repo.files.values()],
        }
        if self.after_listing is not None:  # before the answer leaves: the client's next request sees it done
            hook, self.after_listing = self.after_listing, None
            hook()
        handler.answer(200, listing)

    def _resolve(self, handler: _Handler, parts: list[str]) -> None:
        # /{org}/{name}/resolve/{rev}/{path...}
        repo = self._repo(parts[0], parts[1])
        if (refused := self._access(repo, handler.lower_headers())) is not None:
            return handler.answer(refused[0], {"error": refused[1]["X-Error-Message"]}, refused[1])
        assert repo is not None
        rev, path = unquote(parts[3]), unquote("/".join(parts[4:]))
        if rev not in ("main", repo.commit):
            return handler.answer(404, {"error": "Revision not found"}, {"X-Error-Code": "RevisionNotFound"})
        commit = {"X-Repo-Commit": repo.commit}
        f = repo.files.get(path)
        if f is None:
            return handler.answer(404, {"error": "Entry not found"}, {"X-Error-Code": "EntryNotFound", **commit})
        if f.lfs:
            location = f"{self.cdn_url}/{repo.name}/{f.sha256}?X-Amz-Signature=fake"
            return handler.answer(302, None, {**commit, "Location": location, "X-Linked-Etag": f'"{f.sha256}"',
                                              "X-Linked-Size": str(self._announced_size(f)),
                                              "ETag": f'"{f.blob_id}"'})
        self._file(handler, f, {**commit, "ETag": f'"{f.blob_id}"'})

    def _announced_size(self, f: HubFile) -> int:
        return HUGE if self.faults.get(f.path) == "huge" else f.size

    def _cdn_get(self, handler: _Handler, parts: list[str]) -> None:
        # /{org}/{name}/{sha256}: signed, so no token is asked for
        repo = self._repo(parts[0], parts[1])
        f = next((f for f in repo.files.values() if f.sha256 == parts[-1]), None) if repo else None
        if f is None:
            return handler.answer(404, {"error": "NoSuchKey"})
        self._file(handler, f, {"ETag": f'"{f.sha256}"'})

    def _file(self, handler: _Handler, f: HubFile, headers: dict[str, str]) -> None:
        """The file's bytes, or the part a Range asks for, with the file's fault."""
        fault = self.faults.get(f.path)
        start = _range_start(handler.headers.get("Range"))
        if start >= f.size > 0:
            return handler.answer(416, {"error": "Range Not Satisfiable"}, {"Content-Range": f"bytes */{f.size}"})
        if fault == "cut-then-503" and f.path in self._cut:
            return handler.answer(503, {"error": "Service Unavailable"})
        status = 206 if start else 200
        headers = {**headers, "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream",
                   "Content-Length": str(f.size - start)}
        if start:
            headers["Content-Range"] = f"bytes {start}-{f.size - 1}/{f.size}"
        handler.head(status, headers)
        if handler.command == "HEAD":
            return
        if fault == "stall":
            self.closing.wait()
            return handler.drop()
        cut = f.size // 2 if fault in ("cut", "cut-then-503") and f.path not in self._cut else None
        sent = start
        for chunk in f.chunks(start, f.size if cut is None else cut):
            if fault == "corrupt" and sent == 0:
                chunk = bytes([chunk[0] ^ 0xFF]) + chunk[1:]
            if not handler.send(chunk):
                return
            sent += len(chunk)
        if cut is not None:
            self._cut.add(f.path)
            handler.drop()

    # -- plumbing -----------------------------------------------------------------------------

    def _server(self, name: str) -> http.server.ThreadingHTTPServer:
        hub = self

        class Handler(_Handler):
            def setup(self) -> None:
                super().setup()
                hub._connections.add(self.connection)

            def finish(self) -> None:
                hub._connections.discard(self.connection)
                super().finish()

            def route(self) -> None:
                url = urlsplit(self.path)
                hub.requests.append(Seen(name, self.command, self.path, dict(self.headers.items())))
                parts = [p for p in url.path.split("/") if p]
                if name == "cdn":
                    return hub._cdn_get(self, parts) if len(parts) == 3 else self.answer(404, {"error": "NoSuchKey"})
                if parts[:1] == ["api"]:
                    return hub._api(self, parts[1:], parse_qs(url.query))
                if len(parts) >= 5 and parts[2] == "resolve":
                    return hub._resolve(self, parts)
                self.answer(404, {"error": "Not Found"})

        server = _Server(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        return server


class _Server(http.server.ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: object) -> None:
        """A client that hung up (a cut transfer, a test's closed connection) is no error of the hub's."""
        import sys

        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            super().handle_error(request, client_address)


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # headers and body go as two writes: with Nagle on, the body waits for the client's delayed ACK
    # (up to 40 ms a request on Linux), as no real server makes it
    disable_nagle_algorithm = True

    def log_message(self, *args: object) -> None:
        pass

    def route(self) -> None:
        raise NotImplementedError

    def do_GET(self) -> None:
        self.route()

    def do_HEAD(self) -> None:
        self.route()

    def lower_headers(self) -> dict[str, str]:
        return {k.lower(): v for k, v in self.headers.items()}

    def head(self, status: int, headers: Mapping[str, str]) -> None:
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()

    def answer(self, status: int, body: object, headers: Mapping[str, str] | None = None) -> None:
        data = b"" if body is None else json.dumps(body).encode()
        self.head(status, {**(headers or {}), "Content-Type": "application/json", "Content-Length": str(len(data))})
        if self.command != "HEAD":
            self.send(data)

    def send(self, data: bytes) -> bool:
        try:
            self.wfile.write(data)
            return True
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client gave up
            return False

    def drop(self) -> None:
        """Close the connection where it stands: the client sees a body cut short."""
        self.wfile.flush()
        self.connection.shutdown(socket.SHUT_RDWR)
        self.close_connection = True


def _range_start(header: str | None) -> int:
    """Where a ``Range: bytes=N-`` request starts (the client asks for no other kind)."""
    if not header or not header.startswith("bytes="):
        return 0
    first = header[len("bytes="):].split(",")[0].split("-")[0]
    return int(first) if first else 0


def use_hub(monkeypatch: pytest.MonkeyPatch, endpoint: str, home: Path) -> Path:
    """Point huggingface_hub at `endpoint`, with a home (cache, login, xet cache) of its own under
    `home`; returns the cache folder. The client reads these settings when it is imported, so its
    constants are set as well as the environment (for a subprocess, and hf_xet)."""
    from huggingface_hub import constants

    cache = home / "hub"
    env = {"HF_ENDPOINT": endpoint, "HF_HOME": str(home), "HF_HUB_CACHE": str(cache), "HF_XET_CACHE": str(home / "xet")}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    for key in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "HF_OIDC_RESOURCE", "HF_TOKEN_PATH",
                "HUGGINGFACE_HUB_CACHE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(key, raising=False)
    values: dict[str, object] = {
        "ENDPOINT": endpoint,
        "HUGGINGFACE_CO_URL_TEMPLATE": endpoint + "/{repo_id}/resolve/{revision}/{filename}",
        "HF_HOME": str(home), "HF_HUB_CACHE": str(cache), "HF_ASSETS_CACHE": str(home / "assets"),
        "HF_XET_CACHE": str(home / "xet"), "HF_TOKEN_PATH": str(home / "token"),
        "HF_STORED_TOKENS_PATH": str(home / "stored_tokens"),
        "AGENT_HARNESSES_PATH": str(home / ".agent_harnesses.json"),
        "HF_HUB_OFFLINE": False, "HF_HUB_DISABLE_IMPLICIT_TOKEN": False,
    }
    for key, setting in values.items():
        monkeypatch.setattr(constants, key, setting)
    return cache


# -- fixtures: a hub serving small GGUFs -----------------------------------------------------------

ORG = "edgekit-test"


def _gguf(folder: Path, name: str, *, tensors: int = 1, split: bool = False) -> dict[str, bytes]:
    """A small GGUF written with the gguf package (split one tensor a part): {file name: bytes}."""
    writer = gguf.GGUFWriter(folder / name, "llama", split_max_tensors=1 if split else 0)
    writer.add_name(name)
    for i in range(tensors):
        writer.add_tensor(f"t{i}", np.arange(4096, dtype=np.float32) + i)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    stem = name.removesuffix(".gguf")
    return {p.name: p.read_bytes() for p in sorted(folder.glob(f"{stem}*.gguf"))}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict[str, bytes]:
    """Small GGUFs by file name: three quants, a projector and a model split in three parts."""
    folder = tmp_path_factory.mktemp("tiny")
    files: dict[str, bytes] = {}
    for name in ("tiny-Q8_0.gguf", "tiny-Q4_K_M.gguf", "tiny-F16.gguf", "mmproj-tiny-F16.gguf"):
        files |= _gguf(folder, name)
    return files | _gguf(folder, "tiny-IQ4_XS.gguf", tensors=3, split=True)


@pytest.fixture()
def hub(tmp_path, monkeypatch, tiny) -> Iterator[FakeHub]:
    """The hub, huggingface_hub pointed at it with a cache of its own, and the repo tiny-GGUF."""
    with FakeHub() as fake:
        use_hub(monkeypatch, fake.url, tmp_path / "hf")
        fake.add_repo(f"{ORG}/tiny-GGUF", {"README.md": b"# tiny\n", **{
            (f"IQ4_XS/{name}" if "IQ4_XS" in name else name): data for name, data in tiny.items()}})
        yield fake
