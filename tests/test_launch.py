"""Launch shapes of GPU schedules (records/launch.py): blocks, threads and waves at a share's SMs,
read from real schedules of an example model's conv for a CUDA target, generated on this CPU."""
import pytest


def test_launch_shape_is_read_from_the_thread_bindings():
    from tunekit.records.launch import launch_of_script, with_waves

    script = '''
    for b in T.thread_binding(14, thread="blockIdx.x"):
        for b2 in T.thread_binding(4, thread="blockIdx.y"):
            for t in T.thread_binding(64, thread="threadIdx.x"):
                pass
            for t in T.thread_binding(0, 128, thread="threadIdx.x"):
                pass
            for v in T.thread_binding(T.int64(8), thread="vthread.x"):
                for t in T.thread_binding(T.int64(96), thread="threadIdx.x"):
                    pass
    '''
    assert launch_of_script(script) == {"blocks": 56, "threads": 128}
    assert with_waves({"blocks": 56, "threads": 128}, 52) == {"blocks": 56, "threads": 128, "waves": 2}
    assert with_waves({"blocks": 52, "threads": 128}, 52)["waves"] == 1
    assert launch_of_script("for i in T.serial(8):\n    pass") is None  # a CPU schedule


@pytest.fixture(scope="module")
def conv_traces(tmp_path_factory):
    """(workload, [traces]): schedules of tiny_cnn's first conv for an H100, sampled on CPU."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from tunekit.metaschedule_env import import_for_target
    from tunekit.frontend.onnx_loader import import_to_relax, load_onnx, model_inputs
    from tunekit.frontend.tasks import extract_tasks, prepare_for_tuning
    from tunekit.models.examples import save_example

    import_for_target("cuda")
    target = tvm.target.Target("nvidia/nvidia-h100")
    model = load_onnx(save_example("tiny_cnn", str(tmp_path_factory.mktemp("m") / "tiny_cnn.onnx")))
    prepared = prepare_for_tuning(import_to_relax(model, model_inputs(model, {})), target)
    task = next(t for t in extract_tasks(prepared, target) if "conv2d" in t.task_name)
    ctx = ms.TuneContext(mod=task.dispatched[0], target=target, space_generator="post-order-apply",
                         search_strategy="replay-trace", num_threads=1, task_name=task.task_name, rand_state=0)
    # random decisions (tile sizes, thread extents) in the design spaces, as the search samples them
    ctx.pre_tuning(max_trials=8, num_trials_per_iter=8, design_spaces=ctx.generate_design_space(),
                   database=ms.database.MemoryDatabase(), cost_model=None)
    return ctx.mod, [candidate.sch.trace for candidate in ctx.generate_measure_candidates()]


def test_launch_of_a_real_cuda_schedule(conv_traces):
    from tunekit.records.launch import launch_of_trace

    mod, traces = conv_traces
    shapes = [launch_of_trace(mod, trace) for trace in traces]
    assert shapes and all(s is not None for s in shapes)
    for shape in shapes:
        assert shape["blocks"] >= 1 and 1 <= shape["threads"] <= 1024
    # the untuned workload has no bindings: there is nothing to launch until it is scheduled
    assert launch_of_trace(mod, tvm_empty_trace()) is None


def test_best_launches_reads_each_workloads_best_record(conv_traces, tmp_path):
    """The best record's shape, not the first one's: two schedules of one conv, the slower first."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from tunekit.records.database import open_database
    from tunekit.records.launch import best_launches, launch_of_trace

    mod, traces = conv_traces
    target = tvm.target.Target("nvidia/nvidia-h100")
    shapes = [launch_of_trace(mod, t) for t in traces]
    slow, fast = next((i, j) for i in range(len(traces)) for j in range(len(traces)) if shapes[i] != shapes[j])
    database = open_database(str(tmp_path / "records-gpu40"))
    workload = database.commit_workload(mod)
    for index, secs in ((slow, 2e-3), (fast, 1e-3)):
        database.commit_tuning_record(ms.database.TuningRecord(traces[index], workload, [secs], target,
                                                               ms.arg_info.ArgInfo.from_prim_func(mod["main"])))
    (shape,) = best_launches(str(tmp_path / "records-gpu40")).values()
    assert shape == shapes[fast]


def tvm_empty_trace():
    from tvm.s_tir import Trace

    return Trace([], {})
