"""fp16 tensor-core tasks, CUDA graphs, the numerics gate and the GPU target, checked on CPU: a CUDA
target compiles and schedules without a GPU (codegen emits CUDA source; nothing runs it here)."""
import json

import numpy as np
import pytest
import tvm
from tvm.target import Target

from tunekit.errors import RunFailed, TunekitError
from tunekit.frontend.precision import prepare, resolve_precision
from tunekit.frontend.tasks import extract_tasks
from tunekit.numerics import BOUNDS, check, compare_outputs
from tunekit.run.session import load_model
from tunekit.shares.share import Share
from tunekit.targets import GpuInfo, cuda_target, target_for
from tunekit.testing import run_cli

H100 = "nvidia/nvidia-h100"


def _buffer_dtypes(task) -> set[str]:
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    return {str(info.as_json()[1]) for func in task.mod.functions.values() for info in ArgInfo.from_prim_func(func)}


@pytest.fixture(scope="module")
def fp16_tasks(example_model):
    prepared, precision = prepare(load_model(example_model).mod, Target(H100), precision="auto")
    return prepared, precision, extract_tasks(prepared, Target(H100))


def test_precision_is_chosen_by_the_target():
    assert resolve_precision("auto", Target(H100)) == "fp16"
    assert resolve_precision("auto", target_for(Share("cpu", 50))) == "fp32"
    assert resolve_precision("auto", cuda_target(GpuInfo("Tesla P100", (6, 0)))) == "fp32"  # no tensor cores
    assert resolve_precision("fp32", Target(H100)) == "fp32"
    with pytest.raises(TunekitError, match="needs a GPU"):
        resolve_precision("fp16", target_for(Share("cpu", 50)))


def test_fp16_conversion_gives_fp16_conv_tasks_in_nhwc_with_fp32_model_io(fp16_tasks, example_model):
    prepared, precision, tasks = fp16_tasks
    assert precision == "fp16"
    convs = [t for t in tasks if "conv2d" in t.task_name]
    assert len(convs) == 2
    for task in convs:
        assert "float16" in _buffer_dtypes(task), task.task_name
        assert "nhwc" in task.mod.script(), task.task_name  # NHWC: what tensor-core convs want
    params = prepared["main"].params
    assert [str(p.ty.dtype) for p in params] == ["float32"]  # the user passes fp32 arrays
    plain, fp32 = prepare(load_model(example_model).mod, Target(H100), precision="fp32")
    assert fp32 == "fp32" and all("float16" not in _buffer_dtypes(t) for t in extract_tasks(plain, Target(H100)))


@pytest.mark.e2e
def test_tensor_core_candidates_are_tensorized_and_build_on_the_cuda_target(fp16_tasks, tmp_path):
    """MetaSchedule's cuda-tensorcore rules tensorize the fp16 conv; the build pool builds the WMMA
    candidates (most of them fail TVM 0.27's StorageRewrite, which the pool then leaves out)."""
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule.builder import BuilderInput

    from tunekit.clients.build_pool import BuildPool
    from tunekit.metaschedule_env import import_for_target, prepare_metaschedule_logging
    from tunekit.records.trace_keys import is_tensorized

    _, _, tasks = fp16_tasks
    conv = next(t for t in tasks if "conv2d1" in t.task_name)
    import_for_target("cuda")
    prepare_metaschedule_logging()  # pytest's log capture handlers would break MetaSchedule's logging set-up
    strategy = ms.search_strategy.EvolutionarySearch(population_size=64, genetic_num_iters=1, init_min_unmeasured=8)
    (ctx,), _ = ms.relax_integration.extracted_tasks_to_tune_contexts([conv], str(tmp_path), strategy=strategy,
                                                                      num_threads=2, seed=0)
    ctx.pre_tuning(max_trials=8, num_trials_per_iter=8, design_spaces=ctx.generate_design_space(),
                   database=ms.database.MemoryDatabase(), cost_model=ms.cost_model.RandomModel())
    candidates = ctx.generate_measure_candidates()
    tensorized = [c for c in candidates if is_tensorized(c.sch.trace)]
    assert tensorized, "no candidate of the fp16 conv uses tensor cores"
    pool = BuildPool(workers=1, timeout_s=120, cuda_aot=False, artifact_dir=str(tmp_path / "a"))
    try:
        results = pool.build([BuilderInput(c.sch.mod, Target(H100)) for c in tensorized[:4]])
    finally:
        pool.shutdown()
    assert [r.error_msg for r in results] == [None] * len(results)
    summary = pool.profile.summary()
    assert summary["tensor_core_candidates"] == len(results)


@pytest.mark.e2e
def test_a_fresh_process_reads_tensor_core_records(fp16_tasks, tmp_path):
    """--resume, warm starts and `tunekit compile` open a GPU run's records in a process that has not
    imported the CUDA tensor intrinsics; the traces name them ("TensorIntrin 'wmma_fill_16x16x16_f32'
    is not registered" ended a resumed BERT-base run on the H100)."""
    import subprocess
    import sys

    from tvm.s_tir import meta_schedule as ms

    from tunekit.metaschedule_env import import_for_target, prepare_metaschedule_logging
    from tunekit.records.trace_keys import is_tensorized
    from tunekit.records.database import open_database

    _, _, tasks = fp16_tasks
    conv = next(t for t in tasks if "conv2d1" in t.task_name)
    import_for_target("cuda")
    prepare_metaschedule_logging()
    strategy = ms.search_strategy.EvolutionarySearch(population_size=64, genetic_num_iters=1, init_min_unmeasured=8)
    (ctx,), _ = ms.relax_integration.extracted_tasks_to_tune_contexts([conv], str(tmp_path / "work"),
                                                                      strategy=strategy, num_threads=2, seed=0)
    ctx.pre_tuning(max_trials=8, num_trials_per_iter=8, design_spaces=ctx.generate_design_space(),
                   database=ms.database.MemoryDatabase(), cost_model=ms.cost_model.RandomModel())
    candidate = next(c for c in ctx.generate_measure_candidates() if is_tensorized(c.sch.trace))
    records = str(tmp_path / "records")
    database = open_database(records)
    database.commit_tuning_record(ms.database.TuningRecord(
        candidate.sch.trace, database.commit_workload(conv.mod), [1e-5], Target(H100), candidate.args_info))
    read = ("import sys; from tunekit.records.database import open_database; "
            "print(len(open_database(sys.argv[1], create=False).get_all_tuning_records()))")
    done = subprocess.run([sys.executable, "-c", read, records], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.split()[-1] == "1", done.stderr[-1500:]


def test_gpu_artifacts_capture_a_cuda_graph_and_can_be_built_without(fp16_tasks, tmp_path):
    from tunekit.clients.compiler import compile_and_export

    prepared, _, _ = fp16_tasks
    with_graph = compile_and_export(prepared_mod=prepared, target=Target(H100), database=None,
                                    path=str(tmp_path / "g.so"))
    without = compile_and_export(prepared_mod=prepared, target=Target(H100), database=None,
                                 path=str(tmp_path / "n.so"), cuda_graph=False)
    assert b"main_cuda_graph_capture" in open(with_graph, "rb").read()
    assert b"main_cuda_graph_capture" not in open(without, "rb").read()


def test_numerics_refusal_names_the_output_the_error_and_the_way_out():
    ref = [np.linspace(-1, 1, 100, dtype=np.float32)]
    close = compare_outputs(["logits"], [ref[0] + 1e-4], ref)
    check(close, precision="fp16")  # within the fp16 bound: no error
    far = compare_outputs(["logits"], [ref[0] + 0.1], ref)
    with pytest.raises(RunFailed) as caught:
        check(far, precision="fp16")
    text = str(caught.value)
    assert "'logits'" in text and "0.1" in text and "--precision fp32" in text and "\n" not in text
    assert far[0]["max_rel_err"] > BOUNDS["fp16"].max_rel_err
    assert "underflow" not in text  # the reference is well inside fp16's range


def test_fp16_refusal_says_when_the_reference_itself_is_below_fp16s_range():
    """A model whose fp32 outputs are ~1e-9 (MobileNetV2 with fresh weights and uncalibrated BatchNorm) cannot
    be built in fp16 however it is scheduled; the refusal says so instead of only 'cosine 0'."""
    ref = [np.linspace(-1e-9, 1e-9, 100, dtype=np.float32)]
    zeros = compare_outputs(["536"], [np.zeros(100, dtype=np.float32)], ref)
    with pytest.raises(RunFailed) as caught:
        check(zeros, precision="fp16")
    text = str(caught.value)
    assert "underflow in fp16" in text and "1e-09" in text and "--precision fp32" in text and "\n" not in text
    with pytest.raises(RunFailed) as caught:  # in fp32 the same tiny outputs are not an fp16 range problem
        check(zeros, precision="fp32")
    assert "underflow" not in str(caught.value)
    all_zero = compare_outputs(["mask"], [np.ones(4, dtype=np.float32)], [np.zeros(4, dtype=np.float32)])
    with pytest.raises(RunFailed) as caught:  # an output that is zero everywhere did not underflow
        check(all_zero, precision="fp16")
    assert "underflow" not in str(caught.value)


@pytest.mark.e2e
def test_min_output_cosine_tightens_the_bound_and_is_checked(example_model, tmp_path):
    """The cosine bound is the user's to set (max rel error loosened here, so only the cosine can refuse):
    at 1.0, an fp32 build that differs from onnxruntime in its last bits is refused, naming that bound."""
    error = _refusal(example_model, tmp_path, "max_output_error: 1.0\nmin_output_cosine: 1.0\n")
    assert "(bound 1)" in error and "min_output_cosine" in error
    proc = _tune_with_config(example_model, tmp_path, "min_output_cosine: 1.5\n")
    assert proc.returncode != 0 and "min_output_cosine must be a number in (0, 1]" in proc.stderr, proc.stderr[-2000:]


def _tune_with_config(example_model, tmp_path, config: str):
    (tmp_path / "gate.yaml").write_text(config)
    return run_cli("tune", example_model, "--cpu-pct", "50", "--trials", "2", "--config", tmp_path / "gate.yaml",
                   "--out", tmp_path / "o")


def _refusal(example_model, tmp_path, config: str) -> str:
    """The one error line of a tune that the numerics gate refused (rc 1, no traceback)."""
    proc = _tune_with_config(example_model, tmp_path, config)
    assert proc.returncode == 1, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("tunekit: error:")]
    assert len(errors) == 1 and "refused" in errors[0] and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    return errors[0]


@pytest.mark.e2e
def test_tune_refuses_an_artifact_past_the_bound_in_one_line(example_model, tmp_path):
    assert "'y'" in _refusal(example_model, tmp_path, "max_output_error: 1.0e-12\n")
    assert not (tmp_path / "o" / "records-cpu50" / "database_tuning_record.json").exists()  # before any tuning


def test_the_gpu_target_comes_from_the_device_and_is_never_guessed():
    assert cuda_target(GpuInfo("NVIDIA H100 80GB HBM3", (9, 0))).export() == Target(H100).export()
    assert cuda_target(GpuInfo("NVIDIA H200", (9, 0))).arch == "sm_90a"
    assert cuda_target(GpuInfo("NVIDIA A100-SXM4-40GB", (8, 0))).export() == Target("nvidia/nvidia-a100").export()
    future = cuda_target(GpuInfo("NVIDIA Future 9000", (12, 0)))
    assert future.arch == "sm_120" and int(future.attrs["max_threads_per_block"]) == 1024
    # a tag whose architecture disagrees with the device is not used
    assert cuda_target(GpuInfo("NVIDIA H100 (odd)", (8, 9))).arch == "sm_89"


@pytest.mark.e2e
def test_report_counts_tensorized_tasks_and_records_precision(example_model, tmp_path):
    proc = run_cli("tune", example_model, "--cpu-pct", "100", "--trials", "4", "--out", tmp_path / "o", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)["report"]
    assert report["precision"] == "fp32" and report["cuda_graph"] is False
    assert report["tensor_cores"]["tasks"] == len(report["tasks"])
    assert all("best_tensorized" in t and "negligible" in t for t in report["tasks"])
    assert report["numerics"]["tuned"][0]["name"] == "y" and report["numerics"]["tuned"][0]["cosine"] > 0.9999
    assert report["artifact_choice"] in ("tuned", "untuned")
    build = report["phases"]["build_profile"]
    assert build["candidates"] >= report["trials"]["measured"] and build["export_per_candidate_s"] > 0
    # where the whole command's time goes, tuning and everything around it
    steps = report["command_s"]
    assert {"load_s", "prepare_s", "untuned_s", "tune_s", "tuning_wall_s", "finish_s"} <= set(steps)
    assert steps["tune_s"] >= steps["tuning_wall_s"] > 0 and sum(steps.values()) - steps["tuning_wall_s"] \
        <= report["wall_s"] + 1
    assert report["phases"]["total_s"]["model_s"] > 0  # the cost model trained on its own thread


def _kernel_launches(prepared) -> list[tuple[str, object, str]]:
    """(kernel, its first argument, its output dtype) for each call_tir in main, in order."""
    from tvm import relax

    launches = []
    for block in prepared["main"].body.blocks:
        for binding in block.bindings:
            call = binding.value
            if isinstance(call, relax.Call) and getattr(call.op, "name", None) == "relax.call_tir":
                first = call.args[1].fields[0] if len(call.args[1].fields) else None
                launches.append((call.args[0].name_hint, first, getattr(binding.var.ty, "dtype", None)))
    return launches


@pytest.fixture(scope="module")
def transformer_model(tmp_path_factory):
    from tunekit.models.examples import save_example

    return save_example("transformer", str(tmp_path_factory.mktemp("models") / "transformer.onnx"))


def test_fp16_transformer_stays_fp16_between_matmuls_and_combines_q_k_v(transformer_model):
    """The residual stream, LayerNorms and elementwise ops run in fp16 (no kernel that only casts a
    matmul's input, LayerNorm kernels write fp16), and matmuls reading one input are one kernel.
    Under ToMixedPrecision alone the transformer had 43 launches, 8 of them casts; the three
    projections read one LayerNorm output each layer."""
    import re

    prepared, precision = prepare(load_model(transformer_model).mod, Target(H100), precision="fp16")
    assert precision == "fp16"
    launches = _kernel_launches(prepared)
    assert not [name for name, _, _ in launches if re.fullmatch(r"cast\d*", name)]
    norms = [str(dtype) for name, _, dtype in launches if "layer_norm" in name]
    assert len(norms) > 1 and set(norms[:-1]) == {"float16"}  # the last one writes the fp32 model output
    matmul_inputs = [first for name, first, _ in launches if "matmul" in name]
    assert len({first.name for first in matmul_inputs}) == len(matmul_inputs), "matmuls share an input"
    # the combined output is read in place by the fused attention: no slice or transpose is a kernel
    assert any(name.startswith("fused_attention") for name, _, _ in launches)
    assert not [name for name, _, _ in launches if "strided_slice" in name or "transpose" in name], launches


@pytest.mark.e2e
def test_fp16_model_computes_the_model_within_the_fp16_bound(transformer_model):
    """The whole-model fp16 conversion, compiled for the CPU (LLVM emulates fp16), against
    onnxruntime fp32: fp32 accumulation and fp32 LayerNorm statistics keep it inside the bound."""
    from tvm import relax

    from tunekit.frontend.precision import convert

    model = load_model(transformer_model)
    converted = convert(model.mod, "fp16", target_kind="llvm")
    executable = tvm.compile(converted, target=Target({"kind": "llvm", "num-cores": 1}))
    vm = relax.VirtualMachine(executable, tvm.cpu())
    sample = model.inputs.random(seed=1)
    out = vm["main"](*[tvm.runtime.tensor(sample[name]) for name in model.inputs.shapes])
    outputs = [out[i].numpy() for i in range(len(out))] if hasattr(out, "__len__") and not hasattr(out, "numpy") \
        else [out.numpy()]
    assert outputs[0].dtype == np.float32  # the model's outputs keep their dtype
    rows = compare_outputs(model.output_names, outputs, model.reference(sample))
    check(rows, precision="fp16")
    assert rows[0]["max_rel_err"] > 0  # it did run in fp16: not bit-equal to fp32


def _flattened_ffn(path: str, *, width: int = 32, hidden: int = 64, rows: int = 16) -> str:
    """A transformer feed-forward block as ONNX exports of BERT write it: reshape to 2-D around each
    matmul, GELU and the residual add on 3-D tensors."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(a, n) for n, a in [
        ("w1", (rng.standard_normal((width, hidden)) * 0.2).astype(np.float32)),
        ("b1", np.full(hidden, 0.1, np.float32)),
        ("w2", (rng.standard_normal((hidden, width)) * 0.2 * np.sqrt(64 / hidden)).astype(np.float32)),
        ("b2", np.full(width, 0.1, np.float32)),
        ("s2d_in", np.array([rows, width], np.int64)), ("s3d_mid", np.array([1, rows, hidden], np.int64)),
        ("s2d_mid", np.array([rows, hidden], np.int64)), ("s3d_out", np.array([1, rows, width], np.int64)),
        ("sqrt2", np.array(1.4142135, np.float32)), ("one", np.array(1.0, np.float32)),
        ("half", np.array(0.5, np.float32))]]
    node = helper.make_node
    nodes = [node("Reshape", ["x", "s2d_in"], ["x2"]), node("MatMul", ["x2", "w1"], ["m1"]),
             node("Add", ["m1", "b1"], ["h1"]), node("Reshape", ["h1", "s3d_mid"], ["h3"]),
             node("Div", ["h3", "sqrt2"], ["d"]), node("Erf", ["d"], ["e"]), node("Add", ["e", "one"], ["e1"]),
             node("Mul", ["h3", "e1"], ["g0"]), node("Mul", ["g0", "half"], ["g"]),
             node("Reshape", ["g", "s2d_mid"], ["g2"]), node("MatMul", ["g2", "w2"], ["m2"]),
             node("Add", ["m2", "b2"], ["o2"]), node("Reshape", ["o2", "s3d_out"], ["o3"]),
             node("Add", ["o3", "x"], ["y"])]
    io = [1, rows, width]
    graph = helper.make_graph(nodes, "ffn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, io)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, io)], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


def _check_ffn_in_fp16_on_cpu(model, *, seed: int) -> None:
    """The fp16 conversion of a one-input model, compiled for the CPU, within the fp16 bound of onnxruntime fp32."""
    from tvm import relax

    from tunekit.frontend.precision import convert

    vm = relax.VirtualMachine(tvm.compile(convert(model.mod, "fp16", target_kind="llvm"), target=Target({"kind": "llvm", "num-cores": 1})),
                              tvm.cpu())
    sample = model.inputs.random(seed=seed)
    rows = compare_outputs(model.output_names, [vm["main"](tvm.runtime.tensor(sample["x"])).numpy()],
                           model.reference(sample))
    check(rows, precision="fp16")


@pytest.mark.e2e
def test_fp16_reshapes_around_matmuls_no_longer_split_their_epilogues(tmp_path):
    """GELU and the residual add fuse into the matmuls' kernels once the reshapes between them are
    deferred (frontend.reshapes), no kernel is a bare reshape, and the model computes the same.
    Before, the GELU chain and the residual add were kernels of their own."""
    model = load_model(_flattened_ffn(str(tmp_path / "ffn.onnx")))
    prepared, _ = prepare(model.mod, Target(H100), precision="fp16")
    names = [name for name, _, _ in _kernel_launches(prepared)]
    assert not [n for n in names if n.startswith("reshape")], names
    assert [n for n in names if "erf" in n] and all("matmul" in n for n in names if "erf" in n), names
    assert [n for n in names if "matmul" in n and n.count("add") >= 2], names  # bias + residual in the epilogue

    _check_ffn_in_fp16_on_cpu(model, seed=2)


def _sequence_first_projection(path: str, *, rows: int = 20, width: int = 48) -> str:
    """torchvision's multi-head attention around its out-projection: [1, S, C] -> transpose to [S, 1, C] -> reshape
    [S, C] -> matmul + bias -> reshape [S, 1, C] -> transpose to [1, S, C] -> residual add."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(v, n) for n, v in [
        ("w", (rng.standard_normal((width, width)) * width ** -0.5).astype(np.float32)),
        ("b", np.full(width, 0.1, np.float32)), ("s2d", np.array([rows, width], np.int64)),
        ("s3d", np.array([rows, 1, width], np.int64))]]
    node = helper.make_node
    nodes = [node("Transpose", ["x"], ["xt"], perm=[1, 0, 2]), node("Reshape", ["xt", "s2d"], ["x2"]),
             node("MatMul", ["x2", "w"], ["m"]), node("Add", ["m", "b"], ["h"]), node("Reshape", ["h", "s3d"], ["h3"]),
             node("Transpose", ["h3"], ["ht"], perm=[1, 0, 2]), node("Add", ["ht", "x"], ["y"])]
    io = [1, rows, width]
    graph = helper.make_graph(nodes, "proj", [helper.make_tensor_value_info("x", TensorProto.FLOAT, io)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, io)], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


@pytest.mark.e2e
def test_fp16_transposes_of_size_one_axes_are_reshapes_and_the_residual_joins_the_matmul(tmp_path):
    """A transpose that moves only an axis of size 1 keeps the elements in order: deferred like a reshape, so the
    residual add after torchvision's attention out-projection fuses into the matmul's kernel (ViT-B/16: 12 kernels
    fewer) and no transpose is left; the model computes the same. Before, the transpose ended the epilogue."""
    model = load_model(_sequence_first_projection(str(tmp_path / "proj.onnx")))
    prepared, _ = prepare(model.mod, Target(H100), precision="fp16")
    names = [name for name, _, _ in _kernel_launches(prepared)]
    assert not [n for n in names if "transpose" in n], names
    assert [n for n in names if "matmul" in n and n.count("add") >= 2], names  # bias + residual in the epilogue
    _check_ffn_in_fp16_on_cpu(model, seed=3)


def test_split_k_is_chosen_only_where_the_reduction_dominates():
    from tunekit.frontend.split_k import split_count

    assert split_count(128, 768, 3072) == 4    # BERT-base's FFN down-projection
    assert split_count(128, 3072, 768) == 1    # its up-projection: a wide output, a short reduction
    assert split_count(128, 768, 768) == 1     # attention's output projection
    assert split_count(1, 1000, 2048) == 1     # a classifier: one row (and K < 4 N)
    assert split_count(128, 256, 1152) == 2    # 1152 = 2 x 9 x 64: not 4 slices of whole 64-deep tiles
    assert split_count(128, 256, 1000) == 1    # no whole tiles at all


@pytest.mark.e2e
def test_fp16_long_reductions_are_split_along_k_and_compute_the_same(tmp_path):
    """A matmul with a long reduction and a narrow output (BERT's FFN down-projection) becomes a
    tensor-core task of partial products over K slices plus one injective kernel that sums them and
    carries the old epilogue (bias, residual add); the short-reduction matmul is left alone, and
    the model computes the same. Before frontend.split_k both were plain matmul kernels."""
    from tvm.s_tir import meta_schedule as ms

    from tunekit.metaschedule_env import import_for_target
    from tunekit.records.trace_keys import is_tensorized

    model = load_model(_flattened_ffn(str(tmp_path / "ffn.onnx"), width=64, hidden=1024))
    prepared, _ = prepare(model.mod, Target(H100), precision="fp16")
    launches = _kernel_launches(prepared)
    names = [name for name, _, _ in launches]
    assert names.count("matmul_split_k") == 1, names
    assert len([n for n in names if "matmul" in n]) == 2 and "erf" in names[names.index("matmul_split_k") - 1], names
    # the next kernel sums the 4 slices (3 adds) and does the bias and residual adds (2 more)
    sums = names[names.index("matmul_split_k") + 1]
    assert sums.count("strided_slice") == 4 and sums.count("_add") == 5, names
    assert not [n for n in names if n.startswith("reshape")], names  # the batch-1 activation is read as it is

    split_task = next(t for t in extract_tasks(prepared, Target(H100)) if t.task_name == "matmul_split_k")
    import_for_target("cuda")
    spaces = ms.TuneContext(mod=split_task.dispatched[0], target=Target(H100), space_generator="post-order-apply",
                            task_name="split_k", num_threads=1).generate_design_space()
    assert spaces and all(is_tensorized(space.trace) for space in spaces)

    _check_ffn_in_fp16_on_cpu(model, seed=3)
