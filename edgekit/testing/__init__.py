"""Fakes for the seams, for tests of code built on edgekit (and edgekit's own).

`ToyLanguageModel` is a deterministic stand-in for an LM: the logits of a
context are a pseudo-random function of its last tokens; `ToyEngine` serves one
as a verifier's target. `FakeDraftModel`
drives one through the `DraftModel` protocol, `ToyPoolBackend` through a
`DraftPool` (several sequences, batched steps). `toy_verifier(target)` is the
real verifier service over a toy target, reached through `InProcessTransport`:
every request goes as the protobuf bytes gRPC would carry, through the same
checks, rounds and acceptance as `edgekit serve`, so speculative output through
the fakes equals the toy target's own decoding. `SimulatedLink` gives each
exchange the time a modelled link would take, without waiting.

`toy_client(target, ...)` is an `EdgeClient` over all of these in one call: the toy verifier
of `target` and a fake draft of it with some noise, GenerationConfig's fields as keywords.
`toy_server(target, ...)` serves the toy target over real gRPC on a loopback port, as `edgekit
serve` serves a model, for tests of what goes over the wire (tokens, deadlines, proxies).

`ScriptedTransport` is a verifier transport whose every call a test decides, as httpx's
`MockTransport` takes a handler: the `handler` answers each `Call` (or forwards it to an `inner`
transport: the toy verifier, a gRPC one), and the transport records every call. `faults(script)`
is a handler from a script of faults at the n-th call of a method (a request dropped, an answer
lost, an error raised).
(A semantic decision head that reads only the link: `edgekit.semantic.head.link_only_head`,
with the training tooling.)
"""


from importlib import import_module
from typing import TYPE_CHECKING, Any

from ..runtime import ToyLanguageModel
from ._clock import ManualClock
from ._faults import Fault, faults
from ._inprocess import InProcessTransport
from ._link import SimulatedLink
from ._models import FakeDraftModel, ToyPoolBackend
from ._scripted import Call, ScriptedTransport

if TYPE_CHECKING:
    from ..verifier import ToyEngine
    from ._toys import toy_client, toy_server, toy_verifier

# What needs the verifier (and, for toy_client, the client) loads on first use: a test of code
# built on edgekit that only scripts a transport or fakes a draft does not import the verifier.
_LAZY = {"ToyEngine": "..verifier", "toy_client": "._toys", "toy_server": "._toys", "toy_verifier": "._toys"}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(_LAZY[name], __name__), name)
    globals()[name] = value
    return value

__all__ = [
    "Call",
    "FakeDraftModel",
    "Fault",
    "InProcessTransport",
    "ManualClock",
    "ScriptedTransport",
    "SimulatedLink",
    "ToyEngine",
    "ToyLanguageModel",
    "ToyPoolBackend",
    "faults",
    "toy_client",
    "toy_server",
    "toy_verifier",
]
