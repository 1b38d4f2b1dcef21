"""The verifier's target-only stream as a generation's events, and its resume: a stream the
verifier stops answering goes on as a speculative session on the prompt and the tokens it
delivered (which reopens and resumes through outages, `ClientConfig`), counted in the same
figures, with a `Resumed` event where it switched."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import replace

from ..config import ClientConfig, GenerationConfig
from ..errors import VerifierUnavailableError
from ..protocol import ContextSpan, GenerateRequest, SpeedObjective
from ..runtime import DraftModel
from ..transport import VerifierTransport
from ._accumulator import StatsAccumulator
from ._events import Event, FinalStats, Provisional, Resumed, RoundEvent, TextDelta
from ._resilience import through_outages
from ._session import SpeculativeSession
from ._stats import GenerationStats
from ._text import TextDecoder

__all__ = ["TargetOnly"]


class TargetOnly:
    """Target-only generations over `transport`, their text decoded with `draft`'s tokenizer (the
    target's); `session` makes the speculative session a cut-off stream resumes in."""

    def __init__(self, transport: VerifierTransport, draft: DraftModel, config: ClientConfig,
                 session: Callable[[GenerationConfig], SpeculativeSession]) -> None:
        self._transport = transport
        self._draft = draft
        self._config = config
        self._session = session

    def events(self, tokens: list[int], gen: GenerationConfig, *, resume: bool) -> Iterator[Event]:
        """The stream of `tokens`' answer; with `resume`, resumed speculatively where it is cut off."""
        seed = gen.seed if gen.seed is not None else secrets.randbits(63)
        stats = GenerationStats(
            mode=gen.mode, draft_k=0, drafting="target-only", sampler=gen.sampler().describe(),
            prompt_tokens=len(tokens),
        )
        progress = StatsAccumulator(stats, TextDecoder(self._draft), gen.stop, gen.stop_tokens)
        request = GenerateRequest(
            tuple(tokens), gen.mode, seed, gen.max_tokens, gen.sampler(), stop_tokens=gen.stop_tokens,
            slo=SpeedObjective(gen.slo_class, gen.target_speed), logprobs=-1 if gen.logprobs is None else gen.logprobs,
        )
        finish = None
        stream = self._transport.generate(request)
        try:
            for t in stream:
                progress.add_target_token(t.decode_ms)
                delta = progress.output([t.token], (t.logprobs,) if t.logprobs is not None else ())
                if delta.text or delta.token_ids:
                    yield delta
                finish = _finish(t.token, t.finish_reason, gen) or finish
                if progress.stop_found:
                    finish = "stop"
                    break
        except VerifierUnavailableError as exc:
            if not resume:
                raise
            finish = yield from self._resumed(tokens, gen, progress, exc)
        finally:
            close = getattr(stream, "close", None)
            if close is not None:  # a stream left at a stop string: the verifier stops decoding it
                close()
        tail = progress.flush()
        if tail is not None:  # streamed, as a session's stream does
            yield tail
        yield progress.finish(finish)

    def _resumed(self, tokens: list[int], gen: GenerationConfig, progress: StatsAccumulator,
                 cause: Exception) -> Generator[Event, None, str | None]:
        """The rest of a stream cut off by `cause`, drafted and verified in a session of its own;
        returns its finish reason."""
        start = time.perf_counter()
        done = list(progress.produced)
        left = gen.max_tokens - len(done)
        if left <= 0:
            return "length"
        session = self._session(replace(gen, max_tokens=left, stop=()))  # stop strings: in the whole text
        try:
            def open_it() -> Generator[Provisional, None, float]:
                # the stream's tokens were the target's steps: the verifier rebuilds them as rounds
                history = (ContextSpan(len(tokens)), ContextSpan(len(done), generated=True))
                return session.open(tokens + done, history if done else ())
                yield  # a generator: through_outages runs attempts that may yield

            def sleep(delay: float) -> Iterator[Provisional]:
                time.sleep(delay)
                yield from ()

            # the verifier may still be away: open the session with back-off, as a round would be
            prefill_ms, outage = yield from through_outages(open_it, self._config, reopen=lambda: 0, between=sleep)
            causes = (type(cause).__name__, *(outage.causes if outage is not None else ()))
            resumed = Resumed((time.perf_counter() - start) * 1e3, (outage.attempts if outage is not None else 0) + 1,
                              len(tokens) + len(done), tuple(dict.fromkeys(causes)))
            progress.add(resumed)
            yield resumed
            finish = None
            for ev in session.stream(prefill_ms=prefill_ms):
                if isinstance(ev, TextDelta):
                    if ev.token_ids:
                        delta = progress.output(list(ev.token_ids), ev.logprobs)
                        if delta.text or delta.token_ids:
                            yield delta
                        if progress.stop_found:
                            return "stop"
                elif isinstance(ev, FinalStats):
                    finish = ev.stats.finish_reason
                else:
                    if isinstance(ev, (RoundEvent, Resumed)):
                        progress.add(ev)
                    yield ev
            return finish
        finally:
            session.close()


def _finish(token: int, reason: str | None, gen: GenerationConfig) -> str | None:
    """The stream's finish reason for its last token: "stop" for a stop token the verifier ended
    it at (it says "eos", as for an end of text)."""
    return "stop" if reason == "eos" and token in gen.stop_tokens else reason
