"""The one place a drafting controller is made from a `GenerationConfig`."""

from __future__ import annotations

import warnings

from ..config import GenerationConfig
from ..errors import ConfigError
from ..link import LinkPolicy
from ._controller import Controller, FixedWindow
from ._gate import PlainWhenFaster
from ._latency_window import LatencyWindow
from ._onnx import OnnxPredictor
from ._shipped import shipped_predictor
from ._stop_at_rejection import AcceptancePredictor, ConfidenceThreshold, PredictorController

__all__ = ["ControllerFactory"]


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
        controller = self._build(config, policy)
        if config.plain_when_faster and config.drafting in ("latency", "auto"):
            return PlainWhenFaster(controller, policy)
        return controller

    def _build(self, config: GenerationConfig, policy: LinkPolicy) -> Controller:
        if config.drafting == "fixed":
            return FixedWindow(config.draft_k)
        if config.drafting == "p-min":
            return ConfidenceThreshold(config.p_min, config.max_window)
        if config.drafting == "latency":
            return LatencyWindow(policy, config.max_window)
        path = config.predictor or shipped_predictor(self.draft, self.target, config.mode)
        if config.drafting == "auto":
            if path is None:
                return FixedWindow(config.draft_k)
            try:
                import onnxruntime  # noqa: F401  # importing it is the check: installed and loadable
            except ImportError as exc:
                warnings.warn(
                    f"drafting='auto': onnxruntime cannot be loaded ({exc}), so the shipped predictor is not "
                    f"used and blocks are a fixed {config.draft_k} tokens",
                    RuntimeWarning,
                    stacklevel=2,
                )
                return FixedWindow(config.draft_k)
        elif path is None:
            raise ConfigError(
                f"no predictor is shipped for draft {self.draft!r} with target {self.target!r} ({config.mode}); "
                "give one (predictor=PATH, --predictor PATH) or train one with `edgekit predictor train`"
            )
        predictor = self._predictor(str(path))
        schedule = getattr(predictor, "schedule", None)
        if not config.predictor_schedule or config.predictor_threshold is not None:
            schedule = None  # one threshold for every round: the config's, or the predictor's own
        return PredictorController(predictor, config.max_window, threshold=config.predictor_threshold,
                                   schedule=schedule, policy=policy if schedule is not None else None)

    def _predictor(self, path: str) -> AcceptancePredictor:
        if path not in self._predictors:
            self._predictors[path] = OnnxPredictor(path)
        return self._predictors[path]
