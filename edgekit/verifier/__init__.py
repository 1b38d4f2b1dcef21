"""The reference verifier: the target model behind edgekit.verifier.v1.

Its parts, each in its own module:

- `VerifierServer` (`_server`): gRPC, health, token auth, TLS, the idle-session reaper,
  and the optional Prometheus endpoint (`_metrics`, with prometheus-client).
- `FrontEnds` (`_frontends`): several verifier processes on one port over one engine.
- `VerifierService` (`_service`): protobuf in, protobuf out.
- `RequestChecks` (`_validation`): what a request must satisfy.
- `SessionTable` (`_sessions`): sessions, their KV sequences, limits and eviction.
- `Rounds` (`_rounds`): open, extend, verify (FH, SH, replays), close.
- `Baseline` (`_baseline`): target-only decoding, the centralized baseline.
- `Budgets` (`_budgets`): the draft budgets it assigns (GOODSPEED eqs. 3-5; Fixed-S, Random-S).
- `SpeedClasses` (`_slo`): token-speed SLOs, each round's budget and deadline (WISP eqs. 5, 6, 12).
- `EngineCore` (`_core`): runs the scheduler's batches on the engine.
- `ServingStats` (`_stats`): what was served (batches, rounds by SLO class, drafted and
  accepted tokens, goodput), recorded by the engine core, the rounds and the baseline.
- `VerifyTimeEstimator` (`_estimator`): a batch's run time (WISP eqs. 18-19), fitted
  by `calibrated_estimator` (`_calibration`) and refitted online.
- `SemanticHead` (`_semantic_head`): the semantic mode's ONNX decision head, on the CSI
  (`_csi`) and, where it reads them, the target's confidence (`_confidence`); trained by
  the tooling in `edgekit.semantic`.
- `scheduler/`: what runs next (`Scheduler`: `FcfsScheduler`, `WispScheduler`).
  `engine/`: what runs it (`Engine`: `LlamaEngine` on llama.cpp, `ToyEngine` for tests; `EngineHost`
  serves one to other processes, each driving it as a `RemoteEngine`).
"""

from ..registry import BUDGET_POLICIES
from ._budgets import Budgets, BudgetState, FixedShare, GoodSpeed, RandomShare, capacity_within
from ._calibration import calibrated_estimator, default_calibration_dir, profile_batches
from ._confidence import TARGET_FEATURES, target_features
from ._core import EngineCore
from ._csi import CSI_FEATURES, channel_quality, csi_features, round_cost_ms
from ._estimator import Coefficients, FitReport, VerifyTimeEstimator, batch_features, fit_coefficients, fit_report
from ._frontends import FrontEnds
from ._semantic_head import SemanticHead
from ._server import VerifierServer
from ._service import VerifierService
from ._slo import BEST_EFFORT, SpeedClasses
from ._stats import ClassStats, ServingStats, StatsSnapshot
from .engine import Engine, Feed, LlamaEngine, ToyEngine
from .scheduler import Batch, FcfsScheduler, Objective, Scheduler, WispScheduler, Work, WorkResult

__all__ = [
    "BEST_EFFORT",
    "BUDGET_POLICIES",
    "CSI_FEATURES",
    "TARGET_FEATURES",
    "Batch",
    "BudgetState",
    "Budgets",
    "ClassStats",
    "Coefficients",
    "Engine",
    "EngineCore",
    "FcfsScheduler",
    "Feed",
    "FitReport",
    "FixedShare",
    "FrontEnds",
    "GoodSpeed",
    "LlamaEngine",
    "Objective",
    "RandomShare",
    "Scheduler",
    "SemanticHead",
    "ServingStats",
    "SpeedClasses",
    "StatsSnapshot",
    "ToyEngine",
    "VerifierServer",
    "VerifierService",
    "VerifyTimeEstimator",
    "WispScheduler",
    "Work",
    "WorkResult",
    "batch_features",
    "calibrated_estimator",
    "capacity_within",
    "channel_quality",
    "csi_features",
    "default_calibration_dir",
    "fit_coefficients",
    "fit_report",
    "profile_batches",
    "round_cost_ms",
    "target_features",
]
