"""Fold an ONNX graph's shape computations with onnxruntime, for TVM's importer.

Exporters compute masks and reshapes from `Shape` at run time (BERT from transformers: Shape ->
ConstantOfShape -> Expand for the attention mask). TVM 0.27's ONNX importer fails on some of those
chains ("broadcast_to expects the input shape to have the number of ndim at least as ...").
With the inputs' shapes fixed they are constants: onnxruntime's basic graph optimizations (constant
folding and redundant-node removal, standard ops only) fold them away.
"""
from __future__ import annotations

import logging
import os
import tempfile

log = logging.getLogger("tunekit")


def fold_shapes(model, shapes: dict[str, list[int]]):
    """A copy of `model` with its inputs fixed to `shapes` and every constant subgraph folded."""
    import onnx
    import onnxruntime as ort

    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    for inp in fixed.graph.input:
        if inp.name in shapes:
            dims = inp.type.tensor_type.shape.dim
            for dim, size in zip(dims, shapes[inp.name]):
                dim.Clear()
                dim.dim_value = int(size)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    # Errors only: folding drops the initializers the shapes were computed from, and onnxruntime warns
    # about each one on the user's terminal.
    options.log_severity_level = 3
    with tempfile.TemporaryDirectory(prefix="tunekit-fold-") as tmp:
        options.optimized_model_filepath = os.path.join(tmp, "folded.onnx")
        ort.InferenceSession(fixed.SerializeToString(), options, providers=["CPUExecutionProvider"])
        folded = onnx.load(options.optimized_model_filepath)
    log.info("folded the model's shape computations with onnxruntime (%d -> %d nodes)", len(model.graph.node),
             len(folded.graph.node))
    return folded
