"""What the verifier checks of a request before it touches a session or the engine.

Every check raises an edgekit error that the service turns into a gRPC status:
`ProtocolError` (INVALID_ARGUMENT unless it names another code),
`IncompatibleModelsError` (FAILED_PRECONDITION), `LimitExceededError` naming
OUT_OF_RANGE for context limits. Each message names what was wrong.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..config import ServerConfig
from ..errors import IncompatibleModelsError, LimitExceededError, ProtocolError
from ..protocol import (
    MAX_TOP_LOGPROBS,
    MIN_PROTOCOL_VERSION,
    PROTOCOL_VERSION,
    ContextSpan,
    Fingerprint,
    Sampler,
    SparseDistribution,
)

__all__ = ["RequestChecks", "clip"]

_MODES = ("greedy", "sample")
_UPLOADS = ("tokens", "fh", "sh")
MAX_CLIENT_ID = 256  # characters of OpenSession's client_id
MAX_STOP_TOKENS = 256  # token ids a Generate request may stop at (a user's stop strings are few)


class RequestChecks:
    """`n_vocab`: the ids the target runs (its logits' width); `n_real`: those of them that are
    tokens, before its padding entries (the ones it may commit)."""

    def __init__(self, config: ServerConfig, target: Fingerprint) -> None:
        self.config = config
        self.target = target
        self.n_vocab = target.vocab_size
        self.n_real = target.real_vocab_size

    def protocol_version(self, version: int) -> int:
        """The version both ends speak: the client's highest, if this verifier speaks it, or its own."""
        if version < MIN_PROTOCOL_VERSION:
            raise ProtocolError(
                f"protocol version {version} is not supported; this verifier speaks "
                f"{MIN_PROTOCOL_VERSION} to {PROTOCOL_VERSION}",
                code="FAILED_PRECONDITION",
            )
        return min(version, PROTOCOL_VERSION)

    def tokenizer(self, draft: Fingerprint) -> None:
        """The draft's tokenizer must be the target's; their vocabularies may differ in padding."""
        fp = self.target
        if not fp.same_tokenizer(draft):
            what = (
                f"vocabulary {draft.vocab_size} vs {fp.vocab_size} entries, and not by padding alone"
                if draft.vocab_size != fp.vocab_size
                else "same vocabulary size, different tokens or special tokens"
            )
            raise IncompatibleModelsError(
                f"draft model {clip(draft.model_name) if draft.model_name else '(unnamed)'} does not share a tokenizer "
                "with target model "
                f"{fp.model_name!r} ({what}); use a draft from the target's family"
            )

    def sampling(self, mode: str, sampler: Sampler) -> None:
        """`mode` as edgekit names it, or the wire's name for one edgekit does not verify."""
        if mode not in _MODES:
            raise ProtocolError(f"acceptance mode {mode} is not supported by this verifier")
        if mode == "sample" and not sampler.temperature > 0:
            raise ProtocolError(f"sampling needs a temperature > 0, got {sampler.temperature}")
        if mode == "semantic" and sampler.adjusts:
            raise ProtocolError(
                "semantic mode judges the target's plain top-1 token: it takes no penalties or logit_bias"
            )
        if any(t >= self.n_real for t, _ in sampler.logit_bias):
            raise ProtocolError(f"logit_bias names a token past the target's {self.n_real} tokens")

    def logprobs(self, top: int) -> None:
        """How many alternatives of each committed token's log-probability were asked for (-1: none)."""
        if top > MAX_TOP_LOGPROBS:
            raise ProtocolError(f"top_logprobs {top} exceeds this verifier's {MAX_TOP_LOGPROBS}")

    def tokens(self, tokens: Sequence[int], what: str, vocab: int = 0) -> None:
        """Every id below `vocab` (default: the target's vocabulary)."""
        vocab = vocab or self.n_vocab
        ids = np.asarray(tokens, dtype=np.int64)
        bad = np.flatnonzero((ids < 0) | (ids >= vocab))
        if bad.size:
            raise ProtocolError(
                f"{what} holds token id {ids[bad[0]]} (at {bad[0]}), outside the vocabulary of {vocab}"
            )

    def client_id(self, client_id: str) -> None:
        if len(client_id) > MAX_CLIENT_ID:
            raise ProtocolError(f"client_id of {len(client_id)} characters exceeds {MAX_CLIENT_ID}")

    def prompt(self, tokens: Sequence[int]) -> None:
        if not tokens:
            raise ProtocolError("the prompt is empty")
        if len(tokens) + 1 > self.config.max_context:
            raise ProtocolError(
                f"prompt of {len(tokens)} tokens exceeds the context limit of {self.config.max_context}"
            )
        self.tokens(tokens, "the prompt")

    def history(self, n_tokens: int, spans: Sequence[ContextSpan]) -> tuple[ContextSpan, ...]:
        """How a reopened context was built, span by span (`OpenRequest.history`): their count read
        before a copy (no more spans than tokens), each at least a token long, adding up to the
        prompt. As values, copied off the message."""
        if len(spans) > n_tokens:
            raise ProtocolError(f"the context's history has {len(spans)} spans for {n_tokens} tokens")
        out = tuple(ContextSpan(int(s.length), bool(s.generated)) for s in spans)
        if any(s.length < 1 for s in out):
            raise ProtocolError("a span of the context's history is empty")
        if out and sum(s.length for s in out) != n_tokens:
            raise ProtocolError(
                f"the context's history spans {sum(s.length for s in out)} tokens; the prompt has {n_tokens}"
            )
        return out

    def extension(self, committed: int, tokens: Sequence[int]) -> None:
        if committed + len(tokens) + 1 > self.config.max_context:
            raise LimitExceededError(
                f"extending to {committed + len(tokens)} tokens exceeds the context limit of {self.config.max_context}",
                code="OUT_OF_RANGE",
            )

    def block_size(self, tokens: int, distributions: int) -> None:
        """A block's length, read before anything is copied out of its message."""
        if tokens > self.config.max_block or distributions > self.config.max_block:
            what = f"{tokens} tokens" if tokens > self.config.max_block else f"{distributions} distributions"
            raise ProtocolError(f"draft block of {what} exceeds max_block={self.config.max_block}")

    def block(
        self,
        committed: int,
        block: Sequence[int],
        upload: str,
        mode: str,
        distributions: Sequence[SparseDistribution],
        draft_vocab: int = 0,
    ) -> None:
        """`draft_vocab`: the draft's vocabulary, padding included (its fingerprint's; default: the
        target's), what its tokens and distributions may name: a padding entry the target lacks
        is a draft token like another, which the round rejects."""
        # An empty block is a plain target step (a controller that predicts the
        # first draft token rejected sends none: WISP eq. 25 allows K = 0).
        if len(block) > self.config.max_block:
            raise ProtocolError(f"draft block of {len(block)} tokens exceeds max_block={self.config.max_block}")
        self.tokens(block, "the draft block", draft_vocab)
        if committed + len(block) + 1 > self.config.max_context:
            raise LimitExceededError(
                f"a block of {len(block)} on {committed} committed tokens exceeds the context limit of "
                f"{self.config.max_context}",
                code="OUT_OF_RANGE",
            )
        if upload not in _UPLOADS:
            raise ProtocolError(f"upload protocol {upload} is not one this verifier knows")
        if mode == "sample":
            self.distributions(distributions, block, draft_vocab)

    def distributions(self, dists: Sequence[SparseDistribution], block: Sequence[int], draft_vocab: int = 0) -> None:
        vocab = draft_vocab or self.n_vocab
        if len(dists) != len(block):
            raise ProtocolError(f"sampling needs one draft distribution per draft token: {len(dists)} for {len(block)}")
        for i, (d, tok) in enumerate(zip(dists, block)):
            if len(d.ids) != len(d.probs) or not len(d.ids):
                raise ProtocolError(f"draft distribution {i} has {len(d.ids)} ids and {len(d.probs)} probabilities")
            if len(d.ids) > self.config.max_draft_top_k:
                raise ProtocolError(
                    f"draft distribution {i} has {len(d.ids)} entries, over {self.config.max_draft_top_k}"
                )
            ids = d.ids
            probs = np.asarray(d.probs, dtype=np.float64)
            if ids.min() < 0 or ids.max() >= vocab or np.unique(ids).size != ids.size:
                raise ProtocolError(f"draft distribution {i} has token ids out of range or repeated")
            if not np.all(np.isfinite(probs)) or probs.min() <= 0 or abs(probs.sum() - 1.0) > 1e-3:
                raise ProtocolError(f"draft distribution {i} is not a probability distribution (sum {probs.sum():.6f})")
            if tok not in ids:
                raise ProtocolError(f"draft token {tok} at offset {i} is outside its draft distribution")

    def stop_tokens(self, tokens: Sequence[int]) -> None:
        """A generation's stop tokens: at most MAX_STOP_TOKENS (counted before a copy), each in the vocabulary."""
        if len(tokens) > MAX_STOP_TOKENS:
            raise ProtocolError(f"{len(tokens)} stop tokens exceed {MAX_STOP_TOKENS}")
        self.tokens(tokens, "stop_tokens")

    def generate_length(self, max_tokens: int) -> None:
        if not 1 <= max_tokens <= self.config.max_generate_tokens:
            raise ProtocolError(f"max_tokens must be between 1 and {self.config.max_generate_tokens}")

    def ping_reply(self, reply_bytes: int) -> None:
        # a few bytes must not buy megabytes of the verifier's uplink: the probe's payloads grow to this
        limit = min(self.config.max_message_bytes // 2, self.config.max_ping_reply_bytes)
        if reply_bytes > limit:
            raise ProtocolError(f"reply_bytes {reply_bytes} exceeds {limit}")


def clip(value: object, limit: int = 48) -> str:
    """`value` for an error message: repr'd and cut to `limit` characters, so a message never echoes a whole input."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 16]}... ({len(text)} chars)"
