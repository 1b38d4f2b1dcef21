"""Ollama's API shapes (https://github.com/ollama/ollama/blob/main/docs/api.md): requests read
into a generation, and the answers, streamed as JSON lines or whole, with Ollama's figures.

`/api/generate` takes a `prompt`. Ollama renders it through the model's template; here, a model
with a chat template gets it as the user's turn (after `system`, if any), as `/api/chat` would;
a model without one (a base model, such as gemma-3-270m) gets the text as it is (`system`
before it, as the plain chat turns place it), as Ollama's default template `{{ .Prompt }}`
does. With `raw: true` the prompt goes as it is, and a `system` with it is refused (nothing
would place it). `/api/chat` renders its `messages` ({role, content}) with the chat template,
as `EdgeClient.chat` does. An empty prompt, or no messages, generates nothing: the answer is
done at once with `done_reason` "load", Ollama's way to load a model. Answers stream (JSON
lines) unless `stream` is false; the last object is `done`, with `done_reason` ("stop" or
"length") and the figures, durations in nanoseconds: `total_duration` (the generation's wall
time), `prompt_eval_duration` (opening the verifier session, both prefills, or until the first
token of a target-only stream), `eval_duration` (the rest) and
`load_duration` 0 (the models are loaded when `edgekit api` starts). No `context` is returned.

Options honoured: `temperature` (0: greedy, the target's exact argmax; above 0: lossless
speculative sampling; absent: Ollama's 0.8), `top_k`, `top_p`, `min_p`, `repeat_penalty`,
`repeat_last_n`, `frequency_penalty`, `presence_penalty` (edgekit's sampler; absent: off, as in
`edgekit generate`, not Ollama's defaults top_k 40, top_p 0.9 and repeat_penalty 1.1, so the
text is the target's own distribution's unless asked otherwise; greedy decoding takes the most
likely token after the penalties, which top_k, top_p and min_p never drop), `num_predict`
(absent, -1 or -2: the most `edgekit api --max-tokens` allows), `seed` (negative: a random
one), `stop`.

Refused with a 400 that names them, since each would change the text and is not done here:
the options `mirostat` (but 0), `typical_p` and `tfs_z` (but 1), and options Ollama does not
have; `format` (JSON mode and schemas), `images`, `tools`, `think` (true or a level: no model
served here thinks; false is taken), `logprobs`, `suffix`, `template`, `context`, and fields
Ollama's requests do not have. Accepted and ignored, since they tune how a local Ollama runs
and not what it answers: `keep_alive`, and the options `num_ctx`, `num_batch`, `num_gpu`,
`main_gpu`, `num_thread`, `num_keep`, `numa`, `low_vram`, `f16_kv`, `logits_all`,
`vocab_only`, `use_mmap`, `use_mlock`, `embedding_only`, `penalize_newline` (ignored by Ollama
itself), `mirostat_tau` and `mirostat_eta` (read only by mirostat).

Models are named as `/v1/models` lists them; `NAME:latest` is NAME. Errors are Ollama's
`{"error": "..."}` with the HTTP status.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from ..__version__ import __version__
from ..client import ChatTemplate, GenerationStats
from ..errors import ApiError
from ._answer import Job, finish_reason, sampling_fields

__all__ = ["Request", "error_body", "lines", "models", "parse", "ps", "reply", "show", "timestamp", "version"]

_FIELDS = {
    "generate": {"model", "prompt", "suffix", "system", "template", "context", "stream", "raw", "format", "images",
                 "options", "keep_alive", "think", "logprobs", "top_logprobs"},
    "chat": {"model", "messages", "tools", "stream", "format", "options", "keep_alive", "think", "logprobs",
             "top_logprobs"},
}
# Fields that change the answer in ways not done here: refused unless they are their "off" value.
_OFF: dict[str, tuple[Any, ...]] = {
    "format": ("",), "images": ([],), "tools": ([],), "think": (False,), "logprobs": (False,), "top_logprobs": (0,),
    "suffix": ("",), "template": ("",), "context": ([],),
}
_WHY = {
    "format": "JSON mode and schemas are not done here",
    "images": "no model served here reads images",
    "tools": "tool calls are not done here",
    "think": "no model served here thinks",
    "logprobs": "log-probabilities are not returned here",
    "top_logprobs": "log-probabilities are not returned here",
    "suffix": "fill-in-the-middle is not done here",
    "template": "templates are the model's own chat template here",
    "context": "no context is returned here: send the conversation to /api/chat",
}
_IGNORED = frozenset({"num_ctx", "num_batch", "num_gpu", "main_gpu", "num_thread", "num_keep", "numa", "low_vram",
                      "f16_kv", "logits_all", "vocab_only", "use_mmap", "use_mlock", "embedding_only",
                      "penalize_newline", "mirostat_tau", "mirostat_eta"})
_NEUTRAL = {"mirostat": 0, "typical_p": 1, "tfs_z": 1}  # samplers not done here, refused unless off
# Ollama's sampling options and the GenerationConfig fields they set.
_SAMPLER = {"top_k": "top_k", "top_p": "top_p", "min_p": "min_p", "repeat_penalty": "repetition_penalty",
            "repeat_last_n": "penalty_last_n", "frequency_penalty": "frequency_penalty",
            "presence_penalty": "presence_penalty"}
_TRUNCATING = frozenset({"top_k", "top_p", "min_p"})  # they keep the most likely token: nothing to greedy decoding
_INTEGER = frozenset({"top_k", "repeat_last_n", "num_predict", "seed", "mirostat"})
_OPTIONS = _IGNORED | set(_NEUTRAL) | set(_SAMPLER) | {"temperature", "num_predict", "seed", "stop"}
_MAX_STOPS = 16


@dataclass(frozen=True)
class Request:
    kind: str  # "generate" or "chat"
    model: str  # as asked: Ollama answers with the name it was given
    job: Job | None  # None: no prompt (no messages), only a model to load
    stream: bool


def error_body(e: ApiError) -> dict:
    return {"error": str(e)}


def parse(kind: str, body: Any, *, models: tuple[str, ...], max_tokens_limit: int,
          template: ChatTemplate) -> Request:
    """A request body, checked; ApiError (400, or 404 for an unknown model) otherwise.
    `template` is the model's chat template (plain turns for a model without one)."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    body = {k: v for k, v in body.items() if v is not None}  # a null is the default, as in Ollama's Go
    unknown = sorted(set(body) - _FIELDS[kind])
    if unknown:
        raise ApiError(400, f"unsupported field(s): {', '.join(unknown)}", param=unknown[0])
    model = served_model(body.get("model"), models)
    for name, off in _OFF.items():
        if name in body and body[name] not in off:
            raise ApiError(400, f"'{name}' is not supported: {_WHY[name]}", param=name)
    stream = body.get("stream", True)  # Ollama streams unless told not to
    if not isinstance(stream, bool):
        raise ApiError(400, "'stream' must be true or false", param="stream")
    overrides, stops = _options(body.get("options", {}), max_tokens_limit)
    if kind == "chat":
        messages = _messages(body.get("messages", []))
        job = Job(messages, True, overrides, stops) if messages else None
    else:
        job = _generation(body, template, overrides, stops)
    return Request(kind, model, job, stream)


def served_model(name: object, models: tuple[str, ...]) -> str:
    """The name asked for, if it is served (`NAME:latest` is NAME); a 400 or 404 otherwise."""
    if not isinstance(name, str) or not name:
        raise ApiError(400, "'model' is required", param="model")
    if name.removesuffix(":latest") not in models:
        raise ApiError(404, f"model '{name}' not found; served here: {', '.join(models)}", param="model",
                       code="model_not_found")
    return name


def _generation(body: dict, template: ChatTemplate, overrides: dict[str, Any], stops: tuple[str, ...]) -> Job | None:
    prompt, system, raw = body.get("prompt", ""), body.get("system", ""), body.get("raw", False)
    for name, value, kind in (("prompt", prompt, str), ("system", system, str), ("raw", raw, bool)):
        if not isinstance(value, kind):
            raise ApiError(400, f"'{name}' must be a {'string' if kind is str else 'boolean'}", param=name)
    if not prompt:
        return None
    if raw:
        if system:
            raise ApiError(400, "'system' with 'raw': a raw prompt goes as it is; put the system text in it",
                           param="system")
        return Job(prompt, False, overrides, stops)
    turns = [{"role": "system", "content": system}] if system else []
    if template.is_plain:  # no chat template: the text as it is, as Ollama's default template sends it
        head = template.render(turns, add_generation_prompt=False) if turns else ""
        return Job(head + prompt, False, overrides, stops)
    return Job([*turns, {"role": "user", "content": prompt}], True, overrides, stops)


def _messages(messages: object) -> list[dict]:
    if not isinstance(messages, list):
        raise ApiError(400, "'messages' must be a list of {role, content}", param="messages")
    out = []
    for m in messages:
        if not (isinstance(m, dict) and isinstance(m.get("role"), str)
                and isinstance(m.get("content", ""), str)):
            raise ApiError(400, "'messages' must be a list of {role, content} with text content", param="messages")
        for name in ("images", "tool_calls"):
            if m.get(name):
                raise ApiError(400, f"a message's '{name}' is not supported: "
                               f"{_WHY['images'] if name == 'images' else _WHY['tools']}", param="messages")
        out.append({"role": m["role"], "content": m.get("content") or ""})
    return out


def _options(options: object, max_tokens_limit: int) -> tuple[dict[str, Any], tuple[str, ...]]:
    """Ollama's options as GenerationConfig fields, and the stop strings."""
    if not isinstance(options, dict):
        raise ApiError(400, "'options' must be an object", param="options")
    options = {k: v for k, v in options.items() if v is not None}
    unknown = sorted(set(options) - _OPTIONS)
    if unknown:
        raise ApiError(400, f"unknown option(s): {', '.join(unknown)}", param=unknown[0])
    for name, off in _NEUTRAL.items():
        if name in options and options[name] != off:
            raise ApiError(400, f"option '{name}' is not supported: lossless speculative sampling here samples "
                           f"the target's distribution (leave it out, or {off})", param=name)
    numbers = {k: _number(k, v) for k, v in options.items() if k in _SAMPLER or k in _INTEGER or k == "temperature"}
    temperature = numbers.get("temperature", 0.8)  # Ollama's default
    if temperature < 0:
        raise ApiError(400, "option 'temperature' must be 0 (greedy) or above", param="temperature")
    mode = "greedy" if temperature == 0 else "sample"
    limit = numbers.get("num_predict", -1)
    if limit in (-1, -2):  # Ollama's "until the end" and "until the context is full"
        limit = max_tokens_limit
    if not 1 <= limit <= max_tokens_limit:
        raise ApiError(400, f"option 'num_predict' must be from 1 to {max_tokens_limit} (edgekit api --max-tokens), "
                       "or -1 for that most", param="num_predict")
    seed = numbers.get("seed")
    gen: dict[str, Any] = {"mode": mode, "max_tokens": limit,
                           "seed": None if seed is None or seed < 0 else seed & ((1 << 63) - 1)}
    if mode == "sample":
        gen["temperature"] = temperature
    for field, value in sampling_fields({**options, **numbers}, 0, _SAMPLER).items():
        if mode == "sample" or field not in _TRUNCATING:
            gen[field] = value
    stop = options.get("stop", [])
    stops = (stop,) if isinstance(stop, str) else tuple(stop) if isinstance(stop, list) else ()
    if not isinstance(stop, (str, list)) or len(stops) > _MAX_STOPS or not all(isinstance(s, str) and s for s in stops):
        raise ApiError(400, f"option 'stop' must be a string or a list of up to {_MAX_STOPS} non-empty strings",
                       param="stop")
    return gen, stops


def _number(name: str, value: object) -> Any:
    integer = name in _INTEGER
    if not (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            and (not integer or value == int(value))):
        raise ApiError(400, f"option '{name}' must be {'an integer' if integer else 'a number'}", param=name)
    return int(value) if integer else value


def timestamp() -> str:
    """Now, as Ollama writes its times (RFC 3339, UTC)."""
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def _text(req: Request, text: str) -> dict:
    return {"message": {"role": "assistant", "content": text}} if req.kind == "chat" else {"response": text}


def lines(req: Request, text: str, stats: GenerationStats | None) -> list[dict]:
    """A streamed answer's objects for one piece: its text, and once the answer is done, the last."""
    out = [{"model": req.model, "created_at": timestamp(), **_text(req, text), "done": False}] if text else []
    if stats is not None:
        out.append(reply(req, "", stats))
    return out


def reply(req: Request, text: str, stats: GenerationStats | None) -> dict:
    """The answer done: the whole of it (or, streamed, the last piece), with its figures."""
    out = {"model": req.model, "created_at": timestamp(), **_text(req, text), "done": True}
    if req.job is None:
        return {**out, "done_reason": "load"}
    out["done_reason"] = finish_reason(stats.finish_reason if stats else None)
    if stats is not None:
        total = round(stats.elapsed_s * 1e9)
        # The verifier's target-only stream (an "auto" answer may be one) opens no session: its
        # prompt's time is until the first token came.
        opening = stats.prefill_ms if stats.drafting != "target-only" else stats.time_to_first_token_ms or 0.0
        prompt = min(total, round(opening * 1e6))
        out.update(total_duration=total, load_duration=0, prompt_eval_count=stats.prompt_tokens,
                   prompt_eval_duration=prompt, eval_count=stats.completion_tokens, eval_duration=total - prompt)
    return out


_DETAILS = {"parent_model": "", "format": "", "family": "", "families": None, "parameter_size": "",
            "quantization_level": ""}  # Ollama's zero values: the verifier's files are not known here


def models(names: tuple[str, ...], since: str) -> dict:
    """`/api/tags`: the models served, `since` the time edgekit api started."""
    return {"models": [{"name": n, "model": n, "modified_at": since, "size": 0, "digest": "", "details": _DETAILS}
                       for n in names]}


def ps(names: tuple[str, ...], context: int) -> dict:
    """`/api/ps`: the models served are always loaded."""
    return {"models": [{"name": n, "model": n, "size": 0, "digest": "", "details": _DETAILS, "size_vram": 0,
                        "context_length": context} for n in names]}


def show(*, target: str, draft: str, context: int, since: str) -> dict:
    """`/api/show`: what is known of a model here. Its `model_info` is under the architecture
    "edgekit", so that a client reading `{architecture}.context_length` finds the context."""
    info = {"general.architecture": "edgekit", "general.name": target, "edgekit.context_length": context,
            "edgekit.draft_model": draft}
    return {"modelfile": "", "parameters": "", "template": "", "details": _DETAILS, "model_info": info,
            "capabilities": ["completion"], "modified_at": since}


def version() -> dict:
    """`/api/version`: edgekit's version (the API is Ollama's)."""
    return {"version": __version__}
