"""`OpenAITransport`: verification on an OpenAI-compatible completions server that returns
log-probabilities of prompt tokens (`echo` with `logprobs`): vLLM and llama-cpp-python's server
(llama.cpp's own llama-server ignores `echo` and cannot verify).

A round reads the target by one of three routes (`ROUTES`; `?route=` in the URL). "generate", where
vLLM offers it (started with --enable-scale-out and --enable-prompt-tokens-details), is one request
to its token-in/token-out `/inference/v1/generate` that reads the prefix cache and returns every
block position's top-k and the greedy token after the block (`_vllm_generate`): one request a
round, its cost flat in the context (a session's prompt, and a long extension, go first as a plain
request, which the cache keeps: `_prefill`); "auto" takes it wherever the server answers it. "prompt-logprobs"
sends committed tokens plus the draft block as one prompt with `echo: true, logprobs: 1,
max_tokens: 1, temperature: 0`: every prompt position comes back with its top-1 alternative, and
the one generated token is the target's greedy token after the block (the bonus); vLLM reads no
prefix cache for such a request, so the round costs the whole context. "prefixes" sends the
context and each longer prefix as one-token completions at once (token-id prompts only): the
generated token of each is the target's greedy token there, and each reads the prefix cache, so
the round's cost stays flat in the context, at the price of K+1 requests. "auto" (the default),
where "generate" is not offered, takes the prefixes from `PREFIXES_FROM` tokens of context. A sampling session asks for
`logprobs: K` (its top-k, within the server's cap) and reads the K likeliest
tokens at every block position and after the block, from which the device
applies the sampler and the lossless rule (see `StatelessTransport`); this needs
tokens named by id (vLLM's `return_tokens_as_token_ids`), or texts that name one
token each.

Prompts go as token ids where the server takes them (vLLM, llama.cpp's server),
so no re-tokenization can shift positions. Where it takes text only
(llama-cpp-python's server), the text of the tokens is sent and the server's
echoed tokens are checked against ours, position by position: a sequence that
text cannot carry exactly (a split the server would tokenize differently, or
half a UTF-8 character) is refused, never verified on shifted positions.

The API names tokens by their text. Where the server can name them by id
instead (vLLM's `return_tokens_as_token_ids`, "token_id:N"; found at the
handshake), it is asked to, and ids are read as they are. Otherwise the top-1
token's id is recovered from the draft's vocabulary (shared with the target:
checked at the handshake): the token with that text, or where several share it
(a byte-fallback token and the piece itself) the one the tokenizer produces; an
empty string (a control token such as end-of-text) is resolved by the server's
finish reason. A target that chose a non-canonical twin of the same text is
indistinguishable through text; token-id backends (SGLang, vLLM's token ids)
do not have that limit.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import ConfigError, ProtocolError, VerifierError
from ..protocol import OpenedSession, OpenRequest
from ..runtime import DraftModel
from ._http import HttpJson
from ._stateless import TOKENIZER_PROBE, StatelessTransport
from ._vllm_generate import GENERATE_PATH, PREFILL_FROM, UNWRITABLE, GenerateRows, generate_body, prefill_body

__all__ = ["PREFIXES_FROM", "ROUTES", "OpenAITransport"]

# How a round reads the target's rows: "generate", one request to vLLM's token-in/token-out endpoint
# that reads the prefix cache (started with --enable-scale-out); "prompt-logprobs", one completion of
# the whole sequence that echoes the log-probabilities of every prompt position (vLLM reads no prefix
# cache for those: every round costs the whole context); "prefixes", one-token completions of each
# prefix at once (each reads the cache; token-id prompts only); "auto", "generate" where the server
# answers it, else the prefixes from PREFIXES_FROM tokens of context.
ROUTES = ("auto", "generate", "prefixes", "prompt-logprobs")
PREFIXES_FROM = 256


class OpenAITransport(StatelessTransport):
    backend = "openai"
    kind = "OpenAI-compatible server"
    prefix_cache = False  # nothing we can rely on: the whole context goes every round
    samples = True

    def __init__(self, url: str, tokenizer: DraftModel, *, timeout: float = 30.0, token: str | None = None,
                 model: str | None = None, max_block: int = 16, max_context: int = 4096,
                 max_logprobs: int = 20, route: str = "auto") -> None:
        base = url if url.rstrip("/").endswith("/v1") else url.rstrip("/") + "/v1"
        super().__init__(HttpJson(base, timeout=timeout, token=token, kind=self.kind), tokenizer,
                         max_context=max_context, max_block=max_block)
        self.model = model or ""
        self.max_logprobs = max_logprobs  # the server's cap on logprobs per position (vLLM: 20 by default)
        self.prompt_ids: bool | None = None  # whether the server takes token-id prompts (found at the handshake)
        self.id_names = False  # whether it names tokens "token_id:N" when asked (found at the handshake)
        # Sampling switches that are on by default in some servers and would make temperature 0 something
        # other than the target's argmax (llama-cpp-python's repeat_penalty defaults to 1.1).
        self._plain_sampling: dict = {}
        self._by_text: dict[str, int] | None = None
        if route not in ROUTES:
            raise ConfigError(f"route must be one of {', '.join(ROUTES)}, got {route!r}")
        self.route = route  # how a block's rows are read (ROUTES; `_reads_prefixes` decides per round)
        self.generates: bool | None = None  # whether it answers vLLM's token-in/token-out route (the handshake)
        self.engine = ""  # what the server says it is ("vLLM 0.32.0"), where it says
        # rounds of the generate route read by the prefixes instead: their block served from the cache,
        # or their answer unwritable
        self.cached_block = self.unwritable = 0
        self.prefills = 0  # plain requests that cached a session's prompt or extension (generate route)

    # -- sessions: the generate route prefills what a session adds ---------------------------

    def open_session(self, request: OpenRequest) -> OpenedSession:
        opened = super().open_session(request)
        self._prefill(request.prompt_tokens, len(request.prompt_tokens))
        return opened

    def extend_session(self, session_id: str, base_position: int, tokens: Sequence[int]) -> int:
        length = super().extend_session(session_id, base_position, tokens)
        self._prefill(self._session(session_id).tokens, len(tokens))
        return length

    def _prefill(self, context: Sequence[int], added: int) -> None:
        """`context` sent as a plain one-token request where it adds PREFILL_FROM tokens or more and
        the rounds read the prefix cache. On the generate route, a round's prompt log-probabilities
        cost the LM head at every position it computes, a plain prefill at one (see `_vllm_generate`);
        on the prefixes, each of a round's K+1 requests would compute the uncached context anew."""
        if added < PREFILL_FROM or not (self.generates or self._reads_prefixes(context)):
            return
        # All but the last token: the cache then never holds the context's last position, whose row
        # (predicting the block's first token) the first round must compute (a context of whole
        # blocks, cached whole, would send that round by the prefixes)
        head = list(context[:-1])
        if self.generates:
            self.http.request("POST", self._root + GENERATE_PATH, prefill_body(self.model, head),
                              during="prefilling the context", from_root=True)
        else:
            self.http.request("POST", "/completions", {"model": self.model, "prompt": head, "max_tokens": 1,
                                                        "temperature": 0} | self._plain_sampling,
                              during="prefilling the context")
        self.prefills += 1

    # -- discovery -------------------------------------------------------------------------

    def _discover(self) -> str:
        data = self.http.request("GET", "/models", during="listing its models")
        models = [str(m["id"]) for m in data.get("data", []) if isinstance(m, dict) and m.get("id")]
        if not models:
            raise ProtocolError(f"{self.kind} at {self.address} lists no models at /v1/models", address=self.address)
        if self.model and self.model not in models:
            raise ConfigError(f"{self.kind} at {self.address} serves {', '.join(models)}, not {self.model!r}")
        name = self.model or models[0]
        if self.prompt_ids is None:
            self.prompt_ids = self._takes_token_ids(name)
            self._check_prompt_logprobs(name)
            self.engine = self._version()
            self.generates = self.route in ("auto", "generate") and self._answers_generate(name)
            if self.route == "generate" and not self.generates:
                raise ConfigError(
                    f"{self.kind} at {self.address} does not answer {GENERATE_PATH} (route=generate): start vLLM "
                    "with --enable-scale-out, or leave the route to auto"
                )
        return name

    def _version(self) -> str:
        """What the server says it is: vLLM answers GET /version."""
        try:
            data = self.http.request("GET", self._root + "/version", during="asking its version", from_root=True)
        except VerifierError:  # (ProtocolError among them) a server with no /version
            return ""
        version = data.get("version")
        return f"vLLM {version}" if isinstance(version, str) else ""

    def _answers_generate(self, model: str) -> bool:
        """Whether it serves vLLM's token-in/token-out route (--enable-scale-out; 403 or 404 otherwise)."""
        if not self.prompt_ids:
            return False
        probe = self.tokenizer.tokenize("The quick brown fox", add_special=True)
        try:
            answer = self.http.request("POST", self._root + GENERATE_PATH, generate_body(model, probe, 1),
                                       during="asking for the token-in/token-out route", from_root=True)
        except VerifierError as exc:
            if exc.code in ("403", "404", "405", "400", "422"):
                return False
            raise
        # the shape a round reads (or ProtocolError now), and how much came from the cache, without which
        # no round could tell its block's rows were computed
        if GenerateRows(answer, probe, 1, self.address).cached is None:
            if self.route == "generate":
                raise ConfigError(
                    f"{self.kind} at {self.address} does not say how many tokens it served from its prefix cache, "
                    "so a round could read rows it never computed (vLLM issue 42019): start vLLM with "
                    "--enable-prompt-tokens-details as well as --enable-scale-out"
                )
            return False
        return True

    @property
    def _root(self) -> str:
        """The path of the server's root under the base URL's (vLLM's /tokenize, /version beside /v1)."""
        return self.http.base.removesuffix("/v1")

    def _takes_token_ids(self, model: str) -> bool:
        probe = self.tokenizer.tokenize("Hello", add_special=True)
        try:
            body = {"model": model, "prompt": probe, "max_tokens": 1, "temperature": 0}
            self.http.request("POST", "/completions", body, during="a token-id prompt")
            return True
        except VerifierError as exc:
            # A validation error naming the prompt (llama-cpp-python answers one with HTTP 500): text only.
            if exc.code in ("400", "422", "500") and "prompt" in str(exc):
                return False
            raise

    def _check_prompt_logprobs(self, model: str) -> None:
        """Prompt log-probabilities must come back; with token-id prompts, also asks for
        tokens named by id and keeps that only if the server answers with them."""
        tokens = self.tokenizer.tokenize("The quick brown fox", add_special=True)
        self.id_names = bool(self.prompt_ids)
        try:
            choice = self._complete(model, tokens, during="a prompt log-probability check")
        except VerifierError as exc:
            if not self.id_names or exc.code not in ("400", "422"):
                raise
            self.id_names = False  # a strict server refusing the unknown field: text names
            choice = self._complete(model, tokens, during="a prompt log-probability check")
        lp = choice.get("logprobs") or {}
        names = lp.get("tokens")
        by_id = isinstance(names, list) and [_token_id(n) for n in names[: len(tokens)]] == tokens
        self.id_names = self.id_names and by_id
        if not isinstance(lp.get("token_logprobs"), list) or len(lp["token_logprobs"]) < 2:
            raise ConfigError(
                f"{self.kind} at {self.address} returns no log-probabilities of prompt tokens (echo with logprobs), "
                "so it cannot verify drafts. Servers that can: vLLM (token ids; start it with --max-logprobs N to "
                "sample with a top-k above 20), llama-cpp-python's server (logits_all on); llama.cpp's own "
                "llama-server ignores echo and cannot. Or run edgekit serve on the target"
            )

    def _check_tokenizer(self, draft_model: str) -> str:
        """The server's tokenization of a probe text (llama-cpp-python's /extras/tokenize, vLLM's
        /tokenize) against the draft's; without either, each round's echoed tokens are checked."""
        ours = self.tokenizer.tokenize(TOKENIZER_PROBE, add_special=True)
        asks = (("/extras/tokenize", {"input": TOKENIZER_PROBE}), ("/tokenize", {"prompt": TOKENIZER_PROBE}))
        for path, body in asks:
            try:
                data = self.http.request("POST", self._root + path, body, during="tokenizing a probe text",
                                         from_root=True)
            except ProtocolError:
                continue  # not this server's endpoint
            theirs = data.get("tokens")
            if isinstance(theirs, list) and all(isinstance(t, int) for t in theirs):
                convention = self._compare_tokenizations(draft_model, ours, theirs)
                if convention and not self.prompt_ids:
                    # Text prompts take the server's convention: the target would read other tokens than ours.
                    raise self._incompatible(draft_model, f"{convention}, and it takes text prompts only, so the "
                                             "target would not read the draft's tokens as they are")
                if path == "/extras/tokenize":  # llama-cpp-python: penalize nothing, so greedy is the argmax
                    self._plain_sampling = {"repeat_penalty": 1.0}
                if convention:
                    # Token-id prompts reach the target as they are, our BOS/EOS included: nothing to adapt.
                    return f"probe text through {path} (same vocabulary; {convention}: token-id prompts carry ours)"
                return f"probe text through {path}"
        return "none at the handshake; each round's echoed tokens"

    def _compare_tokenizations(self, draft_model: str, ours: list[int], theirs: list[int]) -> str:
        """"" where the server tokenizes the probe as we do; a description where only the special
        tokens its tokenizer adds differ (a BOS or EOS added on one side only: a convention, not
        another vocabulary); raises IncompatibleModelsError naming the first token that differs otherwise."""
        if theirs == ours:
            return ""
        fp = self.tokenizer.fingerprint()

        def name(tok: int) -> str:
            text = self.tokenizer.token_bytes(tok, special=True) if 0 <= tok < self.tokenizer.n_vocab else b"?"
            return f"{text.decode('utf-8', errors='replace')!r} (id {tok})"

        edges = []
        a, b = list(ours), list(theirs)
        for token, what, at in ((fp.bos_token, "BOS", 0), (fp.eos_token, "EOS", -1)):
            if token < 0:
                continue
            mine, its = bool(a) and a[at] == token, bool(b) and b[at] == token
            if mine != its:
                side = "adds no" if mine else "adds a"
                edges.append(f"the server's tokenizer {side} {what} {name(token)} where the draft's "
                             f"{'does' if mine else 'does not'}")
            if mine:
                a = a[1:] if at == 0 else a[:-1]
            if its:
                b = b[1:] if at == 0 else b[:-1]
        if a != b:
            at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            mine_s = name(a[at]) if at < len(a) else "the end"
            its_s = f"id {b[at]}" if at < len(b) else "the end"  # its text in the draft's vocabulary would mislead
            raise self._incompatible(
                draft_model, f"the vocabularies differ: the probe text {TOKENIZER_PROBE!r} tokenizes differently from "
                f"its token {at} on (not counting BOS/EOS): the draft's is {mine_s}, the server's {its_s}")
        return "; ".join(edges)

    # -- rounds ------------------------------------------------------------------------------

    def _offset(self, tokens: Sequence[int]) -> int:
        """Text prompts leave the BOS to the server (it adds one)."""
        bos = self.tokenizer.fingerprint().bos_token
        return 1 if not self.prompt_ids and bos >= 0 and tokens and tokens[0] == bos else 0

    def _prompt(self, tokens: Sequence[int]) -> list[int] | str:
        if self.prompt_ids:
            return list(tokens)
        data = b"".join(self.tokenizer.token_bytes(t, special=True) for t in tokens[self._offset(tokens):])
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolError(
                f"the tokens end inside a UTF-8 character, which {self.kind} at {self.address} cannot take as text; "
                "a server that takes token-id prompts can",
                address=self.address,
            ) from None

    def _complete(
        self, model: str, tokens: Sequence[int], *, during: str, max_tokens: int = 1, echo: bool = True,
        logprobs: int = 1,
    ) -> dict:
        body = {"model": model, "prompt": self._prompt(tokens), "max_tokens": max_tokens, "temperature": 0,
                "echo": echo, "logprobs": logprobs} | self._plain_sampling
        if self.id_names:
            body["return_tokens_as_token_ids"] = True
        data = self.http.request("POST", "/completions", body, during=during)
        choices = data.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise ProtocolError(
                f"{self.kind} at {self.address} sent a completion without choices", address=self.address
            )
        return choices[0]

    def _generate_rows(self, tokens: Sequence[int], start: int, k: int) -> GenerateRows | None:
        """A round through vLLM's token-in/token-out route (`_vllm_generate`): one request reading
        the cache. None where the block's rows were not all computed by it (served from the cache)
        or vLLM cannot write the answer (`UNWRITABLE`): that round goes by the prefixes, whose
        one-token completions read the cache and compute each position they are asked for (asking
        again without the cache would compute the whole context: 3.5x the round at 2,048 tokens)."""
        try:
            answer = self.http.request("POST", self._root + GENERATE_PATH, generate_body(self.model, tokens, k),
                                       during="verifying a block", from_root=True)
        except ProtocolError as exc:
            if exc.code == "400" and UNWRITABLE in str(exc):
                self.unwritable += 1
                return None
            raise
        rows = GenerateRows(answer, tokens, start, self.address)
        if not rows.fresh:
            self.cached_block += 1
            return None
        return rows

    def _topk(self, tokens: Sequence[int], start: int, k: int) -> list[dict[int, float]]:
        read = self._generate_rows(tokens, start, k) if self.generates else None
        if read is not None:
            return read.top_k(k)
        if self.generates or self._reads_prefixes(tokens):
            tops_by_prefix = [top for _, top in self._prefix_rows(tokens, start, k)]
            if any(len(top) < k for top in tops_by_prefix):
                raise ProtocolError(f"{self.kind} at {self.address} returned fewer than the {k} likeliest tokens at "
                                    "a position", address=self.address)
            return tops_by_prefix
        tops = self._scored(tokens, start, k)[3]
        offset = self._offset(tokens)
        rows: list[dict[int, float]] = []
        for i in range(start, len(tokens) + 1):  # each block position, and the one after the block
            j = i - offset
            top = tops[j]
            if not isinstance(top, dict) or not top:
                raise ProtocolError(f"{self.kind} at {self.address} sent no top log-probabilities at position {j}",
                                    address=self.address)
            row: dict[int, float] = {}
            for name, value in top.items():
                tok = self._identify(name, list(tokens[:i])) if name else None
                if tok is None or tok in row or not isinstance(value, (int, float)):
                    raise ProtocolError(
                        f"{self.kind} at {self.address} named the target's likely tokens at position {j} ambiguously "
                        f"({name!r}); sampling needs tokens named by id (vLLM's return_tokens_as_token_ids)",
                        address=self.address,
                    )
                row[tok] = float(value)
            rows.append(row)
        return rows

    def _scored(self, tokens: Sequence[int], start: int, k: int) -> tuple[dict, list, list, list]:
        """The completion of `tokens` with the top-k log-probabilities at every position: the
        choice, and its token names, own log-probabilities and top log-probabilities, checked."""
        if start - self._offset(tokens) < 1:
            raise ConfigError("the prompt needs at least one token besides BOS for the server to score the first draft")
        choice = self._complete(self.model, tokens, during="verifying a block", logprobs=k)
        lp = choice.get("logprobs")
        if not isinstance(lp, dict):
            raise ProtocolError(f"{self.kind} at {self.address} sent no logprobs", address=self.address)
        strs, lps, tops = lp.get("tokens"), lp.get("token_logprobs"), lp.get("top_logprobs")
        offset = self._offset(tokens)
        ours = list(tokens[offset:])
        if not (isinstance(strs, list) and isinstance(lps, list) and isinstance(tops, list)) or not (
            len(strs) == len(lps) == len(tops)
        ):
            raise ProtocolError(f"{self.kind} at {self.address} sent malformed logprobs", address=self.address)
        self._check_echo(strs, ours)
        return choice, strs, lps, tops

    def _reads_prefixes(self, tokens: Sequence[int]) -> bool:
        """Whether this round reads its rows as one-token completions of each prefix (`_prefix_rows`):
        needs token-id prompts (a text prefix could tokenize otherwise); "auto" takes them from
        PREFIXES_FROM tokens of context on, where re-reading the context costs more than the requests."""
        if self.route == "prompt-logprobs" or not self.prompt_ids:
            return False
        return self.route == "prefixes" or len(tokens) >= PREFIXES_FROM

    def _prefix_rows(self, tokens: Sequence[int], start: int, k: int) -> list[tuple[int, dict]]:
        """For each block position and the one after the block: the target's greedy token there and
        its top-k log-probabilities, from one-token completions of every prefix, sent at once (the
        server batches them). Unlike prompt log-probabilities these read the server's prefix cache,
        so each prefills only what is not cached: the cost of a round stays flat in the context."""
        ids = {"return_tokens_as_token_ids": True} if self.id_names else {}  # as `_complete`: only to vLLM
        bodies = [{"model": self.model, "prompt": list(tokens[:i]), "max_tokens": 1, "temperature": 0,
                   "echo": False, "logprobs": k} | ids | self._plain_sampling
                  for i in range(start, len(tokens) + 1)]
        rows: list[tuple[int, dict]] = []
        for i, data in zip(range(start, len(tokens) + 1),
                           self.http.many("POST", "/completions", bodies, during="verifying a block")):
            choices = data.get("choices")
            choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
            lp = choice.get("logprobs")
            strs, tops = (lp.get("tokens"), lp.get("top_logprobs")) if isinstance(lp, dict) else (None, None)
            if not (isinstance(strs, list) and isinstance(tops, list) and len(strs) == len(tops) == 1):
                if choice.get("finish_reason") == "stop" and not choice.get("text"):
                    rows.append((self.tokenizer.fingerprint().eos_token, {}))  # a server that drops the EOS
                    continue
                raise ProtocolError(f"{self.kind} at {self.address} sent no log-probabilities with a one-token "
                                    "completion", address=self.address)
            top = tops[0] if isinstance(tops[0], dict) else {}
            context = list(tokens[:i])
            rows.append((self._generated(choice, strs[0], context),
                         {self._identify(name, context): float(v) for name, v in top.items()
                          if name and isinstance(v, (int, float))}))
        return rows

    def _top1(self, tokens: Sequence[int], start: int) -> list[int]:
        read = self._generate_rows(tokens, start, 1) if self.generates else None
        if read is not None:
            return read.best(tokens, start)
        if self.generates or self._reads_prefixes(tokens):
            best: list[int] = []
            for i, (tok, _) in zip(range(start, len(tokens) + 1), self._prefix_rows(tokens, start, 1)):
                best.append(tok)
                if i < len(tokens) and tok != tokens[i]:
                    break  # the block stops at its first rejection
            return best
        choice, strs, lps, tops = self._scored(tokens, start, 1)
        offset = self._offset(tokens)
        best = []
        for i in range(start, len(tokens)):
            j = i - offset
            top, own = tops[j], lps[j]
            if not isinstance(top, dict) or not top or not isinstance(own, (int, float)):
                raise ProtocolError(f"{self.kind} at {self.address} sent no top log-probability at prompt position {j}",
                                    address=self.address)
            peak = max(top.values())
            if own >= peak:
                best.append(tokens[i])  # the draft token is the top-1 (ties go to the draft)
            else:
                best.append(self._identify(max(top, key=lambda name: top[name]), tokens[:i]))
                return best  # the block stops at its first rejection: later positions are never read
        best.append(self._generated(choice, strs[len(tokens) - offset], tokens))
        return best

    def _check_echo(self, strs: list, ours: list[int]) -> None:
        if len(strs) != len(ours) + 1:
            raise ProtocolError(
                f"{self.kind} at {self.address} tokenized the prompt text into {len(strs) - 1} tokens, not our "
                f"{len(ours)}: this sequence cannot be verified through text prompts",
                address=self.address,
            )
        if self.id_names:
            theirs = [_token_id(s) for s in strs[: len(ours)]]
            if theirs != ours:
                j = next(j for j, (a, b) in enumerate(zip(theirs, ours)) if a != b)
                raise ProtocolError(
                    f"{self.kind} at {self.address} echoed prompt token {j} as {strs[j]!r}, ours is {ours[j]}",
                    address=self.address,
                )
            return
        for j, (s, t) in enumerate(zip(strs, ours)):
            mine = self.tokenizer.token_bytes(t).decode("utf-8", errors="ignore")
            if s != mine:
                raise ProtocolError(
                    f"{self.kind} at {self.address} re-tokenized the prompt text: token {j} is {s!r}, ours is "
                    f"{mine!r}; this sequence cannot be verified through text prompts",
                    address=self.address,
                )

    def _generated(self, choice: dict, text: str, tokens: Sequence[int]) -> int:
        if text == "" and choice.get("finish_reason") == "stop":
            return self.tokenizer.fingerprint().eos_token
        return self._identify(text, tokens)

    def _identify(self, name: str, context: Sequence[int]) -> int:
        """The id of the token the server names `name`, the target's greedy choice after `context`."""
        if not self.id_names:
            return self._resolve(name, context)
        tok = _token_id(name)
        if tok is None or not 0 <= tok < self.tokenizer.n_vocab:
            raise ProtocolError(
                f"{self.kind} at {self.address} named the target's token {name!r}, not a token id of the "
                f"{self.tokenizer.n_vocab}-token vocabulary",
                address=self.address,
            )
        return tok

    def _resolve(self, text: str, context: Sequence[int]) -> int:
        """The id of the token the server names by `text`, the target's greedy choice after `context`."""
        if self._by_text is None:
            self._by_text = _reverse_vocabulary(self.tokenizer)
        tok = self._by_text.get(text, -1)
        if tok >= 0:
            return tok
        if tok == -2 and text:
            # Several tokens render as this text (a byte-fallback token and the piece itself, say):
            # take the one the tokenizer itself produces for it.
            canonical = self.tokenizer.tokenize(text, add_special=False)
            if len(canonical) == 1:
                return canonical[0]
        if text == "":  # a control token or a byte piece: let the server's own generation say
            choice = self._complete(self.model, context, during="naming a token", echo=False)
            if choice.get("finish_reason") == "stop" and not choice.get("text"):
                return self.tokenizer.fingerprint().eos_token
        raise ProtocolError(
            f"{self.kind} at {self.address} named the target's token {text!r}, which matches "
            f"{'no' if tok == -1 else 'several'} tokens of the vocabulary; it cannot be identified through this API",
            address=self.address,
        )

    def _generate_ids(self, tokens: Sequence[int], max_tokens: int) -> list[int]:
        choice = self._complete(self.model, tokens, during="generating", max_tokens=max_tokens, echo=False)
        strs = (choice.get("logprobs") or {}).get("tokens")
        if not isinstance(strs, list):
            raise ProtocolError(
                f"{self.kind} at {self.address} sent no tokens with its completion", address=self.address
            )
        ids: list[int] = []
        for i, s in enumerate(strs):
            last = i + 1 == len(strs)
            if s == "" and last and choice.get("finish_reason") == "stop":
                ids.append(self.tokenizer.fingerprint().eos_token)
            else:
                ids.append(self._identify(s, list(tokens) + ids))
        return ids


def _token_id(name: object) -> int | None:
    """N of a token named "token_id:N" (vLLM's return_tokens_as_token_ids), else None."""
    if isinstance(name, str) and name.startswith("token_id:") and name[9:].isdigit():
        return int(name[9:])
    return None


def _reverse_vocabulary(tokenizer: DraftModel) -> dict[str, int]:
    """Token text (as the API renders it: special tokens empty, partial UTF-8 dropped) to id; -2 where ambiguous."""
    out: dict[str, int] = {}
    for tok in range(tokenizer.n_vocab):
        text = tokenizer.token_bytes(tok).decode("utf-8", errors="ignore")
        out[text] = -2 if text in out else tok
    return out
