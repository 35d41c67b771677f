"""Squeeze-excitation convs get a design space in fp16 on a tensor-core GPU (clients.design_spaces).

TVM 0.27's tensor-core tiling rule fails on every draw for a 1x1 conv on a 1x1 input in fp16 NHWC (the squeeze and
excite convs of EfficientNet, MobileNetV3 and RegNet): "Back optional access", then a ScheduleError in `split`. Such a
task is searched with the same rules less the tensorizing ones; every other task keeps its space. A task that has no
space at all raises NoDesignSpace, in one line. No GPU needed: the target is an H100's, NVRTC compiles without one.
"""
import numpy as np
import pytest
from tvm.target import Target

from tunekit.frontend.precision import prepare
from tunekit.frontend.tasks import already_scheduled, extract_tasks
from tunekit.records.trace_keys import TENSORIZE_MARK
from tunekit.run.session import load_model

H100 = "nvidia/nvidia-h100"
C = 64


@pytest.fixture(scope="module")
def se_model(tmp_path_factory):
    """A 3x3 conv, then a squeeze-excitation block: GlobalAveragePool -> 1x1 conv C->C/4 + bias -> Relu ->
    1x1 conv C/4->C + bias -> Sigmoid -> Mul with the conv's output."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rs = np.random.RandomState(0)
    weights = {"w0": rs.randn(C, C, 3, 3) * 0.05, "b0": rs.randn(C) * 0.1, "w1": rs.randn(C // 4, C, 1, 1) * 0.1,
               "b1": rs.randn(C // 4) * 0.1, "w2": rs.randn(C, C // 4, 1, 1) * 0.1, "b2": rs.randn(C) * 0.1}
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c0"], ["a"]),
             helper.make_node("GlobalAveragePool", ["a"], ["p"]),
             helper.make_node("Conv", ["p", "w1", "b1"], ["c1"], kernel_shape=[1, 1]),
             helper.make_node("Relu", ["c1"], ["r"]),
             helper.make_node("Conv", ["r", "w2", "b2"], ["c2"], kernel_shape=[1, 1]),
             helper.make_node("Sigmoid", ["c2"], ["s"]),
             helper.make_node("Mul", ["a", "s"], ["y"])]
    graph = helper.make_graph(nodes, "se", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, C, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, C, 8, 8])],
                              [numpy_helper.from_array(w.astype(np.float32), name) for name, w in weights.items()])
    path = str(tmp_path_factory.mktemp("se") / "se.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


@pytest.fixture(scope="module")
def se_tasks(se_model):
    """The tasks a GPU run of the model searches, in fp16."""
    from tunekit.metaschedule_env import import_for_target, prepare_metaschedule_logging

    import_for_target("cuda")
    prepare_metaschedule_logging()  # pytest's log capture handlers would break MetaSchedule's logging set-up
    target = Target(H100)
    prepared, precision = prepare(load_model(se_model).mod, target, precision="auto")
    assert precision == "fp16"
    return [t for t in extract_tasks(prepared, target) if not already_scheduled(t)]


def _contexts(tasks, work_dir, seed=0):
    from tvm.s_tir import meta_schedule as ms

    from tunekit.metaschedule_env import prepare_metaschedule_logging

    prepare_metaschedule_logging()

    strategy = ms.search_strategy.EvolutionarySearch(population_size=16, genetic_num_iters=1, init_min_unmeasured=8)
    contexts, _ = ms.relax_integration.extracted_tasks_to_tune_contexts(tasks, str(work_dir), strategy=strategy,
                                                                        num_threads=1, seed=seed)
    return contexts


def _is_squeeze_conv(ctx) -> bool:
    """A task whose conv has a 1x1 output (NHWC: [1, 1, 1, channels])."""
    from tvm.s_tir import Schedule

    if "conv2d" not in str(ctx.task_name):
        return False
    sch = Schedule(ctx.mod)
    nn, yy, xx = sch.get_loops(sch.get_sblock("conv2d_nhwc"))[:3]
    return [int(sch.get(loop).extent) for loop in (nn, yy, xx)] == [1, 1, 1]


def _traces(spaces) -> list[str]:
    return [str(space.trace) for space in spaces]


@pytest.mark.e2e
def test_squeeze_convs_get_a_design_space_whose_candidates_build(se_tasks, tmp_path):
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from tunekit.clients.design_spaces import generate_design_spaces

    squeeze = [ctx for ctx in _contexts(se_tasks, tmp_path) if _is_squeeze_conv(ctx)]
    assert len(squeeze) == 2, [ctx.task_name for ctx in _contexts(se_tasks, tmp_path)]
    again = [ctx for ctx in _contexts(se_tasks, tmp_path) if _is_squeeze_conv(ctx)]
    nvrtc = _nvrtc()
    for ctx, twin in zip(squeeze, again):
        with pytest.raises(Exception, match="Back optional access"):  # TVM's rule still fails on them
            twin.generate_design_space()
        spaces = generate_design_spaces(ctx)
        assert spaces and not any(TENSORIZE_MARK in trace for trace in _traces(spaces))
        assert _traces(generate_design_spaces(twin)) == _traces(spaces)  # the same seed is the same run
        # the context's own search (tensor-core postprocs and mutators) takes these spaces
        ctx.pre_tuning(max_trials=8, num_trials_per_iter=8, design_spaces=spaces,
                       database=ms.database.MemoryDatabase(), cost_model=ms.cost_model.RandomModel(seed=0))
        candidates = ctx.generate_measure_candidates()
        assert candidates, ctx.task_name
        sources = [_cuda_source(tvm.compile(candidate.sch.mod, Target(H100))) for candidate in candidates]
        assert all("__global__" in source for source in sources)
        if nvrtc is not None:  # a kernel compiles for sm_90a, as the runner would load it (TVM 0.27 emits some
            # candidates' int32x8 index vectors as longlong4 with 8 values: those fail to build, as in any search)
            assert any(_compiles(nvrtc, source) for source in sources), ctx.task_name


def _cuda_source(executable) -> str:
    return "\n".join(m.inspect_source() for m in executable.mod.imports if m.kind == "cuda")


def _compiles(nvrtc, source: str) -> bool:
    try:
        return len(nvrtc.compile_cuda(source, target_format="ptx", arch="compute_90a", compiler="nvrtc")) > 0
    except RuntimeError:
        return False


def _nvrtc():
    """tvm.support.nvcc where NVRTC and the CUDA headers can be used, else None."""
    from tvm.support import nvcc

    from tunekit.testing.kernels import nvrtc_unavailable

    return nvcc if nvrtc_unavailable() is None else None


def test_every_other_task_keeps_its_design_space(se_tasks, tmp_path):
    """The 3x3 conv keeps its tensor-core space, unchanged; the model's other tasks too."""
    from tunekit.clients.design_spaces import generate_design_spaces

    tensorized = 0
    for ctx, twin in zip(_contexts(se_tasks, tmp_path), _contexts(se_tasks, tmp_path)):
        spaces = generate_design_spaces(ctx)
        if _is_squeeze_conv(ctx):
            continue
        assert _traces(spaces) == _traces(twin.generate_design_space()), ctx.task_name
        tensorized += any(TENSORIZE_MARK in trace for trace in _traces(spaces))
    assert tensorized == 1


def _failing_context(mod, target, primitive, calls: list):
    """A real context whose space generator, a schedule function, fails on every draw; `calls` counts draws."""
    from tvm.s_tir import meta_schedule as ms

    def schedule(sch):
        calls.append(primitive)
        block = sch.get_sblock("conv2d_nhwc")
        if primitive == "split":  # ScheduleError: the kind a new draw of sampled tiles may fix
            sch.split(sch.get_loops(block)[3], factors=[0, None])
        else:  # any other error of TVM's (here a ValueError): no new draw changes it
            sch.tensorize(sch.get_loops(block)[3], "no_such_intrin")

    return ms.TuneContext(mod, target=target, space_generator=ms.space_generator.ScheduleFn(schedule),
                          task_name="no_space", rand_state=0, num_threads=1)


@pytest.mark.parametrize("primitive,reason,draws", [("split", "'split'", 3), ("tensorize", "no_such_intrin", 1)])
def test_a_task_without_any_design_space_raises_no_design_space_in_one_line(se_tasks, tmp_path, primitive, reason,
                                                                            draws):
    from tunekit.clients.design_spaces import NoDesignSpace, generate_design_spaces
    from tunekit.errors import TunekitError

    squeeze = next(ctx for ctx in _contexts(se_tasks, tmp_path) if _is_squeeze_conv(ctx))
    calls = []
    with pytest.raises(NoDesignSpace) as raised:
        generate_design_spaces(_failing_context(squeeze.mod, squeeze.target, primitive, calls), draws=3)
    error = raised.value
    assert isinstance(error, TunekitError)
    assert "\n" not in str(error) and "\n" not in error.reason and "seed" not in str(error)
    assert str(error).startswith("task no_space:") and error.reason in str(error) and reason in error.reason
    assert len(calls) == draws  # a new draw only where it could help


def test_stock_engine_searches_squeeze_convs_with_the_fallback_rules(se_tasks, tmp_path):
    from tunekit.clients.design_spaces import stock_contexts, stock_seed

    seed, _ = stock_seed(se_tasks, str(tmp_path), threads=1, seed=0)
    contexts = _contexts(se_tasks, tmp_path, seed)
    kept, weights, left_out = stock_contexts(contexts, [1] * len(contexts))
    assert len(kept) == len(weights) == len(contexts) and not left_out
    swapped = [new for old, new in zip(contexts, kept) if new is not old]
    assert sorted(str(c.task_name) for c in swapped) == sorted(str(c.task_name) for c in contexts
                                                              if _is_squeeze_conv(c))
    for ctx in swapped:
        assert ctx.generate_design_space()


@pytest.mark.gpu
def test_a_model_with_squeeze_excitation_tunes_in_fp16_at_a_gpu_share(se_model, tmp_path):
    """On the GPU, at 40%: every task is searched (no fallback), the squeeze convs get measured candidates, and the
    tuned fp16 artifact passes the numerics bound against onnxruntime."""
    import json

    from tunekit.testing import run_cli

    config = tmp_path / "all.yaml"
    config.write_text("min_task_share: 0\n")  # the squeeze convs are tiny: tune them even so
    proc = run_cli("tune", se_model, "--gpu-pct", "40", "--trials", "24", "--trials-per-iter", "4",
                   "--config", config, "--out", tmp_path / "se", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)["report"]
    assert report["config"]["precision"] == "auto" and report["fallback_tasks"] == 0, report["tasks"]
    squeeze = [t for t in report["tasks"] if t["name"].startswith(("fused_conv2d1", "fused_conv2d2"))]
    assert squeeze and all(t["trials"] > 0 and t["tuned_us"] for t in squeeze), squeeze
