"""ONNX export of a trained predictor: Gemm/Relu layers, then a sigmoid.

The input standardisation is folded into the first layer's weights, so the
graph is only the layers. Metadata: `edgekit.features` (input columns) and
`edgekit.threshold` (operating point), read by `OnnxPredictor`, plus whatever
else the caller passes (pair, models, training summary).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

__all__ = ["export_onnx"]


def export_onnx(
    model,  # LinearModel | Mlp
    path: str | os.PathLike[str],
    *,
    feature_names: tuple[str, ...] | str,
    threshold: float,
    metadata: dict[str, str] | None = None,
    input_name: str = "features",
    output_name: str = "p_accept",
    graph_name: str = "",
) -> Path:
    """Writes `model` as ONNX: one float input `input_name` [N, features], one
    probability `output_name` [N, 1]. `feature_names` names the input columns, or
    describes them in one string where naming each would not help (hidden states)."""
    width = len(model.mean)
    if not isinstance(feature_names, str) and len(feature_names) != width:
        raise ValueError(f"{len(feature_names)} feature names for a model of {width} inputs")
    try:
        import onnx
        from onnx import TensorProto, helper, numpy_helper
    except ImportError as exc:
        from edgekit.errors import DependencyMissingError

        raise DependencyMissingError("onnx", "train") from exc
    layers = model.layers()
    w0, b0 = layers[0]
    # ((x - mean) / scale) @ W + b  ==  x @ (W / scale[:, None]) + (b - (mean / scale) @ W)
    folded = [(w0 / model.scale[:, None], b0 - (model.mean / model.scale) @ w0)] + layers[1:]
    nodes, inits = [], []
    x = input_name
    for i, (w, b) in enumerate(folded):
        inits.append(numpy_helper.from_array(np.asarray(w, dtype=np.float32), f"W{i}"))
        inits.append(numpy_helper.from_array(np.asarray(b, dtype=np.float32), f"B{i}"))
        out = f"z{i}"
        nodes.append(helper.make_node("Gemm", [x, f"W{i}", f"B{i}"], [out], name=f"layer{i}"))
        if i < len(folded) - 1:
            nodes.append(helper.make_node("Relu", [out], [f"h{i}"], name=f"relu{i}"))
            out = f"h{i}"
        x = out
    nodes.append(helper.make_node("Sigmoid", [x], [output_name], name="sigmoid"))
    graph = helper.make_graph(
        nodes,
        graph_name or f"edgekit-rejection-predictor-{model.kind}",
        [helper.make_tensor_value_info(input_name, TensorProto.FLOAT, ["N", width])],
        [helper.make_tensor_value_info(output_name, TensorProto.FLOAT, ["N", 1])],
        inits,
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], producer_name="edgekit")
    proto.ir_version = 8  # readable by onnxruntime >= 1.10
    names = feature_names if isinstance(feature_names, str) else ",".join(feature_names)
    meta = {"edgekit.features": names, "edgekit.threshold": repr(float(threshold))}
    meta.update(metadata or {})
    for k, v in meta.items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = k, str(v)
    onnx.checker.check_model(proto)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(proto.SerializeToString())
    os.replace(tmp, path)
    return path
