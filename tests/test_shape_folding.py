"""Shapes computed in an ONNX graph are folded to constants at import (issue 55: shufflenet_v2, maxvit_t).

torch.onnx.export writes `torch.chunk` and `.view(b, g, c // g, h, w)` as Shape -> Gather -> arithmetic -> Slice/Reshape.
TVM's importer keeps those values as run-time tensors, so every op after them has an unknown shape: preparation
then failed ("emit_te now only supports Tensor that has ShapeExpr shape") or left tasks with symbolic shapes, whose
ArgInfo MetaSchedule cannot make. frontend.onnx_loader folds them with onnxruntime when the import left any.
Real ONNX models (onnx.helper, as the exporter writes them, and the zoo's compact shufflenet), the real import,
precision conversion and task extraction."""
import json
import lzma
import os

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from tunekit.testing import run_cli

ZOO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "zoo")


def _const(name, values, dtype=np.int64):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.array(values, dtype=dtype), name))


def _weight(name, shape, seed=0):
    rng = np.random.default_rng(seed)
    return numpy_helper.from_array((rng.standard_normal(shape) * 0.1).astype(np.float32), name)


def _save(tmp_path, name, nodes, x_shape, y_shape, inits):
    import onnx

    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)], inits)
    path = str(tmp_path / f"{name}.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


def _chunk_attention(tmp_path) -> str:
    """q, k, v = qkv(x).chunk(3, dim=-1); softmax(q k^T) v: maxvit_t's attention and shufflenet's split, as exported:
    the chunk's bounds are Shape -> Gather -> Add -> Div -> Mul, and its Slices become dynamic_strided_slice."""
    nodes = [helper.make_node("MatMul", ["x", "w_qkv"], ["qkv"]),
             _const("last", [2]), _const("one", [1]), _const("two", [2]), _const("three", [3]), _const("zero", [0]),
             helper.make_node("Shape", ["qkv"], ["s"]),
             helper.make_node("Gather", ["s", "last"], ["n"], axis=0),
             helper.make_node("Add", ["n", "two"], ["n2"]),
             helper.make_node("Div", ["n2", "three"], ["third"]),
             helper.make_node("Mul", ["third", "one"], ["e1"]),
             helper.make_node("Mul", ["third", "two"], ["e2"]),
             helper.make_node("Mul", ["third", "three"], ["e3"]),
             helper.make_node("Slice", ["qkv", "zero", "e1", "last"], ["q"]),
             helper.make_node("Slice", ["qkv", "e1", "e2", "last"], ["k"]),
             helper.make_node("Slice", ["qkv", "e2", "e3", "last"], ["v"]),
             helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["q", "kt"], ["scores"]),
             helper.make_node("Softmax", ["scores"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["o"]),
             helper.make_node("MatMul", ["o", "w_out"], ["y"])]
    return _save(tmp_path, "chunk_attention", nodes, [1, 64, 64], [1, 64, 64],
                 [_weight("w_qkv", (64, 192)), _weight("w_out", (64, 64), 1)])


def _channel_shuffle(tmp_path) -> str:
    """shufflenet_v2's channel_shuffle as older exporters write `x.view(b, 2, c // 2, h, w)`: each Reshape's shape a
    Concat of Unsqueezed Gathers of Shape(x); then torch.chunk(2, dim=1) on the shuffled channels."""
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c"], kernel_shape=[1, 1]),
             helper.make_node("Shape", ["c"], ["s"]),
             _const("i0", 0), _const("i1", 1), _const("i2", 2), _const("i3", 3), _const("groups", [2]),
             _const("g", 2), _const("minus1", [-1]), _const("axis0", [0]),
             *[helper.make_node("Gather", ["s", f"i{i}"], [f"d{i}"], axis=0) for i in range(4)],
             helper.make_node("Div", ["d1", "g"], ["cpg"]),
             *[helper.make_node("Unsqueeze", [d, "axis0"], [f"u_{d}"]) for d in ("d0", "cpg", "d2", "d3")],
             helper.make_node("Concat", ["u_d0", "groups", "u_cpg", "u_d2", "u_d3"], ["shape5"], axis=0),
             helper.make_node("Reshape", ["c", "shape5"], ["r5"]),
             helper.make_node("Transpose", ["r5"], ["t5"], perm=[0, 2, 1, 3, 4]),
             helper.make_node("Concat", ["u_d0", "minus1", "u_d2", "u_d3"], ["shape4"], axis=0),
             helper.make_node("Reshape", ["t5", "shape4"], ["shuffled"]),
             helper.make_node("Shape", ["shuffled"], ["s2"]),
             _const("zero", [0]), _const("one", [1]),
             helper.make_node("Gather", ["s2", "one"], ["ch"], axis=0),
             helper.make_node("Div", ["ch", "groups"], ["half"]),
             helper.make_node("Slice", ["shuffled", "zero", "half", "one"], ["left"]),
             helper.make_node("Conv", ["left", "w2"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])]
    return _save(tmp_path, "channel_shuffle", nodes, [1, 32, 14, 14], [1, 32, 14, 14],
                 [_weight("w1", (32, 32, 1, 1)), _weight("w2", (32, 16, 3, 3), 1)])


def _slice_from_input_shape(tmp_path) -> str:
    """x[:, :, : h // 2 * 2, : w // 2 * 2] with h, w read from Shape(x) (a patch-merging crop), then a conv."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             _const("hw", [2, 3]), _const("two", [2]), _const("zeros", [0, 0]),
             helper.make_node("Gather", ["s", "hw"], ["dims"], axis=0),
             helper.make_node("Div", ["dims", "two"], ["halves"]),
             helper.make_node("Mul", ["halves", "two"], ["ends"]),
             helper.make_node("Slice", ["x", "zeros", "ends", "hw"], ["crop"]),
             helper.make_node("Conv", ["crop", "w"], ["y"], kernel_shape=[2, 2], strides=[2, 2])]
    return _save(tmp_path, "slice_from_input_shape", nodes, [1, 16, 15, 15], [1, 32, 7, 7], [_weight("w", (32, 16, 2, 2))])


def _shufflenet(tmp_path) -> str:
    """The zoo's compact shufflenet_v2_x1_0 (torchvision, every weight one constant; the graph is exact)."""
    path = str(tmp_path / "shufflenet_v2_x1_0.onnx")
    with lzma.open(os.path.join(ZOO, "shufflenet_v2_x1_0.onnx.xz")) as src, open(path, "wb") as dst:
        dst.write(src.read())
    return path


def _symbolic_tasks(tasks) -> list[str]:
    """Tasks MetaSchedule cannot measure: ArgInfo needs every buffer's shape a constant (maxvit_t's TypeError)."""
    from tvm import tirx
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    bad = []
    for task in tasks:
        for func in task.dispatched[0].functions.values():
            try:
                shapes = [info.shape for info in ArgInfo.from_prim_func(func)] if isinstance(func, tirx.PrimFunc) else []
            except TypeError:
                bad.append(task.task_name)
                continue
            if not all(isinstance(d, int) for shape in shapes for d in shape):
                bad.append(task.task_name)
    return bad


def _prepares_static(path, target, precision):
    from tunekit.frontend.onnx_loader import unknown_shapes
    from tunekit.frontend.precision import prepare
    from tunekit.frontend.tasks import extract_tasks
    from tunekit.run.session import load_model

    mod = load_model(path).mod
    assert not unknown_shapes(mod)
    prepared, used = prepare(mod, target, precision=precision)
    assert used == precision
    tasks = extract_tasks(prepared, target)
    assert tasks and not _symbolic_tasks(tasks)
    return tasks


MODELS = {"chunk_attention": _chunk_attention, "channel_shuffle": _channel_shuffle,
          "slice_from_input_shape": _slice_from_input_shape, "shufflenet_v2_x1_0": _shufflenet}


@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.e2e) if name == "shufflenet_v2_x1_0" else name
                                  for name in MODELS])  # a whole model's preparation: 20-30 s on 2 cores
def test_prepares_in_fp32_on_a_cpu_share_and_fp16_on_h100_with_static_tasks(name, tmp_path):
    from tvm.target import Target

    path = MODELS[name](tmp_path)
    _prepares_static(path, Target({"kind": "llvm", "num-cores": 2}), "fp32")
    _prepares_static(path, Target("nvidia/nvidia-h100"), "fp16")


@pytest.mark.parametrize("name", ["chunk_attention", "channel_shuffle", "slice_from_input_shape"])
@pytest.mark.e2e
def test_check_says_ready_on_sm_90(name, tmp_path):
    proc = run_cli("check", MODELS[name](tmp_path), "--gpu-arch", "sm_90", "--json", timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads(proc.stdout)
    assert result["precision"] == "fp16" and not result["problems"], result["problems"]



def test_the_importer_does_not_check_the_model_again_and_the_checker_is_left_as_it_was():
    """load_onnx checks the file; TVM's importer ran onnx's checker again on the model in memory (only to warn, after
    serializing it: hundreds of MB for GPT-2, twice when the import is redone folded). Here the checker would complain
    (an output without a type): no warning comes from the import, and the checker still complains after it."""
    import warnings

    import onnx

    from tunekit.frontend import onnx_loader

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    untyped = helper.make_empty_tensor_value_info("y")
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [untyped])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        onnx_loader.import_to_relax(model, onnx_loader.model_inputs(model, {}))
    assert not [w for w in caught if "value_info" in str(w.message)], [str(w.message) for w in caught]
    with pytest.raises(onnx.checker.ValidationError):
        onnx.checker.check_model(model)
