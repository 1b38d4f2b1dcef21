"""edgekit.verifier.v1, the wire protocol, as both ends use it.

- `pb`, `pb_grpc`: the code generated from proto/verifier.proto
  (`python proto/generate.py`), which documents every message.
- Python values of the protocol (`BlockRequest`, `VerifyResult`, `ServerInfo`, ...)
  and their protobuf conversions (`*_to_pb`, `*_from_pb`).
- The acceptance rules (greedy, lossless speculative sampling, a stock server's
  top-1 tokens) and `decide`, the verdict every verifier path applies.
- The hidden-state codec of FH and SH uploads.
- The mapping between edgekit errors and gRPC status codes, used by both ends.
"""

from ._acceptance import (
    SparseDistribution,
    accept_greedy,
    accept_sampling,
    accept_semantic,
    accept_top1,
    acceptance_ratios,
    draft_distribution,
    mismatch_positions,
    target_probs,
    top1_mismatches,
)
from ._hidden import ENCODINGS, EncodedHidden, bits_per_element, decode_hidden, encode_hidden, encoding_error
from ._pb import verifier_pb2 as pb
from ._pb import verifier_pb2_grpc as pb_grpc
from ._status import COMMITTED_LENGTH_KEY, RETRY_AFTER_MS_KEY, Status, error_from_status, status_of
from ._types import (
    MIN_PROTOCOL_VERSION,
    PROTOCOL_VERSION,
    BlockRequest,
    Exchange,
    Fingerprint,
    GeneratedToken,
    LinkState,
    OpenedSession,
    ServerInfo,
    SpeedObjective,
    VerifyResult,
)
from ._verdict import Verdict, check_base, decide
from ._wire import (
    ENCODING_FROM_PB,
    ENCODING_TO_PB,
    FINISH_FROM_PB,
    FINISH_TO_PB,
    MODE_FROM_PB,
    MODE_TO_PB,
    UPLOAD_FROM_PB,
    UPLOAD_TO_PB,
    distributions_from_pb,
    fingerprint_from_pb,
    fingerprint_to_pb,
    hidden_answer_to_pb,
    hidden_from_pb,
    hidden_to_pb,
    link_from_pb,
    link_to_pb,
    sampling_to_pb,
    server_info_from_pb,
    verify_request_to_pb,
)

SERVICE_NAME = "edgekit.verifier.v1.Verifier"

__all__ = [
    "COMMITTED_LENGTH_KEY",
    "ENCODINGS",
    "ENCODING_FROM_PB",
    "ENCODING_TO_PB",
    "FINISH_FROM_PB",
    "FINISH_TO_PB",
    "MIN_PROTOCOL_VERSION",
    "MODE_FROM_PB",
    "MODE_TO_PB",
    "PROTOCOL_VERSION",
    "RETRY_AFTER_MS_KEY",
    "SERVICE_NAME",
    "UPLOAD_FROM_PB",
    "UPLOAD_TO_PB",
    "BlockRequest",
    "EncodedHidden",
    "Exchange",
    "Fingerprint",
    "GeneratedToken",
    "LinkState",
    "OpenedSession",
    "ServerInfo",
    "SparseDistribution",
    "SpeedObjective",
    "Status",
    "Verdict",
    "VerifyResult",
    "accept_greedy",
    "accept_sampling",
    "accept_semantic",
    "accept_top1",
    "acceptance_ratios",
    "bits_per_element",
    "check_base",
    "decide",
    "decode_hidden",
    "distributions_from_pb",
    "draft_distribution",
    "encode_hidden",
    "encoding_error",
    "error_from_status",
    "fingerprint_from_pb",
    "fingerprint_to_pb",
    "hidden_answer_to_pb",
    "hidden_from_pb",
    "hidden_to_pb",
    "link_from_pb",
    "link_to_pb",
    "mismatch_positions",
    "pb",
    "pb_grpc",
    "sampling_to_pb",
    "server_info_from_pb",
    "status_of",
    "target_probs",
    "top1_mismatches",
    "verify_request_to_pb",
]
