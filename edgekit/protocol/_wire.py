"""Conversions between edgekit's types and edgekit.verifier.v1 messages, used by both ends."""

from __future__ import annotations

import numpy as np

from ..errors import ConfigError
from ._acceptance import SparseDistribution
from ._hidden import EncodedHidden, encode_hidden
from ._pb import verifier_pb2 as pb
from ._types import BlockRequest, Fingerprint, LinkState, ServerInfo

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
        server_version=r.server_version,
        exact_numerics=c.exact_numerics,
        invariant_batch=c.invariant_batch,
        slo_classes=dict(c.slo_classes),
        scheduling_policy=c.scheduling_policy,
        semantic_head=c.semantic_head,
        semantic_threshold=c.semantic_threshold,
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


def sampling_to_pb(mode: str, temperature: float, seed: int, semantic_threshold: float = 0.0) -> pb.SamplingParams:
    return pb.SamplingParams(
        mode=MODE_TO_PB[mode], temperature=temperature, seed=seed, semantic_threshold=semantic_threshold
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
