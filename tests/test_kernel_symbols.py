"""Every hand-written kernel of a model has a global symbol of its own (issue 55: timm's mobilevit_s).

tunekit's attention kernels (frontend.attention_kernel) were all TVMScript functions named `attention`, so a
model with two attentions of different shapes held the symbol twice and its untuned CUDA build failed
("IRModule contains duplicate global symbol: attention"). mobilevit_s's head dims (48, 60) then showed that
the CUDA-core body did not compile for them either (odd and clamped fp16 vectors). Checked here without a GPU:
the symbols, the CUDA source TVM emits, and NVRTC's compile of it where .nvrtcsite provides NVRTC.
"""
from __future__ import annotations

import collections
import json
import lzma
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import tvm
from tvm.target import Target

from tunekit.frontend.attention_kernel import Attention, Operand, attention_kernel, plan

H100 = "nvidia/nvidia-h100"
F16 = "float16"
HERE = os.path.dirname(os.path.abspath(__file__))
# (sequence, heads, head dim) of each attention block: the tensor-core body (32) and the CUDA-core one at
# mobilevit_s's head dims, 48 (three columns a thread) and 60 (not a multiple of 16)
BLOCKS = [(40, 2, 32), (64, 2, 48), (16, 4, 60)]
# a kernel's definition (its declarations, which TVM emits first, end in ";")
_DEFINED = re.compile(r'extern "C" __global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\([^;{]*\)\s*\{')


def _two_attentions_onnx(path: str) -> str:
    """One graph, one softmax(q k^T / sqrt(d) + mask) v per BLOCKS entry on [1, H, S, D] inputs (as in
    tests/test_attention.py: K transposed in the graph, a padding mask)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, inputs, outputs, constants = [], [], [], []
    for i, (seq, heads, dim) in enumerate(BLOCKS):
        q, k, v, y = (f"{n}{i}" for n in "qkvy")
        constants += [numpy_helper.from_array(np.where(rng.random((1, 1, 1, seq)) < 0.2, -1e4, 0).astype(np.float32),
                                              f"bias{i}"),
                      numpy_helper.from_array(np.array(dim ** -0.5, np.float32), f"scale{i}")]
        nodes += [helper.make_node("Transpose", [k], [f"kt{i}"], perm=[0, 1, 3, 2]),
                  helper.make_node("MatMul", [q, f"kt{i}"], [f"s{i}"]),
                  helper.make_node("Mul", [f"s{i}", f"scale{i}"], [f"ss{i}"]),
                  helper.make_node("Add", [f"ss{i}", f"bias{i}"], [f"sm{i}"]),
                  helper.make_node("Softmax", [f"sm{i}"], [f"p{i}"], axis=-1),
                  helper.make_node("MatMul", [f"p{i}", v], [y])]
        io = [1, heads, seq, dim]
        inputs += [helper.make_tensor_value_info(n, TensorProto.FLOAT, io) for n in (q, k, v)]
        outputs.append(helper.make_tensor_value_info(y, TensorProto.FLOAT, io))
    graph = helper.make_graph(nodes, "attentions", inputs, outputs, constants)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


def _prepared(onnx_path: str, target: str | Target = H100):
    from tunekit.frontend.precision import prepare
    from tunekit.run.session import load_model

    prepared, precision = prepare(load_model(onnx_path).mod, Target(target) if isinstance(target, str) else target,
                                  precision="fp16")
    assert precision == "fp16"
    return prepared


def _hand_written(mod) -> dict[str, str]:
    """{function name: global symbol} of the module's hand-written kernels (tirx.is_scheduled)."""
    return {gv.name_hint: str(func.attrs["global_symbol"]) for gv, func in mod.functions_items()
            if isinstance(func, tvm.tirx.PrimFunc) and func.attrs is not None and "tirx.is_scheduled" in func.attrs}


def _cuda_source(mod, target) -> str:
    from tunekit.testing.kernels import cuda_source

    return cuda_source(mod, target)


def _nvrtc_compile(code: str) -> None:
    """NVRTC compiles `code` for sm_90a (skipped where NVRTC is not usable)."""
    from tunekit.testing.kernels import nvrtc_ptx, nvrtc_unavailable

    missing = nvrtc_unavailable()
    if missing is not None:
        pytest.skip(missing)
    assert ".entry" in nvrtc_ptx(code)


def _assert_one_definition_each(code: str, symbols) -> None:
    """No kernel of `code` is defined twice, and each of `symbols` is defined (TVM appends `_kernel`)."""
    defined = collections.Counter(_DEFINED.findall(code))
    assert not [name for name, n in defined.items() if n > 1], defined
    assert all(f"{symbol}_kernel" in defined for symbol in symbols), (sorted(symbols), sorted(defined))


@pytest.mark.e2e
def test_attentions_of_different_shapes_get_their_own_symbols_and_compile(tmp_path):
    path = _two_attentions_onnx(str(tmp_path / "attentions.onnx"))
    prepared = _prepared(path)
    kernels = _hand_written(prepared)
    assert len(kernels) == len(BLOCKS) and len(set(kernels.values())) == len(BLOCKS), kernels
    # the same model gives the same names in another process (records and artifacts may name kernels)
    child = subprocess.run([sys.executable, "-c", (
        "import json, sys; sys.path.insert(0, sys.argv[2]); import test_kernel_symbols as t; "
        "print(json.dumps(t._hand_written(t._prepared(sys.argv[1]))))"), path, HERE],
        capture_output=True, text=True, timeout=300)
    assert child.returncode == 0, child.stderr[-2000:]
    assert json.loads(child.stdout.strip().splitlines()[-1]) == kernels
    code = _cuda_source(prepared, Target(H100))
    _assert_one_definition_each(code, kernels.values())
    _nvrtc_compile(code)


def _reference(q, k, v, mask, scale):
    s = np.einsum("bhid,bhjd->bhij", q.astype(np.float64), k.astype(np.float64)) * scale + mask.astype(np.float64)
    p = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("bhij,bhjd->bhid", p / p.sum(-1, keepdims=True), v.astype(np.float64))


@pytest.mark.parametrize("dim", [48, 60, 64])
def test_cuda_core_body_at_head_dims_that_are_no_vector_of_columns(dim):
    """The CUDA-core body's loop nest on the CPU (serial loops) against numpy, at the head dims whose columns
    per thread are read one by one (48: three, 60: clamped) and one read as a vector (64: four)."""
    b, h, s = 1, 2, 20
    rng = np.random.default_rng(dim)
    q, k, v = (rng.standard_normal((b, h, s, dim)).astype(F16) for _ in range(3))
    mask = np.where(rng.random((1, s)) < 0.25, -10000.0, 0.0).astype(F16)

    def contiguous(shape):
        return Operand(shape, F16, 0, tuple(int(np.prod(shape[i + 1:])) for i in range(4)))

    spec = Attention(b, h, s, s, dim, contiguous(q.shape), contiguous(k.shape), contiguous(v.shape),
                     Operand(mask.shape, F16, 0, (0, 0, 0, 1)), dim ** -0.5)
    assert not plan(spec, tensor_cores=False).tensor_cores
    lib = tvm.compile(tvm.IRModule({"main": attention_kernel(spec, gpu=False, tensor_cores=False)}),
                      target=Target({"kind": "llvm"}))
    out = tvm.runtime.tensor(np.zeros((b, s, h, dim), F16))
    lib["main"](*[tvm.runtime.tensor(a) for a in (q, k, v, mask)], out)
    np.testing.assert_allclose(out.numpy().transpose(0, 2, 1, 3), _reference(q, k, v, mask, dim ** -0.5),
                               atol=2e-3, rtol=1e-2)


@pytest.mark.e2e
def test_mobilevit_s_hand_written_kernels_build_together_for_sm_90(tmp_path):
    """timm's mobilevit_s (the zoo's compact copy): its two attentions (head dims 48 and 60) have two symbols,
    and built together for sm_90a they are two CUDA kernels that NVRTC compiles."""
    from tunekit.readiness import gpu_arch_target

    path = tmp_path / "mobilevit_s.onnx"
    with lzma.open(os.path.join(HERE, "data", "zoo", "mobilevit_s.onnx.xz")) as src:
        path.write_bytes(src.read())
    target = gpu_arch_target("sm_90")
    prepared = _prepared(str(path), target)
    kernels = _hand_written(prepared)
    assert len(kernels) == 2 and len(set(kernels.values())) == 2, kernels
    code = _cuda_source(tvm.IRModule({name: prepared[name] for name in kernels}), target)
    _assert_one_definition_each(code, kernels.values())
    _nvrtc_compile(code)
