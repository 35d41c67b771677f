"""Scaled-dot-product attention as one kernel (tunekit/frontend/attention.py, attention_kernel.py).

The kernel's loops are checked on the CPU (`gpu=False`: the same TIR with serial loops in place of
the thread bindings) against numpy, and the GPU build of the same kernel on the device (-m gpu).
"""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm.target import Target

from tunekit.frontend.attention_kernel import Attention, Operand, attention_kernel, plan

H100 = "nvidia/nvidia-h100"
F16 = "float16"


def _reference(q, k, v, mask, scale):
    """softmax(q k^T scale + mask) v in fp64; rows masked everywhere give zeros."""
    s = np.einsum("bhid,bhjd->bhij", q.astype(np.float64), k.astype(np.float64)) * scale + mask.astype(np.float64)
    top = s.max(-1, keepdims=True)
    p = np.exp(s - np.where(np.isfinite(top), top, 0))
    total = p.sum(-1, keepdims=True)
    p = np.where(total > 0, p / np.where(total > 0, total, 1), 0)
    return np.einsum("bhij,bhjd->bhid", p, v.astype(np.float64))


def _strides(shape):
    return [int(np.prod(shape[i + 1:])) for i in range(len(shape))]


def _mask_operand(shape):
    padded = (1,) * (4 - len(shape)) + tuple(shape)
    return Operand(tuple(shape), F16, 0, tuple(0 if d == 1 else s for d, s in zip(padded, _strides(padded))))


def _run_on_cpu(spec, *arrays, tensor_cores=True, key_tiles=False):
    kernel = attention_kernel(spec, gpu=False, tensor_cores=tensor_cores, key_tiles=key_tiles)
    lib = tvm.compile(tvm.IRModule({"main": kernel}), target=Target({"kind": "llvm"}))
    out = tvm.runtime.tensor(np.zeros((spec.batch, spec.seq, spec.heads, spec.head_dim), F16))
    lib["main"](*[tvm.runtime.tensor(a) for a in arrays], out)
    return out.numpy().transpose(0, 2, 1, 3).astype(np.float64)  # [B, S, H, D] -> [B, H, S, D]


def test_kernel_reads_q_k_v_in_place_from_a_combined_projection():
    """BERT's layout: Q, K and V are column ranges of one [B, S, 3 * H * D] tensor (K first, as
    frontend.combine orders them there), 40 query rows (not a whole number of 16-row tiles), a
    full [1, 1, S, S] mask with one row masked everywhere (its output is zeros)."""
    spec, qkv, mask, want = _combined_projection_case()
    assert plan(spec).query_tiles == 3 and spec.k.vector(spec.head_dim) == 8  # 16-byte loads of the aligned rows
    for tensor_cores in (True, False):  # the tensor-core body (head dim 64) and the CUDA-core one
        assert plan(spec, tensor_cores=tensor_cores).tensor_cores == tensor_cores
        got = _run_on_cpu(spec, qkv, qkv, qkv, mask, tensor_cores=tensor_cores)
        assert np.abs(want[0, :, 5]).max() == 0 and np.abs(got[0, :, 5]).max() == 0
        np.testing.assert_allclose(got, want, atol=2e-3, rtol=1e-2)


def _combined_projection_case():
    """(spec, qkv, mask, expected context [B, H, S, D]) of _kernel_reads_q_k_v_in_place_..."""
    b, h, s, d = 1, 3, 40, 64
    c = 3 * h * d
    rng = np.random.default_rng(0)
    qkv = rng.standard_normal((b, s, c)).astype(F16)
    mask = np.where(rng.random((1, 1, s, s)) < 0.3, -np.inf, 0).astype(F16)
    mask[0, 0, 5, :] = -np.inf

    def view(offset):
        return Operand((b, s, c), F16, offset, (s * c, d, c, 1))

    spec = Attention(b, h, s, s, d, view(h * d), view(0), view(2 * h * d), _mask_operand(mask.shape), 0.125)
    heads = qkv.reshape(b, s, 3, h, d).transpose(2, 0, 3, 1, 4)  # [K|Q|V, B, H, S, D]
    return spec, qkv, mask, _reference(heads[1], heads[0], heads[2], mask, 0.125)


@pytest.mark.parametrize("d", [16, 12, 32])
def test_kernel_reads_separate_tensors_and_a_transposed_k(d):
    """Q and V as [B, H, S, D] tensors, K^T as a [B, H, D, SK] tensor (strided, scalar loads), more
    keys than queries, a [1, SK] padding mask broadcast over heads and rows; d=12 is not a whole
    number of 16-byte chunks (the score loop's scalar path)."""
    b, h, s, sk = 2, 2, 24, 33
    rng = np.random.default_rng(d)
    q = rng.standard_normal((b, h, s, d)).astype(F16)
    kt = rng.standard_normal((b, h, d, sk)).astype(F16)
    v = rng.standard_normal((b, h, sk, d)).astype(F16)
    mask = np.where(rng.random((1, sk)) < 0.25, -10000.0, 0.0).astype(F16)

    def contiguous(shape):
        return Operand(shape, F16, 0, tuple(_strides(shape)))

    kt_operand = Operand(kt.shape, F16, 0, (h * d * sk, d * sk, 1, sk))  # element (b, h, j, d) = kt[b, h, d, j]
    spec = Attention(b, h, s, sk, d, contiguous(q.shape), kt_operand, contiguous(v.shape), _mask_operand(mask.shape),
                     d ** -0.5)
    got = _run_on_cpu(spec, q, kt, v, mask)
    want = _reference(q, kt.transpose(0, 1, 3, 2), v, mask, d ** -0.5)
    np.testing.assert_allclose(got, want, atol=2e-3, rtol=1e-2)


def test_attention_that_does_not_fit_a_block_is_not_planned():
    big = Operand((1, 1024, 2304), F16, 0, (1024 * 2304, 64, 2304, 1))
    spec = Attention(1, 12, 1024, 1024, 64, big, big, big, _mask_operand((1,)), 0.125)
    assert plan(spec) is None
    assert plan(spec, key_tiles=True).key_tile == 128  # unless the keys may go through a tile at a time
    odd = Operand((1, 1024, 3 * 12 * 60), F16, 0, (1024 * 2160, 60, 2160, 1))  # head dim 60: no 16-column chunks
    assert plan(Attention(1, 12, 1024, 1024, 60, odd, odd, odd, _mask_operand((1,)), 0.125), key_tiles=True) is None


def _projection_case(*, seq, heads, dim, mask, seed=0):
    """(spec, qkv, expected [B, H, S, D]): Q, K, V read in place from one [1, S, 3 H D] projection, `mask` [1, 1, S, S]."""
    c = 3 * heads * dim
    qkv = np.random.default_rng(seed).standard_normal((1, seq, c)).astype(F16)

    def view(offset):
        return Operand((1, seq, c), F16, offset, (seq * c, dim, c, 1))

    spec = Attention(1, heads, seq, seq, dim, view(heads * dim), view(0), view(2 * heads * dim),
                     _mask_operand(mask.shape), dim ** -0.5)
    parts = qkv.reshape(1, seq, 3, heads, dim).transpose(2, 0, 3, 1, 4)  # [K|Q|V, B, H, S, D]
    return spec, qkv, _reference(parts[1], parts[0], parts[2], mask, dim ** -0.5)


@pytest.mark.parametrize("seq,dim,causal", [(197, 64, False), (512, 64, False), (200, 128, True), (197, 80, False)])
def test_key_tiled_kernel_matches_the_reference_past_what_one_block_holds(seq, dim, causal):
    """attention_flash (keys a tile at a time, online softmax) where K and V do not fit one block: ViT-B/16's 197
    keys (the last tile part padding), BERT's 512 (four tiles), a causal mask (GPT-2) at head dim 128 with a row
    masked everywhere, which gives zeros, and head dim 80 (computed as 96, zero columns). Tiles of 128 keys, 64 at
    head dims 80 and 128."""
    mask = np.zeros((1, 1, seq, seq), F16)
    if causal:
        mask[0, 0] = np.where(np.tril(np.ones((seq, seq), bool)), 0, -np.inf).astype(F16)
        mask[0, 0, 3, :] = -np.inf
    spec, qkv, want = _projection_case(seq=seq, heads=2, dim=dim, mask=mask)
    shape = plan(spec, key_tiles=True)
    assert plan(spec) is None and shape.key_tile == (128 if dim == 64 else 64)
    got = _run_on_cpu(spec, qkv, qkv, qkv, mask, key_tiles=True)
    if causal:
        assert np.abs(got[0, :, 3]).max() == 0
    np.testing.assert_allclose(got, want, atol=2e-3, rtol=1e-2)


@pytest.mark.parametrize("dim", [64, 80])
def test_key_tiled_kernel_compiles_for_a_hopper_gpu_without_one(dim):
    """The GPU build of attention_flash (thread bindings, shared memory, mma.sync), as CUDA source and then PTX by
    NVRTC for sm_90a, at ViT-B/16's shape and at head dim 80: a tile loop around the phases lowers with the barriers
    it needs."""
    from tunekit.readiness import gpu_arch_target
    from tunekit.testing.kernels import cuda_source, nvrtc_ptx, nvrtc_unavailable

    spec, _, _ = _projection_case(seq=197, heads=12, dim=dim, mask=np.zeros((1, 1, 197, 197), F16))
    code = cuda_source(tvm.IRModule({"main": attention_kernel(spec, key_tiles=True)}), gpu_arch_target("sm_90"))
    assert "mma.sync.aligned.m16n8k16" in code and code.count("__syncthreads()") >= 4
    if nvrtc_unavailable() is not None:
        pytest.skip(nvrtc_unavailable())
    assert ".entry" in nvrtc_ptx(code)


def _attention_onnx(path: str, *, seq: int, heads: int = 2, dim: int = 16, axis: int = -1) -> str:
    """softmax(q k^T / sqrt(d) + mask) v on three [1, H, S, D] inputs (K transposed in the graph)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    bias = numpy_helper.from_array(np.where(rng.random((1, 1, 1, seq)) < 0.2, -1e4, 0).astype(np.float32), "bias")
    scale = numpy_helper.from_array(np.array(dim ** -0.5, np.float32), "scale")
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["s"]), helper.make_node("Mul", ["s", "scale"], ["ss"]),
             helper.make_node("Add", ["ss", "bias"], ["sm"]), helper.make_node("Softmax", ["sm"], ["p"], axis=axis),
             helper.make_node("MatMul", ["p", "v"], ["y"])]
    io = [1, heads, seq, dim]
    graph = helper.make_graph(nodes, "attention",
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, io) for n in "qkv"],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, io)], [bias, scale])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


def _packed_attention_onnx(path: str, *, seq: int, heads: int = 2, dim: int = 16) -> str:
    """torch's multi-head attention as torchvision's ViT exports it: one [S, 1, 3E] projection, unflattened, unsqueezed,
    transposed, squeezed and split by Gather into Q, K and V, each reshaped to [S, H, D] and transposed to [H, S, D];
    the context transposed to [S, 1, H, D] and flattened to [S, E] for the output projection."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng, e = np.random.default_rng(1), heads * dim
    consts = {"w": rng.standard_normal((e, 3 * e)).astype(np.float32) * 0.3,
              "b": rng.standard_normal(3 * e).astype(np.float32) * 0.1,
              "unflat": np.array([seq, 1, 3, e], np.int64), "zero": np.array([0], np.int64),
              "three": np.array([3], np.int64), "heads": np.array([seq, heads, dim], np.int64),
              "batched": np.array([1, heads, seq, dim], np.int64), "scale": np.array(dim ** -0.5, np.float32),
              **{f"i{i}": np.array(i, np.int64) for i in range(3)}}
    nodes = [helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["proj"]),
             helper.make_node("Reshape", ["proj", "unflat"], ["p4"]),
             helper.make_node("Unsqueeze", ["p4", "zero"], ["p5"]),
             helper.make_node("Transpose", ["p5"], ["pt"], perm=[3, 1, 2, 0, 4]),
             helper.make_node("Squeeze", ["pt", "three"], ["qkv"])]
    for i, name in enumerate("qkv"):
        nodes += [helper.make_node("Gather", ["qkv", f"i{i}"], [f"{name}0"], axis=0),
                  helper.make_node("Reshape", [f"{name}0", "heads"], [f"{name}1"]),
                  helper.make_node("Transpose", [f"{name}1"], [f"{name}2"], perm=[1, 0, 2]),
                  helper.make_node("Reshape", [f"{name}2", "batched"], [f"{name}3"])]
    nodes += [helper.make_node("Mul", ["q3", "scale"], ["qs"]),
              helper.make_node("Transpose", ["k3"], ["kt"], perm=[0, 1, 3, 2]),
              helper.make_node("MatMul", ["qs", "kt"], ["s"]), helper.make_node("Softmax", ["s"], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", "v3"], ["ctx"]),
              helper.make_node("Transpose", ["ctx"], ["ctx_t"], perm=[2, 0, 1, 3]),  # [S, 1, H, D]
              helper.make_node("Reshape", ["ctx_t", "flat"], ["y"])]
    consts["flat"] = np.array([seq, e], np.int64)
    graph = helper.make_graph(nodes, "packed_attention", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [seq, 1, e])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [seq, e])],
                              [numpy_helper.from_array(v, k) for k, v in consts.items()])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


def test_q_k_and_v_are_read_in_place_from_a_packed_projection_and_compute_the_same(tmp_path):
    """ViT's attention (torch's packed in-projection, split by unsqueeze, transpose, squeeze and Gather): the fused
    kernel reads Q, K and V where the projection wrote them and its [B, S, H, D] context is the [S, E] the graph
    asks for, so no copy is left on either side, and the CPU build computes what onnxruntime does."""
    from tvm import relax

    from tunekit.frontend.precision import convert, prepare
    from tunekit.numerics import check, compare_outputs
    from tunekit.run.session import load_model

    model = load_model(_packed_attention_onnx(str(tmp_path / "packed.onnx"), seq=40))
    names = _launches(prepare(model.mod, Target(H100), precision="fp16")[0])
    # left: the input's cast, the projection, the kernel, and the output's cast to fp32
    assert [n for n in names if n.startswith("fused_attention")] and len(names) == 4 and \
        not [n for n in names if "take" in n or "squeeze" in n or "transpose" in n], names
    vm = relax.VirtualMachine(tvm.compile(convert(model.mod, "fp16", target_kind="llvm"), target=Target("llvm")),
                              tvm.cpu())
    sample = model.inputs.random(seed=3)
    out = vm["main"](tvm.runtime.tensor(sample["x"])).numpy()
    check(compare_outputs(model.output_names, [out], model.reference(sample)), precision="fp16")


@pytest.mark.gpu
@pytest.mark.parametrize("seq", [40, 197])
def test_gpu_q_k_and_v_read_in_place_from_a_packed_projection_compute_the_same(tmp_path, seq):
    """The packed-projection attention (ViT's, head dim 64) built for the GPU, untuned: at 40 the kernel holds K and
    V in one block, at ViT's 197 it loops over key tiles; both read Q, K and V where the projection wrote them and
    match onnxruntime fp32 within the fp16 bound."""
    import os

    from tvm import relax

    from tunekit.clients.compiler import compile_and_export
    from tunekit.frontend.precision import prepare
    from tunekit.numerics import check, compare_outputs
    from tunekit.run.session import load_model
    from tunekit.shares.share import Share
    from tunekit.targets import target_for

    os.environ.setdefault("CUDA_PATH", "/usr/local/cuda")
    model = load_model(_packed_attention_onnx(str(tmp_path / "packed.onnx"), seq=seq, heads=2, dim=64))
    target = target_for(Share("gpu", 100))
    prepared, precision = prepare(model.mod, target, precision="fp16")
    assert precision == "fp16" and len(_launches(prepared)) == 4, _launches(prepared)
    path = compile_and_export(prepared_mod=prepared, target=target, database=None, path=str(tmp_path / "p.so"))
    vm = relax.VirtualMachine(tvm.runtime.load_module(path), tvm.cuda(0))
    for sample_seed in (3, 4):
        sample = model.inputs.random(seed=sample_seed)
        out = vm["main"](tvm.runtime.tensor(sample["x"], device=tvm.cuda(0))).numpy()
        check(compare_outputs(model.output_names, [out], model.reference(sample)), precision="fp16")


def _launches(prepared) -> list[str]:
    from tvm import relax

    return [b.value.args[0].name_hint for block in prepared["main"].body.blocks for b in block.bindings
            if isinstance(b.value, relax.Call) and getattr(b.value.op, "name", None) == "relax.call_tir"]


def test_an_attention_graph_becomes_one_kernel_and_computes_the_same(tmp_path):
    """On a CUDA target the matmuls, softmax, mask and transposes of an attention are one kernel;
    compiled for the CPU (the kernel's serial loops) it computes what onnxruntime does in fp32.
    A softmax over another axis stays unfused."""
    from tvm import relax

    from tunekit.frontend.precision import convert, prepare
    from tunekit.numerics import check, compare_outputs
    from tunekit.run.session import load_model

    model = load_model(_attention_onnx(str(tmp_path / "attn.onnx"), seq=48))
    prepared, _ = prepare(model.mod, Target(H100), precision="fp16")
    names = _launches(prepared)
    # left: the fp32 inputs' casts, and the [B, S, H, D] context back to the graph's [B, H, S, D] fp32 output
    assert [n for n in names if n.startswith("fused_attention")] and \
        not [n for n in names if "softmax" in n or "matmul" in n], names

    vm = relax.VirtualMachine(tvm.compile(convert(model.mod, "fp16", target_kind="llvm"), target=Target("llvm")),
                              tvm.cpu())
    sample = model.inputs.random(seed=4)
    out = vm["main"](*[tvm.runtime.tensor(sample[n]) for n in "qkv"]).numpy()
    check(compare_outputs(model.output_names, [out], model.reference(sample)), precision="fp16")

    names = _launches(prepare(load_model(_attention_onnx(str(tmp_path / "axis2.onnx"), seq=48, axis=2)).mod,
                              Target(H100), precision="fp16")[0])
    assert not [n for n in names if n.startswith("fused_attention")] and [n for n in names if "softmax" in n]


def _shifted_window_attention_onnx(path: str, *, images: int = 2, windows: int = 4, heads: int = 2, seq: int = 16,
                                   dim: int = 8) -> str:
    """Swin's attention in shifted windows: softmax(q k^T s + relative-position bias, then per window of each image a
    shift mask through a reshape to [images, windows, H, S, S] and back) v, on [images * windows, H, S, D] inputs."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    rows = images * windows
    consts = [numpy_helper.from_array(rng.standard_normal((1, heads, seq, seq)).astype(np.float32), "bias"),
              numpy_helper.from_array(np.where(rng.random((1, windows, 1, seq, seq)) < 0.3, -100.0, 0.0)
                                      .astype(np.float32), "shift_mask"),
              numpy_helper.from_array(np.array(dim ** -0.5, np.float32), "scale"),
              numpy_helper.from_array(np.array([images, windows, heads, seq, seq], np.int64), "split"),
              numpy_helper.from_array(np.array([rows, heads, seq, seq], np.int64), "merged")]
    nodes = [helper.make_node("Mul", ["q", "scale"], ["qs"]),
             helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["qs", "kt"], ["s"]), helper.make_node("Add", ["s", "bias"], ["sb"]),
             helper.make_node("Reshape", ["sb", "split"], ["s5"]), helper.make_node("Add", ["s5", "shift_mask"], ["m5"]),
             helper.make_node("Reshape", ["m5", "merged"], ["m4"]), helper.make_node("Softmax", ["m4"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["y"])]
    io = [rows, heads, seq, dim]
    graph = helper.make_graph(nodes, "shifted_windows",
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, io) for n in "qkv"],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, io)], consts)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


def test_a_shifted_window_attention_becomes_one_kernel_and_computes_the_same(tmp_path):
    """Swin's shifted windows add their mask through a reshape that splits the windows by image: the bias and the mask
    become one constant over [images * windows, H, S, S], the attention one kernel, which compiled for the CPU computes
    what onnxruntime does in fp32 (Swin-T: 12 of 12 attentions fused, 7 before)."""
    from tvm import relax

    from tunekit.frontend.precision import convert, prepare
    from tunekit.numerics import check, compare_outputs
    from tunekit.run.session import load_model

    model = load_model(_shifted_window_attention_onnx(str(tmp_path / "swin.onnx")))
    names = _launches(prepare(model.mod, Target(H100), precision="fp16")[0])
    assert [n for n in names if n.startswith("fused_attention")] and not [n for n in names if "softmax" in n], names
    vm = relax.VirtualMachine(tvm.compile(convert(model.mod, "fp16", target_kind="llvm"), target=Target("llvm")),
                              tvm.cpu())
    for seed in (6, 7):
        sample = model.inputs.random(seed=seed)
        out = vm["main"](*[tvm.runtime.tensor(sample[n]) for n in "qkv"]).numpy()
        check(compare_outputs(model.output_names, [out], model.reference(sample)), precision="fp16")


@pytest.mark.gpu
def test_gpu_a_shifted_window_attention_computes_the_same(tmp_path):
    """The shifted-window attention (one mask constant over [images * windows, H, S, S]) built for the GPU, untuned,
    against onnxruntime fp32 within the fp16 bound."""
    import os

    from tvm import relax

    from tunekit.clients.compiler import compile_and_export
    from tunekit.frontend.precision import prepare
    from tunekit.numerics import check, compare_outputs
    from tunekit.run.session import load_model
    from tunekit.shares.share import Share
    from tunekit.targets import target_for

    os.environ.setdefault("CUDA_PATH", "/usr/local/cuda")
    model = load_model(_shifted_window_attention_onnx(str(tmp_path / "swin.onnx"), seq=49, dim=32))
    target = target_for(Share("gpu", 100))
    prepared, _ = prepare(model.mod, target, precision="fp16")
    assert [n for n in _launches(prepared) if n.startswith("fused_attention")]
    path = compile_and_export(prepared_mod=prepared, target=target, database=None, path=str(tmp_path / "s.so"))
    vm = relax.VirtualMachine(tvm.runtime.load_module(path), tvm.cuda(0))
    for seed in (6, 7):
        sample = model.inputs.random(seed=seed)
        out = vm["main"](*[tvm.runtime.tensor(sample[n], device=tvm.cuda(0)) for n in "qkv"]).numpy()
        check(compare_outputs(model.output_names, [out], model.reference(sample)), precision="fp16")


def test_a_long_attention_becomes_one_key_tiled_kernel_and_computes_the_same(tmp_path):
    """Sequence 1024 (K and V do not fit a block) with key_tiles: one kernel that passes over the keys in tiles,
    which compiled for the CPU computes what onnxruntime does in fp32, the padding mask included."""
    from tvm import relax

    from tunekit.frontend.attention import fuse_attention
    from tunekit.frontend.precision import convert
    from tunekit.numerics import check, compare_outputs
    from tunekit.run.session import load_model

    model = load_model(_attention_onnx(str(tmp_path / "long.onnx"), seq=1024, dim=64))
    half = convert(model.mod, "fp16", target_kind="llvm", fuse_attention=False)
    assert fuse_attention(half, gpu=False)[1] == 0
    fused, count = fuse_attention(half, gpu=False, key_tiles=True)
    names = _launches(fused)
    assert count == 1 and [n for n in names if n.startswith("fused_attention")] and \
        not [n for n in names if "softmax" in n], names
    vm = relax.VirtualMachine(tvm.compile(fused, target=Target("llvm")), tvm.cpu())
    sample = model.inputs.random(seed=5)
    out = vm["main"](*[tvm.runtime.tensor(sample[n]) for n in "qkv"]).numpy()
    check(compare_outputs(model.output_names, [out], model.reference(sample)), precision="fp16")


def test_a_long_attention_is_prepared_as_one_key_tiled_kernel(tmp_path):
    """Sequence 1024 on a CUDA target: K and V do not fit one block, and the model is prepared with the key-tiled
    kernel, not the unfused chain (ViT-B/16 at 40% of an H200: benchmarks/RESULTS.md, "key-tiled attention")."""
    from tunekit.frontend.precision import prepare
    from tunekit.run.session import load_model

    mod = load_model(_attention_onnx(str(tmp_path / "long.onnx"), seq=1024, dim=64)).mod
    names = _launches(prepare(mod, Target(H100), precision="fp16")[0])
    assert [n for n in names if n.startswith("fused_attention")] and not [n for n in names if "softmax" in n], names


def test_the_fused_kernel_is_built_as_written_and_never_searched(tmp_path):
    """Extraction lists the hand-written kernel as a task too, marked on its PrimFunc (the module's
    attrs are empty): the tuner must skip it (searching it crashed a BERT tune on the H100)."""
    from tunekit.frontend.precision import prepare
    from tunekit.frontend.tasks import already_scheduled, extract_tasks
    from tunekit.models.examples import save_example
    from tunekit.run.session import load_model

    model = load_model(save_example("transformer", str(tmp_path / "transformer.onnx")))
    prepared, _ = prepare(model.mod, Target(H100), precision="fp16")
    tasks = extract_tasks(prepared, Target(H100))
    assert [t.task_name for t in tasks if already_scheduled(t)] == ["fused_attention"]
    assert len(tasks) > 5 and not any(t.mod.attrs.get("tirx.is_scheduled", False) for t in tasks)


@pytest.mark.gpu
@pytest.mark.parametrize("tensor_cores", [True, False])
def test_gpu_kernel_computes_the_attention(tensor_cores):
    """The GPU build of both bodies on the device, against numpy: this is where the tensor-core
    body's fragment layouts are checked (the CPU variant computes the same elements by loops)."""
    import os

    from tunekit.shares.share import Share
    from tunekit.targets import target_for

    os.environ.setdefault("CUDA_PATH", "/usr/local/cuda")
    spec, qkv, mask, want = _combined_projection_case()
    target = target_for(Share("gpu", 100))
    with target:
        lib = tvm.compile(tvm.IRModule({"main": attention_kernel(spec, tensor_cores=tensor_cores)}), target=target)
    dev = tvm.cuda(0)
    out = tvm.runtime.tensor(np.zeros((spec.batch, spec.seq, spec.heads, spec.head_dim), F16), device=dev)
    lib["main"](*[tvm.runtime.tensor(a, device=dev) for a in (qkv, qkv, qkv, mask)], out)
    np.testing.assert_allclose(out.numpy().transpose(0, 2, 1, 3).astype(np.float64), want, atol=2e-3, rtol=1e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("seq,dim,causal", [(197, 64, False), (512, 64, False), (200, 128, True), (197, 80, False)])
def test_gpu_key_tiled_kernel_computes_the_attention(seq, dim, causal):
    """The GPU build of the key-tiled body on the device, against numpy (its fragments and barriers across tiles)."""
    import os

    from tunekit.shares.share import Share
    from tunekit.targets import target_for

    os.environ.setdefault("CUDA_PATH", "/usr/local/cuda")
    mask = np.zeros((1, 1, seq, seq), F16)
    if causal:
        mask[0, 0] = np.where(np.tril(np.ones((seq, seq), bool)), 0, -np.inf).astype(F16)
    spec, qkv, want = _projection_case(seq=seq, heads=12, dim=dim, mask=mask)
    target = target_for(Share("gpu", 100))
    with target:
        lib = tvm.compile(tvm.IRModule({"main": attention_kernel(spec, key_tiles=True)}), target=target)
    dev = tvm.cuda(0)
    out = tvm.runtime.tensor(np.zeros((1, seq, 12, dim), F16), device=dev)
    lib["main"](*[tvm.runtime.tensor(a, device=dev) for a in (qkv, qkv, qkv, mask)], out)
    np.testing.assert_allclose(out.numpy().transpose(0, 2, 1, 3).astype(np.float64), want, atol=2e-3, rtol=1e-2)


@pytest.mark.gpu
def test_gpu_tune_of_a_transformer_skips_the_fused_kernel_and_keeps_it(tmp_path):
    import json

    from tunekit.models.examples import save_example
    from tunekit.testing import run_cli

    onnx_path = save_example("transformer", str(tmp_path / "transformer.onnx"))
    proc = run_cli("tune", onnx_path, "--gpu-pct", "40", "--trials", "24", "--out", tmp_path / "t", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)["report"]
    assert report["precision"] == "fp16" and report["trials"]["measured"] >= 16
    assert not [t for t in report["tasks"] if "attention" in t["name"]]
    assert min(o["cosine"] for o in report["numerics"]["tuned"]) > 0.999
    from tunekit.run.efficiency import device_peak

    if device_peak(report["environment"]["gpu_name"]):  # each task against the roofline of its 40%
        assert report["roofline"]["sm_count"] < report["roofline"]["of_sms"]
        fractions = [t["efficiency"]["roofline_fraction"] for t in report["tasks"] if "efficiency" in t]
        assert fractions and all(f > 0 for f in fractions), report["tasks"]


@pytest.mark.gpu
def test_gpu_fused_attention_transformer_matches_onnxruntime(tmp_path):
    """The example transformer (two fused attentions, head dim 32: the tensor-core body) built for
    the GPU with CUDA graphs, untuned, run on the device against onnxruntime fp32 within the fp16
    bound, random 0/1 masks included."""
    import os

    from tvm import relax

    from tunekit.clients.compiler import compile_and_export
    from tunekit.frontend.precision import prepare
    from tunekit.models.examples import save_example
    from tunekit.numerics import check, compare_outputs
    from tunekit.run.session import load_model
    from tunekit.shares.share import Share
    from tunekit.targets import target_for

    os.environ.setdefault("CUDA_PATH", "/usr/local/cuda")
    model = load_model(save_example("transformer", str(tmp_path / "transformer.onnx"), seq=64, hidden=128, heads=4))
    target = target_for(Share("gpu", 100))
    prepared, precision = prepare(model.mod, target, precision="fp16")
    assert precision == "fp16" and sum(n.startswith("fused_attention") for n in _launches(prepared)) == 2
    path = compile_and_export(prepared_mod=prepared, target=target, database=None, path=str(tmp_path / "t.so"))
    vm = relax.VirtualMachine(tvm.runtime.load_module(path), tvm.cuda(0))
    for seed in (1, 2):
        sample = model.inputs.random(seed=seed)
        out = vm["main"](*[tvm.runtime.tensor(sample[n], device=tvm.cuda(0)) for n in model.inputs.shapes])
        check(compare_outputs(model.output_names, [out.numpy()], model.reference(sample)), precision="fp16")
