"""`edgekit api` as a web page would drive it (issue 66, items 3 and 6): the Host and Origin
checks (DNS rebinding, cross-site requests), JSON bodies only, the body's size bounded while it
comes, a non-streamed answer stopped when its client leaves, and internal errors logged, not sent.
Over a toy verifier on a free loopback port (no model files), and `edgekit api` itself once."""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
from _served import Served
from _wait import until

from edgekit import EdgeClient
from edgekit.api import create_app
from edgekit.client import GenerationStream, TextDelta
from edgekit.testing import FakeDraftModel, ToyLanguageModel, toy_server

GIB, MIB = 1 << 30, 1 << 20
# What a server that stops reading at its limit (4 MiB) may still take in: the limit and the
# socket buffers between the two ends (a few MiB each on loopback)
READ_AT_MOST = 32 * MIB
JSON = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def toy():
    """A client of a toy verifier, and the name of the model it serves."""
    lm = ToyLanguageModel(seed=3, eos_bias=-9.0)
    server = toy_server(lm, max_sessions=4, max_context=512, calibrate="off").start()
    client = EdgeClient(server.address, draft=FakeDraftModel(ToyLanguageModel(seed=3, noise=0.5)))
    yield client, lm.name
    client.close()
    server.stop()


@contextmanager
def serving(client: EdgeClient, **options) -> Iterator[Served]:
    served = Served(create_app(client, **options))
    try:
        yield served
    finally:
        served.stop()


def _completion(model: str, **fields) -> dict:
    return {"model": model, "prompt": [1, 2, 3], "max_tokens": 2, "temperature": 0, **fields}


def test_a_host_other_than_the_servers_names_is_refused(toy):
    """DNS rebinding: a page at http://evil.example:PORT, its name rebound to 127.0.0.1, is
    same-origin with the server to the browser, but sends Host: evil.example:PORT."""
    client, model = toy
    with serving(client) as served, httpx.Client(base_url=served.host, timeout=60) as http:
        for host in (f"localhost:{served.port}", f"127.0.0.1:{served.port}", f"[::1]:{served.port}", "LOCALHOST"):
            assert http.get("/v1/models", headers={"Host": host}).status_code == 200, host
        evil = {"Host": f"evil.example:{served.port}"}
        refused = http.get("/v1/models", headers=evil)
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "host_not_allowed"
        assert http.get("/api/tags", headers=evil).json() == {"error": refused.json()["error"]["message"]}  # Ollama's
        assert http.post("/v1/completions", json=_completion(model), headers=evil).status_code == 403
        assert http.get("/nowhere", headers=evil).status_code == 403  # before any route
    with serving(client, allowed_hosts=["api.example", "*.home.arpa"]) as served, \
            httpx.Client(base_url=served.host, timeout=60) as http:
        for host, status in [("api.example:8080", 200), ("box.home.arpa", 200), ("evil.example", 403),
                             ("api.example.evil.example", 403)]:
            assert http.get("/v1/models", headers={"Host": host}).status_code == status, host
    with serving(client, allowed_hosts=["*"]) as served, httpx.Client(base_url=served.host, timeout=60) as http:
        assert http.get("/v1/models", headers={"Host": "anything.example"}).status_code == 200


def test_the_cli_answers_its_bound_address_and_on_every_interface_any_name_unless_given():
    from edgekit.cli.api import _answered_hosts  # private: the hosts `edgekit api` answers by default, from its flags

    assert _answered_hosts("127.0.0.1", "") == ["127.0.0.1"]
    assert _answered_hosts("192.168.1.5", "box.local, api.example") == ["box.local", "api.example", "192.168.1.5"]
    assert _answered_hosts("0.0.0.0", "") == ["*"] and _answered_hosts("::", "") == ["*"]
    assert _answered_hosts("0.0.0.0", "box.local") == ["box.local"]


def test_a_request_from_a_page_of_another_origin_is_refused_and_loopback_pages_get_cors(toy):
    client, model = toy
    with serving(client) as served, httpx.Client(base_url=served.host, timeout=60) as http:
        evil = {"Origin": "https://evil.example"}
        refused = http.post("/v1/completions", json=_completion(model), headers=evil)
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "origin_not_allowed"
        assert "access-control-allow-origin" not in refused.headers
        assert http.get("/api/tags", headers=evil).status_code == 403
        for origin in ("http://localhost:5173", "http://127.0.0.1", "https://[::1]:8443"):
            ok = http.post("/v1/completions", json=_completion(model), headers={"Origin": origin})
            assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == origin, origin
        for origin in ("http://localhost.evil.example", "http://127.0.0.1.evil.example:80", "null"):
            assert http.get("/v1/models", headers={"Origin": origin}).status_code == 403, origin

        preflight = {"Access-Control-Request-Method": "POST",
                     "Access-Control-Request-Headers": "authorization, content-type"}
        ok = http.options("/v1/chat/completions", headers={"Origin": "http://localhost:3000", **preflight})
        assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == "http://localhost:3000"
        assert "POST" in ok.headers["access-control-allow-methods"]
        assert {"authorization", "content-type"} <= set(ok.headers["access-control-allow-headers"].lower().split(", "))
        no = http.options("/v1/chat/completions", headers={**evil, **preflight})
        assert no.status_code == 403 and "access-control-allow-origin" not in no.headers

    with serving(client, origins=["https://*.example.com", "http://192.168.1.5:*"]) as served, \
            httpx.Client(base_url=served.host, timeout=60) as http:
        for origin, status in [("https://app.example.com", 200), ("http://192.168.1.5:8000", 200),
                               ("http://localhost:8000", 200), ("http://app.example.com", 403),
                               ("https://example.com.evil.example", 403)]:
            assert http.get("/v1/models", headers={"Origin": origin}).status_code == status, origin
    with serving(client, origins=["*"]) as served, httpx.Client(base_url=served.host, timeout=60) as http:
        assert http.get("/v1/models", headers={"Origin": "https://any.example"}).status_code == 200


def test_a_body_is_read_only_as_json(toy):
    """A page may POST text/plain or a form's types without a preflight: they reach no route."""
    client, model = toy
    body = json.dumps(_completion(model))
    with serving(client) as served, httpx.Client(base_url=served.host, timeout=60) as http:
        for kind in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", None):
            headers = {"Content-Type": kind} if kind else {}
            for path in ("/v1/completions", "/api/generate", "/api/show"):
                refused = http.post(path, content=body, headers=headers)
                assert refused.status_code == 415 and "application/json" in refused.text, (kind, path)
        for kind in ("application/json", "Application/JSON; charset=utf-8"):
            assert http.post("/v1/completions", content=body, headers={"Content-Type": kind}).status_code == 200


def test_a_gigabyte_body_is_refused_before_it_is_read_and_the_server_goes_on(toy):
    """Chunked (no length given) and with a Content-Length: each answered 413 once the limit
    (4 MiB) is passed, the connection closed; the rest of the gigabyte is never read. Nor is
    that of a request refused before its body is looked at."""
    client, model = toy
    for declared, origin, status in [(False, None, 413), (True, None, 413), (False, "https://evil.example", 403)]:
        sent = 0

        def gigabyte() -> Iterator[bytes]:
            nonlocal sent
            yield b'{"model": "' + model.encode() + b'", "prompt": "'
            sent = 1
            chunk = b"x" * (64 << 10)
            while sent < GIB:
                if sent > 2 * READ_AT_MOST:  # the server reads on: the test fails, not holding a gigabyte
                    return
                sent += len(chunk)
                yield chunk

        headers = {**JSON, **({"Content-Length": str(GIB)} if declared else {})}
        if origin:
            headers["Origin"] = origin
        with serving(client) as served, httpx.Client(base_url=served.host, timeout=60) as http:
            refused = http.post("/v1/completions", content=gigabyte(), headers=headers)
            assert refused.status_code == status and refused.headers["connection"] == "close", (declared, origin)
            assert refused.json()["error"]["code"] == {413: "request_too_large", 403: "origin_not_allowed"}[status]
            assert sent <= READ_AT_MOST, (declared, origin, sent)
            assert http.post("/v1/completions", json=_completion(model)).status_code == 200
    with serving(client, max_body_bytes=100) as served, httpx.Client(base_url=served.host, timeout=60) as http:
        assert http.post("/v1/completions", json=_completion(model, user="x" * 100)).status_code == 413
        assert http.post("/v1/completions", json=_completion(model)).status_code == 200


def test_a_client_that_leaves_before_its_whole_answer_stops_the_generation():
    """Nothing is sent before a non-streamed answer is done: the server watches for the client's
    disconnect, and stops generating (the verifier's session closed, the slot given back)."""
    lm = ToyLanguageModel(seed=5, eos_bias=-9.0)
    started = threading.Event()

    def cost(feeds) -> float:
        started.set()
        return 30.0  # ms a target pass: the answer asked for takes a minute or more

    server = toy_server(lm, max_sessions=2, max_context=4096, cost=cost, calibrate="off").start()
    client = EdgeClient(server.address, draft=FakeDraftModel(ToyLanguageModel(seed=6, noise=0.9)))
    try:
        with serving(client, concurrency=1, queue=0) as served:
            with socket.create_connection(("127.0.0.1", served.port), timeout=60) as conn:
                body = json.dumps(_completion(lm.name, max_tokens=4000)).encode()
                conn.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
                assert started.wait(60)
                until(lambda: len(server.service.sessions) == 1, "the answer's session opened")
            until(lambda: len(server.service.sessions) == 0, "the session of the client that left closed", 15)
            # the only slot is free: the next request is answered, not refused 429
            with httpx.Client(base_url=served.host, timeout=60) as http:
                assert http.post("/v1/completions", json=_completion(lm.name)).status_code == 200
    finally:
        client.close()
        server.stop()


def test_an_internal_error_is_logged_and_not_sent(toy, monkeypatch, caplog):
    client, model = toy
    secret = "/home/someone/.cache/token=hf_abc"

    def broken(prompt, **options):
        raise RuntimeError(f"cannot open {secret}")

    def broken_midway(prompt, **options):
        def events():
            yield TextDelta("Hi", (1,))
            raise RuntimeError(f"cannot open {secret}")
        return GenerationStream(events())

    caplog.set_level(logging.ERROR, logger="edgekit.api")
    with serving(client) as served, httpx.Client(base_url=served.host, timeout=60) as http:
        monkeypatch.setattr(client, "generate", broken)
        monkeypatch.setattr(client, "chat", broken)
        for path, body in [("/v1/completions", _completion(model)),
                           ("/v1/completions", _completion(model, stream=True)),
                           ("/api/generate", {"model": model, "prompt": "hi", "stream": False})]:
            answer = http.post(path, json=body)
            assert answer.status_code == 500 and secret not in answer.text, (path, answer.text)
            assert "internal error; see the server's log" in answer.text
        monkeypatch.setattr(client, "generate", broken_midway)
        streamed = http.post("/v1/completions", json=_completion(model, stream=True))
        assert streamed.status_code == 200 and "internal error; see the server's log" in streamed.text
        assert secret not in streamed.text and streamed.text.endswith("data: [DONE]\n\n")
    logged = [r for r in caplog.records if r.exc_info and secret in str(r.exc_info[1])]
    assert len(logged) == 4 and all(r.levelno == logging.ERROR for r in logged)
