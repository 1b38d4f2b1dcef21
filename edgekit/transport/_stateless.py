"""Verification on servers that keep no edgekit session: stock serving engines reached over
HTTP (OpenAI-compatible completions, SGLang's generate).

The client holds each session's committed tokens and sends the whole sequence (committed plus
draft block) every round. Greedy: the server's top-1 token at each block position decides
acceptance exactly as greedy verification does, and its greedy next token after the block is
the bonus. Sampling, where a backend returns the top-k log-probabilities at every position
(`samples`): a sampler with a top-k within the server's cap (`max_logprobs`; vLLM's is 20 unless
started with --max-logprobs) needs only those, so this transport applies the sampler to them,
and the lossless rule (`accept_sampling`), with the session's seeded generator, here on the
device: the output is distributed exactly as the target's own sampling with that top-k (then
temperature, min-p and top-p over what it keeps). Penalties and logit bias are refused: they can
raise a token outside the top-k the server returned. What these backends cannot do is declared in
`ServerInfo` (no hidden-state uploads; no assigned budgets) and the session refuses it.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

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
    GenerateRequest,
    OpenedSession,
    OpenRequest,
    Sampler,
    ServerFigures,
    ServerInfo,
    SpeedObjective,
    VerifyResult,
    accept_sampling,
    accept_top1,
    check_base,
    decide,
)
from ..runtime import DraftModel
from ._http import HttpJson

__all__ = ["StatelessTransport"]

# Text for the tokenizer check: code, numbers, accents, CJK, an emoji, runs of spaces.
TOKENIZER_PROBE = "def f(x):\n    return x**2  # 3.14159, naïve café, 日本語, emoji 🙂, tabs\tand  spaces."


@dataclass
class _Session:
    tokens: list[int]  # committed
    mode: str
    sampler: Sampler
    rng: np.random.Generator  # the acceptance rule's draws (a sampling session), seeded by the session


class StatelessTransport:
    backend = "stateless"
    kind = "server"
    prefix_cache = False  # whether the server reuses the shared prefix of successive requests
    can_time_payloads = False  # no echo endpoint: the link's rates cannot be probed, only its RTT
    samples = False  # whether it returns top-k log-probabilities at every position (`_topk`)
    max_logprobs = 0  # the most it returns per position

    def __init__(self, http: HttpJson, tokenizer: DraftModel, *, max_context: int = 4096, max_block: int = 16) -> None:
        self.http = http
        self.address = http.address
        self.tokenizer = tokenizer
        self.max_context = max_context
        self.max_block = max_block
        self.model = ""
        self.tokenizer_check = "none"
        self._sessions: dict[str, _Session] = {}
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

    def _topk(self, tokens: Sequence[int], start: int, k: int) -> list[dict[int, float]]:
        """The target's k likeliest tokens and their log-probabilities predicting tokens[start],
        tokens[start + 1], ... and the one after the last: one row each (where `samples`)."""
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
            modes=("greedy", "sample") if self.samples else ("greedy",),
            upload_protocols=("tokens",),
            max_block=self.max_block,
            max_context=self.max_context,
            max_sessions=1 << 16,
            assigns_budgets=False,
            prefix_cache=self.prefix_cache,
            max_draft_top_k=1024 if self.samples else 0,  # the draft's distributions stay on this device
            sampler_features=("top_k", "top_p", "min_p") if self.samples else (),
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
        sampler = request.sampler
        if mode == "sample" and not self.samples:
            raise ConfigError(
                f"the {self.kind} at {self.address} returns top-1 log-probabilities only, which verify greedy "
                f"decoding but carry no target distribution for {mode!r}; use mode='greedy' or an edgekit verifier"
            )
        if mode == "sample" and not 1 <= sampler.top_k <= self.max_logprobs:
            raise ConfigError(
                f"sampling against the {self.kind} at {self.address} needs a top_k from 1 to {self.max_logprobs}: "
                f"it returns the target's {self.max_logprobs} likeliest tokens per position, and the target's "
                "distribution beyond them is unknown (for vLLM, --max-logprobs raises its cap; then "
                "openai+http://...?max_logprobs=N); or use an edgekit verifier, which samples any setting"
            )
        if sampler.adjusts:
            raise ConfigError(
                f"the {self.kind} at {self.address} gives the target's raw log-probabilities: penalties and logit_bias "
                "could raise a token outside those it returns, so they cannot be applied losslessly here; use an "
                "edgekit verifier"
            )
        if request.logprobs >= 0:
            raise ConfigError(f"the target's log-probabilities are not read from the {self.kind} at {self.address}")
        self._no_slo(request.slo)
        sid = f"{self.backend}-{next(self._ids)}"
        self._sessions[sid] = _Session(list(request.prompt_tokens), mode, sampler, np.random.default_rng(request.seed))
        return OpenedSession(sid, len(request.prompt_tokens), self.max_context)

    def _no_slo(self, slo: SpeedObjective) -> None:
        if not slo.best_effort:
            raise ConfigError(
                f"the {self.kind} at {self.address} does not schedule by token-speed SLOs; "
                "leave slo_class and target_speed unset, or use an edgekit verifier"
            )

    def _session(self, sid: str) -> _Session:
        if sid not in self._sessions:
            raise SessionNotFoundError(f"session {sid!r} is unknown (closed?)", address=self.address)
        return self._sessions[sid]

    def extend_session(self, session_id: str, base_position: int, tokens: Sequence[int]) -> int:
        toks = self._session(session_id).tokens
        check_base(base_position, len(toks), what="extension", address=self.address)
        toks.extend(tokens)
        return len(toks)

    def verify(self, block: BlockRequest) -> VerifyResult:
        sess = self._session(block.session_id)
        toks = sess.tokens
        check_base(block.base_position, len(toks), address=self.address)
        if block.upload != "tokens":
            raise ProtocolError(f"the {self.kind} at {self.address} takes no hidden states", address=self.address)
        draft = list(block.draft_tokens)
        if len(toks) + len(draft) + 1 > self.max_context:
            raise LimitExceededError(
                f"a block of {len(draft)} on {len(toks)} tokens exceeds the context of {self.max_context}"
            )
        t0 = time.perf_counter()
        if sess.mode == "sample":
            accepted, nxt = self._sampled(sess, draft, block)
        else:
            accepted, nxt = accept_top1(self._known(self._top1(toks + draft, len(toks))), draft)
        ms = (time.perf_counter() - t0) * 1e3
        if nxt is None:
            raise ProtocolError(
                f"the {self.kind} at {self.address} gave too few predictions for a block of {len(draft)}",
                address=self.address,
            )
        v = decide(draft, accepted, nxt, base=len(toks), max_context=self.max_context, is_end=self.tokenizer.is_eog,
                   continue_after_eog=block.continue_after_eog)
        toks.extend(v.committed)
        return v.answer(
            # These APIs report no server timings: the whole call is charged to verification,
            # and the exchange teaches the link estimate nothing (server_ms unknown).
            server=ServerFigures(verify_ms=ms),
            exchanges=(Exchange(ms, None, *self.http.last_sizes),),
        )

    def _sampled(self, sess: _Session, draft: list[int], block: BlockRequest) -> tuple[int, int | None]:
        """(accepted, next token) by the lossless rule over the target's top-k at each position."""
        k = sess.sampler.top_k
        rows = self._topk(sess.tokens + draft, len(sess.tokens), k)
        if len(rows) != len(draft) + 1:
            return 0, None
        logits = np.full((len(rows), self.tokenizer.n_vocab), -np.inf, dtype=np.float32)
        for r, top in enumerate(rows):
            ids = self._known(sorted(top, key=lambda t: -top[t])[:k])
            if len(ids) < k:
                raise ProtocolError(
                    f"the {self.kind} at {self.address} returned {len(ids)} of the {k} likeliest tokens at a position",
                    address=self.address,
                )
            logits[r, ids] = [top[t] for t in ids]  # log-probabilities: logits up to a constant, all the sampler needs
        if len(block.draft_distributions) != len(draft):
            raise ProtocolError("sampling needs the draft's distribution of every draft token")
        return accept_sampling(logits, draft, block.draft_distributions, sess.sampler, sess.rng, sess.tokens)

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

    def generate(self, request: GenerateRequest) -> Iterator[GeneratedToken]:
        if request.mode != "greedy":
            raise ConfigError(f"the {self.kind} at {self.address} is driven greedily here; use mode='greedy'")
        if request.logprobs >= 0:
            raise ConfigError(f"the target's log-probabilities are not read from the {self.kind} at {self.address}")
        if request.sampler.adjusts:
            raise ConfigError(f"the {self.kind} at {self.address} decodes the target's plain argmax here: no "
                              "penalties or logit_bias")
        self._no_slo(request.slo)
        t0 = time.perf_counter()
        ids = self._known(self._generate_ids(list(request.prompt_tokens), request.max_tokens))
        ms = (time.perf_counter() - t0) * 1e3 / max(len(ids), 1)
        stops = set(request.stop_tokens)
        ids = next((ids[: i + 1] for i, tok in enumerate(ids) if tok in stops), ids)  # the first stop token ends it
        for i, tok in enumerate(ids):
            last = i + 1 == len(ids)
            reason = ("eos" if self.tokenizer.is_eog(tok) or tok in stops else "length") if last else None
            yield GeneratedToken(tok, i, decode_ms=ms, finish_reason=reason)

    def close(self) -> None:
        self.http.close()
