"""A session's stream: rounds until EOS, a stop string or token, `max_tokens` or a full context,
as events.

Each round drafts at most what is left to produce and what the context and the verifier's
budget allow; its committed tokens go out as text (`TextDelta`), the tokens the device drafted
ahead through an outage as `Provisional`, its figures as a `RoundEvent` after its text, an
outage it came through as `Resumed` before it; the generation's figures last (`FinalStats`).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator

from ..config import ClientConfig
from ..protocol import ServerInfo
from ._accumulator import StatsAccumulator
from ._drafter import Drafter
from ._events import Event, Provisional, Resumed, RoundEvent
from ._round import RoundDriver
from ._stats import RoundStats

__all__ = ["RoundFn", "run"]

# One round drafting at most `limit` tokens, up to `ahead` past the output through an outage and
# within `room` proactively, tried again through outages: the tokens it committed, its figures,
# whether the context is full, the outage it came through (if any).
RoundFn = Callable[[int, int, int], Generator[Provisional, None, tuple[list[int], RoundStats, bool, Resumed | None]]]


def run(
    drafter: Drafter,
    rounds: RoundDriver,
    server: ServerInfo,
    retry: ClientConfig,
    *,
    progress: StatsAccumulator,
    max_tokens: int,
    play_round: RoundFn,
    semantic: Callable[[], tuple[float, str]],
) -> Iterator[Event]:
    """The stream of a session whose draft side is `drafter` and rounds `rounds`, counted in
    `progress`; `semantic`: the threshold and head a semantic session decides at, where no verdict
    named them."""
    progress.start()
    stats = progress.stats
    out = progress.produced
    finish: str | None = None
    drafter.provisional_shown = drafter.provisional_kept = 0
    plain_before = getattr(drafter.controller, "plain_rounds", 0)
    drafter.chain.shown = 0  # what an earlier stream showed is not this one's to count
    showing = False  # whether the consumer was last shown provisional tokens
    while finish is None:
        remaining = max_tokens - len(out)
        room = drafter.max_context - len(drafter.committed) - 1  # base + K + 1 must fit
        if room < 1:
            finish = "context"
            break
        # A round commits up to K+1 tokens: keep K+1 within what is left to produce.
        limit = max(1, min(server.max_block, room, remaining - 1))
        if rounds.budget:
            limit = min(limit, rounds.budget)  # the verifier's assigned budget bounds every policy
        shown = drafter.provisional_shown
        ahead = min(retry.max_provisional, remaining)
        new, rstats, context_full, resumed = yield from play_round(limit, ahead, remaining)
        showing = showing or drafter.provisional_shown > shown
        if resumed is not None:
            progress.add(resumed)
            yield resumed
        done = RoundEvent(rstats)
        progress.add(done)  # counted at once: a consumer that stops at the text has seen its round
        emitted: list[int] = []
        for tok in new:
            if len(out) + len(emitted) >= max_tokens:
                finish = "length"
                break
            emitted.append(tok)
            if drafter.config.stop_at_eos and drafter.draft.is_eog(tok):
                finish = "eos"
                break
            if tok in drafter.config.stop_tokens:
                finish = "stop"
                break
        if finish is None and len(out) + len(emitted) >= max_tokens:
            finish = "length"
        if finish is None and context_full:
            finish = "context"
        delta = progress.output(emitted, rounds.logprobs[: len(emitted)])
        if progress.stop_found:
            finish = "stop"
        if delta.text or delta.token_ids:
            yield delta
        if showing:  # what is still ahead of the output, or nothing
            ahead_now = drafter.provisional() if finish is None else Provisional("", ())
            showing = bool(ahead_now.token_ids)
            yield ahead_now
        yield done
    tail = progress.flush()
    if tail is not None:
        yield tail
    stats.provisional_tokens, stats.provisional_kept = drafter.provisional_shown, drafter.provisional_kept
    stats.plain_rounds = getattr(drafter.controller, "plain_rounds", 0) - plain_before
    if drafter.config.mode == "semantic":
        stats.semantic_threshold, stats.semantic_head = rounds.semantic_decider or semantic()
    yield progress.finish(finish)
