"""Rejection predictors (WISP): logit features, the ONNX runtime wrapper, trace
collection, training and export, and the shipped predictors with their metric cards."""

from pathlib import Path

TRAIN_PROMPTS = Path(__file__).parent / "prompts" / "train.jsonl"  # the training prompt set (issue 4)
