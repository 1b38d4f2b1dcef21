"""Target-only decoding, token by token: the centralized baseline (`Generate`).

The same engine, sessions and prefill as speculative rounds, so the two can be
measured against each other on one server.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from ..config import ServerConfig
from ..protocol import GeneratedToken, target_probs
from ._core import EngineCore
from ._sessions import SessionTable
from ._validation import RequestChecks
from .engine import Feed

__all__ = ["TargetOnly"]


class TargetOnly:
    def __init__(self, core: EngineCore, sessions: SessionTable, checks: RequestChecks, config: ServerConfig) -> None:
        self.core = core
        self.engine = core.engine
        self.sessions = sessions
        self.checks = checks
        self.config = config

    def generate(
        self,
        prompt: Sequence[int],
        *,
        mode: str,
        temperature: float,
        seed: int,
        max_tokens: int,
        stop_tokens: Sequence[int] = (),
        is_active: Callable[[], bool] = lambda: True,
    ) -> Iterator[GeneratedToken]:
        """The target's tokens after `prompt`; stops early when `is_active()` turns false (a cancelled call)."""
        self.checks.sampling(mode, temperature)
        tokens = list(prompt)
        self.checks.prompt(tokens)
        self.checks.generate_length(max_tokens)
        stops = set(stop_tokens)
        sess = self.sessions.create(mode=mode, temperature=temperature, seed=seed, slo_class="batch", prefix="g-")
        try:
            with sess.lock:
                prefill_ms = self.core.run(Feed(sess.seq, 0, tuple(tokens[:-1]), 0), session_id=sess.id).run_ms
                pos = len(tokens) - 1
                last = tokens[-1]
                for index in range(max_tokens):
                    if not is_active():
                        return
                    ran = self.core.run(Feed(sess.seq, pos, (last,), 1), session_id=sess.id, slo_class="batch")
                    pos += 1
                    if mode == "greedy":
                        tok = int(np.argmax(ran.logits[0]))
                    else:
                        p = target_probs(ran.logits[0], temperature)
                        tok = int(sess.rng.choice(p.size, p=p))
                    sess.last_used = time.monotonic()
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
                    )
                    if reason is not None:
                        return
                    last = tok
        finally:
            self.sessions.close(sess.id)
