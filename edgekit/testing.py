"""Fakes for the seams, for tests of code built on edgekit (and edgekit's own).

`ToyLanguageModel` is a deterministic stand-in for an LM: the logits of a
context are a pseudo-random function of its last tokens. `FakeDraftModel`
drives one through the `DraftModel` protocol; `FakeVerifier` is an in-process
`VerifierTransport` over another, applying the real acceptance rules, so
speculative output through the fakes equals the toy target's own decoding.
"""

from __future__ import annotations

import hashlib
import itertools
from typing import Iterator, Sequence

import numpy as np

from ._draft import DraftOutput
from ._errors import LimitExceededError, ProtocolError, SessionNotFoundError, StaleRoundError
from ._hidden import HiddenError, decode_hidden, encode_hidden
from ._llama import Fingerprint
from ._proto import verifier_pb2 as pb
from ._sampling import accept_greedy, accept_sampling, cut_at_end, mismatch_positions, target_probs
from ._wire import hidden_answer_to_pb, hidden_from_pb, verify_request_to_pb
from .transport._base import BlockRequest, Exchange, GeneratedToken, OpenedSession, ServerInfo, VerifyResult

__all__ = ["FakeDraftModel", "FakeOpenAIServer", "FakeSGLangServer", "FakeVerifier", "SimulatedLink", "ToyLanguageModel"]


class ToyLanguageModel:
    """Logits of a context: a seeded function of its last `order` tokens.

    `noise` perturbs the logits (a draft that disagrees with its target now and then).
    """

    def __init__(
        self,
        vocab_size: int = 64,
        *,
        seed: int = 0,
        order: int = 2,
        noise: float = 0.0,
        eos: int = 1,
        eos_bias: float = -4.0,
        name: str = "toy",
    ) -> None:
        self.eos_bias = eos_bias
        self.vocab_size = vocab_size
        self.seed = seed
        self.order = order
        self.noise = noise
        self.eos = eos
        self.name = name

    def _rng(self, context: Sequence[int], salt: str) -> np.random.Generator:
        key = f"{self.seed}:{salt}:{list(context[-self.order :])}".encode()
        return np.random.default_rng(int.from_bytes(hashlib.sha256(key).digest()[:8], "little"))

    def logits(self, context: Sequence[int]) -> np.ndarray:
        base = self._rng(context, "base").normal(0.0, 3.0, self.vocab_size)
        base[self.eos] += self.eos_bias
        if self.noise:
            base += self._rng(context, f"noise{self.noise}").normal(0.0, self.noise, self.vocab_size)
        return base.astype(np.float32)

    def fingerprint(self) -> Fingerprint:
        return Fingerprint(self.vocab_size, hashlib.sha256(b"toy-vocab").digest(), 0, self.eos, self.name)


class FakeDraftModel:
    """A `DraftModel` over a toy LM; its "KV cache" is the list of tokens it has evaluated."""

    def __init__(self, lm: ToyLanguageModel, *, n_ctx: int = 4096, n_embd: int = 8) -> None:
        self.lm = lm
        self.n_embd = n_embd
        self.name = lm.name
        self.n_vocab = lm.vocab_size
        self.n_ctx = n_ctx
        self.evaluated: list[int] = []
        self.eval_calls = 0

    @property
    def n_past(self) -> int:
        return len(self.evaluated)

    def fingerprint(self) -> Fingerprint:
        return self.lm.fingerprint()

    def tokenize(self, text: str, *, add_special: bool = True) -> list[int]:
        ids = [2 + (b % (self.n_vocab - 2)) for b in text.encode()]
        return ([0] if add_special else []) + ids

    def token_bytes(self, token: int, *, special: bool = False) -> bytes:
        if token < 2:
            return (b"<bos>", b"<eos>")[token] if special else b""
        return bytes([ord("a") + token % 26])

    def detokenize(self, tokens: Sequence[int]) -> str:
        return b"".join(self.token_bytes(t) for t in tokens).decode()

    def is_eog(self, token: int) -> bool:
        return token == self.lm.eos

    def chat_template(self) -> str | None:
        return None

    def prefill(self, tokens: Sequence[int]) -> None:
        self.evaluated.extend(tokens)

    def eval(self, tokens: Sequence[int], *, hidden: bool = False) -> DraftOutput:
        if not tokens:
            raise ValueError("eval needs at least one token")
        self.eval_calls += 1
        self.evaluated.extend(tokens)
        logits = self.lm.logits(self.evaluated)
        h = np.resize(logits, self.n_embd) if hidden else None  # a stand-in that differs from step to step
        return DraftOutput(logits, h)

    def truncate(self, length: int) -> None:
        del self.evaluated[length:]

    def close(self) -> None:
        pass  # nothing held (LlamaDraftModel frees its model)


class SimulatedLink:
    """Times of exchanges over a modelled link, without waiting: base RTT, rates
    each way, Gaussian jitter and, with probability `loss`, one retransmission
    timeout (seeded, so tests are exact)."""

    def __init__(
        self,
        rtt_ms: float = 0.0,
        uplink_mbps: float = 1e6,
        downlink_mbps: float = 1e6,
        jitter_ms: float = 0.0,
        loss: float = 0.0,
        rto_ms: float = 200.0,
        seed: int = 0,
    ) -> None:
        self.rtt_ms, self.uplink_mbps, self.downlink_mbps = rtt_ms, uplink_mbps, downlink_mbps
        self.jitter_ms, self.loss, self.rto_ms = jitter_ms, loss, rto_ms
        self._rng = np.random.default_rng(seed)

    def exchange_ms(self, up_bytes: int, down_bytes: int) -> float:
        t = self.rtt_ms + up_bytes * 8 / (self.uplink_mbps * 1e3) + down_bytes * 8 / (self.downlink_mbps * 1e3)
        t += abs(self._rng.normal(0.0, self.jitter_ms)) if self.jitter_ms else 0.0
        if self.loss and self._rng.random() < self.loss:
            t += self.rto_ms
        return t


class FakeVerifier:
    """An in-process verifier over a toy target LM, with the protocol's checks."""

    def __init__(
        self,
        lm: ToyLanguageModel,
        *,
        max_block: int = 32,
        max_context: int = 4096,
        link: "SimulatedLink | None" = None,
    ) -> None:
        self.lm = lm
        self.link = link or SimulatedLink()
        self.address = "fake"
        self.max_block = max_block
        self.max_context = max_context
        self.sessions: dict[str, dict] = {}
        self.verify_calls: list[BlockRequest] = []
        self._ids = itertools.count()

    def ping(self, payload_bytes: int = 0, reply_bytes: int = 0) -> float:
        return self.link.exchange_ms(payload_bytes, reply_bytes)

    def handshake(self, draft: Fingerprint, *, draft_model: str, draft_hidden_size: int) -> ServerInfo:
        return ServerInfo(
            protocol_version=1,
            target_model=self.lm.name,
            target_fingerprint=self.lm.fingerprint(),
            target_hidden_size=8,
            modes=("greedy", "sample"),
            upload_protocols=("tokens", "fh", "sh"),
            max_block=self.max_block,
            max_context=self.max_context,
            max_sessions=64,
            assigns_budgets=False,
            prefix_cache=True,
            max_draft_top_k=1024,
            exact_numerics=True,
        )

    def open_session(self, prompt_tokens, *, mode, temperature, seed, slo_class, draft, draft_hidden_size=0) -> OpenedSession:  # type: ignore[no-untyped-def]
        sid = f"fake-{next(self._ids)}"
        self.sessions[sid] = {
            "hidden_size": draft_hidden_size,
            "tokens": list(prompt_tokens),
            "mode": mode,
            "temperature": temperature,
            "rng": np.random.default_rng(seed),
        }
        return OpenedSession(sid, len(prompt_tokens), self.max_context)

    def _session(self, sid: str) -> dict:
        if sid not in self.sessions:
            raise SessionNotFoundError(f"session {sid!r} is unknown or was evicted", address=self.address)
        return self.sessions[sid]

    def extend_session(self, session_id: str, base_position: int, tokens: Sequence[int]) -> int:
        s = self._session(session_id)
        if base_position != len(s["tokens"]):
            raise StaleRoundError("stale extension", committed_length=len(s["tokens"]), address=self.address)
        s["tokens"].extend(tokens)
        return len(s["tokens"])

    def verify(self, block: BlockRequest) -> VerifyResult:
        self.verify_calls.append(block)
        s = self._session(block.session_id)
        toks = s["tokens"]
        if block.base_position != len(toks):
            raise StaleRoundError(
                f"stale round: base {block.base_position}, committed {len(toks)}",
                committed_length=len(toks),
                address=self.address,
            )
        draft = list(block.draft_tokens)
        if len(draft) > self.max_block:
            raise ProtocolError(f"bad block length {len(draft)}", address=self.address)
        if len(toks) + len(draft) + 1 > self.max_context:
            raise LimitExceededError("context full", address=self.address)
        logits = np.stack([self.lm.logits(toks + draft[:i]) for i in range(len(draft) + 1)])
        # The uploads as the real verifier takes them; times from the simulated link and real message sizes.
        first = verify_request_to_pb(block)
        requested: tuple[int, ...] = ()
        rows = 0
        if block.upload == "fh":
            rows = len(self._hidden(s, block, first.hidden, tuple(range(len(draft)))))
        elif block.upload == "sh":
            requested = tuple(mismatch_positions(logits, draft))
        if s["mode"] == "greedy":
            a, nxt = accept_greedy(logits, draft)
        else:
            a, nxt = accept_sampling(logits, draft, block.draft_distributions, s["temperature"], s["rng"])
        end: int | None = nxt
        if not block.continue_after_eog:
            a, end = cut_at_end(a, nxt, draft, lambda t: t == self.lm.eos)
        verdict = pb.VerifyResponse(verdict=pb.Verdict(accepted=a, next_token=end if end is not None else -1))
        exchanges = []
        if requested:
            second = hidden_answer_to_pb(block, encode_hidden(block.hidden[list(requested)], block.hidden_encoding, requested))
            rows = len(self._hidden(s, block, second.hidden, requested))
            ask = pb.VerifyResponse(hidden_request=pb.HiddenRequest(positions=requested))
            exchanges.append(self._exchange(first, ask))
            first = second
        exchanges.append(self._exchange(first, verdict))
        toks.extend(draft[:a] + ([end] if end is not None else []))
        return VerifyResult(
            accepted=a,
            next_token=end,
            bonus=end is not None and a == len(draft),
            committed_length=len(toks),
            context_full=len(toks) + 2 > self.max_context,
            exchanges=tuple(exchanges),
            hidden_rows=rows,
            hidden_requested=requested,
        )

    def _exchange(self, request: pb.VerifyRequest, answer: pb.VerifyResponse) -> Exchange:
        up, down = request.ByteSize(), answer.ByteSize()
        return Exchange(self.link.exchange_ms(up, down), 0.0, up, down)

    def _hidden(self, s: dict, block: BlockRequest, h: pb.HiddenStates, positions: tuple[int, ...]) -> np.ndarray:
        if not s["hidden_size"]:
            raise ProtocolError("this session was opened without draft_hidden_size", address=self.address)
        try:
            return decode_hidden(hidden_from_pb(h), dim=s["hidden_size"], positions=positions)
        except HiddenError as exc:
            raise ProtocolError(f"verifier at {self.address} refused round {block.round_index}: {exc}", address=self.address) from None

    def close_session(self, session_id: str) -> None:
        self.sessions.pop(session_id, None)

    def generate(self, prompt_tokens, *, mode, temperature, seed, max_tokens) -> Iterator[GeneratedToken]:  # type: ignore[no-untyped-def]
        toks = list(prompt_tokens)
        rng = np.random.default_rng(seed)
        for i in range(max_tokens):
            logits = self.lm.logits(toks)
            if mode == "greedy":
                tok = int(np.argmax(logits))
            else:
                tok = int(rng.choice(self.lm.vocab_size, p=target_probs(logits, temperature)))
            toks.append(tok)
            last = tok == self.lm.eos or i + 1 == max_tokens
            yield GeneratedToken(tok, i, finish_reason=("eos" if tok == self.lm.eos else "length") if last else None)
            if last:
                return

    def close(self) -> None:
        pass


class _LocalJSONServer:
    """A local HTTP server answering JSON through `get(path)` and `post(path, request)`,
    each returning (status, body). `fault` makes it misbehave for error tests:
    "http500", "not-json", "slow" (sleeps `delay` seconds first)."""

    def __init__(self) -> None:
        import http.server
        import json
        import threading
        import time as _time

        self.fault: str | None = None
        self.delay = 0.0
        self.requests: list[dict] = []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

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

            def do_GET(self) -> None:  # noqa: N802
                self._answer(*server.get(self.path))

            def do_POST(self) -> None:  # noqa: N802
                req = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                server.requests.append(req)
                if server.fault == "slow":
                    _time.sleep(server.delay)
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

    def __enter__(self):  # type: ignore[no-untyped-def]
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
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
    output_top_logprobs as (logprob, token_id, text) entries.

    `fault` makes it misbehave for error tests: "http500", "not-json",
    "no-logprobs", "slow" (sleeps `delay` seconds).
    """

    def __init__(self, lm: ToyLanguageModel, text_of, *, name: str = "toy-target") -> None:  # type: ignore[no-untyped-def]
        super().__init__()
        self.lm, self.text_of, self.name = lm, text_of, name

    def get(self, path: str) -> tuple[int, object]:
        if path == "/get_model_info":
            return 200, {"model_path": self.name, "is_generation": True}
        return super().get(path)

    def post(self, path: str, req: dict) -> tuple[int, object]:
        if path == "/generate":
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
                if p == 0:
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

    `fault`: those of every fake server, "bad-id" (the target's choices named by
    an id outside the vocabulary) and "bad-echo" (the prompt's last token echoed as
    another).
    """

    def __init__(self, lm: ToyLanguageModel, text_of, *, name: str = "toy-target", id_names: bool = True,  # type: ignore[no-untyped-def]
                 tokenize=None) -> None:  # type: ignore[no-untyped-def]
        super().__init__()
        self.lm, self.text_of, self.name, self.id_names, self.tokenize = lm, text_of, name, id_names, tokenize

    def get(self, path: str) -> tuple[int, object]:
        if path == "/v1/models":
            return 200, {"object": "list", "data": [{"id": self.name, "object": "model"}]}
        return super().get(path)

    def post(self, path: str, req: dict) -> tuple[int, object]:
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
