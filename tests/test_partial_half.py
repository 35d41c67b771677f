"""fp16 for models the conversion used to refuse whole (issue 55): each pattern as a small ONNX model,
built here the way torchvision exports it, and the dynamo-exported ViT-B/16 itself (compact copy:
its graph, every float weight a constant). Checked on CPU against the H100 target."""
import logging
import lzma
import os

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from tvm.target import Target

from tunekit.errors import TunekitError
from tunekit.frontend.precision import fp32_kept, prepare, skipped_steps
from tunekit.frontend.tasks import extract_tasks
from tunekit.run.session import load_model

H100 = "nvidia/nvidia-h100"
ZOO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "zoo")


def _save(tmp_path, name, nodes, x_shape, y_shape, inits):
    import onnx

    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32) * 0.1, n) for n, s in inits.items()
               if not isinstance(s, np.ndarray)]
    weights += [numpy_helper.from_array(s, n) for n, s in inits.items() if isinstance(s, np.ndarray)]
    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)], weights)
    path = str(tmp_path / f"{name}.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


def _fp16(path):
    """(prepared, dtypes of each conv/matmul task's buffers) of `path` prepared in fp16 for the H100."""
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    prepared, precision = prepare(load_model(path).mod, Target(H100), precision="fp16")
    assert precision == "fp16" and skipped_steps(prepared) == []  # NHWC convs, split-K, fused attention all ran
    heavy = {}
    for task in extract_tasks(prepared, Target(H100)):
        if any(op in task.task_name for op in ("conv2d", "matmul", "attention", "einsum")):
            heavy[task.task_name] = {str(info.as_json()[1]) for func in task.mod.functions.values()
                                     for info in ArgInfo.from_prim_func(func)}
    assert heavy and all("float16" in dtypes for dtypes in heavy.values()), heavy
    return prepared, heavy


def _ints(values):
    return np.array(values, dtype=np.int64)


def _swin_pads(tmp_path):
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[4, 4], strides=[4, 4]),
             helper.make_node("Transpose", ["c"], ["t"], perm=[0, 2, 3, 1]),
             helper.make_node("Pad", ["t", "zero"], ["z"]),
             helper.make_node("Pad", ["z", "pads"], ["p"]),
             helper.make_node("MatMul", ["p", "m"], ["y"])]
    return _save(tmp_path, "swin_pads", nodes, [1, 3, 32, 32], [1, 9, 10, 16],
                 {"w": (16, 3, 4, 4), "m": (16, 16), "zero": _ints([0] * 8), "pads": _ints([0, 1, 0, 0, 0, 0, 2, 0])})


def test_swin_window_pads_are_lifted_and_the_model_is_all_fp16(tmp_path):
    """swin_t pads each window partition (by zero at 224x224); the importer writes Pad as TIR, which no Relax
    pass could retype (ToMixedPrecision: "Expected TensorType, but got R.Callable")."""
    prepared, heavy = _fp16(_swin_pads(tmp_path))
    assert fp32_kept(prepared) == []
    assert any("conv2d" in n for n in heavy) and any("matmul" in n for n in heavy)


def _maxvit_einsums(tmp_path):
    q = [1, 4, 2, 7, 8]
    nodes = [helper.make_node("Reshape", ["x", "qshape"], ["q"]),
             helper.make_node("MatMul", ["q", "wq"], ["qq"]),
             helper.make_node("MatMul", ["q", "wk"], ["kk"]),
             helper.make_node("Einsum", ["qq", "kk"], ["s"], equation="bghid,bghjd->bghij"),
             helper.make_node("Softmax", ["s"], ["a"], axis=-1),
             helper.make_node("Einsum", ["a", "q"], ["o"], equation="bghij,bghjd->bghid"),
             helper.make_node("MatMul", ["o", "wo"], ["y"])]
    return _save(tmp_path, "maxvit_einsum", nodes, [1, 8, 7, 8], q,
                 {"qshape": _ints(q), "wq": (8, 8), "wk": (8, 8), "wo": (8, 8)})


def test_maxvit_einsum_attention_becomes_fp16_matmuls(tmp_path):
    """maxvit_t's attention is two Einsums ("bghid,bghjd->bghij", "bghij,bghjd->bghid"), imported as TIR."""
    prepared, heavy = _fp16(_maxvit_einsums(tmp_path))
    assert fp32_kept(prepared) == []
    assert "einsum" not in prepared.script()
    assert sum("matmul" in n for n in heavy) == 4, heavy  # q/k combined, o, and the two einsums


def _dynamo_squeeze(tmp_path):
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[4, 4], strides=[4, 4]),
             helper.make_node("Reshape", ["c", "flat"], ["f"]),
             helper.make_node("Transpose", ["f"], ["t"], perm=[0, 2, 1]),
             helper.make_node("Unsqueeze", ["t", "at"], ["u"]),
             helper.make_node("Squeeze", ["u", "neg"], ["s"]),
             helper.make_node("MatMul", ["s", "m"], ["y"])]
    return _save(tmp_path, "dynamo_squeeze", nodes, [1, 3, 16, 16], [1, 16, 8],
                 {"w": (8, 3, 4, 4), "m": (8, 8), "flat": _ints([1, 8, 16]), "at": _ints([2]), "neg": _ints([-2])})


def test_negative_squeeze_axis_no_longer_breaks_the_layout_pass(tmp_path):
    """ViT-B/16 exported with dynamo=True squeezes its QKV tensor with axes=[-2]: ConvertLayout's squeeze rule
    took the axis as an index (std::bad_alloc), whether or not a conv's layout reached it."""
    prepared, heavy = _fp16(_dynamo_squeeze(tmp_path))
    assert fp32_kept(prepared) == [] and any("conv2d" in n for n in heavy)


def _reflect_pad_between_convs(tmp_path):
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[3, 3]),
             helper.make_node("Pad", ["c", "pads"], ["p"], mode="reflect"),
             helper.make_node("Conv", ["p", "w2"], ["y"], kernel_shape=[3, 3])]
    return _save(tmp_path, "reflect_pad", nodes, [1, 8, 14, 14], [1, 4, 12, 12],
                 {"w": (8, 8, 3, 3), "w2": (4, 8, 3, 3), "pads": _ints([0, 0, 1, 1, 0, 0, 1, 1])})


def _masked_row_attention(tmp_path):
    """transformers 5's attention mask: -inf where masked, a row masked everywhere (its softmax is NaN) set to
    zeros after the softmax (GPT-2's first rows in the zoo's export)."""
    keep = np.tril(np.ones((8, 8), bool))
    keep[0] = False
    nodes = [helper.make_node("Where", ["keep", "zero", "ninf"], ["m"]), helper.make_node("Add", ["x", "m"], ["s"]),
             helper.make_node("Softmax", ["s"], ["p"], axis=-1), helper.make_node("IsNaN", ["p"], ["n"]),
             helper.make_node("Where", ["n", "zero", "p"], ["q"]), helper.make_node("MatMul", ["q", "v"], ["y"])]
    return _save(tmp_path, "masked_rows", nodes, [1, 2, 8, 8], [1, 2, 8, 4],
                 {"keep": keep.reshape(1, 1, 8, 8), "zero": np.zeros(1, np.float32),
                  "ninf": np.full(1, -np.inf, np.float32), "v": (8, 4)})


def test_a_kernel_fp16_cannot_retype_stays_fp32_and_the_rest_is_fp16(tmp_path, caplog):
    """A reflect pad is TIR that neither frontend.half nor ToMixedPrecision can retype: it alone stays fp32,
    with casts at its boundary; both convs are fp16, and what stayed fp32 is named after prepare_for_tuning."""
    caplog.set_level(logging.INFO, logger="tunekit")
    prepared, heavy = _fp16(_reflect_pad_between_convs(tmp_path))
    assert sum("conv2d" in n for n in heavy) == 2
    kept = fp32_kept(prepared)
    assert len(kept) == 1 and "call_tir" in kept[0] and "pad" in kept[0].lower(), kept
    lines = [r.getMessage() for r in caplog.records if "kept in fp32" in r.getMessage()]
    assert len(lines) == 1 and "1 x call_tir" in lines[0], lines


def test_a_model_that_really_cannot_be_converted_is_still_refused_or_tuned_in_fp32(tmp_path, monkeypatch):
    """What test_precision's pad-between-convs model checked before such models converted."""
    from tunekit.frontend import half

    def fails(mod):
        raise half.NotHalvable("relax.something of nothing")

    monkeypatch.setattr(half, "to_half_partial", fails)
    path = _reflect_pad_between_convs(tmp_path)  # ToMixedPrecision fails on its call_tir
    assert prepare(load_model(path).mod, Target(H100), precision="auto")[1] == "fp32"
    with pytest.raises(TunekitError, match="--precision fp32"):
        prepare(load_model(path).mod, Target(H100), precision="fp16")


@pytest.mark.parametrize("build", [_swin_pads, _maxvit_einsums, _dynamo_squeeze, _reflect_pad_between_convs,
                                   _masked_row_attention])
def test_converted_models_compute_the_onnx_model_within_the_fp16_bound(build, tmp_path):
    """Each conversion above, compiled for the CPU (LLVM emulates fp16), against onnxruntime in fp32."""
    import tvm
    from tvm import relax

    from tunekit.frontend.precision import convert
    from tunekit.numerics import check, compare_outputs

    model = load_model(build(tmp_path))
    converted = convert(model.mod, "fp16", target_kind="llvm")
    assert "einsum" not in converted.script()  # maxvit's: the lifted matmuls compute it, not ToMixedPrecision's TIR
    vm = relax.VirtualMachine(tvm.compile(converted, target=Target({"kind": "llvm", "num-cores": 1})), tvm.cpu())
    sample = model.inputs.random(seed=0)
    out = vm["main"](*[tvm.runtime.tensor(sample[name]) for name in model.inputs.shapes]).numpy()
    assert out.dtype == np.float32
    check(compare_outputs(model.output_names, [out], model.reference(sample)), precision="fp16")


def test_vit_b_16_exported_by_dynamo_is_all_fp16(tmp_path):
    """The real graph (torchvision's vit_b_16, torch.onnx.export(dynamo=True)); it was refused with std::bad_alloc."""
    path = str(tmp_path / "vit_b_16_dynamo.onnx")
    with lzma.open(os.path.join(ZOO, "vit_b_16_dynamo.onnx.xz")) as src, open(path, "wb") as dst:
        while chunk := src.read(1 << 24):
            dst.write(chunk)
    prepared, heavy = _fp16(path)
    assert fp32_kept(prepared) == []
    assert any("conv2d" in n for n in heavy) and sum("matmul" in n for n in heavy) >= 4, heavy


@pytest.mark.parametrize("equation,a,b", [("bghid,bghjd->bghij", (1, 2, 3, 5, 8), (1, 2, 3, 6, 8)),
                                          ("bghij,bghjd->bghid", (1, 2, 3, 5, 6), (1, 2, 3, 6, 8)),
                                          ("bik,bkj->bji", (2, 5, 8), (2, 8, 6)), ("abk,ck->acb", (2, 3, 4), (5, 4))])
def test_lifted_einsums_and_pads_compute_what_the_tir_did(equation, a, b):
    """frontend.tir_calls reads the einsum and the pad back from their TIR: the Relax ops give the same numbers."""
    import tvm
    from tvm import relax, topi

    from tunekit.frontend.tir_calls import lift_tir_calls

    bb = relax.BlockBuilder()
    va, vb = relax.Var("a", relax.TensorType(a, "float32")), relax.Var("b", relax.TensorType(b, "float32"))
    ndim = len(equation.split("->")[1])
    with bb.function("main", [va, vb]):
        with bb.dataflow():
            y = bb.emit_te(topi.einsum, equation, va, vb)
            y = bb.emit_te(topi.nn.pad, y, [0] * ndim, [0] * ndim, 0.0)  # swin_t's: a copy
            y = bb.emit_te(topi.nn.pad, y, [1] + [0] * (ndim - 1), [0] * (ndim - 1) + [2], 0.5)
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    lifted, counts = lift_tir_calls(bb.get())
    assert counts == {"einsum": 1, "pad": 2} and "call_tir" not in lifted.script()
    rng = np.random.default_rng(0)
    xa, xb = rng.standard_normal(a).astype(np.float32), rng.standard_normal(b).astype(np.float32)
    expected = np.pad(np.einsum(equation, xa, xb), [(1, 0)] + [(0, 0)] * (ndim - 2) + [(0, 2)], constant_values=0.5)
    vm = relax.VirtualMachine(relax.build(lifted, "llvm"), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(xa), tvm.runtime.tensor(xb)).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
