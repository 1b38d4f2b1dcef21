"""Rejection predictors (WISP), the training tooling: logit features, trace collection,
training and export, and the shipped predictors with their metric cards (in `shipped/`).

    from edgekit.predictors import OnnxPredictor, PredictorController
    controller = PredictorController(OnnxPredictor("my.onnx"), max_window=8)
    client.generate("...", controller=controller)

or, through the configuration: GenerationConfig(drafting="predictor", predictor="my.onnx").
`PredictorController` (and `ConfidenceThreshold`, `AcceptanceTracker`), `OnnxPredictor`
and the shipped-predictor lookups live in the core (`edgekit.drafting`), re-exported here:
this package imports the core, never the reverse.
"""

from pathlib import Path

from edgekit.drafting import (
    AcceptanceTracker,
    ConfidenceThreshold,
    OnnxPredictor,
    PredictorController,
    shipped_cards,
    shipped_predictor,
)
from edgekit.errors import PredictorError

from .features import FEATURE_NAMES, LogitFeatures

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
