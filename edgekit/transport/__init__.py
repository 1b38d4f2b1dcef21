"""Transports to verifiers: one seam (`VerifierTransport`), several backends.

`connect(url, ...)` picks one by the URL's scheme, a lookup in `edgekit.registry.TRANSPORTS`
(`_schemes` holds the shipped builders; a package adds a scheme by entry point): `GrpcTransport`
for an edgekit verifier, `OpenAITransport`, `SGLangTransport` and `TritonTransport` (TensorRT-LLM
on Triton) for stock serving engines that can verify greedy decoding. `MessageTransport` is the
client side of edgekit's protocol over any carrier (gRPC here; in process for tests).
"""

from ._base import VerifierTransport
from ._connect import connect, needs_tokenizer
from ._failover import FailoverTransport
from ._grpc import CLIENT_HEADER, SESSION_HEADER, GrpcTransport, map_rpc_error
from ._message import MessageTransport
from ._openai import PREFIXES_FROM, OpenAITransport
from ._sglang import SGLangTransport
from ._stateless import TOKENIZER_PROBE, StatelessTransport
from ._triton import TritonTransport

__all__ = [
    "CLIENT_HEADER",
    "PREFIXES_FROM",
    "SESSION_HEADER",
    "TOKENIZER_PROBE",
    "FailoverTransport",
    "GrpcTransport",
    "MessageTransport",
    "OpenAITransport",
    "SGLangTransport",
    "StatelessTransport",
    "TritonTransport",
    "VerifierTransport",
    "connect",
    "map_rpc_error",
    "needs_tokenizer",
]
