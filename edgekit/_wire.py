"""Conversions between edgekit's types and edgekit.verifier.v1 messages, used by both ends."""

from __future__ import annotations

from ._llama import Fingerprint
from ._proto import verifier_pb2 as pb

MODE_TO_PB = {"greedy": pb.ACCEPTANCE_MODE_GREEDY, "sample": pb.ACCEPTANCE_MODE_SAMPLING}
MODE_FROM_PB = {
    pb.ACCEPTANCE_MODE_GREEDY: "greedy",
    pb.ACCEPTANCE_MODE_SAMPLING: "sample",
    pb.ACCEPTANCE_MODE_SEMANTIC: "semantic",
}
UPLOAD_FROM_PB = {
    pb.UPLOAD_PROTOCOL_TOKENS_ONLY: "tokens",
    pb.UPLOAD_PROTOCOL_FULL_HIDDEN: "fh",
    pb.UPLOAD_PROTOCOL_SELECTIVE_HIDDEN: "sh",
}
SLO_TO_PB = {"interactive": pb.SLO_CLASS_INTERACTIVE, "standard": pb.SLO_CLASS_STANDARD, "batch": pb.SLO_CLASS_BATCH}
SLO_FROM_PB = {v: k for k, v in SLO_TO_PB.items()} | {pb.SLO_CLASS_UNSPECIFIED: "standard"}
FINISH_TO_PB = {"eos": pb.FINISH_REASON_EOS, "length": pb.FINISH_REASON_LENGTH, "context": pb.FINISH_REASON_CONTEXT}
FINISH_FROM_PB = {v: k for k, v in FINISH_TO_PB.items()}


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


def sampling_to_pb(mode: str, temperature: float, seed: int) -> pb.SamplingParams:
    return pb.SamplingParams(mode=MODE_TO_PB[mode], temperature=temperature, seed=seed)
