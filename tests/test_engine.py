"""tunekit's engine, part by part, on real TVM builds, real RPC servers and real tuning runs."""
import json
import os
import signal
import time

import psutil
import pytest
import tvm
from tvm.s_tir.meta_schedule.builder import BuilderInput

from tunekit.clients.build_pool import BuildPool
from tunekit.records.jsonl import read_records
from tunekit.testing import (add_one_module, alive_after, build_inputs, distinct, hang_module, local_fleet,
                             pass_failure_module, record_keys, record_lines, run_cli, session_runner, take_module,
                             tune_process, wait_for_records)

pytestmark = pytest.mark.e2e


def test_build_pool_workers_persist_across_batches(tmp_path):
    pool = BuildPool(workers=1, timeout_s=60, artifact_dir=str(tmp_path))
    try:
        target = tvm.target.Target({"kind": "llvm"})
        pids = []
        for _ in range(2):
            results = pool.build([BuilderInput(add_one_module(), target)] * 2)
            assert [r.error_msg for r in results] == [None, None]
            assert all(str(r.artifact_path).endswith(".so") and os.path.getsize(r.artifact_path) for r in results)
            assert all(t.ok and t.build_s > 0 for t in pool.last_timings)
            pids.append(pool._pool.submit(os.getpid).result())
        assert pids[0] == pids[1]  # the same worker process served both batches
        # a broken candidate fails alone; the pool goes on
        results = pool.build([BuilderInput(tvm.IRModule({}), target), BuilderInput(add_one_module(), target)])
        assert results[1].error_msg is None
    finally:
        pool.shutdown()


def test_build_pool_says_when_its_workers_have_started_without_anyone_waiting(tmp_path):
    """BuildPool.on_warm: a GPU share's warm-up does not wait for the build workers (tuning's first
    searches overlap their start), yet the report times it (phases.warm_up.steps.build_workers_s)."""
    import threading

    heard, fired = [], threading.Event()
    pool = BuildPool(workers=2, timeout_s=60, artifact_dir=str(tmp_path))
    try:
        pool.on_warm(lambda seconds: (heard.append(seconds), fired.set()))  # before they have started
        assert fired.wait(120)
        assert pool.warm_s is not None and heard == [pool.warm_s] and pool.warm_s > 0
        pool.on_warm(heard.append)  # after: at once, the same time
        assert heard == [pool.warm_s] * 2
    finally:
        pool.shutdown()


def test_a_build_that_fails_inside_a_pass_leaves_the_worker_able_to_build(tmp_path):
    """TVM's pass profiler, left in the pass that threw, failed every later build of the worker
    ("cannot print pass profile while still in a pass!", then a crash) until it was recycled."""
    pool = BuildPool(workers=1, timeout_s=60, artifact_dir=str(tmp_path))
    try:
        target = tvm.target.Target({"kind": "llvm"})
        results = pool.build([BuilderInput(m, target) for m in (pass_failure_module(), *[add_one_module()] * 3)])
        assert "tvm_access_ptr" in results[0].error_msg
        assert [r.error_msg for r in results[1:]] == [None] * 3
        summary = pool.profile.summary()
        assert summary["candidates"] == 3 and summary["pass_timed_candidates"] == 0
    finally:
        pool.shutdown()


def test_session_runner_reuses_a_session_and_survives_a_server_kill(tmp_path):
    pool = BuildPool(workers=1, timeout_s=60, artifact_dir=str(tmp_path))

    def measure(runner, count):
        futures = runner.run(build_inputs(pool, [add_one_module()] * count))
        return [f.result() for f in futures]

    with local_fleet("t-session") as fleet:
        runner = session_runner(fleet, candidate_timeout_s=60)
        try:
            results = measure(runner, 3)
            assert all(r.error_msg is None and len(r.run_secs) == 1 and min(r.run_secs) > 0 for r in results)
            assert fleet.idle_servers() == 0  # our one session holds the server between candidates
            (pid,) = fleet.server_pids
            psutil.Process(pid).kill()
            deadline = time.time() + 60
            while fleet.restarts == 0 and time.time() < deadline:
                time.sleep(0.2)
            # the first candidate finds the dead session; the runner reconnects and measures it once more
            results = measure(runner, 3)
            assert all(r.error_msg is None for r in results), [r.error_msg for r in results]
            assert runner.session_failures == 1 and runner.retried == 1 and runner.retry_survived == 1
        finally:
            runner.shutdown()
            pool.shutdown()


def test_resume_continues_without_remeasuring_and_refuses_mismatches(example_model, tmp_path):
    out = tmp_path / "run"
    first = run_cli("tune", example_model, "--cpu-pct", "100", "--trials", "8", "--out", out, "--json")
    assert first.returncode == 0, first.stderr[-2000:]
    db = out / "records-cpu100"
    assert len(record_lines(db)) == 8
    again = run_cli("tune", example_model, "--cpu-pct", "100", "--trials", "8", "--out", out)
    assert again.returncode == 2 and "--resume" in again.stderr and "Traceback" not in again.stderr
    assert len(record_lines(db)) == 8  # refused before touching anything
    resumed = run_cli("tune", example_model, "--cpu-pct", "100", "--trials", "8", "--out", out, "--resume", "--json")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    report = json.loads(resumed.stdout)["report"]
    assert len(record_lines(db)) == 8 + report["trials"]["measured"] and report["trials"]["measured"] == 8
    # no candidate measured twice: every (workload, trace) pair is unique
    keys = record_keys(db)
    assert len(keys) == 16 and len(distinct(keys)) == len(keys)
    # a crash that cuts the last line: not fatal to reading or compiling (which read the records as they are),
    # and repaired when the database is opened to tune on (the cut bytes kept aside)
    records_file = db / "database_tuning_record.json"
    text = records_file.read_text()
    records_file.write_text(text[:-150])
    summary = run_cli("records", out, "--json")
    assert summary.returncode == 0, summary.stderr[-1000:]
    compiled = run_cli("compile", example_model, "--records", out, "--out", tmp_path / "m.so")
    assert compiled.returncode == 0, compiled.stderr[-1000:]
    skipped = []
    assert len(list(read_records(str(db), skipped=skipped))) == 15 and len(skipped) == 1  # compile wrote nothing
    from tunekit.records.database import open_database

    assert len(open_database(str(db)).get_all_tuning_records()) == 15
    skipped = []
    assert len(list(read_records(str(db), skipped=skipped))) == 15 and skipped == []  # the cut line moved aside
    assert any(p.name.startswith("database_tuning_record.json.damaged-") for p in db.iterdir())
    other = tmp_path / "other.onnx"
    from tunekit.models.examples import save_example

    save_example("tiny_cnn", str(other), seed=1)  # same graph, other weights: another model
    mismatch = run_cli("tune", other, "--cpu-pct", "100", "--trials", "8", "--out", out, "--resume")
    assert mismatch.returncode == 2 and "another model" in mismatch.stderr


def test_ctrl_c_stops_every_process_and_keeps_records(example_model, tmp_path):
    out = tmp_path / "int"
    proc = tune_process(example_model, out, "--trials", "200")
    assert wait_for_records(proc, out / "records-cpu50", 1, timeout=300)
    children = psutil.Process(proc.pid).children(recursive=True)
    assert children, "the tracker and server should be running"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert "interrupted" in err and "Traceback" not in err
    alive = alive_after(children, timeout=15)
    assert not alive, [c.cmdline() for c in alive]
    assert len(record_lines(out / "records-cpu50")) >= 1


def test_untuned_gpu_baseline_leaves_the_workload_intact(example_model, tmp_path):
    """Regression: DLight scheduled the task's module in place, so the database's
    workload changed and the tuned model silently got none of its records. Needs no GPU: it only
    schedules and applies for the CUDA target."""
    import tvm_ffi
    from tvm.s_tir import meta_schedule as ms
    from tvm.target import Target

    from tunekit.clients.compiler import apply_records
    from tunekit.metaschedule_env import import_for_target, prepare_metaschedule_logging
    from tunekit.clients.search_loop import untuned_module
    from tunekit.frontend.tasks import extract_tasks, prepare_for_tuning
    from tunekit.run.session import load_model

    target = Target("nvidia/nvidia-h100")
    prepared = prepare_for_tuning(load_model(example_model).mod, target)
    tasks = [t for t in extract_tasks(prepared, target) if "conv2d" in t.task_name][:1]
    prepare_metaschedule_logging()  # pytest's log capture handlers, left by an earlier test, would break it
    import_for_target("cuda")  # as make_engine does: an earlier in-process CPU tune registers only the CPU's
    # replay-trace: one random candidate is all this needs (the evolutionary search took ~90 s to give it)
    (ctx,), _ = ms.relax_integration.extracted_tasks_to_tune_contexts(tasks, str(tmp_path), num_threads=1, seed=0,
                                                                     strategy="replay-trace")
    database = ms.database.MemoryDatabase()
    ctx.pre_tuning(max_trials=4, num_trials_per_iter=4, design_spaces=ctx.generate_design_space(),
                   database=database, cost_model=ms.cost_model.RandomModel())
    candidate = ctx.generate_measure_candidates()[0]
    workload = database.commit_workload(ctx.mod)
    database.commit_tuning_record(ms.database.TuningRecord(candidate.sch.trace, workload, [1e-5], target,
                                                           candidate.args_info))
    before = tvm_ffi.structural_hash(ctx.mod)
    baseline = untuned_module(ctx, target)
    assert tvm_ffi.structural_hash(ctx.mod) == before
    assert next(iter(baseline.functions.values())).attrs.get("tirx.is_scheduled", False)
    applied = apply_records(prepared_mod=prepared, target=target, database=database)
    scheduled = [gv.name_hint for gv, f in applied.functions.items() if f.attrs and f.attrs.get("tirx.is_scheduled", False)]
    assert scheduled == [tasks[0].task_name]


def test_a_hung_candidate_fails_alone_and_its_server_is_replaced(tmp_path):
    pool = BuildPool(workers=1, timeout_s=60, artifact_dir=str(tmp_path))
    with local_fleet("t-hang") as fleet:
        runner = session_runner(fleet, candidate_timeout_s=5)
        try:
            hung, after = [f.result() for f in runner.run(build_inputs(pool, [hang_module(), add_one_module()]))]
            assert hung.error_msg is not None and "server was stopped" in hung.error_msg
            assert after.error_msg is None and min(after.run_secs) > 0  # the run goes on, on a new server
            assert runner.hangs == 1 and fleet.restarts == 1
        finally:
            runner.shutdown()
            pool.shutdown()


def _tune_on_cpu(model, tmp_path, *, yaml: str, trials: int, per_iter: int) -> dict:
    """`tunekit tune` at cpu100 with a YAML config; checks that exactly `trials` distinct candidates
    were measured (the budget holds, nothing twice) and returns the report."""
    config = tmp_path / "config.yaml"
    config.write_text(yaml)
    out = tmp_path / "run"
    # The search's defaults: QUICK_SEARCH's can run out of new tiny_cnn candidates before the budget (10 of 12 measured)
    tuned = run_cli("tune", model, "--cpu-pct", "100", "--trials", str(trials), "--trials-per-iter", str(per_iter),
                    "--config", config, "--out", out, "--json", search=None)
    assert tuned.returncode == 0, tuned.stderr[-2000:]
    report = json.loads(tuned.stdout)["report"]
    assert report["trials"]["measured"] == trials
    keys = record_keys(out / "records-cpu100")
    assert len(keys) == trials and len(distinct(keys)) == len(keys)
    assert sum(task["trials"] for task in report["tasks"]) == trials
    assert all(0 <= task["failed_build"] <= task["failed"] for task in report["tasks"])  # build vs run failures
    # each task's first search only sampled and ranked (clients.first_look: no generations before a measurement)
    assert all(task["first_looks"] == 1 for task in report["tasks"] if task["trials"]), report["tasks"]
    # what each task's efficiency is computed from (run.efficiency); a CPU share has no roofline to hold it to
    assert all(task["flops"] > 1 and task["bytes"] > 0 for task in report["tasks"]), report["tasks"]
    assert "roofline" not in report and not any("efficiency" in task for task in report["tasks"])
    # when each task's latency fell (benchmarks/fleet.py traces a model's estimated latency over time from it); a
    # task whose candidates never beat its untuned kernel has none
    for task in report["tasks"]:
        times, us = [t for t, _ in task["fell_at"]], [u for _, u in task["fell_at"]]
        assert times == sorted(times) and all(a > b for a, b in zip(us, us[1:])), task
        if task["tuned_us"] and (task["untuned_us"] is None or task["tuned_us"] < task["untuned_us"]):
            assert us[-1] == task["tuned_us"], task
        # and when each batch of it came back, with its trials so far (fleet.py: what each model got, when)
        times, counts = [t for t, _ in task["measured_at"]], [n for _, n in task["measured_at"]]
        assert times == sorted(times) and counts == sorted(counts), task
        assert counts[-1:] == ([task["trials"]] if task["trials"] else counts[-1:]), task
    return report


def test_pipelined_loop_searches_while_batches_build_and_keeps_the_budget(example_model, tmp_path):
    """overlap on: the next task is searched while earlier batches are built and measured (two
    batches in flight). The budget holds, no candidate is measured twice, every phase is timed.
    The search runs on the loop's thread, which holds a finished batch in flight until the search is done, so the
    depth is reached whatever the timing."""
    report = _tune_on_cpu(example_model, tmp_path, yaml="overlap: true\n", trials=12, per_iter=3)
    phases = report["phases"]
    assert phases["overlap"] is True
    assert all(phases["total_s"][k] > 0 for k in ("search_s", "build_s", "run_s"))
    # more than one task was tuned: the loop does not search a task whose batch is still in flight
    assert sum(1 for task in report["tasks"] if task["trials"]) >= 2
    pipeline = phases["pipeline"]
    assert (pipeline["depth"], pipeline["most_in_flight"]) == (2, 2)
    # how full the pipeline was kept, time-weighted over the loop: never more than the most at once
    assert 0 < pipeline["mean_in_flight"] <= pipeline["most_in_flight"], pipeline


def test_a_deeper_pipeline_keeps_more_batches_in_flight_and_the_budget(example_model, tmp_path):
    """search.pipeline_depth 3: three batches (of three tasks) are built and measured while the loop searches the
    next. The budget still holds and no candidate is measured twice (_tune_on_cpu checks both)."""
    # every task tuned: whether tiny_cnn's two small tasks count as negligible depends on their untuned timing
    yaml = "overlap: true\nsearch: {pipeline_depth: 3}\nmin_task_share: 0\n"
    report = _tune_on_cpu(example_model, tmp_path, yaml=yaml, trials=12, per_iter=2)
    pipeline = report["phases"]["pipeline"]
    assert (pipeline["depth"], pipeline["most_in_flight"]) == (3, 3) and 0 < pipeline["mean_in_flight"] <= 3, pipeline
    assert sum(1 for task in report["tasks"] if task["trials"]) >= 3


AHEAD = "overlap: true\nsearch: {pipeline_depth: 3, batches: 3}\nmin_task_share: 0.2\n"  # 1-2 tasks tuned, depth 3


def test_a_task_sends_its_next_batch_from_its_reserve_while_its_last_is_in_flight(example_model, tmp_path):
    """With fewer tasks to tune than batches the pipeline may hold, a task whose search left picks in reserve sends
    its next batch before its last one came back, so more batches are in flight than there are tasks. Its search
    still hears every batch before it searches again; the budget holds and nothing is measured twice
    (_tune_on_cpu)."""
    report = _tune_on_cpu(example_model, tmp_path, yaml=AHEAD, trials=12, per_iter=2)
    tuned = [task for task in report["tasks"] if task["trials"]]
    pipeline = report["phases"]["pipeline"]
    assert pipeline["sent_ahead"] > 0 and pipeline["most_in_flight"] > len(tuned), (pipeline, tuned)
    # no search ran ahead of its results: a search serves 3 batches, so a task searched at least trials / 6 times
    assert all(task["searches"] >= -(-task["trials"] // 6) for task in tuned), tuned


def test_one_search_serves_several_batches_and_keeps_the_budget(example_model, tmp_path):
    """search.batches 3: a search picks 3 batches' worth and the task's next batches take them before
    it searches again. Batches stay trials_per_iter long, the budget holds, nothing is measured twice."""
    report = _tune_on_cpu(example_model, tmp_path, yaml="overlap: true\nsearch: {batches: 3}\n", trials=18, per_iter=2)
    tuned_tasks = [task for task in report["tasks"] if task["trials"]]
    # 9 batches of 2; a task's search serves up to 3 of its batches
    assert all(task["searches"] >= -(-task["trials"] // 6) for task in tuned_tasks)
    assert sum(task["searches"] for task in tuned_tasks) < 9
    assert any(task["trials"] > 2 * task["searches"] for task in tuned_tasks)
    assert any(task["searches"] > 1 for task in tuned_tasks)  # a task that searched again ran the evolutionary search


def test_index_arguments_are_filled_in_range_so_a_take_kernel_measures(tmp_path):
    """An embedding lookup (take/gather) reads its table at the index argument's values: random
    int64 values read far outside the table and kill the server. The runner fills integer
    arguments with zeros, so such a candidate measures like any other."""
    pool = BuildPool(workers=1, timeout_s=60, artifact_dir=str(tmp_path))
    with local_fleet("t-take") as fleet:
        runner = session_runner(fleet, candidate_timeout_s=60)
        try:
            results = [f.result() for f in runner.run(build_inputs(pool, [take_module()] * 2))]
            assert all(r.error_msg is None and min(r.run_secs) > 0 for r in results), [r.error_msg for r in results]
            assert runner.server_losses == 0 and runner.retried == 0 and fleet.restarts == 0
        finally:
            runner.shutdown()
            pool.shutdown()



@pytest.mark.e2e
def test_the_time_budget_covers_the_untuned_kernels_measured_before_the_search(example_model, tmp_path):
    """inception_v3's fp32 baselines once took 713 s of a 120 s budget (each broke its server): the budget covers them
    too. Spent before the first is measured, it leaves every task without one, and the untuned model is the artifact."""
    proc = run_cli("tune", example_model, "--cpu-pct", "100", "--time-budget", "0.001", "--out", tmp_path / "run",
                   "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)["report"]
    assert report["tasks"] and all(task["untuned_us"] is None for task in report["tasks"]), report["tasks"]
    assert report["trials"]["measured"] == 0 and os.path.getsize(report["artifact"]) > 0


@pytest.mark.e2e
def test_a_task_whose_untuned_kernel_fails_says_why_in_the_report_and_the_rest_keep_theirs(example_model, tmp_path,
                                                                                            monkeypatch):
    """inception_v3's fp32 baselines each failed on the GPU and nothing said why: each task's row keeps the error of
    its untuned kernel (injected here at its build), one warning counts them, and the run goes on."""
    from tunekit.clients.task_faults import ENV

    monkeypatch.setenv(ENV, "untuned:conv2d")
    proc = run_cli("tune", example_model, "--cpu-pct", "100", "--trials", "4", "--out", tmp_path / "run", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    tasks = json.loads(proc.stdout)["report"]["tasks"]
    failed = [t for t in tasks if "conv2d" in t["name"]]
    assert failed and all(t["untuned_us"] is None and "injected untuned failure" in t["untuned_error"]
                          and t["untuned_error"].startswith("build: ") for t in failed), failed
    others = [t for t in tasks if "conv2d" not in t["name"]]
    assert others and all(t["untuned_us"] is not None and "untuned_error" not in t for t in others), others
    assert f"{len(failed)} task(s) have no untuned baseline" in proc.stderr
