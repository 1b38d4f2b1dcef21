"""The one place a drafting controller is made from a `GenerationConfig`."""

from __future__ import annotations

import warnings
from pathlib import Path

from ..config import GenerationConfig
from ..errors import ConfigError
from ..link import LinkPolicy
from ..registry import DRAFTING
from ._controller import Controller, FixedWindow
from ._gate import PlainWhenFaster
from ._latency_window import LatencyWindow
from ._onnx import OnnxPredictor
from ._shipped import shipped_predictor
from ._stop_at_rejection import AcceptancePredictor, ConfidenceThreshold, PredictorController

__all__ = ["ControllerFactory", "build_auto", "build_fixed", "build_latency", "build_p_min", "build_predictor"]


class ControllerFactory:
    """Builds the controller `config.drafting` names for a draft/target pair:

    - "fixed": `FixedWindow(draft_k)`; "p-min": `ConfidenceThreshold(p_min, max_window)`;
    - "latency": `LatencyWindow` over the session's link policy;
    - "predictor": `PredictorController` over `config.predictor`, or the predictor
      shipped for the pair and mode (an error if there is none);
    - "auto": "predictor" where one is shipped (or given) and onnxruntime is
      installed, else "fixed".

    A predictor whose card holds a delay schedule follows it (its threshold, stop rule and
    largest block for what a round costs now) unless `config.predictor_threshold` fixes
    the threshold or `config.predictor_schedule` is off.

    "latency" and "auto" are wrapped in `PlainWhenFaster` unless `config.plain_when_faster`
    is off: speculation stops while plain target decoding is expected to be faster.

    ONNX predictors are loaded once per path and shared by the controllers built here.
    """

    def __init__(self, draft: str = "", target: str = "") -> None:
        self.draft = draft
        self.target = target
        self._predictors: dict[str, AcceptancePredictor] = {}

    def build(self, config: GenerationConfig, policy: LinkPolicy) -> Controller:
        """The controller `config.drafting` names (`edgekit.registry.DRAFTING`)."""
        return DRAFTING.load(config.drafting)(self, config, policy)

    def predictor_at(self, path: str | Path | None, config: GenerationConfig, policy: LinkPolicy) -> Controller:
        """A `PredictorController` over the ONNX predictor at `path` (the pair's shipped one where
        None; an error if there is none)."""
        found = path or shipped_predictor(self.draft, self.target, config.mode)
        if found is None:
            raise ConfigError(
                f"no predictor is shipped for draft {self.draft!r} with target {self.target!r} ({config.mode}); "
                "give one (predictor=PATH, --predictor PATH) or train one with `edgekit predictor train`"
            )
        predictor = self._predictor(str(found))
        schedule = getattr(predictor, "schedule", None)
        if not config.predictor_schedule or config.predictor_threshold is not None:
            schedule = None  # one threshold for every round: the config's, or the predictor's own
        return PredictorController(predictor, config.max_window, threshold=config.predictor_threshold,
                                   schedule=schedule, policy=policy if schedule is not None else None)

    def _predictor(self, path: str) -> AcceptancePredictor:
        if path not in self._predictors:
            self._predictors[path] = OnnxPredictor(path)
        return self._predictors[path]


# The drafting policies, as `edgekit.registry.DRAFTING` names them: each a controller built from the
# factory (its pair and its predictors), the generation's config and the session's link policy.


def build_fixed(factory: ControllerFactory, config: GenerationConfig, policy: LinkPolicy) -> Controller:
    return FixedWindow(config.draft_k)


def build_p_min(factory: ControllerFactory, config: GenerationConfig, policy: LinkPolicy) -> Controller:
    return ConfidenceThreshold(config.p_min, config.max_window)


def build_latency(factory: ControllerFactory, config: GenerationConfig, policy: LinkPolicy) -> Controller:
    return _gated(LatencyWindow(policy, config.max_window), config, policy)


def build_predictor(factory: ControllerFactory, config: GenerationConfig, policy: LinkPolicy) -> Controller:
    return factory.predictor_at(config.predictor, config, policy)


def build_auto(factory: ControllerFactory, config: GenerationConfig, policy: LinkPolicy) -> Controller:
    """The predictor given or shipped, where onnxruntime loads; else a fixed window."""
    path = config.predictor or shipped_predictor(factory.draft, factory.target, config.mode)
    if path is None:
        return _gated(FixedWindow(config.draft_k), config, policy)
    try:
        import onnxruntime  # noqa: F401  # importing it is the check: installed and loadable
    except ImportError as exc:
        warnings.warn(
            f"drafting='auto': onnxruntime cannot be loaded ({exc}), so the shipped predictor is not "
            f"used and blocks are a fixed {config.draft_k} tokens",
            RuntimeWarning,
            stacklevel=3,
        )
        return _gated(FixedWindow(config.draft_k), config, policy)
    return _gated(factory.predictor_at(path, config, policy), config, policy)


def _gated(controller: Controller, config: GenerationConfig, policy: LinkPolicy) -> Controller:
    """`controller`, with speculation off while plain target decoding is expected to be faster
    (unless `config.plain_when_faster` is off)."""
    return PlainWhenFaster(controller, policy) if config.plain_when_faster else controller
