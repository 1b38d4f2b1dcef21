"""Rejection predictors (WISP): logit features, the ONNX runtime wrapper, trace
collection, training and export, and the shipped predictors with their metric cards."""
