"""Local HTTP servers that speak stock serving engines' documented APIs over a
toy target: SGLang's native /generate and vLLM-style OpenAI completions. The
stock-server transports are tested against them (tests/unit/transport/test_transports.py)."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Callable, Sequence

import numpy as np

from edgekit.testing import ToyLanguageModel

TextOf = Callable[[int], str]


class _LocalJSONServer:
    """A local HTTP server answering JSON through `get(path)` and `post(path, request)`,
    each returning (status, body). `fault` makes it misbehave for error tests:
    "http500", "not-json", "slow" (holds the answer `delay` seconds first, or until the server
    closes: a wait the client's deadline is sure to end, that ends when the test does)."""

    def __init__(self) -> None:
        self.fault: str | None = None
        self.delay = 0.0
        self.closing = threading.Event()
        self.requests: list[dict] = []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # headers and body go as two writes: with Nagle on, the body waits for the client's delayed ACK
            # (up to 40 ms a request on Linux), as no real server makes it
            disable_nagle_algorithm = True

            def log_message(self, *args: object) -> None:
                pass

            def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a deadline test)

            def _answer(self, status: int, answer: object) -> None:
                self._send(status, json.dumps(answer).encode())

            def do_GET(self) -> None:
                self._answer(*server.get(self.path))

            def do_POST(self) -> None:
                req = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                server.requests.append(req)
                if server.fault == "slow":
                    server.closing.wait(server.delay)
                if server.fault == "drop":
                    server.fault = None
                    self.close_connection = True
                    return  # no answer: the client's read of it fails
                if server.fault == "http500":
                    self._send(500, b'{"error": {"message": "CUDA out of memory"}}')
                elif server.fault == "not-json":
                    self._send(200, b"<html>502 Bad Gateway</html>", "text/html")
                else:
                    self._answer(*server.post(self.path, req))

        self._httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def get(self, path: str) -> tuple[int, object]:
        return 404, {"detail": "Not Found"}

    def post(self, path: str, req: dict) -> tuple[int, object]:
        return 404, {"detail": "Not Found"}

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.closing.set()
        self._httpd.shutdown()
        self._httpd.server_close()


def _log_softmax(lm: ToyLanguageModel, context: Sequence[int]) -> np.ndarray:
    z = lm.logits(context).astype(np.float64)
    return z - (np.log(np.exp(z - z.max()).sum()) + z.max())


class FakeSGLangServer(_LocalJSONServer):
    """A local HTTP server speaking SGLang's documented native API over a toy target:
    GET /get_model_info and POST /generate with input_ids, sampling_params
    (max_new_tokens, temperature 0), return_logprob, logprob_start_len,
    top_logprobs_num and return_text_in_logprobs; meta_info carries
    input_token_logprobs, input_top_logprobs, output_token_logprobs and
    output_top_logprobs as (logprob, token_id, text) entries. As SGLang, the entry exactly at
    logprob_start_len has no log-probabilities (None): the logits before it are not computed in
    the request. A request whose input and new tokens pass `context_length` is answered 400 with
    SGLang's message.

    `fault` makes it misbehave for error tests: "http500", "not-json",
    "no-logprobs", "slow" (holds the answer `delay` seconds), "drop" (closes the connection
    without an answer, once: a connection lost mid-request).
    """

    def __init__(self, lm: ToyLanguageModel, text_of: TextOf, *, name: str = "toy-target",
                 context_length: int = 4096) -> None:
        super().__init__()
        self.lm, self.text_of, self.name, self.context_length = lm, text_of, name, context_length

    def get(self, path: str) -> tuple[int, object]:
        if path == "/get_model_info":
            return 200, {"model_path": self.name, "is_generation": True}
        return super().get(path)

    def post(self, path: str, req: dict) -> tuple[int, object]:
        if path == "/generate":
            new = int((req.get("sampling_params") or {}).get("max_new_tokens", 16))
            if len(req["input_ids"]) + new > self.context_length:
                return 400, {"error": {"message": f"The input ({len(req['input_ids'])} tokens) is longer than the "
                                                  f"model's context length ({self.context_length} tokens)."}}
            return 200, self.answer(req)
        return super().post(path, req)

    def answer(self, req: dict) -> dict:
        ids = list(req["input_ids"])
        params = req.get("sampling_params") or {}
        start = req.get("logprob_start_len", -1)
        texts = bool(req.get("return_text_in_logprobs"))
        k = int(req.get("top_logprobs_num") or 0)

        def entry(lp: np.ndarray, tok: int) -> list:
            return [float(lp[tok]), int(tok), self.text_of(tok) if texts else None]

        meta: dict = {"prompt_tokens": len(ids)}
        if req.get("return_logprob") and start is not None and start >= 0 and self.fault != "no-logprobs":
            inp, top = [], []
            for p in range(start, len(ids)):
                if p == start:  # the logits before it are not computed in this request
                    inp.append([None, ids[0], self.text_of(ids[0]) if texts else None])
                    top.append(None)
                    continue
                lp = _log_softmax(self.lm, ids[:p])
                inp.append(entry(lp, ids[p]))
                top.append([entry(lp, int(t)) for t in np.argsort(-lp, kind="stable")[:k]])
            meta["input_token_logprobs"], meta["input_top_logprobs"] = inp, top
        out, out_top, context = [], [], list(ids)
        for _ in range(int(params.get("max_new_tokens", 16))):
            lp = _log_softmax(self.lm, context)
            tok = int(np.argmax(lp))
            out.append(entry(lp, tok))
            out_top.append([entry(lp, int(t)) for t in np.argsort(-lp, kind="stable")[:k]])
            context.append(tok)
            if tok == self.lm.eos:
                break
        if req.get("return_logprob") and self.fault != "no-logprobs":
            meta["output_token_logprobs"], meta["output_top_logprobs"] = out, out_top
        return {"text": "".join(self.text_of(e[1]) for e in out), "meta_info": meta}


class FakeOpenAIServer(_LocalJSONServer):
    """A local OpenAI-compatible completions server over a toy target, as vLLM
    serves one: GET /v1/models, POST /v1/completions with token-id prompts,
    echo, logprobs (top-k plus the prompt's own token at each position) and
    max_tokens at temperature 0, and POST /tokenize when given a `tokenize`.
    Tokens are named by `text_of(id)`, or "token_id:N" when a request asks
    with return_tokens_as_token_ids and `id_names` is on.

    With `scale_out`, it also serves vLLM's token-in/token-out POST /inference/v1/generate (vLLM
    0.32 with --enable-scale-out; without, 403 as vLLM answers): token_ids, sampling_params with
    max_tokens at temperature 0, prompt_logprobs and logprobs (k), and the answer's shape:
    prompt_logprobs[i] maps ids (as strings) to {logprob, rank, decoded_token} for the top k and the
    prompt's own token (None at position 0), choices[0] the generated token ids and their
    logprobs.content[i].top_logprobs as [{token_id, logprob, rank}]. As vLLM's, its prefix cache
    keeps whole blocks of BLOCK tokens of every request, serves a request the longest cached prefix
    short of its last token (unless it says skip_reading_prefix_cache) and says how many tokens in
    usage.prompt_tokens_details.cached_tokens (--enable-prompt-tokens-details; `details`); the rows
    of positions it served from the cache hold what vLLM's hold there (issue 42019): not the target's
    (here, a wrong token ranked first).

    `fault`: those of every fake server, "bad-id" (the target's choices named by
    an id outside the vocabulary), "bad-echo" (the prompt's last token echoed as
    another) and "unwritable" (every generate answered 400 as vLLM 0.32 answers one holding an
    infinite log-probability).
    """

    BLOCK = 32

    def __init__(self, lm: ToyLanguageModel, text_of: TextOf, *, name: str = "toy-target", id_names: bool = True,
                 tokenize: Callable[[str], list[int]] | None = None, scale_out: bool = False,
                 details: bool = True) -> None:
        super().__init__()
        self.lm, self.text_of, self.name, self.id_names, self.tokenize = lm, text_of, name, id_names, tokenize
        self.scale_out, self.details = scale_out, details
        self.blocks: set[tuple[int, ...]] = set()  # the prefix cache: every request's whole blocks
        self.head_rows: list[int] = []  # per generate request: positions whose LM-head row it computed

    def get(self, path: str) -> tuple[int, object]:
        if path == "/v1/models":
            return 200, {"object": "list", "data": [{"id": self.name, "object": "model"}]}
        if path == "/version":
            return 200, {"version": "0.32.0"}
        return super().get(path)

    def post(self, path: str, req: dict) -> tuple[int, object]:
        if path == "/inference/v1/generate":
            if not self.scale_out:
                return 403, {"error": {"message": "scale-out routes are disabled: start with --enable-scale-out"}}
            if self.fault == "unwritable":
                return 400, {"error": {"message": "Out of range float values are not JSON compliant", "code": 400}}
            return 200, self.tokens_answer(req)
        if path == "/tokenize" and self.tokenize is not None:
            return 200, {"tokens": self.tokenize(req["prompt"])}
        if path != "/v1/completions":
            return super().post(path, req)
        ids = req.get("prompt")
        if not (isinstance(ids, list) and ids and all(isinstance(t, int) for t in ids)):
            return 400, {"error": {"message": "prompt: this server takes token ids", "code": 400}}
        return 200, self.answer(req)

    def answer(self, req: dict) -> dict:
        ids, k = list(req["prompt"]), int(req.get("logprobs") or 0)
        by_id = self.id_names and bool(req.get("return_tokens_as_token_ids"))

        def name(tok: int) -> str:
            return f"token_id:{tok}" if by_id else self.text_of(tok)

        def top(lp: np.ndarray, own: int) -> dict:
            return {label(lp, int(t)): float(lp[t]) for t in [*np.argsort(-lp, kind="stable")[:k], own]}

        def label(lp: np.ndarray, tok: int) -> str:  # the target's choice under the "bad-id" fault: no such id
            return name(self.lm.vocab_size + 5) if self.fault == "bad-id" and tok == int(np.argmax(lp)) else name(tok)

        names: list[str] = []
        own: list[float | None] = []
        tops: list[dict | None] = []
        if req.get("echo"):
            for p, tok in enumerate(ids):
                shifted = self.fault == "bad-echo" and p == len(ids) - 1
                names.append(name((tok + 1) % self.lm.vocab_size if shifted else tok))
                if p == 0:
                    own.append(None)
                    tops.append(None)
                    continue
                lp = _log_softmax(self.lm, ids[:p])
                own.append(float(lp[tok]))
                tops.append(top(lp, tok))
        context, finish = list(ids), "length"
        for _ in range(int(req.get("max_tokens", 16))):
            lp = _log_softmax(self.lm, context)
            tok = int(np.argmax(lp))
            names.append(label(lp, tok))
            own.append(float(lp[tok]))
            tops.append(top(lp, tok))
            context.append(tok)
            if tok == self.lm.eos:
                finish = "stop"
                break
        text = "".join(self.text_of(t) for t in context[len(ids):])
        logprobs = {"tokens": names, "token_logprobs": own, "top_logprobs": tops} if k else None
        return {"choices": [{"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish}]}

    def tokens_answer(self, req: dict) -> dict:
        ids, params = list(req["token_ids"]), req.get("sampling_params") or {}
        k, out_k = int(params.get("prompt_logprobs") or 0), int(params.get("logprobs") or 0)
        cached = 0 if params.get("skip_reading_prefix_cache") else max(
            (b for b in range(self.BLOCK, len(ids), self.BLOCK) if tuple(ids[:b]) in self.blocks), default=0)
        self.blocks.update(tuple(ids[:b]) for b in range(self.BLOCK, len(ids) + 1, self.BLOCK))
        self.head_rows.append(len(ids) - cached if k else 1)  # prompt log-probabilities: every computed row

        def ranked(lp: np.ndarray) -> np.ndarray:
            return np.argsort(-lp, kind="stable")

        prompt: list[dict | None] = [None]
        for p in range(1, len(ids)):
            lp = _log_softmax(self.lm, ids[:p])
            if p <= cached:  # its logits (at p - 1) were never computed: not the target's row
                lp = np.roll(lp, 1)
            order = ranked(lp)
            rank = {int(t): r + 1 for r, t in enumerate(order)}
            prompt.append({str(int(t)): {"logprob": float(lp[t]), "rank": rank[int(t)], "decoded_token": None}
                           for t in [*order[:k], ids[p]]})
        context, content = list(ids), []
        for _ in range(int(params.get("max_tokens", 16))):
            lp = _log_softmax(self.lm, context)
            order = ranked(lp)
            tok = int(order[0])
            content.append({"token_id": tok, "logprob": float(lp[tok]), "rank": 1,
                            "top_logprobs": [{"token_id": int(t), "logprob": float(lp[t]), "rank": r + 1}
                                             for r, t in enumerate(order[:out_k])]})
            context.append(tok)
            if tok == self.lm.eos:
                break
        usage = {"prompt_tokens": len(ids), "completion_tokens": len(content),
                 "prompt_tokens_details": {"cached_tokens": cached} if self.details else None}
        return {"request_id": "generate-tokens-fake", "model": self.name, "output_mode": "tokens", "usage": usage,
                "prompt_logprobs": prompt if k else None,
                "choices": [{"index": 0, "finish_reason": "length", "token_ids": context[len(ids):],
                             "logprobs": {"content": content} if out_k else None}]}
