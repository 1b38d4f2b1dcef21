"""`TritonTransport`: verification on TensorRT-LLM served by Triton Inference Server, through the
`tensorrt_llm` model of tensorrtllm_backend over the KServe v2 HTTP/REST protocol, one request a round.

TensorRT-LLM verifies drafts made elsewhere: a request's `draft_input_ids` become its executor's
ExternalDraftTokensConfig, and the engine accepts the draft's prefix that matches its own greedy
tokens and generates the next one in one step. Its engine must be built with a maximum draft length
(trtllm-build --max_draft_len N), which no Triton endpoint reports: the URL says it
(`?max_draft_len=N`), so the client drafts no longer; a longer block reaching the engine anyway
(the executor refuses it: "Draft tokens length (K) exceeds maximum draft tokens length (N)") is
LimitExceededError naming the limit and that option.

A round sends the committed tokens as `input_ids`, the block as `draft_input_ids` and
`request_output_len` = the block's length + 1, greedy (`runtime_top_k` 1, `beam_width` 1). The
answer is the target's greedy continuation of the committed tokens: the engine's token at each
block position up to the first the draft got wrong (the correction), or all of them and the one
after (the bonus), as `_top1` returns them. A round sends no `end_id`: the engine would stop at
end-of-text and leave it out of its output (TensorRT-LLM issue 2190), where a round needs the
target's token at every position, the end and what follows it included (`decide` ends a round at
an accepted end-of-text itself, or goes on past it where the session asks to). Target-only
generation sends the draft's end-of-sequence id as `end_id` (and `pad_id`) and ends there: an
answer cut short of the tokens asked ended at it, which the executor leaves out (then it is put
back), or holds it followed by padding (some builds: tensorrtllm_backend issue 634; cut after it).
Only an engine that shortens a request past its --max_seq_len (it does so with a warning) makes
a shorter answer mean something else: in a round, that is LimitExceededError; in target-only
generation, it would read as an end of text.

`output_ids` [1, beam, T] holds the input first unless the model's `exclude_input_in_output`
parameter is true: read from the model's configuration (`GET /v2/models/{model}/config`) where it
says, else from the first answer that settles it, then kept: a round's always does (with no end_id
the engine generates every token asked, so an answer holding the input is longer), a target-only
generation's where it is longer than the tokens asked or does not start with the input.
`sequence_length` [1, beam] says how much of `output_ids` is the sequence (the rest is padding).

Written against the `tensorrt_llm` model's documented tensors (tensorrtllm_backend's
docs/model_config.md and all_models/inflight_batcher_llm/tensorrt_llm/config.pbtxt) and the
KServe v2 protocol, and tested against a local server that follows them (tests/triton_fake.py):
TensorRT-LLM and Triton need an NVIDIA GPU, which the machines this was built on lack; not yet run
against a real deployment. Greedy only: TensorRT-LLM's draft-logits acceptance (`draft_logits`,
`draft_acceptance_threshold`) was not built.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from urllib.parse import quote

from ..errors import (
    ConfigError,
    LimitExceededError,
    ProtocolError,
    VerifierError,
    VerifierUnavailableError,
)
from ..protocol import Fingerprint, OpenedSession, OpenRequest, ServerInfo
from ..runtime import DraftModel
from ._http import HttpJson
from ._stateless import StatelessTransport

__all__ = ["DEFAULT_MODEL", "TritonTransport", "triton_transport"]

DEFAULT_MODEL = "tensorrt_llm"  # tensorrtllm_backend's name for the model that takes token ids
DEFAULT_MAX_DRAFT_LEN = 16

# The documented types of the inputs a round or a generation sends; a model whose metadata says
# otherwise (older configurations made request_output_len and end_id UINT32) gets its own.
_TYPES = {
    "input_ids": "INT32",
    "input_lengths": "INT32",
    "request_output_len": "INT32",
    "draft_input_ids": "INT32",
    "end_id": "INT32",
    "pad_id": "INT32",
    "beam_width": "INT32",
    "runtime_top_k": "INT32",
    "streaming": "BOOL",
}
_NEEDED_INPUTS = ("input_ids", "input_lengths", "request_output_len")
_NEEDED_OUTPUTS = ("output_ids", "sequence_length")

# The engine's refusal of a block past its maximum draft length, in the executor's words
# ("maximum draft tokens length (N)", "maximum number of draft tokens (N)") or a configuration's
# ("max_draft_len N"): the number is the limit.
_DRAFT_LIMIT = re.compile(r"max(?:imum)?[ _](?:number of )?draft[ _](?:tokens?[ _]?)?(?:len(?:gth)?)?\D{0,8}?(\d+)",
                          re.IGNORECASE)
_INPUT_LIMIT = re.compile(r"exceeds maximum input length \((\d+)\)", re.IGNORECASE)


class _TritonHttp(HttpJson):
    """Triton's answers that are not JSON objects: its health endpoints answer 200 with no body,
    its repository index a JSON array (here under "models")."""

    def _parse(self, status: int, raw: bytes, during: str) -> dict:
        text = raw.decode("utf-8", errors="replace").strip()
        if status < 400 and not text:
            return {}
        if status < 400 and text.startswith("["):
            try:
                return {"models": json.loads(text)}
            except json.JSONDecodeError:
                pass
        return super()._parse(status, raw, during)


class TritonTransport(StatelessTransport):
    backend = "trtllm"
    kind = "Triton server"
    samples = False  # greedy acceptance only (see open_session)

    def __init__(self, url: str, tokenizer: DraftModel, *, timeout: float = 30.0, token: str | None = None,
                 model: str = DEFAULT_MODEL, max_draft_len: int | None = None, max_context: int = 4096) -> None:
        super().__init__(_TritonHttp(url, timeout=timeout, token=token, kind=self.kind), tokenizer,
                         max_context=max_context, max_block=max_draft_len or DEFAULT_MAX_DRAFT_LEN)
        self.served = model  # the model asked for by name; `model` is what its metadata calls it
        self.max_draft_len = max_draft_len  # the engine's, as the URL says; None: not said
        self.end_id: int | None = None  # the draft's end of sequence (its fingerprint's, at the handshake)
        self.exclude_input: bool | None = None  # the model's exclude_input_in_output; None: not yet known
        self._types: dict[str, str] = {}  # the model's inputs and their datatypes, from its metadata

    @property
    def _model_path(self) -> str:
        return f"/v2/models/{quote(self.served, safe='')}"

    # -- discovery -----------------------------------------------------------------------

    def _ping(self) -> None:
        self._ready()

    def _ready(self) -> None:
        try:
            self.http.request("GET", "/v2/health/ready", during="asking whether it is ready")
        except ProtocolError as exc:
            if exc.code == "404":
                raise ProtocolError(
                    f"{self.kind} at {self.address} has no /v2/health/ready: is the URL Triton's HTTP port "
                    "(8000 by default), with no path?", address=self.address, code="404"
                ) from None
            if exc.code == "400":  # Triton's answer while its models are loading
                raise VerifierUnavailableError(
                    f"{self.kind} at {self.address} is up but not ready (its models still loading?)",
                    address=self.address, code="UNAVAILABLE",
                ) from None
            raise

    def _discover(self) -> str:
        self._ready()
        try:
            meta = self.http.request("GET", self._model_path, during=f"asking for model {self.served!r}")
        except ProtocolError as exc:
            if exc.code in ("400", "404"):  # Triton's answers for a model it does not serve
                raise self._unknown_model() from None
            raise
        inputs = {i["name"]: i for i in meta.get("inputs") or ()
                  if isinstance(i, dict) and isinstance(i.get("name"), str)}
        outputs = {o.get("name") for o in meta.get("outputs") or () if isinstance(o, dict)}
        if "draft_input_ids" not in inputs:
            takes = ", ".join(sorted(inputs)) or "nothing it lists"
            raise ConfigError(
                f"model {self.served!r} at {self.address} takes no draft_input_ids (it takes {takes}): verifying "
                "drafts needs TensorRT-LLM's tensorrt_llm model (tensorrtllm_backend's inflight_batcher_llm), "
                "its engine built with trtllm-build --max_draft_len N; name it in the URL: "
                "trtllm+http://HOST:PORT?model=tensorrt_llm&max_draft_len=N"
            )
        lacking = [n for n in _NEEDED_INPUTS if n not in inputs] + [n for n in _NEEDED_OUTPUTS if n not in outputs]
        if lacking:
            raise ConfigError(
                f"model {self.served!r} at {self.address} lacks {', '.join(lacking)}, which the tensorrt_llm model "
                "of tensorrtllm_backend has: is it that model?"
            )
        self._types = {name: str(i.get("datatype") or _TYPES.get(name, "INT32")) for name, i in inputs.items()}
        self._read_config()
        name = meta.get("name")
        return name if isinstance(name, str) and name else self.served

    def _read_config(self) -> None:
        """The model's exclude_input_in_output and whether it reuses the KV cache of a shared prefix
        (enable_kv_cache_reuse), where its configuration (a Triton extension) says."""
        try:
            config = self.http.request(
                "GET", f"{self._model_path}/config", during="asking for its model's configuration"
            )
        except ProtocolError:
            return  # not offered: the answers settle the convention
        params = config.get("parameters")
        if not isinstance(params, dict):
            return
        self.exclude_input = _flag(params, "exclude_input_in_output")
        self.prefix_cache = _flag(params, "enable_kv_cache_reuse") is True

    def _unknown_model(self) -> ConfigError:
        """That the model named is not served, naming those that are, as the repository index lists them."""
        try:
            index = self.http.request("POST", "/v2/repository/index", {}, during="listing its models").get("models")
        except VerifierError:
            index = None
        if not isinstance(index, list):
            served = "it does not list its models (the repository extension is off)"
        else:
            names = [f"{m.get('name')} ({m.get('state', 'state unknown')})" for m in index if isinstance(m, dict)]
            served = f"it serves: {', '.join(names)}" if names else "it serves no model"
        return ConfigError(
            f"the {self.kind} at {self.address} serves no model {self.served!r}; {served}. Name TensorRT-LLM's "
            "tensorrt_llm model (built with trtllm-build --max_draft_len N) in the URL: ?model=NAME"
        )

    def _check_tokenizer(self, draft_model: str) -> str:
        return ("none (the tensorrt_llm model takes token ids only; the ensemble's preprocessing model, "
                "if deployed, is not asked)")

    def handshake(self, draft: Fingerprint, *, draft_model: str, draft_hidden_size: int) -> ServerInfo:
        self.end_id = draft.eos_token
        return super().handshake(draft, draft_model=draft_model, draft_hidden_size=draft_hidden_size)

    def open_session(self, request: OpenRequest) -> OpenedSession:
        if request.mode == "sample":
            raise ConfigError(
                f"the {self.kind} at {self.address} verifies greedily: TensorRT-LLM's external-draft verification "
                "is driven here with greedy acceptance only (its draft_logits-based acceptance, which could "
                "sample, was not built); use mode='greedy', or an edgekit verifier to sample"
            )
        return super().open_session(request)

    # -- a request -------------------------------------------------------------------------

    def _infer(self, prompt: list[int], new: int, *, draft: Sequence[int] = (), end: bool, during: str) -> list[int]:
        """The tokens the engine generates after `prompt` (at most `new`), greedily, verifying `draft`;
        with `end`, stopping at the draft's end of sequence."""
        if not prompt:
            raise ProtocolError("the engine needs at least one token of input", address=self.address)
        if not self._types:
            self._discover()
        inputs = [
            self._tensor("input_ids", prompt),
            self._tensor("input_lengths", [len(prompt)]),
            self._tensor("request_output_len", [new]),
            *(self._tensor(n, [1]) for n in ("beam_width", "runtime_top_k") if n in self._types),  # greedy
        ]
        if "streaming" in self._types:
            inputs.append(self._tensor("streaming", [False]))
        if draft:
            inputs.append(self._tensor("draft_input_ids", list(draft)))
        if end:
            end_id = self.end_id if self.end_id is not None else self.tokenizer.fingerprint().eos_token
            inputs.extend(self._tensor(n, [end_id]) for n in ("end_id", "pad_id") if n in self._types)
        body = {"inputs": inputs, "outputs": [{"name": n} for n in _NEEDED_OUTPUTS]}
        try:
            data = self.http.request("POST", f"{self._model_path}/infer", body, during=during)
        except VerifierError as exc:
            limit = self._limit(exc, len(draft))
            if limit is None:
                raise
            raise limit from None
        return self._generated(data, prompt, new, ends=end)

    def _tensor(self, name: str, values: list) -> dict:
        """One input of a batch of one: [1, n] (the model's batch dimension first)."""
        return {"name": name, "shape": [1, len(values)], "datatype": self._types.get(name, _TYPES[name]),
                "data": values}

    def _limit(self, exc: VerifierError, drafted: int) -> LimitExceededError | None:
        """The engine's refusal of a request past one of its build limits, as LimitExceededError."""
        if exc.code not in ("400", "500"):  # how Triton answers a request its backend refused
            return None
        said = str(exc).split(f"HTTP {exc.code}: ", 1)[-1].split("; the server", 1)[0]  # the engine's words
        draft_limit = _DRAFT_LIMIT.search(said) if "draft" in said.lower() else None
        if draft_limit is not None:
            n = int(draft_limit.group(1))
            fix = (f"the client drafts no more when the URL says so: ?max_draft_len={n}" if n else
                   "its engine was built without draft tokens: rebuild it with trtllm-build --max_draft_len N")
            return LimitExceededError(
                f"the {self.kind} at {self.address} takes at most {n} draft tokens a round (its engine's "
                f"max_draft_len) and was sent {drafted}; {fix}. It said: {said}",
                address=self.address, code=exc.code,
            )
        input_limit = _INPUT_LIMIT.search(said)
        if input_limit is not None:
            return LimitExceededError(
                f"the {self.kind} at {self.address} takes at most {input_limit.group(1)} tokens of input (its "
                f"engine's trtllm-build --max_input_len). It said: {said}", address=self.address, code=exc.code,
            )
        return None

    def _generated(self, data: dict, prompt: list[int], asked: int, *, ends: bool) -> list[int]:
        """The generated tokens of an answer to `asked` tokens after `prompt` (`ends`: stopping at
        end_id): `output_ids`' first beam, `sequence_length` of it, without the input where the model
        returns it."""
        outs = {o.get("name"): o for o in data.get("outputs") or () if isinstance(o, dict)}
        ids, lengths = outs.get("output_ids"), outs.get("sequence_length")
        if ids is None or lengths is None:
            raise ProtocolError(f"{self.kind} at {self.address} sent no output_ids and sequence_length",
                                address=self.address)
        flat, shape = _ints(ids.get("data"), self.address), ids.get("shape")
        width = shape[-1] if isinstance(shape, list) and shape and isinstance(shape[-1], int) else len(flat)
        n = _ints(lengths.get("data"), self.address)
        if not n or not 0 <= n[0] <= width <= len(flat):
            raise ProtocolError(f"{self.kind} at {self.address} sent a sequence_length {n[:1]} that does not fit "
                                f"output_ids of {width}", address=self.address)
        seq = flat[: n[0]]  # the first beam, without its padding
        starts = seq[: len(prompt)] == prompt
        exclude = self.exclude_input
        if exclude is None:  # not declared: the answer settles it where it can
            if not ends or len(seq) > asked or not starts:
                # With no end_id the engine generates every token asked: the input and them are more.
                exclude = self.exclude_input = len(seq) <= asked if not ends else not starts
            else:  # tokens that repeat the whole input, or the input and tokens: the backend's default
                exclude = False
        if exclude:
            return seq
        if not starts:
            raise ProtocolError(f"{self.kind} at {self.address} sent output_ids that do not start with the input, "
                                "though its model includes the input in them (exclude_input_in_output false)",
                                address=self.address)
        return seq[len(prompt):]

    # -- what the stateless base asks ------------------------------------------------------

    def _top1(self, tokens: Sequence[int], start: int) -> list[int]:
        prompt, draft = list(tokens[:start]), list(tokens[start:])
        need = len(draft) + 1
        out = self._infer(prompt, need, draft=draft, end=False, during="verifying a block")
        best: list[int] = []
        for j, tok in enumerate(out[:need]):
            best.append(tok)
            if j == len(draft) or tok != draft[j]:
                return best
        # Short of the tokens asked while agreeing with the draft: without an end_id the engine stops
        # only at its maximum sequence length, where it cuts the tokens asked (with a warning).
        raise LimitExceededError(
            f"the {self.kind} at {self.address} generated {len(out)} of the {need} tokens asked after {len(prompt)} "
            "tokens: the sequence reached its engine's maximum length (trtllm-build --max_seq_len, counting the "
            "draft tokens of a step)", address=self.address,
        )

    def _generate_ids(self, tokens: Sequence[int], max_tokens: int) -> list[int]:
        out = self._infer(list(tokens), max_tokens, end=True, during="generating")
        end_id = self.end_id if self.end_id is not None else self.tokenizer.fingerprint().eos_token
        if end_id in out:
            return out[: out.index(end_id) + 1]  # what follows it is padding (some builds)
        if len(out) < max_tokens:
            return [*out, end_id]  # it stopped at end_id, which the executor leaves out of its output
        return out[:max_tokens]


def triton_transport(url: str, tokenizer: DraftModel, *, timeout: float, token: str | None) -> TritonTransport:
    """A `TritonTransport` from `http(s)://HOST:PORT[?model=NAME&max_draft_len=N]` (`connect`'s
    `trtllm+` URLs, the scheme's prefix off)."""
    base, _, query = url.partition("?")
    options = dict(opt.partition("=")[::2] for opt in query.split("&") if opt)
    model, draft = options.pop("model", DEFAULT_MODEL), options.pop("max_draft_len", None)
    if options or not model or (draft is not None and not (draft.isdigit() and 1 <= int(draft) <= 4096)):
        raise ConfigError(
            f"{url!r}: a trtllm verifier takes ?model=NAME (default {DEFAULT_MODEL}) and max_draft_len=N "
            "(N >= 1: the engine's trtllm-build --max_draft_len), nothing else"
        )
    return TritonTransport(base, tokenizer, timeout=timeout, token=token, model=model,
                           max_draft_len=int(draft) if draft is not None else None)


def _flag(params: dict, name: str) -> bool | None:
    """A model configuration's boolean parameter: None where unset (a template's "${...}" left in)."""
    entry = params.get(name)
    value = entry.get("string_value") if isinstance(entry, dict) else None
    if not isinstance(value, str) or value.strip().lower() not in ("true", "false", "1", "0"):
        return None
    return value.strip().lower() in ("true", "1")


def _ints(data: object, address: str) -> list[int]:
    """A tensor's data as a flat list of ints (KServe's JSON flattens it; nested lists are read too)."""
    flat: list[int] = []
    stack = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(reversed(item))
        elif isinstance(item, int) and not isinstance(item, bool):
            flat.append(item)
        else:
            raise ProtocolError(f"Triton server at {address} sent a tensor holding {item!r}, not token ids",
                                address=address)
    return flat
