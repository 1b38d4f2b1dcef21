"""One generation's output and figures, counted as they come.

Every way of generating counts with a `StatsAccumulator` (as openai-python's stream
state serves both its clients): a session's stream gives it each round, outage and
output token, the target-only baseline each token the target decodes, and a
conversation whose reply was stopped early takes the figures counted so far. Output
tokens come back as the `TextDelta` to stream (text may lag tokens on split UTF-8);
the first sets the time to first token; `finish` closes the count into the stream's
`FinalStats`.

Stop strings end the output here, whichever way it was generated: text that may begin one is
held back, with the tokens it belongs to, until it cannot; the first one found cuts the text
before it, and the output's tokens are those whose text begins before the cut (`stop_found`
tells the generation to end, finish reason "stop"). Stop tokens show no text.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from ..protocol import ServerFigures, TokenLogprobs
from ..runtime import device_load, process_cpu_seconds
from ._events import FinalStats, Resumed, RoundEvent, TextDelta
from ._stats import GenerationStats
from ._text import TextDecoder, safe_end, stop_at

__all__ = ["StatsAccumulator"]


class StatsAccumulator:
    """Counts one generation into `stats` (its settings, and the time to open the session,
    already filled in), its tokens decoded to text by `decoder`, ended by the `stop` strings and
    `stop_tokens` a config names. `start` restarts the clocks (a stream made before it is read
    counts from its first event)."""

    def __init__(self, stats: GenerationStats, decoder: TextDecoder, stop: Sequence[str] = (),
                 stop_tokens: Sequence[int] = ()) -> None:
        self.stats = stats
        self.token_ids: list[int] = []  # the output's tokens, as far as their text was shown
        self.produced: list[int] = []  # every token given to the output, those held back too
        self.logprobs: tuple[TokenLogprobs, ...] = ()
        self.stop_found = False  # a stop string ended the output
        self._decoder = decoder
        self._stops = tuple(stop)
        self._hidden = frozenset(stop_tokens)
        self._parts: list[str] = []
        self._text = ""  # with stop strings: the text so far, what was shown and what is held back
        self._held: list[tuple[int, int, int, TokenLogprobs | None]] = []  # token, its text's start and end
        self.start()

    def start(self) -> None:
        self._t0, self._cpu0 = time.perf_counter(), process_cpu_seconds()

    def elapsed_s(self) -> float:
        """Wall time of the generation so far, the session's opening included."""
        return time.perf_counter() - self._t0 + self.stats.prefill_ms / 1e3

    def output(self, token_ids: list[int], logprobs: Sequence[TokenLogprobs] = ()) -> TextDelta:
        """The output grows by `token_ids` (with the target's log-probabilities of them, when
        asked): counted, and the text they complete (and the tokens of it, with stop strings)."""
        if token_ids and self.stats.time_to_first_token_ms is None:
            self.stats.time_to_first_token_ms = self.elapsed_s() * 1e3
        self.produced += token_ids
        pieces = ["" if t in self._hidden else self._decoder.feed([t]) for t in token_ids]
        if self._stops:
            return self._against_stops(token_ids, pieces, logprobs)
        return self._shown("".join(pieces), token_ids, tuple(logprobs))

    def _against_stops(self, token_ids: list[int], pieces: list[str], logprobs: Sequence[TokenLogprobs]) -> TextDelta:
        shown = self._held[0][1] if self._held else len(self._text)  # the text shown so far
        for i, (tok, piece) in enumerate(zip(token_ids, pieces, strict=True)):
            start = len(self._text)
            self._text += piece
            self._held.append((tok, start, len(self._text), logprobs[i] if i < len(logprobs) else None))
        cut = stop_at(self._text, self._stops, shown)
        if cut is not None:  # the tokens whose text begins before the stop string are the output's
            self.stop_found = True
            self._text = self._text[:cut]
            released = [h for h in self._held if h[1] < cut]
            self._held = []
            end = cut
        else:
            end = safe_end(self._text, self._stops)
            n = next((i for i, h in enumerate(self._held) if h[2] > end), len(self._held))
            released, self._held = self._held[:n], self._held[n:]
            end = released[-1][2] if released else shown
        return self._shown(self._text[shown:end], [h[0] for h in released],
                           tuple(h[3] for h in released if h[3] is not None))

    def _shown(self, text: str, token_ids: list[int], logprobs: tuple[TokenLogprobs, ...]) -> TextDelta:
        self.token_ids += token_ids
        delta = TextDelta(text, tuple(token_ids), logprobs=logprobs)
        self.logprobs += delta.logprobs
        self._parts.append(delta.text)
        return delta

    def flush(self) -> TextDelta | None:
        """What is still held back at the end: an incomplete UTF-8 sequence, and text (with its
        tokens) that might have begun a stop string; None if nothing."""
        tail = self._decoder.flush()
        held, self._held = self._held, []
        if not self._stops or self.stop_found:
            delta = self._shown(tail, [], ())
        else:
            start = held[0][1] if held else len(self._text)
            self._text += tail
            delta = self._shown(self._text[start:], [h[0] for h in held], tuple(h[3] for h in held if h[3] is not None))
        return delta if delta.text or delta.token_ids else None

    def add(self, event: RoundEvent | Resumed) -> None:
        """Counts a round's figures, or an outage."""
        if isinstance(event, RoundEvent):
            self.stats.add_round(event.stats)
        else:
            self.stats.add_outage(event)

    def add_target_token(self, decode_ms: float) -> None:
        """Counts a step of target-only decoding: a pass of the target (its output comes as text)."""
        self.stats.rounds += 1
        self.stats.server += ServerFigures(verify_ms=decode_ms)

    def finish(self, reason: str | None) -> FinalStats:
        """The generation ended (eos, length, context, stopped): its final figures and output."""
        stats = self.stats
        stats.completion_tokens = len(self.token_ids)
        stats.elapsed_s = self.elapsed_s()
        stats.finish_reason = reason
        stats.device = device_load(self._cpu0, time.perf_counter() - self._t0).as_dict()
        return FinalStats(stats, tuple(self.token_ids), "".join(self._parts), logprobs=tuple(self.logprobs))

    def stopped(self) -> GenerationStats | None:
        """The figures of a generation its consumer stopped before the end (finish reason
        "stopped"), or None if no round ran."""
        return self.finish("stopped").stats if self.stats.rounds else None
