"""Kernels of another kind tried for a tuning loop's GEMM tasks (clients.kernel_trials; issue 53): one Triton candidate
per tile configuration, built by the build pool, checked against the task's own kernel on the share's runner server,
then timed, and kept in every share's kernel records.

Without a GPU: the runner's check (a real RPC server on 127.0.0.1, CPU libraries built by the build pool), and which
candidates a model's tasks get. On the device (-m gpu): a tune that tries them and a report that says which kind won."""
from __future__ import annotations

import numpy as np
import pytest
from test_triton_gemm import H100, _dense_onnx, _tasks
from tvm.target import Target

from tunekit.clients.build_pool import BuildPool
from tunekit.clients.session_runner import is_wrong_output
from tunekit.records import kernel_records
from tunekit.records.kernel_records import KernelRecord
from tunekit.testing import checked_library, local_fleet, session_runner


def _checked_results(tmp_path, libraries: list[tuple]) -> tuple[list[str], list]:
    """Each (main_adds, reference_adds, written) of testing.checked_library built by a build pool, then run on a
    real runner server on 127.0.0.1: (their paths, their RunnerResults)."""
    from tvm.s_tir.meta_schedule.arg_info import TensorInfo
    from tvm.s_tir.meta_schedule.runner import RunnerInput

    pool = BuildPool(workers=1, timeout_s=60, artifact_dir=str(tmp_path), cuda_aot=False)
    try:
        paths = [pool.submit_call(checked_library, *library).result() for library in libraries]
    finally:
        pool.shutdown()
    args = [TensorInfo("float32", [256]), TensorInfo("float32", [256])]
    with local_fleet("t-check") as fleet:
        runner = session_runner(fleet)
        try:
            return paths, [f.result() for f in runner.run([RunnerInput(p, "cpu", args) for p in paths])]
        finally:
            runner.shutdown()


def test_a_candidate_with_a_reference_is_timed_only_when_its_output_matches(tmp_path):
    _, results = _checked_results(tmp_path, [(1.0, 1.0, None), (1.0, 2.0, None), (1.0, 1.001, None)])
    assert results[0].error_msg is None and min(results[0].run_secs) > 0
    assert results[1].run_secs is None and is_wrong_output(results[1]), results[1].error_msg
    assert "argument 1" in results[1].error_msg  # B, the output; A is the same in both
    assert results[2].error_msg is None  # rounding-sized differences pass (numerics.KERNEL_BOUND)


def test_a_candidate_that_names_its_written_arguments_is_checked_on_those_alone(tmp_path):
    """session_runner.mark_written_args: the check compares only the arguments the candidate writes (a GEMM's weight
    need not cross the RPC link twice); here the reference differs in B, which the candidate says it does not write.
    The file goes with the library (callbacks.remove_artifact)."""
    import os

    from tunekit.clients.callbacks import remove_artifact
    from tunekit.clients.session_runner import written_args_path

    (only_a, _), results = _checked_results(tmp_path, [(1.0, 2.0, [0]), (1.0, 2.0, [1])])
    assert results[0].error_msg is None and min(results[0].run_secs) > 0
    assert is_wrong_output(results[1]) and "argument 1" in results[1].error_msg
    assert os.path.exists(written_args_path(only_a))
    remove_artifact(only_a)
    assert not os.path.exists(only_a) and not os.path.exists(written_args_path(only_a))


def test_kernel_candidates_are_measured_a_few_at_a_time_and_none_is_sent_once_the_time_is_out(tmp_path):
    """kernel_trials.measure_in_order: a run is sent only once all but AHEAD of the earlier ones came back, so a
    time budget that runs out leaves no queue of measurements behind it; builds past it are not sent."""
    from tvm import te

    from tunekit.clients.kernel_trials import AHEAD, KernelTrial, measure_in_order

    a = te.placeholder((256,), name="A")
    func = te.create_prim_func([a, te.compute((256,), lambda i: a[i] + 1.0, name="B")])
    pool = BuildPool(workers=2, timeout_s=60, artifact_dir=str(tmp_path), cuda_aot=False)
    sent, outstanding, most, outcomes = [], [0], [0], []
    try:
        builds = [(KernelTrial(None, "w", f"c{i}", func), pool.submit_call(checked_library, 1.0, 1.0, None))
                  for i in range(8)]
        for _, build in builds:
            build.result()  # every library ready before the first is sent: a queue would form at once
        with local_fleet("t-ahead") as fleet:
            runner = session_runner(fleet)

            def run(task, inputs):
                sent.append(inputs[0].artifact_path)
                outstanding[0] += 1
                most[0] = max(most[0], outstanding[0])
                return runner.run(inputs)

            def on_result(done, trial, future):
                outstanding[0] -= 1
                outcomes.append((done, trial.config, future.result().error_msg))

            try:
                taken = measure_in_order(builds, device_type="cpu", run=run, on_result=on_result,
                                         out_of_time=lambda: len(outcomes) >= 3)
            finally:
                runner.shutdown()
    finally:
        pool.shutdown()
    assert most[0] == AHEAD + 1  # never all eight at once
    assert [c for _, c, _ in outcomes] == [f"c{i}" for i in range(taken)] and all(e is None for _, _, e in outcomes)
    assert 3 <= taken <= 3 + AHEAD and len(sent) == taken  # the rest never reached the runner


def _contexts(path: str, tmp_path):
    from tunekit.clients.scheduler import TaskState
    from tunekit.clients.search_loop import search_contexts
    from tunekit.config import TuneConfig

    target = Target(H100)
    _, tasks = _tasks(path, target)
    contexts, _ = search_contexts(tasks, target, str(tmp_path / "work"), config=TuneConfig(), threads=1)
    return target, [TaskState(i, t.task_name, 1.0, ctx) for i, (t, ctx) in enumerate(zip(tasks, contexts))]


def _two_models(tmp_path):
    """(target, the tasks of a small and of a larger dense model), numbered in that order, each 1 µs untuned."""
    target, small = _contexts(_dense_onnx(str(tmp_path / "s.onnx"), m=40, k=72, n=48, residual=True), tmp_path / "s")
    _, large = _contexts(_dense_onnx(str(tmp_path / "l.onnx"), m=40, k=64, n=96, residual=False), tmp_path / "l")
    for i, task in enumerate(small + large):
        task.index, task.untuned_us = i, 1.0
    return target, small, large


def test_each_gemm_task_gets_a_triton_trial_per_tile_config_until_every_share_has_recorded_it(tmp_path):
    pytest.importorskip("triton")
    from tunekit.clients.kernel_trials import plan_trials
    from tunekit.kernels.gemm_plan import plan_of
    from tunekit.kernels.triton_gemm import tile_configs

    target, tasks = _contexts(_dense_onnx(str(tmp_path / "d.onnx"), m=40, k=72, n=48, residual=True), tmp_path)
    gemm = [t for t in tasks if plan_of(t.ctx.mod["main"])]
    assert len(gemm) == 1 and len(tasks) > 1
    dirs = {"gpu40": str(tmp_path / "a"), "gpu100": str(tmp_path / "b")}
    trials = plan_trials(tasks, target=target, records_dirs=dirs)
    configs = [c.name for c in tile_configs(plan_of(gemm[0].ctx.mod["main"]))]
    assert [t.config for t in trials] == configs and {t.task.index for t in trials} == {gemm[0].index}
    assert plan_trials(tasks, target=Target("llvm"), records_dirs=dirs) == []  # no CUDA target: MetaSchedule only
    for config in configs[1:]:
        for directory in dirs.values():
            kernel_records.append(directory, KernelRecord(trials[0].workload, "triton", config, (1e-5,), True))
    kernel_records.append(dirs["gpu40"], KernelRecord(trials[0].workload, "triton", configs[0], (), False, error="x"))
    left = plan_trials(tasks, target=target, records_dirs=dirs)
    assert [t.config for t in left] == configs[:1]  # measured at gpu40 only: still a trial for gpu100
    gemm[0].negligible = True
    assert plan_trials(tasks, target=target, records_dirs=dirs) == []


def test_the_gemm_that_costs_the_model_most_is_tried_first(tmp_path):
    """Under a time budget the kernel trials may not all run (GPT-2's LM head: 16 candidates of a 77 MB weight): the
    task with the most weight x untuned latency goes first, a fused attention (cost unknown) before any."""
    pytest.importorskip("triton")
    from tunekit.clients.kernel_trials import FIRST_ROUND, ScheduledTask, plan_trials

    target, small, large = _two_models(tmp_path)
    tasks = small + large
    dirs = {"gpu40": str(tmp_path / "a")}
    by_index = [t.task.index for t in plan_trials(tasks, target=target, records_dirs=dirs)]
    first, second = sorted(set(by_index))
    assert by_index[0] == first and by_index[FIRST_ROUND] == second  # equal costs: in task order
    tasks[second].untuned_us = 50.0
    by_cost = [t.task.index for t in plan_trials(tasks, target=target, records_dirs=dirs)]
    assert by_cost[0] == second and by_cost[-1] == first and sorted(by_cost) == sorted(by_index)
    unknown = ScheduledTask(len(tasks), "fused", tasks[first].ctx)  # a fused attention's cost is not known
    assert plan_trials([*tasks, unknown], target=target, records_dirs=dirs)[0].task is unknown


def test_every_task_gets_its_first_candidates_before_any_task_its_others(tmp_path):
    """A budget that runs out after a few candidates (GPT-2 at 512, 90 s: all of it on the LM head's 13 tiles) still
    leaves every GEMM task its first FIRST_ROUND tiles, the ones most often best, in its configurations' order."""
    pytest.importorskip("triton")
    from tunekit.clients.kernel_trials import FIRST_ROUND, plan_trials
    from tunekit.kernels.gemm_plan import plan_of
    from tunekit.kernels.triton_gemm import tile_configs

    target, small, large = _two_models(tmp_path)
    tasks = small + large
    heavy = next(t for t in large if plan_of(t.ctx.mod["main"]))
    heavy.untuned_us = 50.0
    trials = plan_trials(tasks, target=target, records_dirs={"gpu40": str(tmp_path / "a")})
    gemms = [t for t in tasks if plan_of(t.ctx.mod["main"])]
    assert len(gemms) == 2 and len(trials) > 2 * FIRST_ROUND
    first_round = trials[:2 * FIRST_ROUND]
    assert [t.task for t in first_round] == [heavy] * FIRST_ROUND + [g for g in gemms if g is not heavy] * FIRST_ROUND
    configs = [c.name for c in tile_configs(plan_of(heavy.ctx.mod["main"]))]
    assert [t.config for t in trials if t.task is heavy] == configs  # each task's in its own order


@pytest.mark.gpu
def test_gpu_tuning_tries_triton_kernels_checks_them_at_the_share_and_reports_the_kind_that_won(tmp_path):
    """A dense layer (M = 256, K = 512, N = 1024) tuned at 40% with few MetaSchedule trials: every Triton
    configuration is measured and checked there, kept in the share's kernel records, the report names each task's
    kernel kind, and the artifact (with the Triton kernel where it won) passes the numerics gate."""
    import json
    import os

    from tunekit.testing import run_cli

    path = _dense_onnx(str(tmp_path / "d.onnx"), m=256, k=512, n=1024, residual=False)
    proc = run_cli("tune", path, "--gpu-pct", "40", "--trials", "8", "--out", tmp_path / "t", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)["report"]
    records = kernel_records.read(os.path.join(tmp_path / "t", "records-gpu40"))
    assert len(records) >= 6 and all(r.kind == "triton" for r in records)
    assert any(r.checked and r.run_secs for r in records), records
    (gemm,) = [t for t in report["tasks"] if t.get("kernel_config")]
    assert gemm["kernel"] in ("triton", "metaschedule", "default") and gemm["kernel_us"] > 0
    assert min(o["cosine"] for o in report["numerics"]["tuned"]) > 0.999
    if gemm["kernel"] == "triton":  # the artifact carries the kernel's cubin, and so does `tunekit compile`'s
        assert gemm["efficiency"]["kernel"] == "triton"
        compiled = tmp_path / "compiled.so"
        proc = run_cli("compile", path, "--records", tmp_path / "t", "--out", compiled)
        assert proc.returncode == 0, proc.stderr[-3000:]
        for artifact in (report["artifact"], compiled):
            with open(artifact, "rb") as fh:
                assert b"tunekit_gemm_" in fh.read()


def test_the_summary_says_which_tasks_run_kernels_of_another_kind():
    """`tunekit tune`'s summary line, from the report of a tune on the H200 (benchmarks/results): ViT-B/16's four
    GEMMs and its fused attention ran Triton; a row left to MetaSchedule's, the untuned or the hand-written kernel
    does not count, a run that shipped its untuned build says none was, and a run without any says nothing."""
    import json
    import os

    from tunekit.cli.tune import kernels_line

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "results",
                        "h200-transformers-triton-attention", "report-vit_b_16.json")
    with open(path) as fh:
        report = json.load(fh)
    assert kernels_line(report) == ("\nkernels: triton for 4 task(s) and 1 fused attention(s) "
                                    "(report tasks[].kernel, fused_kernels)")
    assert "kernels: none shipped" in kernels_line({**report, "artifact_choice": "untuned"})
    report["fused_kernels"][0]["kernel"] = "handwritten"
    for row in report["tasks"]:
        row["kernel"] = "metaschedule" if row["kernel"] == "triton" else row["kernel"]
    assert kernels_line(report) == ""


def test_a_warm_server_fills_every_element_of_a_candidates_inputs():
    """servers.input_fill: the runner's random inputs cover every element. TVM's own fill leaves the last
    size % threads elements as they were (uninitialised, at times NaN), and a kernel that propagates the NaN was
    refused as wrong at the share beside a reference that drops it."""
    import tvm
    from tvm import rpc

    from tunekit.servers.input_fill import remote_fill
    from tunekit.shares.share import Share

    with local_fleet("t-fill", share=Share("cpu", 100)) as fleet:  # every core: TVM's fill splits over them
        tracker = rpc.connect_tracker(fleet.config.connect_host, fleet.tracker_port)
        session = tracker.request(fleet.key, session_timeout=30)
        fill = remote_fill(session)
        for dtype in ("float16", "float32"):
            for size in (301, 5):
                tensor = tvm.runtime.tensor(np.full(size, np.nan, dtype), session.cpu(0))
                fill(tensor)
                values = tensor.numpy()
                assert np.isfinite(values).all() and values.min() >= 1 and values.max() <= 10, (dtype, size, values)


def test_a_warm_server_compares_two_of_its_tensors_where_they_are():
    """servers.output_check: the reference check's comparison runs on the runner server (a GEMM's output no longer
    crosses the RPC link twice per candidate), with numerics.compare's row, the same as on the client."""
    import tvm
    from tvm import rpc

    from tunekit.numerics import compare
    from tunekit.servers.output_check import remote_compare

    mine, theirs = np.linspace(-1, 1, 256, dtype=np.float32), np.linspace(-1, 1, 256, dtype=np.float32) ** 3
    with local_fleet("t-compare") as fleet:
        tracker = rpc.connect_tracker(fleet.config.connect_host, fleet.tracker_port)
        session = tracker.request(fleet.key, session_timeout=30)
        compare_there = remote_compare(session)
        assert compare_there is not None
        device = session.cpu(0)
        row = compare_there(tvm.runtime.tensor(mine, device), tvm.runtime.tensor(theirs, device))
    assert row == pytest.approx(compare(mine, theirs)) and row["cosine"] < 0.99
    nan = compare(np.where(mine > 0.5, np.nan, mine), theirs)  # which side is not finite, where one is not
    assert (nan["nonfinite"], nan["reference_nonfinite"]) == (int((mine > 0.5).sum()), 0) and "nonfinite" not in row
