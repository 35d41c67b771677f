"""--gpu-shared-memory opt-in: the GPU search keeps schedules that stage 48 KB or more of shared memory, which
the static limit throws away. Real TuneContexts of the example ResNet-18's fp16 conv for an H100, made as the
search loop makes them (clients.search_loop.tasks_to_search); the search lowers and verifies, no GPU runs."""
import pytest
from tvm.target import Target

from tunekit.config import TuneConfig
from tunekit.errors import TunekitError
from tunekit.targets import search_target


def test_opt_in_raises_only_the_shared_memory_limit_and_names_an_unknown_gpu():
    h100 = Target("nvidia/nvidia-h100")
    assert search_target(h100) is h100  # static: the model's own target
    opt_in = search_target(h100, shared_memory="opt-in")
    assert int(opt_in.attrs["max_shared_memory_per_block"]) == 232448 > int(h100.attrs["max_shared_memory_per_block"])
    for key in ("arch", "max_threads_per_block", "l2_cache_size_bytes", "thread_warp_size"):
        assert opt_in.attrs[key] == h100.attrs[key], key
    cpu = Target({"kind": "llvm"})
    assert search_target(cpu, shared_memory="opt-in") is cpu
    with pytest.raises(TunekitError, match="no opt-in shared-memory limit for sm_61"):
        search_target(Target({"kind": "cuda", "arch": "sm_61"}), shared_memory="opt-in")
    with pytest.raises(TunekitError, match="gpu_shared_memory"):
        TuneConfig(gpu_shared_memory="lots")


def _kept_seeds(task, target, shared_memory, work_dir, samples: int) -> set[int]:
    """Which of `samples` random schedules (seed i: design space i % n, every decision drawn afresh) pass every
    postproc of the context the search would make for `task`."""
    from tvm.s_tir import Schedule, Trace
    from tvm.s_tir import meta_schedule as ms

    from tunekit.clients.search_loop import tasks_to_search

    searched = tasks_to_search([task], target, shared_memory=shared_memory)
    (ctx,), _ = ms.relax_integration.extracted_tasks_to_tune_contexts(searched, work_dir, num_threads=1, seed=0)
    spaces = ctx.generate_design_space()
    kept = set()
    for i in range(samples):
        sch = Schedule(ctx.mod, seed=i + 1)
        try:
            Trace(spaces[i % len(spaces)].trace.simplified(remove_postproc=True).insts, {}).apply_to_schedule(
                sch, remove_postproc=True)
        except Exception:  # a sampled decision that does not apply: rejected in either mode
            continue
        if all(postproc.apply(sch) for postproc in ctx.space_generator.postprocs):
            kept.add(i)
    return kept


def test_opt_in_search_keeps_the_schedules_static_keeps_and_those_over_48_kb(tmp_path):
    from tunekit.metaschedule_env import import_for_target, prepare_metaschedule_logging
    from tunekit.frontend.onnx_loader import import_to_relax, model_inputs
    from tunekit.frontend.precision import prepare
    from tunekit.frontend.tasks import extract_tasks
    from tunekit.models import examples

    target = Target("nvidia/nvidia-h100")
    prepare_metaschedule_logging()
    import_for_target("cuda")
    model = examples.resnet18()
    prepared, precision = prepare(import_to_relax(model, model_inputs(model, {})), target, precision="fp16")
    assert precision == "fp16"
    task = next(t for t in extract_tasks(prepared, target) if "conv2d6_cast4_add5_add6" in t.task_name)
    static = _kept_seeds(task, target, "static", str(tmp_path / "static"), 24)
    opt_in = _kept_seeds(task, target, "opt-in", str(tmp_path / "opt-in"), 24)
    assert static, "no schedule passed at all: the sampling itself is broken"
    # the same schedules (same seeds, same design spaces), judged against 48 KB and against 227 KB
    assert static < opt_in, (sorted(static), sorted(opt_in))
