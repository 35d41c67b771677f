"""Example models generated with seeded random weights (no downloads), saved as ONNX."""
from __future__ import annotations

import numpy as np

EXAMPLES = ("tiny_cnn", "resnet18", "mobilenet", "transformer")


def tiny_cnn(*, seed: int = 0, image: int = 64, width: int = 32, classes: int = 10):
    """conv-relu, strided conv-relu, global pool, dense: 5 tuning tasks, tunes in a minute on CPU."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)

    def weight(name, shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.1).astype(np.float32), name)

    half = width // 2
    inits = [weight("w1", (half, 3, 3, 3)), weight("b1", (half,)), weight("w2", (width, half, 3, 3)),
             weight("b2", (width,)), weight("fc", (width, classes)), weight("fcb", (classes,))]
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
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", classes])], inits)
    # IR 8 / opset 17: loadable by every onnxruntime the stack pins
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    return model


class _Builder:
    """Accumulates nodes and seeded initializers; every helper returns its output's name."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits, self._n = [], [], 0

    def name(self, prefix: str) -> str:
        self._n += 1
        return f"{prefix}{self._n}"

    def const(self, array, prefix: str = "c") -> str:
        from onnx import numpy_helper

        name = self.name(prefix)
        self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def weight(self, shape, std: float, prefix: str = "w") -> str:
        return self.const((self.rng.standard_normal(shape) * std).astype(np.float32), prefix)

    def op(self, op_type: str, inputs, **attrs) -> str:
        from onnx import helper

        out = self.name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], **attrs))
        return out

    def conv(self, x, cin, cout, k, *, stride=1, group=1, act=None):
        """Conv with bias = conv + BatchNorm folded for inference. He-scaled so activations neither vanish nor blow up
        over 20-50 layers (ResNet-18 logits still grow to O(10-100) through the unnormalized residual adds)."""
        w = self.weight((cout, cin // group, k, k), (2.0 / (cin // group * k * k)) ** 0.5)
        b = self.weight((cout,), 0.05, "b")
        y = self.op("Conv", [x, w, b], kernel_shape=[k, k], strides=[stride, stride], pads=[k // 2] * 4, group=group)
        if act == "relu":
            y = self.op("Relu", [y])
        elif act == "relu6":
            # opset 17 Clip takes min/max as inputs, not attributes
            y = self.op("Clip", [y, self.const(np.float32(0.0)), self.const(np.float32(6.0))])
        return y

    def model(self, graph_name, inputs, outputs):
        import onnx
        from onnx import helper

        graph = helper.make_graph(self.nodes, graph_name, inputs, outputs, self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
        onnx.checker.check_model(model)
        return model


def _image_input(image: int):
    from onnx import TensorProto, helper

    return helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, image, image])


def _classifier(g: _Builder, x: str, channels: int, classes: int):
    from onnx import TensorProto, helper

    f = g.op("Flatten", [g.op("GlobalAveragePool", [x])])
    fc = g.weight((classes, channels), channels ** -0.5, "fc")
    g.nodes.append(helper.make_node("Gemm", [f, fc, g.weight((classes,), 0.05, "fcb")], ["y"], transB=1))
    return helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, classes])


def resnet18(*, seed: int = 0, image: int = 224, width: int = 64, classes: int = 1000):
    """ResNet-18 layout (BatchNorm folded into conv bias); width=8 image=32 makes a seconds-sized test model."""
    g = _Builder(seed)
    x = g.conv("x", 3, width, 7, stride=2, act="relu")
    x = g.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = width
    for stage, mult in enumerate((1, 2, 4, 8)):
        cout = width * mult
        for block in range(2):
            stride = 2 if stage > 0 and block == 0 else 1
            y = g.conv(x, cin, cout, 3, stride=stride, act="relu")
            y = g.conv(y, cout, cout, 3)
            shortcut = g.conv(x, cin, cout, 1, stride=stride) if stride != 1 or cin != cout else x
            x = g.op("Relu", [g.op("Add", [y, shortcut])])
            cin = cout
    return g.model("resnet18", [_image_input(image)], [_classifier(g, x, cin, classes)])


def _divisible(value: float, divisor: int = 8) -> int:
    """MobileNet's channel rounding: nearest multiple of 8, never below 90% of the target."""
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * value else rounded


def mobilenet(*, seed: int = 0, image: int = 224, width_mult: float = 1.0, classes: int = 1000):
    """MobileNetV2 layout: inverted residuals (1x1 expand, 3x3 depthwise, 1x1 linear project), relu6 as Clip."""
    g = _Builder(seed)
    cin = _divisible(32 * width_mult)
    x = g.conv("x", 3, cin, 3, stride=2, act="relu6")
    # (expansion t, channels c, repeats n, first stride s), as in the MobileNetV2 paper
    for t, c, n, s in ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                       (6, 320, 1, 1)):
        cout = _divisible(c * width_mult)
        for i in range(n):
            stride = s if i == 0 else 1
            hidden = cin * t
            y = g.conv(x, cin, hidden, 1, act="relu6") if t != 1 else x
            y = g.conv(y, hidden, hidden, 3, stride=stride, group=hidden, act="relu6")  # depthwise
            y = g.conv(y, hidden, cout, 1)
            x = g.op("Add", [x, y]) if stride == 1 and cin == cout else y
            cin = cout
    last = _divisible(1280 * max(1.0, width_mult))
    x = g.conv(x, cin, last, 1, act="relu6")
    return g.model("mobilenet", [_image_input(image)], [_classifier(g, x, last, classes)])


def transformer(*, seed: int = 0, seq: int = 32, hidden: int = 64, heads: int = 4, layers: int = 2, vocab: int = 1000):
    """BERT-style post-LN encoder on int64 input_ids + attention_mask [1, seq]; outputs the last hidden state.

    Dims are fixed (not symbolic) so the model imports without --input-shape. GELU is written with Erf
    because the Gelu op only exists from opset 20.
    """
    from onnx import TensorProto, helper

    if hidden % heads:
        raise ValueError(f"hidden={hidden} must be divisible by heads={heads}")
    g = _Builder(seed)
    d = hidden // heads
    f32 = np.float32

    def dense(x, n_in, n_out):
        return g.op("Add", [g.op("MatMul", [x, g.weight((n_in, n_out), n_in ** -0.5)]), g.weight((n_out,), 0.02, "b")])

    def layer_norm(x):
        scale = g.const((1.0 + g.rng.standard_normal(hidden) * 0.05).astype(f32), "ln_g")
        return g.op("LayerNormalization", [x, scale, g.weight((hidden,), 0.05, "ln_b")], axis=-1, epsilon=1e-5)

    def heads_view(x, perm):
        return g.op("Transpose", [g.op("Reshape", [x, g.const(np.array([1, seq, heads, d], np.int64))])], perm=perm)

    x = g.op("Gather", [g.weight((vocab, hidden), 1.0, "tok_emb"), "input_ids"])
    # Positions are 0..seq-1 for a fixed seq, so the position table is added directly (no second Gather).
    x = layer_norm(g.op("Add", [x, g.weight((1, seq, hidden), 1.0, "pos_emb")]))
    # mask 1 = attend, 0 = padding -> additive bias 0 / -1e4 over the key axis, [1, 1, 1, seq]
    mask = g.op("Cast", ["attention_mask"], to=TensorProto.FLOAT)
    bias = g.op("Mul", [g.op("Sub", [g.const(f32(1.0)), mask]), g.const(f32(-1e4))])
    bias = g.op("Reshape", [bias, g.const(np.array([1, 1, 1, seq], np.int64))])
    for _ in range(layers):
        q = heads_view(dense(x, hidden, hidden), [0, 2, 1, 3])  # [1, h, s, d]
        k = heads_view(dense(x, hidden, hidden), [0, 2, 3, 1])  # [1, h, d, s]
        v = heads_view(dense(x, hidden, hidden), [0, 2, 1, 3])
        scores = g.op("Mul", [g.op("MatMul", [q, k]), g.const(f32(1.0 / np.sqrt(d)))])
        probs = g.op("Softmax", [g.op("Add", [scores, bias])], axis=-1)
        ctx = g.op("Transpose", [g.op("MatMul", [probs, v])], perm=[0, 2, 1, 3])
        ctx = g.op("Reshape", [ctx, g.const(np.array([1, seq, hidden], np.int64))])
        x = layer_norm(g.op("Add", [x, dense(ctx, hidden, hidden)]))
        h = dense(x, hidden, 4 * hidden)
        erf = g.op("Erf", [g.op("Div", [h, g.const(f32(np.sqrt(2.0)))])])
        h = g.op("Mul", [g.op("Mul", [h, g.op("Add", [erf, g.const(f32(1.0))])]), g.const(f32(0.5))])
        x = layer_norm(g.op("Add", [x, dense(h, 4 * hidden, hidden)]))
    g.nodes.append(helper.make_node("Identity", [x], ["last_hidden_state"]))
    ids = [helper.make_tensor_value_info(n, TensorProto.INT64, [1, seq]) for n in ("input_ids", "attention_mask")]
    out = helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, [1, seq, hidden])
    return g.model("transformer", ids, [out])


def save_example(name: str, path: str, *, seed: int = 0, **kwargs) -> str:
    """Write example `name` to `path`; kwargs (image=, width=, seq=, ...) go to its generator."""
    import inspect
    import os

    import onnx

    from ..errors import TunekitError

    if name not in EXAMPLES:
        raise TunekitError(f"unknown example {name!r}; choose from {', '.join(EXAMPLES)}")
    generator = globals()[name]
    unknown = set(kwargs) - set(inspect.signature(generator).parameters)
    if unknown:
        raise TunekitError(f"example {name!r} has no option(s) {sorted(unknown)}")
    try:
        model = generator(seed=seed, **kwargs)
    except ValueError as exc:
        raise TunekitError(f"example {name!r}: {exc}") from None
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    onnx.save(model, path)
    return path
