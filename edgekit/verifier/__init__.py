"""The reference verifier: the target model behind edgekit.verifier.v1.

Its parts, each in its own module:

- `VerifierServer` (`_server`): gRPC, health, token auth, TLS, the idle-session reaper.
- `VerifierService` (`_service`): protobuf in, protobuf out.
- `RequestChecks` (`_validation`): what a request must satisfy.
- `SessionTable` (`_sessions`): sessions, their KV sequences, limits and eviction.
- `Rounds` (`_rounds`): open, extend, verify (FH, SH, replays), close.
- `TargetOnly` (`_baseline`): target-only decoding, the centralized baseline.
- `EngineCore` (`_core`): runs the scheduler's batches on the engine.
- `scheduler/`: what runs next (`Scheduler`; FCFS today). `engine/`: what runs
  it (`Engine`: `LlamaEngine` on llama.cpp, `ToyEngine` for tests).
"""

from ._core import EngineCore
from ._server import VerifierServer
from ._service import VerifierService
from .engine import Engine, Feed, LlamaEngine, ToyEngine
from .scheduler import FcfsScheduler, Scheduler

__all__ = [
    "Engine",
    "EngineCore",
    "FcfsScheduler",
    "Feed",
    "LlamaEngine",
    "Scheduler",
    "ToyEngine",
    "VerifierServer",
    "VerifierService",
]
