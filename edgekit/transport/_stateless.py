"""Greedy verification on servers that keep no edgekit session: stock serving
engines reached over HTTP (OpenAI-compatible completions, SGLang's generate).

The client holds each session's committed tokens and sends the whole sequence
(committed plus draft block) every round; the server's top-1 token at each
block position decides acceptance exactly as greedy verification does, and its
greedy next token after the block is the bonus. What these backends cannot do
is declared in `ServerInfo` (greedy only: top-1 log-probabilities carry no
target distribution for lossless sampling; no hidden-state uploads; no assigned
budgets) and the session refuses a mode they lack.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator, Sequence

from ..errors import (
    ConfigError,
    IncompatibleModelsError,
    LimitExceededError,
    ProtocolError,
    SessionNotFoundError,
)
from ..protocol import (
    PROTOCOL_VERSION,
    BlockRequest,
    Exchange,
    Fingerprint,
    GeneratedToken,
    OpenedSession,
    OpenRequest,
    Sampler,
    ServerInfo,
    SpeedObjective,
    VerifyResult,
    accept_top1,
    check_base,
    decide,
)
from ..runtime import DraftModel
from ._http import HttpJson

__all__ = ["StatelessTransport"]

# Text for the tokenizer check: code, numbers, accents, CJK, an emoji, runs of spaces.
TOKENIZER_PROBE = "def f(x):\n    return x**2  # 3.14159, naïve café, 日本語, emoji 🙂, tabs\tand  spaces."


class StatelessTransport:
    backend = "stateless"
    kind = "server"
    prefix_cache = False  # whether the server reuses the shared prefix of successive requests
    can_time_payloads = False  # no echo endpoint: the link's rates cannot be probed, only its RTT

    def __init__(self, http: HttpJson, tokenizer: DraftModel, *, max_context: int = 4096, max_block: int = 16) -> None:
        self.http = http
        self.address = http.address
        self.tokenizer = tokenizer
        self.max_context = max_context
        self.max_block = max_block
        self.model = ""
        self.tokenizer_check = "none"
        self._sessions: dict[str, list[int]] = {}
        self._ids = itertools.count()

    # -- what a backend provides -------------------------------------------------------

    def _discover(self) -> str:
        """The served model's name (and any capability probing)."""
        raise NotImplementedError

    def _check_tokenizer(self, draft_model: str) -> str:
        """Compares the server's tokenizer with the draft's as the backend allows; returns how it was
        checked ("none" if it cannot be), raises IncompatibleModelsError on a difference."""
        return "none"

    def _incompatible(self, draft_model: str, what: str) -> IncompatibleModelsError:
        return IncompatibleModelsError(
            f"draft model {draft_model!r} does not share a tokenizer with {self.model!r} at {self.address}: {what}; "
            "use a draft from the target's family"
        )

    def _top1(self, tokens: Sequence[int], start: int) -> list[int]:
        """The target's greedy token predicting tokens[start], tokens[start + 1], ... up to the first
        that differs from the token there (the correction), or all of them and the one after (the bonus)."""
        raise NotImplementedError

    def _generate_ids(self, tokens: Sequence[int], max_tokens: int) -> list[int]:
        raise NotImplementedError

    # -- the transport protocol ----------------------------------------------------------

    def ping(self, payload_bytes: int = 0, reply_bytes: int = 0) -> float:
        if payload_bytes or reply_bytes:
            raise ConfigError(f"the {self.kind} at {self.address} has no echo endpoint: rates cannot be probed")
        t0 = time.perf_counter()
        self._ping()
        return (time.perf_counter() - t0) * 1e3

    def _ping(self) -> None:
        self._discover()

    def handshake(self, draft: Fingerprint, *, draft_model: str, draft_hidden_size: int) -> ServerInfo:
        self.model = self._discover()
        self.tokenizer_check = self._check_tokenizer(draft_model)
        return ServerInfo(
            protocol_version=PROTOCOL_VERSION,
            target_model=self.model,
            # These servers publish no fingerprint: the check above stands in for it (see tokenizer_check).
            target_fingerprint=draft,
            target_hidden_size=0,
            modes=("greedy",),
            upload_protocols=("tokens",),
            max_block=self.max_block,
            max_context=self.max_context,
            max_sessions=1 << 16,
            assigns_budgets=False,
            prefix_cache=self.prefix_cache,
            max_draft_top_k=0,
            server_version=self.backend,
            backend=self.backend,
            tokenizer_check=self.tokenizer_check,
        )

    def open_session(self, request: OpenRequest) -> OpenedSession:
        mode = request.mode
        if mode == "semantic":
            raise ConfigError(
                f"the {self.kind} at {self.address} offers no semantic mode: semantic verification reads the "
                "draft's and the target's hidden states, which only an edgekit verifier with a decision head "
                "(edgekit serve --semantic-head) has; use mode='greedy' here"
            )
        if mode != "greedy":
            raise ConfigError(
                f"the {self.kind} at {self.address} returns top-1 log-probabilities only, which verify greedy "
                f"decoding but carry no target distribution for {mode!r}; use mode='greedy' or an edgekit verifier"
            )
        self._no_slo(request.slo)
        sid = f"{self.backend}-{next(self._ids)}"
        self._sessions[sid] = list(request.prompt_tokens)
        return OpenedSession(sid, len(request.prompt_tokens), self.max_context)

    def _no_slo(self, slo: SpeedObjective) -> None:
        if not slo.best_effort:
            raise ConfigError(
                f"the {self.kind} at {self.address} does not schedule by token-speed SLOs; "
                "leave slo_class and target_speed unset, or use an edgekit verifier"
            )

    def _session(self, sid: str) -> list[int]:
        if sid not in self._sessions:
            raise SessionNotFoundError(f"session {sid!r} is unknown (closed?)", address=self.address)
        return self._sessions[sid]

    def extend_session(self, session_id: str, base_position: int, tokens: Sequence[int]) -> int:
        toks = self._session(session_id)
        check_base(base_position, len(toks), what="extension", address=self.address)
        toks.extend(tokens)
        return len(toks)

    def verify(self, block: BlockRequest) -> VerifyResult:
        toks = self._session(block.session_id)
        check_base(block.base_position, len(toks), address=self.address)
        if block.upload != "tokens":
            raise ProtocolError(f"the {self.kind} at {self.address} takes no hidden states", address=self.address)
        draft = list(block.draft_tokens)
        if len(toks) + len(draft) + 1 > self.max_context:
            raise LimitExceededError(
                f"a block of {len(draft)} on {len(toks)} tokens exceeds the context of {self.max_context}"
            )
        t0 = time.perf_counter()
        best = self._known(self._top1(toks + draft, len(toks)))
        ms = (time.perf_counter() - t0) * 1e3
        accepted, nxt = accept_top1(best, draft)
        if nxt is None:
            raise ProtocolError(
                f"the {self.kind} at {self.address} gave {len(best)} predictions for a block of {len(draft)}",
                address=self.address,
            )
        v = decide(draft, accepted, nxt, base=len(toks), max_context=self.max_context, is_end=self.tokenizer.is_eog,
                   continue_after_eog=block.continue_after_eog)
        toks.extend(v.committed)
        return v.answer(
            # These APIs report no server timings: the whole call is charged to verification,
            # and the exchange teaches the link estimate nothing (server_ms unknown).
            verify_ms=ms,
            exchanges=(Exchange(ms, None, *self.http.last_sizes),),
        )

    def _known(self, ids: list[int]) -> list[int]:
        """The server's tokens, each one the draft has: a target whose vocabulary has more padding
        entries than the draft's could name one (a stock server judges over all of its entries),
        which the device could neither run nor print."""
        n = self.tokenizer.n_vocab
        bad = next((t for t in ids if not 0 <= t < n), None)
        if bad is not None:
            raise ProtocolError(
                f"the {self.kind} at {self.address} chose token {bad}, outside the draft's {n}-token vocabulary "
                "(a padding entry of the target's?); this pair cannot continue the text through it",
                address=self.address,
            )
        return ids

    def close_session(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)

    def generate(
        self,
        prompt_tokens: Sequence[int],
        *,
        mode: str,
        sampler: Sampler,
        seed: int,
        max_tokens: int,
        slo: SpeedObjective = SpeedObjective(),
        logprobs: int = -1,
    ) -> Iterator[GeneratedToken]:
        if mode != "greedy":
            raise ConfigError(f"the {self.kind} at {self.address} is driven greedily here; use mode='greedy'")
        if logprobs >= 0:
            raise ConfigError(f"the target's log-probabilities are not read from the {self.kind} at {self.address}")
        if sampler.adjusts:
            raise ConfigError(f"the {self.kind} at {self.address} decodes the target's plain argmax here: no "
                              "penalties or logit_bias")
        self._no_slo(slo)
        t0 = time.perf_counter()
        ids = self._known(self._generate_ids(list(prompt_tokens), max_tokens))
        ms = (time.perf_counter() - t0) * 1e3 / max(len(ids), 1)
        for i, tok in enumerate(ids):
            last = i + 1 == len(ids)
            reason = ("eos" if self.tokenizer.is_eog(tok) else "length") if last else None
            yield GeneratedToken(tok, i, decode_ms=ms, finish_reason=reason)

    def close(self) -> None:
        self.http.close()
