"""From a GenerationConfig to the drafting controller it names."""

from __future__ import annotations

from ._config import GenerationConfig
from ._controller import Controller, FixedWindow
from ._errors import ConfigError

__all__ = ["make_controller"]


def make_controller(gen: GenerationConfig, draft: str, target: str, loaded: dict) -> Controller:
    """`loaded` caches OnnxPredictor objects by path across calls (a session each)."""
    if gen.drafting == "fixed":
        return FixedWindow(gen.draft_k)
    if gen.drafting == "p-min":
        from edgekit.predictors.runtime import ConfidenceThreshold

        return ConfidenceThreshold(gen.p_min, gen.max_window)
    from edgekit.predictors.shipped import shipped_predictor

    path = gen.predictor or shipped_predictor(draft, target, gen.mode)
    if gen.drafting == "auto":
        if path is None:
            return FixedWindow(gen.draft_k)
        try:
            import onnxruntime  # noqa: F401
        except ImportError:
            return FixedWindow(gen.draft_k)
    elif path is None:
        raise ConfigError(
            f"no predictor is shipped for draft {draft!r} with target {target!r} ({gen.mode}); "
            "give one (predictor=PATH, --predictor PATH) or train one with `edgekit predictor train`"
        )
    from edgekit.predictors.runtime import OnnxPredictor, PredictorController

    key = str(path)
    if key not in loaded:
        loaded[key] = OnnxPredictor(path)
    return PredictorController(loaded[key], gen.max_window, threshold=gen.predictor_threshold)
