"""One answer, whichever API asked for it: the generation a request asks for (`Job`), the
admission of requests (`Gate`), and the answer's text as it comes (the generation cuts it at
the first stop string), with its figures last (`pieces`); edgekit's errors come out as the
API's (`ApiError`).
The OpenAI and the Ollama shapes (`_openai`, `_ollama`) read their requests into a `Job` and
frame what `pieces` yields.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..client import EdgeClient, FinalStats, GenerationStats, GenerationStream, TextDelta
from ..errors import ApiError, ConfigError, EdgekitError, LimitExceededError, VerifierUnavailableError
from ..protocol import Sampler, TokenLogprobs

__all__ = ["Gate", "Job", "Piece", "finish_reason", "pieces", "sampling_fields"]

Piece = tuple[str, "GenerationStats | None"]  # text to send, and the stats once the answer is done


@dataclass(frozen=True)
class Job:
    """The generation one request asks for: a prompt (text or token ids), or, with `chat`, the
    messages the model's chat template renders; GenerationConfig fields; stop strings."""

    prompt: str | list[int] | list[dict]
    chat: bool
    overrides: dict[str, Any]
    stop: tuple[str, ...] = ()
    # where the output's (token id, the target's log-probabilities) go as they come, when asked
    # (overrides["logprobs"]); cut with the text at a stop string
    logprobs: list[tuple[int, TokenLogprobs]] | None = None


class Gate:
    """`limit` requests at a time and `queue` waiting; beyond that, refused."""

    def __init__(self, limit: int, queue: int) -> None:
        self._slots = threading.BoundedSemaphore(limit)
        self._lock = threading.Lock()
        self._admitted = 0
        self._cap = limit + queue

    def admit(self) -> None:
        with self._lock:
            if self._admitted >= self._cap:
                raise ApiError(429, "too many requests in flight; try again shortly", kind="rate_limit_error",
                               code="rate_limit_exceeded", retry_after=1.0)
            self._admitted += 1

    def acquire(self) -> None:
        self._slots.acquire()

    def release(self, *, held: bool) -> None:
        if held:
            self._slots.release()
        with self._lock:
            self._admitted -= 1


def pieces(client: EdgeClient, gate: Gate, job: Job) -> Iterator[Piece]:
    """The answer's text as it comes (the generation cuts it at the first stop string, holding
    back what may begin one); the stats last. Runs on a worker thread, holding one of the gate's
    slots (the request was admitted already)."""
    held = False
    try:
        gate.acquire()
        held = True
        with _mapped():
            stream = _start(client, job)
            with stream:
                for ev in stream:
                    if isinstance(ev, TextDelta):
                        if job.logprobs is not None:  # the tokens of the text shown, as they are shown
                            job.logprobs.extend(zip(ev.token_ids, ev.logprobs))
                        if ev.text:
                            yield ev.text, None
                    elif isinstance(ev, FinalStats):
                        yield "", ev.stats
    finally:
        gate.release(held=held)


def finish_reason(reason: str | None) -> str:
    """The APIs' finish reason (OpenAI's and Ollama's alike) for edgekit's (eos, length,
    context, stopped, or a stop string's "stop")."""
    return "length" if reason in ("length", "context") else "stop"


def _start(client: EdgeClient, job: Job) -> GenerationStream:
    overrides = {**job.overrides, "stop": job.stop} if job.stop else job.overrides
    if job.chat:
        return client.chat(job.prompt, **overrides)  # type: ignore[arg-type]
    return client.generate(job.prompt, **overrides)  # type: ignore[arg-type]


class _mapped:
    """edgekit's errors as the API's: the verifier gone is 503 (retry), limits 400."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type | None, exc: BaseException | None, tb: object) -> None:
        if exc is None or isinstance(exc, (ApiError, GeneratorExit)):
            return
        retry = getattr(exc, "retry_after", None)
        if isinstance(exc, VerifierUnavailableError):
            raise ApiError(503, f"the verifier is unreachable: {exc}", kind="service_unavailable",
                           code="verifier_unavailable", retry_after=retry or 5.0) from exc
        if isinstance(exc, LimitExceededError) and retry is not None:  # the verifier is full for now
            raise ApiError(429, f"the verifier is busy: {exc}", kind="rate_limit_error", code="verifier_busy",
                           retry_after=retry) from exc
        if isinstance(exc, (LimitExceededError, ConfigError)):
            raise ApiError(400, str(exc)) from exc
        if isinstance(exc, EdgekitError):
            raise ApiError(500, str(exc), kind="server_error") from exc


def sampling_fields(body: dict, vocab_size: int, names: dict[str, str]) -> dict[str, Any]:
    """The sampler settings of a request body (or Ollama's options), checked, as GenerationConfig's
    fields; `names` maps the API's names to those fields. ApiError (400, naming the API's setting)
    for a value the sampler refuses."""
    out: dict[str, Any] = {}
    for name, field_name in names.items():
        value = body.get(name)
        if value is None:
            continue
        if field_name == "logit_bias":
            if not isinstance(value, dict):
                raise ApiError(400, f"'{name}' must map token ids (as strings) to biases", param=name)
            try:
                bias = {int(k): float(v) for k, v in value.items() if not isinstance(v, bool)}
            except (TypeError, ValueError):
                raise ApiError(400, f"'{name}' must map token ids (as strings) to numbers", param=name) from None
            if len(bias) != len(value) or any(not 0 <= t < vocab_size for t in bias):
                raise ApiError(400, f"'{name}' names a token that is not below {vocab_size}", param=name)
            out[field_name] = bias
        elif field_name in ("top_k", "penalty_last_n"):
            if isinstance(value, bool) or not isinstance(value, int):
                raise ApiError(400, f"'{name}' must be an integer", param=name)
            out[field_name] = 0 if field_name == "top_k" and value == -1 else value  # vLLM's -1: every token
        elif isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ApiError(400, f"'{name}' must be a number", param=name)
        else:
            out[field_name] = float(value)
    settings: dict[str, Any] = {k: tuple(v.items()) if k == "logit_bias" else v for k, v in out.items()}
    try:
        Sampler(**settings)
    except ValueError as e:
        named = next((n for n, f in names.items() if f in out and f.split("_")[0] in str(e)), next(iter(out)))
        raise ApiError(400, f"'{named}': {e}", param=named) from None
    return out
