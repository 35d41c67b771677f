"""Example models generated with seeded random weights (no downloads), saved as ONNX."""
from __future__ import annotations

import numpy as np

EXAMPLES = ("tiny_cnn",)


def tiny_cnn(*, seed: int = 0, image: int = 64, width: int = 32):
    """conv-relu, strided conv-relu, global pool, dense: 5 tuning tasks, tunes in a minute on CPU."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)

    def weight(name, shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.1).astype(np.float32), name)

    half = width // 2
    inits = [weight("w1", (half, 3, 3, 3)), weight("b1", (half,)), weight("w2", (width, half, 3, 3)),
             weight("b2", (width,)), weight("fc", (width, 10)), weight("fcb", (10,))]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("MatMul", ["f", "fc"], ["m"]),
        helper.make_node("Add", ["m", "fcb"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "tiny_cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, image, image])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])], inits)
    # IR 8 / opset 17: loadable by every onnxruntime the stack pins
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    return model


def save_example(name: str, path: str, *, seed: int = 0) -> str:
    import os

    import onnx

    from ..errors import TunekitError

    if name not in EXAMPLES:
        raise TunekitError(f"unknown example {name!r}; choose from {', '.join(EXAMPLES)}")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    onnx.save(globals()[name](seed=seed), path)
    return path
