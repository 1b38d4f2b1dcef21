"""`edgekit api` started as a user starts it, over the gemma verifier: what a web page could send it
(a foreign Host or Origin, a text/plain body, a body past its limit) is refused as the unit tests
of the guard say (tests/unit/api/test_guard.py, on a toy verifier in this process)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx

GIB, MIB = 1 << 30, 1 << 20
READ_AT_MOST = 32 * MIB  # the 4 MiB limit and the socket buffers between the two ends (test_guard.py)
JSON = {"Content-Type": "application/json"}


def test_edgekit_api_as_started_refuses_what_a_page_could_send(gemma_server):
    """The real process, its options from the command line and the environment: Host, Origin,
    Content-Type and a gigabyte body refused, and the server answering after."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "EDGEKIT_ORIGINS": "http://app.example"}
    api = subprocess.Popen([sys.executable, "-m", "edgekit.cli.app", "api", "--verifier", gemma_server.address,
                            "--port", str(port), "--slots", "1", "--allowed-hosts", "api.example",
                            "--max-body-bytes", "65536"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL, env=env)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
            deadline = time.monotonic() + 120
            while True:  # until it answers (it loads the draft model first)
                try:
                    if http.get("/v1/models").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert api.poll() is None, api.stderr.read()  # type: ignore[union-attr]
                assert time.monotonic() < deadline, "edgekit api did not start"
                time.sleep(0.1)
            assert http.get("/v1/models", headers={"Host": f"api.example:{port}"}).status_code == 200
            assert http.get("/v1/models", headers={"Host": f"evil.example:{port}"}).status_code == 403
            ok = http.get("/v1/models", headers={"Origin": "http://app.example"})
            assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == "http://app.example"
            assert http.get("/v1/models", headers={"Origin": "http://evil.example"}).status_code == 403
            body = json.dumps({"model": "gemma-3-270m", "prompt": "Hi", "max_tokens": 2})
            assert http.post("/v1/completions", content=body, headers={"Content-Type": "text/plain"}).status_code == 415
            sent = 0

            def gigabyte() -> Iterator[bytes]:
                nonlocal sent
                while sent < min(GIB, 2 * READ_AT_MOST):  # beyond that the server is reading it all: the test fails
                    sent += 64 << 10
                    yield b" " * (64 << 10)

            assert http.post("/v1/completions", content=gigabyte(), headers=JSON).status_code == 413
            assert sent <= READ_AT_MOST
            assert http.post("/v1/completions", content=body, headers=JSON).status_code == 200
    finally:
        api.terminate()
        api.wait(30)
