"""Rejection predictors (WISP): logit features, the ONNX runtime wrapper, trace
collection, training and export, and the shipped predictors with their metric cards.

    from edgekit.predictors import OnnxPredictor, PredictorController
    controller = PredictorController(OnnxPredictor("my.onnx"), max_window=8)
    client.generate("...", controller=controller)

or, through the configuration: GenerationConfig(drafting="predictor", predictor="my.onnx").
`PredictorController` (and `ConfidenceThreshold`, `AcceptanceTracker`) are drafting
policies from `edgekit.drafting`, re-exported here.
"""

from pathlib import Path

from edgekit.drafting import AcceptanceTracker, ConfidenceThreshold, PredictorController
from edgekit.errors import PredictorError

from .features import FEATURE_NAMES, LogitFeatures
from .runtime import OnnxPredictor
from .shipped import shipped_cards, shipped_predictor

TRAIN_PROMPTS = Path(__file__).parent / "prompts" / "train.jsonl"  # the training prompt set (issue 4)

__all__ = [
    "FEATURE_NAMES",
    "TRAIN_PROMPTS",
    "AcceptanceTracker",
    "ConfidenceThreshold",
    "LogitFeatures",
    "OnnxPredictor",
    "PredictorController",
    "PredictorError",
    "shipped_cards",
    "shipped_predictor",
]
