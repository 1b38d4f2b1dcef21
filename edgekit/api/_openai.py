"""The OpenAI API's shapes: requests read into a generation, and responses, chunks and errors.

What a request may ask (https://platform.openai.com/docs/api-reference): `model`, `prompt`
(completions) or `messages` (chat), `max_tokens` / `max_completion_tokens`, `temperature` (0:
greedy, the target's exact argmax; above 0: lossless speculative sampling at that
temperature), `top_p`, `frequency_penalty`, `presence_penalty`, `logit_bias` (token ids as
strings, -100 to 100), vLLM's `top_k` (-1 or 0: all), `min_p` and `repetition_penalty` (all
applied by the verifier to the target's logits and by the device to the draft's: the output is
the target's own sampling with them, see `edgekit.Sampler`; the penalties count the last 64
tokens of the context, the prompt's included, as llama.cpp's server does), `seed`, `stop`
(strings, up to 4), `n` (1), `stream`, `stream_options.include_usage`, `user`. Anything else is
refused with a 400 that names it, rather than silently ignored.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..client import GenerationStats
from ..errors import ApiError
from ..protocol import MAX_TOP_LOGPROBS, TokenLogprobs
from ._answer import Job, finish_reason, sampling_fields

__all__ = ["ApiError", "Chunks", "Request", "chunk", "completion", "error_body", "parse", "usage"]

_SAMPLER = ("top_p", "top_k", "min_p", "repetition_penalty", "frequency_penalty", "presence_penalty", "logit_bias")
_COMMON = {"model", "max_tokens", "max_completion_tokens", "temperature", "seed", "stop", "n", "stream",
           "stream_options", "user", "logprobs", "top_logprobs", "echo", *_SAMPLER}
_FIELDS = {"completion": _COMMON | {"prompt", "suffix", "best_of"}, "chat": _COMMON | {"messages"}}


def error_body(e: ApiError) -> dict:
    return {"error": {"message": str(e), "type": e.kind, "param": e.param, "code": e.code}}


@dataclass(frozen=True)
class Request:
    kind: str  # "completion" or "chat"
    model: str
    prompt: str | list[int] | list[dict]  # text or token ids (completion), messages (chat)
    max_tokens: int
    temperature: float
    seed: int | None
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    user: str | None
    sampling: dict[str, Any] = field(default_factory=dict)  # GenerationConfig's sampler fields asked for
    top_logprobs: int | None = None  # the target's log-probabilities with this many alternatives; None: not asked
    # the output's (token id, log-probabilities), as the answer comes (`pieces` fills it)
    tokens: list[tuple[int, TokenLogprobs]] = field(default_factory=list, compare=False)

    def overrides(self) -> dict[str, Any]:
        """GenerationConfig fields for this request."""
        mode = "greedy" if self.temperature == 0 else "sample"
        gen: dict[str, Any] = {"max_tokens": self.max_tokens, "mode": mode, "seed": self.seed, **self.sampling}
        if self.top_logprobs is not None:
            gen["logprobs"] = self.top_logprobs
        if mode == "sample":
            gen["temperature"] = self.temperature
        return gen

    @property
    def job(self) -> Job:
        return Job(self.prompt, self.kind == "chat", self.overrides(), self.stop,
                   self.tokens if self.top_logprobs is not None else None)


def parse(kind: str, body: Any, *, models: tuple[str, ...], max_tokens_limit: int, vocab_size: int) -> Request:
    """A request body, checked; ApiError (400, or 404 for an unknown model) otherwise."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    body = {k: v for k, v in body.items() if v is not None}  # OpenAI's nulls mean "the default"
    unknown = sorted(set(body) - _FIELDS[kind])
    if unknown:
        raise ApiError(400, f"unsupported parameter(s): {', '.join(unknown)}", param=unknown[0])
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ApiError(400, "'model' is required", param="model")
    if model not in models:
        raise ApiError(404, f"the model '{model}' does not exist here; available: {', '.join(models)}",
                       param="model", code="model_not_found")
    for name, allowed in (("echo", (None, False)), ("suffix", (None, "")), ("best_of", (None, 1))):
        if body.get(name) not in allowed:
            raise ApiError(400, f"'{name}' is not supported by speculative verification here", param=name)
    n = body.get("n", 1)
    if n != 1:
        raise ApiError(400, "only n=1 is supported", param="n")
    prompt: Any
    if kind == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and _text(m.get("content")) is not None
            for m in messages
        ):
            raise ApiError(400, "'messages' must be a non-empty list of {role, content} with text content",
                           param="messages")
        prompt = [{"role": m["role"], "content": _text(m.get("content"))} for m in messages]
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not (isinstance(prompt, str) and prompt) and not (
            isinstance(prompt, list) and prompt and all(_int(t) and 0 <= t < vocab_size for t in prompt)
        ):
            raise ApiError(400, f"'prompt' must be a non-empty string or a list of token ids below {vocab_size} "
                           "(one prompt)", param="prompt")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is None:  # OpenAI's defaults: 16 for a completion, up to the context for a chat
        max_tokens = 16 if kind == "completion" else max_tokens_limit
    if not _int(max_tokens) or not 1 <= max_tokens <= max_tokens_limit:
        raise ApiError(400, f"'max_tokens' must be an integer from 1 to {max_tokens_limit}", param="max_tokens")
    temperature = body.get("temperature", 1.0)
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not 0 <= temperature <= 2:
        raise ApiError(400, "'temperature' must be a number from 0 to 2", param="temperature")
    seed = body.get("seed")
    if seed is not None and not _int(seed):
        raise ApiError(400, "'seed' must be an integer", param="seed")
    if seed is not None:
        seed &= (1 << 63) - 1  # OpenAI allows negative seeds; the sampler's streams want one in range
    stop = body.get("stop")
    stops = (stop,) if isinstance(stop, str) else tuple(stop) if isinstance(stop, list) else ()
    if stop is not None and (not stops or len(stops) > 4 or not all(isinstance(s, str) and s for s in stops)):
        raise ApiError(400, "'stop' must be a string or a list of up to 4 non-empty strings", param="stop")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise ApiError(400, "'stream_options' must be an object", param="stream_options")
    user = body.get("user")
    return Request(kind, model, prompt, max_tokens, float(temperature), seed, stops, bool(body.get("stream")),
                   bool(options.get("include_usage")), user if isinstance(user, str) else None,
                   sampling_fields(body, vocab_size, {n: n for n in _SAMPLER}), _top_logprobs(kind, body))


def _top_logprobs(kind: str, body: dict) -> int | None:
    """How many alternatives the target's log-probabilities come with; None: not asked. A
    completion asks with `logprobs: N`, a chat with `logprobs: true` and `top_logprobs: N`."""
    asked, top = body.get("logprobs"), body.get("top_logprobs")
    if kind == "completion":
        if top is not None:
            raise ApiError(400, "'top_logprobs' is a chat parameter; a completion asks with 'logprobs': N",
                           param="top_logprobs")
        if asked is None or asked is False:
            return None
        top, name = asked, "logprobs"
    else:
        if not isinstance(asked, bool) and asked is not None:
            raise ApiError(400, "'logprobs' must be true or false", param="logprobs")
        if not asked:
            if top:
                raise ApiError(400, "'top_logprobs' needs 'logprobs': true", param="top_logprobs")
            return None
        top, name = top or 0, "top_logprobs"
    if not _int(top) or not 0 <= top <= MAX_TOP_LOGPROBS:
        raise ApiError(400, f"'{name}' must be an integer from 0 to {MAX_TOP_LOGPROBS}", param=name)
    return top


def logprobs_object(req: Request, tokens: Sequence[tuple[int, TokenLogprobs]], text_of: Callable[[int], str],
                    offset: int = 0) -> dict | None:
    """OpenAI's `logprobs` of a choice for `tokens` (None where not asked): a completion's
    tokens, token_logprobs, top_logprobs and text_offset from `offset`; a chat's content list."""
    if req.top_logprobs is None:
        return None
    if req.kind == "chat":
        def entry(tok: int, lp: float) -> dict:
            text = text_of(tok)
            return {"token": text, "logprob": lp, "bytes": list(text.encode())}

        return {"content": [{**entry(tok, t.logprob), "top_logprobs": [entry(i, v) for i, v in t.top]}
                            for tok, t in tokens]}
    texts = [text_of(tok) for tok, _ in tokens]
    offsets = [offset + sum(len(x) for x in texts[:i]) for i in range(len(texts))]
    return {"tokens": texts, "token_logprobs": [t.logprob for _, t in tokens],
            "top_logprobs": [{text_of(i): v for i, v in t.top} for _, t in tokens] if req.top_logprobs else None,
            "text_offset": offsets}


def _int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _text(content: object) -> str | None:
    """A message's text: a string, or the text of a list of content parts (images are refused)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    return None


def usage(stats: GenerationStats) -> dict:
    """OpenAI's usage, with vLLM's per-request speculative-decoding figures and edgekit's own."""
    histogram = Counter(r.accepted for r in stats.rounds_detail if r.drafted > 0)
    top = max(histogram, default=0)
    drafting_rounds = sum(histogram.values())
    return {
        "prompt_tokens": stats.prompt_tokens,
        "completion_tokens": stats.completion_tokens,
        "total_tokens": stats.prompt_tokens + stats.completion_tokens,
        "mean_acceptance_length": 1 + stats.accepted / drafting_rounds if drafting_rounds else 1.0,  # vLLM's
        "draft_acceptance_rate": stats.acceptance_rate,
        "num_draft_tokens": stats.drafted,
        "num_accepted_draft_tokens": stats.accepted,
        "acceptance_histogram": [histogram.get(k, 0) for k in range(top + 1)] if histogram else [],  # none drafted
        "rounds": stats.rounds,  # with those that drafted nothing (plain target steps)
        "target_passes_per_token": stats.target_passes_per_token,
        "wasted_draft_tokens": stats.wasted_draft_tokens,
        "tokens_per_second": stats.tokens_per_second,
    }


def completion(req: Request, text: str, stats: GenerationStats | None, *,
               text_of: Callable[[int], str] = str) -> dict:
    """The whole answer; `text_of` gives a token's text (for its log-probabilities)."""
    choice: dict = {"index": 0, "finish_reason": finish_reason(stats.finish_reason if stats else None),
                    "logprobs": logprobs_object(req, req.tokens, text_of)}
    if req.kind == "chat":
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    out: dict[str, Any] = {"id": new_id(req.kind),
                           "object": "chat.completion" if req.kind == "chat" else "text_completion",
                           "created": int(time.time()), "model": req.model, "choices": [choice]}
    if stats is not None:
        out["usage"] = usage(stats)
    return out


class Chunks:
    """A streamed answer's chunks, piece by piece: the first carries the role (even of an empty
    answer), the last the finish, and then the usage where it was asked for. A chunk's
    log-probabilities are those of the tokens its text completes: text held back (it may begin a
    stop string) holds back its tokens' too, so a stop string that cuts it never leaves the
    log-probabilities of text that was not sent; the last text chunk has the rest."""

    def __init__(self, req: Request, *, text_of: Callable[[int], str] = str) -> None:
        self.req, self.rid, self.first = req, new_id(req.kind), True
        self.text_of, self.sent, self.offset = text_of, 0, 0  # tokens whose log-probabilities went, and their text
        self.shown = 0  # characters of text sent

    def __call__(self, text: str, stats: GenerationStats | None) -> list[dict]:
        out = []
        left = self.req.tokens[self.sent:]
        if text or self.first or (stats is not None and left):
            self.shown += len(text)
            new = left if stats is not None else self._completed(left)
            logprobs = logprobs_object(self.req, new, self.text_of, self.offset)
            self.sent += len(new)
            self.offset += sum(len(self.text_of(tok)) for tok, _ in new)
            out.append(chunk(self.req, self.rid, text=text, first=self.first, logprobs=logprobs))
            self.first = False
        if stats is not None:
            out.append(chunk(self.req, self.rid, done=True, finish=stats.finish_reason))
            if self.req.include_usage:
                out.append(chunk(self.req, self.rid, stats=stats))
        return out

    def _completed(self, tokens: list[tuple[int, TokenLogprobs]]) -> list[tuple[int, TokenLogprobs]]:
        """The first of `tokens` whose text lies within the text sent so far."""
        end, n = self.offset, 0
        for tok, _ in tokens:
            end += len(self.text_of(tok))
            if end > self.shown:
                break
            n += 1
        return tokens[:n]


def chunk(req: Request, rid: str, *, text: str | None = None, first: bool = False, finish: str | None = None,
          done: bool = False, stats: GenerationStats | None = None, logprobs: dict | None = None) -> dict:
    """One server-sent event's data: a piece of text, the finish, or (choices empty) the usage."""
    out: dict = {"id": rid, "object": "chat.completion.chunk" if req.kind == "chat" else "text_completion",
                 "created": int(time.time()), "model": req.model}
    if stats is not None:
        out["choices"] = []
        out["usage"] = usage(stats)
        return out
    choice: dict = {"index": 0, "finish_reason": finish_reason(finish) if done else None, "logprobs": logprobs}
    if req.kind == "chat":
        delta: dict = {}
        if first:
            delta["role"] = "assistant"
        if text:
            delta["content"] = text
        choice["delta"] = delta
    else:
        choice["text"] = text or ""
    out["choices"] = [choice]
    if req.include_usage:
        out["usage"] = None
    return out


def new_id(kind: str) -> str:
    return f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex[:24]}"
