"""Conversions between edgekit's values and edgekit.verifier.v1 messages: for each message,
the pair both ends use (`*_to_pb` where it is written, `*_from_pb` where it is read). A field
added to a message is written and read here, and nowhere else: the client's transport and
the verifier's service only call these.

| message                          | value                        |
|----------------------------------|------------------------------|
| HandshakeResponse                | `ServerInfo`                 |
| OpenSessionRequest / Response    | `OpenRequest` / `OpenedSession` |
| VerifyRequest                    | `BlockRequest` out, `ReceivedBlock` in |
| VerifyResponse                   | `VerifyResult` or `HiddenRequest` |
| GenerateResponse                 | `GeneratedToken`             |

The smaller requests (Handshake, Ping, ExtendSession, CloseSession, Generate) carry a few
scalars, read and written where they are used.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from typing import cast

import numpy as np

from ..errors import ConfigError, ProtocolError
from ._acceptance import SparseDistribution
from ._hidden import EncodedHidden, encode_hidden
from ._logprobs import TokenLogprobs
from ._pb import verifier_pb2 as pb
from ._sampler import Sampler
from ._types import (
    BlockRequest,
    ContextSpan,
    Fingerprint,
    GeneratedToken,
    GenerateRequest,
    HiddenRequest,
    LinkState,
    OpenedSession,
    OpenRequest,
    ReceivedBlock,
    ServerFigures,
    ServerInfo,
    SpeedObjective,
    VerifyResult,
)

# Enum values arrive as ints (an unknown one too): the maps from the wire are keyed by int.
MODE_TO_PB: dict[str, pb.AcceptanceMode] = {
    "greedy": pb.ACCEPTANCE_MODE_GREEDY,
    "sample": pb.ACCEPTANCE_MODE_SAMPLING,
    "semantic": pb.ACCEPTANCE_MODE_SEMANTIC,
}
MODE_FROM_PB: dict[int, str] = {
    pb.ACCEPTANCE_MODE_GREEDY: "greedy",
    pb.ACCEPTANCE_MODE_SAMPLING: "sample",
    pb.ACCEPTANCE_MODE_SEMANTIC: "semantic",
}
UPLOAD_TO_PB: dict[str, pb.UploadProtocol] = {
    "tokens": pb.UPLOAD_PROTOCOL_TOKENS_ONLY,
    "fh": pb.UPLOAD_PROTOCOL_FULL_HIDDEN,
    "sh": pb.UPLOAD_PROTOCOL_SELECTIVE_HIDDEN,
}
UPLOAD_FROM_PB: dict[int, str] = {int(v): k for k, v in UPLOAD_TO_PB.items()}
ENCODING_TO_PB: dict[str, pb.HiddenEncoding] = {"fp16": pb.HIDDEN_ENCODING_FP16, "int8": pb.HIDDEN_ENCODING_INT8}
ENCODING_FROM_PB: dict[int, str] = {int(v): k for k, v in ENCODING_TO_PB.items()}
FINISH_TO_PB: dict[str, pb.FinishReason] = {
    "eos": pb.FINISH_REASON_EOS,
    "length": pb.FINISH_REASON_LENGTH,
    "context": pb.FINISH_REASON_CONTEXT,
}
FINISH_FROM_PB: dict[int, str] = {int(v): k for k, v in FINISH_TO_PB.items()}


def fingerprint_to_pb(fp: Fingerprint) -> pb.TokenizerFingerprint:
    return pb.TokenizerFingerprint(
        vocab_size=fp.vocab_size,
        token_hash=fp.token_hash,
        bos_token=fp.bos_token,
        eos_token=fp.eos_token,
        model_name=fp.model_name,
    )


def fingerprint_from_pb(m: pb.TokenizerFingerprint) -> Fingerprint:
    return Fingerprint(m.vocab_size, m.token_hash, m.bos_token, m.eos_token, m.model_name)


_COUNTS = ("top_k", "penalty_last_n")  # recommended sampler settings that are whole numbers


def server_info_from_pb(r: pb.HandshakeResponse) -> ServerInfo:
    """What a handshake told of the verifier (modes or uploads this client does not know are left out)."""
    c = r.capabilities
    return ServerInfo(
        protocol_version=r.protocol_version,
        target_model=r.target_model,
        target_fingerprint=fingerprint_from_pb(r.target_tokenizer),
        target_hidden_size=r.target_hidden_size,
        modes=tuple(MODE_FROM_PB[m] for m in c.acceptance_modes if m in MODE_FROM_PB),
        upload_protocols=tuple(UPLOAD_FROM_PB[u] for u in c.upload_protocols if u in UPLOAD_FROM_PB),
        max_block=c.max_block,
        max_context=c.max_context,
        max_sessions=c.max_sessions,
        assigns_budgets=c.assigns_budgets,
        prefix_cache=c.prefix_cache,
        max_draft_top_k=c.max_draft_top_k,
        chat_template=r.chat_template or None,
        recommended_sampling={k: int(v) if k in _COUNTS else v for k, v in r.recommended_sampling.items()},
        server_version=r.server_version,
        exact_numerics=c.exact_numerics,
        invariant_batch=c.invariant_batch,
        slo_classes=dict(c.slo_classes),
        scheduling_policy=c.scheduling_policy,
        semantic_head=c.semantic_head,
        semantic_threshold=c.semantic_threshold,
        hidden_encodings=tuple(ENCODING_FROM_PB[e] for e in c.hidden_encodings if e in ENCODING_FROM_PB),
        max_message_bytes=c.max_message_bytes,
        sampler_features=tuple(c.sampler_features),
        max_top_logprobs=c.max_top_logprobs,
        decode_step_ms=c.decode_step_ms if math.isfinite(c.decode_step_ms) and c.decode_step_ms > 0 else 0.0,
        round_streams=c.round_streams,
    )


def server_info_to_pb(info: ServerInfo) -> pb.HandshakeResponse:
    """A handshake's answer (the target, and what the verifier does)."""
    return pb.HandshakeResponse(
        protocol_version=info.protocol_version,
        target_tokenizer=fingerprint_to_pb(info.target_fingerprint),
        target_model=info.target_model,
        target_hidden_size=info.target_hidden_size,
        capabilities=pb.Capabilities(
            acceptance_modes=[MODE_TO_PB[m] for m in info.modes],
            upload_protocols=[UPLOAD_TO_PB[u] for u in info.upload_protocols],
            hidden_encodings=[ENCODING_TO_PB[e] for e in info.hidden_encodings],
            max_block=info.max_block,
            max_context=info.max_context,
            max_sessions=info.max_sessions,
            assigns_budgets=info.assigns_budgets,
            max_draft_top_k=info.max_draft_top_k,
            prefix_cache=info.prefix_cache,
            max_message_bytes=info.max_message_bytes,
            exact_numerics=info.exact_numerics,
            invariant_batch=info.invariant_batch,
            slo_classes=info.slo_classes,
            scheduling_policy=info.scheduling_policy,
            semantic_head=info.semantic_head,
            semantic_threshold=info.semantic_threshold,
            sampler_features=info.sampler_features,
            max_top_logprobs=info.max_top_logprobs,
            decode_step_ms=info.decode_step_ms,
            round_streams=info.round_streams,
        ),
        server_version=info.server_version,
        chat_template=info.chat_template or "",
        recommended_sampling=dict(info.recommended_sampling),
    )


def link_to_pb(link: LinkState) -> pb.LinkState:
    return pb.LinkState(
        rtt_ms=link.rtt_ms,
        rtt_jitter_ms=link.rtt_jitter_ms,
        uplink_mbps=link.uplink_mbps,
        downlink_mbps=link.downlink_mbps,
        loss_rate=link.loss_rate,
        samples=link.samples,
    )


def link_from_pb(m: pb.LinkState) -> LinkState:
    """The link state a round carried; figures that cannot be (negative, not finite) read as unmeasured."""
    values = [m.rtt_ms, m.rtt_jitter_ms, m.uplink_mbps, m.downlink_mbps, m.loss_rate]
    if not all(np.isfinite(v) and v >= 0 for v in values) or m.loss_rate > 1:
        return LinkState()
    return LinkState(m.rtt_ms, m.rtt_jitter_ms, m.uplink_mbps, m.downlink_mbps, m.loss_rate, m.samples)


def sampling_to_pb(
    mode: str, sampler: Sampler, seed: int, semantic_threshold: float = 0.0, logprobs: int = -1
) -> pb.SamplingParams:
    """`logprobs`: the target's log-probabilities of committed tokens with this many alternatives; -1: none."""
    return pb.SamplingParams(
        logprobs=logprobs >= 0, top_logprobs=max(logprobs, 0),
        mode=MODE_TO_PB[mode], temperature=sampler.temperature, seed=seed, semantic_threshold=semantic_threshold,
        top_k=sampler.top_k, top_p=sampler.top_p, min_p=sampler.min_p, repetition_penalty=sampler.repetition_penalty,
        frequency_penalty=sampler.frequency_penalty, presence_penalty=sampler.presence_penalty,
        penalty_last_n=sampler.penalty_last_n, logit_bias=dict(sampler.logit_bias),
    )


def sampler_from_pb(m: pb.SamplingParams) -> Sampler:
    """The session's sampler (temperature 0 unless the mode samples); ProtocolError for settings
    out of range."""
    try:
        return Sampler(
            temperature=float(m.temperature) if m.mode == pb.ACCEPTANCE_MODE_SAMPLING else 0.0,
            top_k=m.top_k, top_p=m.top_p or 1.0, min_p=m.min_p, repetition_penalty=m.repetition_penalty or 1.0,
            frequency_penalty=m.frequency_penalty, presence_penalty=m.presence_penalty,
            penalty_last_n=m.penalty_last_n, logit_bias=tuple(m.logit_bias.items()),
        )
    except ValueError as e:
        raise ProtocolError(f"sampling: {e}") from None


def mode_from_pb(value: int) -> str:
    """The acceptance mode as edgekit names it; the wire's name for one it does not verify (for the refusal)."""
    mode = MODE_FROM_PB.get(value)
    if mode is not None:
        return mode
    return pb.AcceptanceMode.Name(value) if value in pb.AcceptanceMode.values() else str(value)


def open_request_to_pb(r: OpenRequest) -> pb.OpenSessionRequest:
    return pb.OpenSessionRequest(
        prompt_tokens=r.prompt_tokens,
        sampling=sampling_to_pb(r.mode, r.sampler, r.seed, r.semantic_threshold, r.logprobs),
        draft_tokenizer=fingerprint_to_pb(r.draft),
        draft_hidden_size=r.draft_hidden_size,
        slo_name=r.slo.slo_class or "",
        target_tokens_per_s=r.slo.tokens_per_s or 0.0,
        client_id=r.client_id,
        history=[pb.ContextSpan(length=h.length, generated=h.generated) for h in r.history],
    )


def open_request_from_pb(m: pb.OpenSessionRequest) -> OpenRequest:
    """The request as values; the prompt stays the message's sequence (its length is checked before a copy)."""
    return OpenRequest(
        prompt_tokens=m.prompt_tokens,
        mode=mode_from_pb(m.sampling.mode),
        sampler=sampler_from_pb(m.sampling),
        seed=m.sampling.seed,
        draft=fingerprint_from_pb(m.draft_tokenizer),
        draft_hidden_size=m.draft_hidden_size,
        slo=SpeedObjective(m.slo_name or None, m.target_tokens_per_s or None),
        client_id=m.client_id,
        semantic_threshold=float(m.sampling.semantic_threshold),
        logprobs=logprobs_from_pb(m.sampling),
        # the message's spans (same fields), counted before a copy as the prompt is (`RequestChecks.history`)
        history=cast(Sequence[ContextSpan], m.history),
    )


def generate_request_to_pb(r: GenerateRequest) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        prompt_tokens=r.prompt_tokens,
        sampling=sampling_to_pb(r.mode, r.sampler, r.seed, logprobs=r.logprobs),
        max_tokens=r.max_tokens,
        stop_tokens=r.stop_tokens,
        slo_name=r.slo.slo_class or "",
        target_tokens_per_s=r.slo.tokens_per_s or 0.0,
    )


def generate_request_from_pb(m: pb.GenerateRequest) -> GenerateRequest:
    """The request as values; the prompt and the stop tokens stay the message's sequences (their
    lengths are checked before a copy)."""
    return GenerateRequest(
        prompt_tokens=m.prompt_tokens,
        mode=mode_from_pb(m.sampling.mode),
        seed=m.sampling.seed,
        max_tokens=m.max_tokens,
        sampler=sampler_from_pb(m.sampling),
        stop_tokens=m.stop_tokens,
        slo=SpeedObjective(m.slo_name or None, m.target_tokens_per_s or None),
        logprobs=logprobs_from_pb(m.sampling),
    )


def logprobs_from_pb(m: pb.SamplingParams) -> int:
    """How many alternatives the log-probabilities asked for come with; -1: none asked."""
    return int(m.top_logprobs) if m.logprobs else -1


def token_logprobs_to_pb(t: TokenLogprobs) -> pb.TokenLogprobs:
    return pb.TokenLogprobs(logprob=t.logprob, top_ids=[i for i, _ in t.top], top_logprobs=[v for _, v in t.top])


def token_logprobs_from_pb(m: pb.TokenLogprobs) -> TokenLogprobs:
    return TokenLogprobs(m.logprob, tuple(zip((int(i) for i in m.top_ids), (float(v) for v in m.top_logprobs))))


def opened_to_pb(o: OpenedSession) -> pb.OpenSessionResponse:
    return pb.OpenSessionResponse(
        session_id=o.session_id,
        committed_length=o.committed_length,
        max_context=o.max_context,
        next_budget=o.next_budget,
        prefill_ms=o.prefill_ms,
        target_tokens_per_s=o.target_speed,
    )


def opened_from_pb(m: pb.OpenSessionResponse) -> OpenedSession:
    return OpenedSession(
        session_id=m.session_id,
        committed_length=m.committed_length,
        max_context=m.max_context,
        next_budget=m.next_budget,
        prefill_ms=m.prefill_ms,
        target_speed=m.target_tokens_per_s,
    )


def distributions_from_pb(dists) -> list[SparseDistribution]:  # a repeated DraftDistribution field
    """The draft distributions of a sampling round, as they were sampled from (float32, as uploaded)."""
    return [
        SparseDistribution(np.asarray(d.token_ids, dtype=np.int32), np.asarray(d.probs, dtype=np.float32))
        for d in dists
    ]


def hidden_to_pb(h: EncodedHidden) -> pb.HiddenStates:
    return pb.HiddenStates(
        encoding=ENCODING_TO_PB[h.encoding],
        count=h.count,
        dim=h.dim,
        data=h.data,
        scales=h.scales,
        positions=h.positions,
    )


def hidden_from_pb(m: pb.HiddenStates) -> EncodedHidden:
    """The message as an `EncodedHidden`; an unknown encoding keeps its enum name, for the refusal."""
    encoding = ENCODING_FROM_PB.get(m.encoding) or (
        pb.HiddenEncoding.Name(m.encoding) if m.encoding in pb.HiddenEncoding.values() else str(m.encoding)
    )
    return EncodedHidden(encoding, m.count, m.dim, m.data, tuple(m.scales), tuple(m.positions))


def verify_request_to_pb(block: BlockRequest) -> pb.VerifyRequest:
    """A round's first (or only) message: under FH with every hidden row, under
    SH with none yet (the encoding it will answer in)."""
    link = block.link
    req = pb.VerifyRequest(
        session_id=block.session_id,
        base_position=block.base_position,
        draft_tokens=block.draft_tokens,
        draft_distributions=[
            pb.DraftDistribution(token_ids=d.ids.tolist(), probs=d.probs.tolist()) for d in block.draft_distributions
        ],
        upload_protocol=UPLOAD_TO_PB[block.upload],
        link=link_to_pb(link),
        round_index=block.round_index,
        continue_after_eog=block.continue_after_eog,
        draft_ms=block.draft_ms,
        network_ms=block.network_ms,
    )
    if block.upload == "fh":
        req.hidden.CopyFrom(hidden_to_pb(encode_hidden(_rows(block), block.hidden_encoding)))
    elif block.upload == "sh":
        _rows(block)
        req.hidden.encoding = ENCODING_TO_PB[block.hidden_encoding]
    return req


def _rows(block: BlockRequest) -> np.ndarray:
    h = block.hidden
    if h is None or h.ndim != 2 or h.shape[0] != len(block.draft_tokens):
        shape = None if h is None else h.shape
        raise ConfigError(
            f"{block.upload} upload needs one hidden row per draft token: {len(block.draft_tokens)}, got {shape}"
        )
    return h


def hidden_answer_to_pb(block: BlockRequest, hidden: EncodedHidden) -> pb.VerifyRequest:
    """SH's second upload (WISV eq. 9): the requested rows and what names the round, nothing more."""
    return pb.VerifyRequest(
        session_id=block.session_id,
        base_position=block.base_position,
        round_index=block.round_index,
        upload_protocol=pb.UPLOAD_PROTOCOL_SELECTIVE_HIDDEN,
        hidden=hidden_to_pb(hidden),
    )


def verify_request_from_pb(m: pb.VerifyRequest) -> ReceivedBlock:
    """A Verify request as the verifier reads it (the hidden rows still encoded)."""
    h = m.hidden
    upload = m.upload_protocol or pb.UPLOAD_PROTOCOL_TOKENS_ONLY
    return ReceivedBlock(
        session_id=m.session_id,
        base_position=m.base_position,
        round_index=m.round_index,
        draft_tokens=tuple(m.draft_tokens),
        distributions=distributions_from_pb(m.draft_distributions),
        upload=UPLOAD_FROM_PB.get(upload, str(upload)),
        hidden=hidden_from_pb(h) if h.count or h.data else None,
        hidden_encoding=ENCODING_FROM_PB.get(h.encoding, "fp16"),
        continue_after_eog=m.continue_after_eog,
        key=round_key(m),
        draft_ms=m.draft_ms,
        network_ms=m.network_ms,
        link=link_from_pb(m.link) if m.HasField("link") else None,
    )


def round_key(m: pb.VerifyRequest) -> bytes:
    """What identifies a round for retries: a hash of the request without what a client
    measures afresh when it sends the round again (its link state and timings)."""
    stable = pb.VerifyRequest()
    stable.CopyFrom(m)
    for name in ("link", "draft_ms", "network_ms"):
        stable.ClearField(name)
    return hashlib.sha256(stable.SerializeToString(deterministic=True)).digest()


def _timings_to_pb(f: ServerFigures) -> pb.ServerTimings:
    return pb.ServerTimings(
        queue_ms=f.queue_ms,
        verify_ms=f.verify_ms,
        batch_size=f.batch_size,
        has_deadline=f.budget_ms is not None,
        budget_ms=f.budget_ms or 0.0,
        deadline_met=bool(f.deadline_met),
        estimated_ms=f.estimated_ms,
    )


def verify_response_to_pb(a: VerifyResult | HiddenRequest) -> pb.VerifyResponse:
    """A round's answer: its verdict, or (SH) the request for hidden states."""
    if isinstance(a, HiddenRequest):
        encoding = ENCODING_TO_PB.get(a.encoding, pb.HIDDEN_ENCODING_UNSPECIFIED)
        request = pb.HiddenRequest(positions=a.positions, encoding=encoding)
        return pb.VerifyResponse(hidden_request=request, timings=_timings_to_pb(a.server))
    return pb.VerifyResponse(
        verdict=pb.Verdict(
            accepted=a.accepted,
            next_token=a.next_token if a.next_token is not None else -1,
            bonus=a.bonus,
            committed_length=a.committed_length,
            context_full=a.context_full,
            ended=a.next_token is None,
            hidden_rows=a.server.hidden_rows,
            next_budget=a.next_budget,
            semantic_accepted=a.server.semantic_accepted,
            semantic_threshold=a.semantic_threshold,
            semantic_head=a.semantic_head,
            logprobs=[token_logprobs_to_pb(t) for t in a.logprobs],
        ),
        timings=_timings_to_pb(a.server),
    )


def verify_response_from_pb(m: pb.VerifyResponse) -> VerifyResult | HiddenRequest | None:
    """The answer as values; None for one that holds neither a verdict nor a request."""
    t = m.timings
    kind = m.WhichOneof("result")
    if kind not in ("hidden_request", "verdict"):
        return None
    v = m.verdict  # the default message for a hidden request: no rows, nothing accepted
    server = ServerFigures(
        queue_ms=t.queue_ms,
        verify_ms=t.verify_ms,
        hidden_rows=v.hidden_rows,
        semantic_accepted=v.semantic_accepted,
        budget_ms=t.budget_ms if t.has_deadline else None,
        deadline_met=t.deadline_met if t.has_deadline else None,
        batch_size=max(1, t.batch_size),
        estimated_ms=t.estimated_ms,
    )
    if kind == "hidden_request":
        h = m.hidden_request
        return HiddenRequest(tuple(h.positions), ENCODING_FROM_PB.get(h.encoding, "fp16"), server)
    return VerifyResult(
        accepted=v.accepted,
        next_token=None if v.ended else v.next_token,
        bonus=v.bonus,
        committed_length=v.committed_length,
        next_budget=v.next_budget,
        context_full=v.context_full,
        server=server,
        semantic_threshold=v.semantic_threshold,
        semantic_head=v.semantic_head,
        logprobs=tuple(token_logprobs_from_pb(t) for t in v.logprobs),
    )


def generated_to_pb(t: GeneratedToken) -> pb.GenerateResponse:
    return pb.GenerateResponse(
        token=t.token,
        index=t.index,
        decode_ms=t.decode_ms,
        prefill_ms=t.prefill_ms,
        finish_reason=FINISH_TO_PB.get(t.finish_reason or "", pb.FINISH_REASON_UNSPECIFIED),
        logprobs=token_logprobs_to_pb(t.logprobs) if t.logprobs is not None else None,
    )


def generated_from_pb(m: pb.GenerateResponse) -> GeneratedToken:
    return GeneratedToken(
        token=m.token,
        index=m.index,
        decode_ms=m.decode_ms,
        prefill_ms=m.prefill_ms,
        finish_reason=FINISH_FROM_PB.get(m.finish_reason),
        logprobs=token_logprobs_from_pb(m.logprobs) if m.HasField("logprobs") else None,
    )
