"""An ASGI app served by uvicorn on a free loopback port, on a thread (`edgekit api` in a test)."""

from __future__ import annotations

import socket
import threading

import uvicorn
from _wait import until


class Served:
    """`url` is the OpenAI API's base (…/v1); `host` the server's, as Ollama's clients take it."""

    def __init__(self, app) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        until(lambda: self.server.started, "the API started", timeout=20)
        self.host = f"http://127.0.0.1:{self.port}"
        self.url = f"{self.host}/v1"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
