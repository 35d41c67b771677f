"""GEMM tasks as Triton kernels (kernels.gemm_plan, kernels.triton_gemm; issue 53), on real ONNX models' tasks.

Without a GPU: which tasks have a plan and what their epilogue does; the generated kernel run in Triton's interpreter
against TVM's LLVM build of the same task (masked tiles, a K that is not a multiple of the K step, bias, residual,
erf-GELU and tanh); the kernel compiled for Hopper by Triton's own ptxas. On the device (-m gpu): the model with its
GEMM task replaced by the Triton kernel, against onnxruntime.
"""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm.target import Target

from tunekit.kernels.gemm_plan import plan_of

H100 = "nvidia/nvidia-h100"


def _dense_onnx(path: str, *, m: int, k: int, n: int, residual: bool, rows: tuple[int, ...] | None = None) -> str:
    """y = gelu(x @ w + b) (erf form), or with `residual` y = tanh(x @ w + b + r): x [1, m, k] and r [1, m, n] inputs
    (`rows`: x [1, *rows, k] instead, as Swin's [1, H, W, C] activations)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    consts = [numpy_helper.from_array((rng.standard_normal((k, n)) * 0.1).astype(np.float32), "w"),
              numpy_helper.from_array((rng.standard_normal((n,)) * 0.1).astype(np.float32), "b")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["mm"]), helper.make_node("Add", ["mm", "b"], ["h"])]
    rows = list(rows or (m,))
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, *rows, k])]
    if residual:
        inputs.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, [1, *rows, n]))
        nodes += [helper.make_node("Add", ["h", "r"], ["hr"]), helper.make_node("Tanh", ["hr"], ["y"])]
    else:
        consts += [numpy_helper.from_array(np.array(v, np.float32), name)
                   for v, name in ((0.5, "half"), (1.0, "one"), (2 ** 0.5, "sq"))]
        nodes += [helper.make_node("Div", ["h", "sq"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
                  helper.make_node("Add", ["e", "one"], ["e1"]), helper.make_node("Mul", ["h", "e1"], ["g"]),
                  helper.make_node("Mul", ["g", "half"], ["y"])]
    graph = helper.make_graph(nodes, "dense", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, *rows, n])], consts)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


def _tasks(path: str, target: Target):
    from tunekit.frontend.precision import prepare
    from tunekit.frontend.tasks import extract_tasks
    from tunekit.metaschedule_env import import_for_target, prepare_metaschedule_logging
    from tunekit.run.session import load_model

    import_for_target("cuda")
    prepare_metaschedule_logging()
    prepared, precision = prepare(load_model(path).mod, target, precision="fp16")
    assert precision == "fp16"
    return prepared, extract_tasks(prepared, target)


def _gemm(path: str):
    _, tasks = _tasks(path, Target(H100))
    found = [(t, plan_of(t.dispatched[0]["main"])) for t in tasks]
    gemms = [(t, plan) for t, plan in found if plan is not None]
    assert len(gemms) == 1, [t.task_name for t in tasks]
    return gemms[0][0].dispatched[0]["main"], gemms[0][1], [t for t, plan in found if plan is None]


def test_a_dense_layer_with_its_epilogue_has_a_plan_and_nothing_else_does(tmp_path):
    func, plan, others = _gemm(_dense_onnx(str(tmp_path / "gelu.onnx"), m=40, k=64, n=48, residual=False))
    assert (plan.m, plan.n, plan.k, plan.in_dtype, plan.b_transposed) == (40, 48, 64, "float16", False)
    assert [o.indexed_by for o in plan.operands] == ["n"]  # the bias, one value per column
    assert any("tl.erf" in s for s in plan.epilogue) and plan.out == len(func.params) - 1
    assert others  # the input's cast is a task too, and no GEMM
    _, plan, _ = _gemm(_dense_onnx(str(tmp_path / "res.onnx"), m=40, k=72, n=48, residual=True))
    assert sorted(o.indexed_by for o in plan.operands) == ["mn", "n"]  # bias and residual
    assert any("tl.sigmoid" in s for s in plan.epilogue)  # tanh
    _, plan, _ = _gemm(_dense_onnx(str(tmp_path / "long.onnx"), m=40, k=1024, n=48, residual=False))
    assert (plan.splits, plan.k, plan.operands, plan.epilogue, plan.out_dtype) == (4, 256, (), (), "float32")


@pytest.mark.parametrize("residual,k,tile,rows,n", [
    (False, 64, (16, 32, 32, 4, 3), (40,), 48), (True, 72, (32, 64, 32, 4, 3), (40,), 48),
    (True, 72, (16, 32, 64, 4, 4), (40,), 48), (False, 1024, (32, 32, 64, 4, 3), (40,), 48),
    (True, 64, (32, 32, 32, 4, 3), (5, 8), 48), (False, 64, (16, 64, 64, 4, 4), (1,), 48),
    (True, 72, (32, 32, 32, 4, 3), (40,), 37)])
def test_the_triton_kernel_computes_what_the_task_does(tmp_path, residual, k, tile, rows, n):
    """The kernel in Triton's interpreter on the CPU against TVM's LLVM build of the task's PrimFunc: M = 40 leaves a
    partial row of tiles, K = 72 a partial K step, N = 48 a partial column of tiles at 32 and 64; K = 1024 is split
    in 4 (frontend.split_k: the task writes 4 partial sums, which another task adds up); [1, 5, 8, C] activations are
    40 rows (Swin's [1, H, W, C]); one row (a classifier head); N = 37, whose weight the task reads as [N, K]."""
    pytest.importorskip("triton")
    pytest.importorskip("torch")
    from tunekit.kernels.triton_gemm import TileConfig
    from tunekit.testing.triton_interpret import interpret

    m = int(np.prod(rows))
    func, plan, _ = _gemm(_dense_onnx(str(tmp_path / "d.onnx"), m=m, k=k, n=n, residual=residual, rows=rows))
    assert plan.m == m
    rng = np.random.default_rng(1)
    params = [(rng.standard_normal([int(s) for s in p.shape]) * 0.5).astype(str(p.dtype)) for p in func.params]
    params[-1][...] = 0
    lib = tvm.compile(tvm.IRModule({"main": func}), target="llvm")
    arrays = [tvm.runtime.tensor(p, tvm.cpu()) for p in params]
    lib["main"](*arrays)
    want = arrays[-1].numpy().astype(np.float32)
    got = interpret(plan, TileConfig(*tile), params, work=str(tmp_path)).astype(np.float32)
    assert np.abs(want).max() > 0.5  # something was computed
    np.testing.assert_allclose(got, want, atol=2e-2, rtol=2e-2)  # fp16 (the epilogue rounds where TIR does)


def test_the_triton_kernel_compiles_for_hopper_without_a_gpu(tmp_path):
    """Triton compiles for sm_90 with its own ptxas; TVM launches it with Triton's scratch pointers as zeros."""
    pytest.importorskip("triton")
    from tunekit.kernels.triton_compile import arch_of
    from tunekit.kernels.triton_gemm import TileConfig, compile_gemm, launching_func, tile_configs

    func, plan, _ = _gemm(_dense_onnx(str(tmp_path / "d.onnx"), m=40, k=64, n=48, residual=False))
    configs = tile_configs(plan)
    assert configs and all(c.block_m <= 64 and c.block_n <= 64 for c in configs)  # no tile beyond the problem
    config = TileConfig(16, 32, 32, 4, 3)
    assert TileConfig.from_name(config.name) == config
    kernel = compile_gemm(plan, config, arch=arch_of(Target(H100)))
    assert kernel.cubin[:4] == b"\x7fELF" and kernel.threads == 128 and kernel.grid == 3 * 2
    assert kernel.pointers == 4 and kernel.params >= kernel.pointers  # a, b, bias, out (+ Triton's scratch)
    text = launching_func(func, plan, kernel).script()
    assert kernel.name in text and "tirx.is_scheduled" in text


def test_a_task_replaced_in_the_module_keeps_its_call_brings_its_device_module_and_builds_for_cuda(tmp_path):
    """kernels.in_module: the task's PrimFunc (matched by its workload key, as records are) is replaced under its own
    name, the module's other functions stay, and the kernel's module is in external_mods for the build to link (a
    CPU module stands in for the CUDA one, which a machine without the CUDA driver cannot create). The Relax build for
    CUDA takes the module: its fusion leaves the launching function alone (FuseTIR takes only block bodies)."""
    pytest.importorskip("triton")
    from tunekit.kernels.in_module import replace_tasks, task_key
    from tunekit.kernels.triton_gemm import TileConfig, compile_gemm, launching_func

    path = _dense_onnx(str(tmp_path / "d.onnx"), m=40, k=64, n=48, residual=False)
    prepared, tasks = _tasks(path, Target(H100))
    func, plan, _ = _gemm(path)
    key = task_key(func)
    launching = launching_func(func, plan, compile_gemm(plan, TileConfig(16, 32, 32, 4, 3), arch=90))
    device = tvm.compile(tvm.IRModule({"main": func}), target="llvm").mod
    mod, replaced = replace_tasks(prepared, lambda k, f: (launching, device) if k in (key, "0" * 16) else None)
    assert replaced == {key}
    changed = [gv.name_hint for gv, f in mod.functions_items()
               if isinstance(f, tvm.tirx.PrimFunc) and "tunekit.kernel" in f.attrs]
    assert len(changed) == 1 and changed[0] in {gv.name_hint for gv, _ in prepared.functions_items()}
    assert mod[changed[0]].attrs["global_symbol"] == changed[0]
    assert len(mod.attrs["external_mods"]) == 1 and "tunekit.kernel" not in str(prepared[changed[0]].attrs)
    assert replace_tasks(prepared, lambda k, f: None)[0].same_as(prepared)
    with Target(H100):
        tvm.compile(mod, target=Target(H100))


@pytest.mark.gpu
@pytest.mark.parametrize("n", [48, 37])
def test_gpu_a_model_with_its_gemm_as_a_triton_kernel_computes_the_same(tmp_path, n):
    """On the device: the model with its GEMM task replaced by the Triton kernel (compiled for the GPU's
    architecture, linked into the artifact) against onnxruntime fp32, within the fp16 bound; N = 37 with its weight
    stored [N, K] (frontend.aligned_weights)."""
    import os

    from tvm import relax

    from tunekit.clients.compiler import compile_and_export
    from tunekit.kernels.in_module import task_key
    from tunekit.kernels.candidates import with_kernels
    from tunekit.kernels.triton_gemm import TileConfig
    from tunekit.numerics import check, compare_outputs
    from tunekit.run.session import load_model
    from tunekit.shares.share import Share
    from tunekit.targets import target_for

    os.environ.setdefault("CUDA_PATH", "/usr/local/cuda")
    path = _dense_onnx(str(tmp_path / "d.onnx"), m=40, k=72, n=n, residual=True)
    model = load_model(path)
    target = target_for(Share("gpu", 100))
    prepared, tasks = _tasks(path, target)
    keys = [task_key(t.dispatched[0]["main"]) for t in tasks if plan_of(t.dispatched[0]["main"])]
    mod, replaced = with_kernels(prepared, {keys[0]: TileConfig(32, 64, 32, 4, 3).name}, target=target)
    assert replaced == {keys[0]}
    artifact = compile_and_export(prepared_mod=mod, target=target, database=None, path=str(tmp_path / "t.so"))
    vm = relax.VirtualMachine(tvm.runtime.load_module(artifact), tvm.cuda(0))
    for seed in (3, 4):
        sample = model.inputs.random(seed=seed)
        out = vm["main"](*[tvm.runtime.tensor(sample[name], device=tvm.cuda(0)) for name in model.inputs.shapes])
        outs = [out.numpy()] if hasattr(out, "numpy") else [o.numpy() for o in out]
        check(compare_outputs(model.output_names, outs, model.reference(sample)), precision="fp16")


def test_a_weight_whose_rows_do_not_start_on_16_bytes_is_read_transposed(tmp_path):
    """N = 37 fp16 columns (74-byte rows, GPT-2's LM head has 50257): the GEMM task reads the weight as [N, K], which
    a kernel loads in 16-byte vectors (frontend.aligned_weights); N = 48 (96 bytes) keeps [K, N]."""
    func, plan, _ = _gemm(_dense_onnx(str(tmp_path / "odd.onnx"), m=40, k=64, n=37, residual=True))
    assert (plan.b_transposed, plan.n, plan.k) == (True, 37, 64)
    assert [int(d) for d in func.params[plan.b].shape] == [37, 64]
    assert sorted(o.indexed_by for o in plan.operands) == ["mn", "n"]  # the epilogue still fused: bias and residual
    _, plan, _ = _gemm(_dense_onnx(str(tmp_path / "even.onnx"), m=40, k=64, n=48, residual=True))
    assert not plan.b_transposed
