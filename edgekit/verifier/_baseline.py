"""Target-only decoding, token by token: the centralized baseline (`Generate`).

The same engine, sessions and prefill as speculative rounds, so the two can be
measured against each other on one server. Each token counts as committed in
the serving statistics, for goodput. Its choices are over the target's tokens, as
the rounds' are: the padding entries at the end of a vocabulary are never one.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator

from ..config import ServerConfig
from ..protocol import GeneratedToken, GenerateRequest, token_logprobs
from ._core import EngineCore
from ._sessions import Caller, SessionTable
from ._slo import SpeedClasses
from ._stats import ServingStats
from ._validation import RequestChecks
from .engine import Feed

__all__ = ["Baseline"]


class Baseline:
    """Each step is one token; with a token-speed SLO of s tokens/s, a step is due
    1/s after it was asked for (its budget), and is worth one token."""

    def __init__(
        self,
        core: EngineCore,
        sessions: SessionTable,
        checks: RequestChecks,
        config: ServerConfig,
        slo: SpeedClasses | None = None,
        stats: ServingStats | None = None,
    ) -> None:
        self.core = core
        self.engine = core.engine
        self.sessions = sessions
        self.checks = checks
        self.config = config
        self.slo = slo or SpeedClasses()
        self.stats = stats if stats is not None else core.stats

    def generate(
        self, request: GenerateRequest, *, is_active: Callable[[], bool] = lambda: True, caller: Caller = Caller()
    ) -> Iterator[GeneratedToken]:
        """The target's tokens after the request's prompt; stops early when `is_active()` turns
        false (a cancelled call)."""
        arrived = time.perf_counter()
        mode, sampler, seed, logprobs, max_tokens = (request.mode, request.sampler, request.seed, request.logprobs,
                                                     request.max_tokens)
        self.checks.sampling(mode, sampler)
        self.checks.logprobs(logprobs)
        slo_class, speed = self.slo.resolve(request.slo.slo_class or "", request.slo.tokens_per_s or 0.0)
        self.checks.prompt(request.prompt_tokens)  # its length before its ids, and before a copy
        tokens = list(request.prompt_tokens)
        self.checks.generate_length(max_tokens)
        self.checks.stop_tokens(request.stop_tokens)
        stops = set(request.stop_tokens)
        sess = self.sessions.create(
            mode=mode, sampler=sampler, seed=seed, slo_class=slo_class, speed=speed, prefix="g-", caller=caller
        )
        # Greedy over plain logits wants each step's best id only, and a top-k or min-p sampler only
        # the logits that reach its cut: both reduced where the row is made, as the rounds' are (so
        # a tie goes the same way in both, wherever the engine reduces). Logprobs, penalties and a
        # logit bias take the whole row.
        plain = not sampler.adjusts and logprobs < 0
        argmax = self.checks.n_real if plain and mode == "greedy" else 0
        keep, spread = sampler.support_cut() if plain and mode == "sample" else (0, math.inf)
        try:
            with sess.lock:
                prefill = Feed(sess.seq, 0, tuple(tokens[:-1]), 0)
                objective = self.slo.prefill(speed, arrived)
                prefill_ms = self.core.run(prefill, session_id=sess.id, slo_class=slo_class, objective=objective).run_ms
                pos = len(tokens) - 1
                last = tokens[-1]
                for index in range(max_tokens):
                    if not is_active():
                        return
                    objective = self.slo.token(speed, time.perf_counter())
                    step = Feed(sess.seq, pos, (last,), 1, argmax=argmax, keep=keep, within=self.checks.n_real,
                                spread=spread)
                    ran = self.core.run(step, session_id=sess.id, slo_class=slo_class, objective=objective)
                    pos += 1
                    # its tokens: a padding entry is no choice (an argmax feed's row stayed in the engine)
                    logits = ran.logits[0, : self.checks.n_real] if ran.best is None else ran.logits
                    context = sampler.window(tokens)
                    if ran.best is not None:
                        tok = int(ran.best[0])
                    elif mode == "greedy":
                        tok = sampler.best(logits, context)
                    else:
                        # Over kept rows (`ran.ids`, the columns' ids) the distribution is the whole row's
                        # where it is not zero, the same floats in the same order: the same draw.
                        p = sampler.probs(logits, context)
                        tok = int(sess.rng.choice(p.size, p=p))
                        tok = tok if ran.ids is None else int(ran.ids[tok])
                    tokens.append(tok)
                    sess.last_used = self.sessions.clock()
                    self.stats.record_generated(slo_class)
                    reason = None
                    if self.engine.is_eog(tok) or tok in stops:
                        reason = "eos"
                    elif index + 1 == max_tokens:
                        reason = "length"
                    elif pos + 1 >= self.config.max_context:
                        reason = "context"
                    yield GeneratedToken(
                        tok,
                        index,
                        decode_ms=ran.run_ms,
                        prefill_ms=prefill_ms if index == 0 else 0.0,
                        finish_reason=reason,
                        logprobs=token_logprobs(logits, tok, logprobs) if logprobs >= 0 else None,
                    )
                    if reason is not None:
                        return
                    last = tok
        finally:
            self.sessions.close(sess.id, caller.tenant)
