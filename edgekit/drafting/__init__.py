"""How long each round's block is: the drafting controllers and their one factory.

The seam is `Controller` (window, per-step decision, verdict feedback). Policies:
`FixedWindow` (SLED's baseline), `PredictorController` (WISP's stop at the first
predicted rejection), `ConfidenceThreshold` (llama.cpp's draft p-min), and
`LatencyWindow` (the window the latency model picks on the measured link), and
`PlainWhenFaster`, which turns any of them off (window 0: plain target decoding)
while the latency model expects that to be faster. `ControllerFactory` builds the
one a `GenerationConfig` names. `OnnxPredictor` runs a trained predictor, and
`shipped_predictor` finds the one shipped for a pair (`edgekit.predictors` trains them).
"""

from ._controller import Controller, Decision, FixedWindow, StopRule
from ._factory import ControllerFactory
from ._gate import PlainWhenFaster
from ._latency_window import LatencyWindow
from ._onnx import OnnxPredictor
from ._shipped import read_cards, shipped_cards, shipped_dir, shipped_predictor
from ._stop_at_rejection import AcceptancePredictor, AcceptanceTracker, ConfidenceThreshold, PredictorController

__all__ = [
    "AcceptancePredictor",
    "AcceptanceTracker",
    "ConfidenceThreshold",
    "Controller",
    "ControllerFactory",
    "Decision",
    "FixedWindow",
    "LatencyWindow",
    "OnnxPredictor",
    "PlainWhenFaster",
    "PredictorController",
    "StopRule",
    "read_cards",
    "shipped_cards",
    "shipped_dir",
    "shipped_predictor",
]
