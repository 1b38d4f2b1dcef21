"""One generation's output and figures, counted as they come.

Every way of generating counts with a `StatsAccumulator` (as openai-python's stream
state serves both its clients): a session's stream gives it each round, outage and
output token, the target-only baseline each token the target decodes, and a
conversation whose reply was stopped early takes the figures counted so far. Output
tokens come back as the `TextDelta` to stream (text may lag tokens on split UTF-8);
the first sets the time to first token; `finish` closes the count into the stream's
`FinalStats`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from ..protocol import TokenLogprobs
from ..runtime import device_load, process_cpu_seconds
from ._events import FinalStats, Resumed, RoundEvent, TextDelta
from ._metrics import GenerationStats
from ._text import TextDecoder

__all__ = ["StatsAccumulator"]


class StatsAccumulator:
    """Counts one generation into `stats` (its settings, and the time to open the session,
    already filled in), its tokens decoded to text by `decoder`. `start` restarts the clocks
    (a stream made before it is read counts from its first event)."""

    def __init__(self, stats: GenerationStats, decoder: TextDecoder) -> None:
        self.stats = stats
        self.token_ids: list[int] = []
        self.logprobs: tuple[TokenLogprobs, ...] = ()
        self._decoder = decoder
        self._parts: list[str] = []
        self.start()

    def start(self) -> None:
        self._t0, self._cpu0 = time.perf_counter(), process_cpu_seconds()

    def elapsed_s(self) -> float:
        """Wall time of the generation so far, the session's opening included."""
        return time.perf_counter() - self._t0 + self.stats.prefill_ms / 1e3

    def output(self, token_ids: list[int], logprobs: Sequence[TokenLogprobs] = ()) -> TextDelta:
        """The output grows by `token_ids` (with the target's log-probabilities of them, when
        asked): counted, and the text they complete."""
        if token_ids and self.stats.time_to_first_token_ms is None:
            self.stats.time_to_first_token_ms = self.elapsed_s() * 1e3
        self.token_ids += token_ids
        delta = TextDelta(self._decoder.feed(token_ids), tuple(token_ids), logprobs=tuple(logprobs))
        self.logprobs += delta.logprobs
        self._parts.append(delta.text)
        return delta

    def flush(self) -> TextDelta | None:
        """The text still held back at the end (an incomplete UTF-8 sequence), if any."""
        tail = self._decoder.flush()
        self._parts.append(tail)
        return TextDelta(tail, ()) if tail else None

    def add(self, event: RoundEvent | Resumed) -> None:
        """Counts a round's figures, or an outage."""
        if isinstance(event, RoundEvent):
            self.stats.add_round(event.stats)
        else:
            self.stats.add_outage(event)

    def add_target_token(self, decode_ms: float) -> None:
        """Counts a step of target-only decoding: a pass of the target (its output comes as text)."""
        self.stats.rounds += 1
        self.stats.server_verify_ms += decode_ms

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
