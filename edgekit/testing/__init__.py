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

`ScriptedTransport` is a verifier transport whose every call a test decides, as httpx's
`MockTransport` takes a handler: the `handler` answers each `Call` (or forwards it to an `inner`
transport: the toy verifier, a gRPC one), and the transport records every call. `faults(script)`
is a handler from a script of faults at the n-th call of a method (a request dropped, an answer
lost, an error raised).
(A semantic decision head that reads only the link: `edgekit.semantic.head.link_only_head`,
with the training tooling.)
"""


from ..runtime import ToyLanguageModel
from ..verifier import ToyEngine
from ._clock import ManualClock
from ._faults import Fault, faults
from ._inprocess import InProcessTransport
from ._link import SimulatedLink
from ._models import FakeDraftModel, ToyPoolBackend
from ._scripted import Call, ScriptedTransport
from ._toys import toy_client, toy_verifier

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
    "toy_verifier",
]
