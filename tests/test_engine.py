"""tunekit's engine, part by part, on real TVM builds, real RPC servers and real tuning runs."""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest
import tvm
from tvm import te
from tvm.s_tir.meta_schedule.arg_info import ArgInfo
from tvm.s_tir.meta_schedule.builder import BuilderInput
from tvm.s_tir.meta_schedule.runner import RunnerInput

from conftest import run_cli
from tunekit.clients.build_pool import BuildPool
from tunekit.clients.search_loop import trace_key
from tunekit.clients.session_runner import RunnerConfig, SessionRunner
from tunekit.servers.fleet import FleetConfig, RunnerFleet
from tunekit.shares.pinning import pinned_env
from tunekit.shares.share import Share


def _add_one_module(n=1024):
    a = te.placeholder((n,), name="A")
    b = te.compute((n,), lambda i: a[i] + 1, name="B")
    return tvm.IRModule({"main": te.create_prim_func([a, b])})


def test_build_pool_workers_persist_across_batches(tmp_path):
    pool = BuildPool(workers=1, timeout_s=60, artifact_dir=str(tmp_path))
    try:
        target = tvm.target.Target({"kind": "llvm"})
        pids = []
        for _ in range(2):
            results = pool.build([BuilderInput(_add_one_module(), target)] * 2)
            assert [r.error_msg for r in results] == [None, None]
            assert all(str(r.artifact_path).endswith(".so") and os.path.getsize(r.artifact_path) for r in results)
            assert all(t.ok and t.build_s > 0 for t in pool.last_timings)
            pids.append(pool._pool.submit(os.getpid).result())
        assert pids[0] == pids[1]  # the same worker process served both batches
        # a broken candidate fails alone; the pool goes on
        results = pool.build([BuilderInput(tvm.IRModule({}), target), BuilderInput(_add_one_module(), target)])
        assert results[1].error_msg is None
    finally:
        pool.shutdown()


def test_session_runner_reuses_a_session_and_survives_a_server_kill(tmp_path):
    pool = BuildPool(workers=1, timeout_s=60, artifact_dir=str(tmp_path))
    target = tvm.target.Target({"kind": "llvm"})
    mod = _add_one_module()
    args_info = ArgInfo.from_prim_func(mod["main"])

    def measure(runner, count):
        built = pool.build([BuilderInput(mod, target)] * count)
        futures = runner.run([RunnerInput(b.artifact_path, "cpu", args_info) for b in built])
        return [f.result() for f in futures]

    with RunnerFleet(key="t-session", pinned=pinned_env(Share("cpu", 50)), config=FleetConfig(servers=1)) as fleet:
        runner = SessionRunner(RunnerConfig(tracker_port=fleet.tracker_port, key=fleet.key, sessions=1,
                                            candidate_timeout_s=60))
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


def _record_lines(db_dir):
    with open(os.path.join(db_dir, "database_tuning_record.json")) as fh:
        return [json.loads(line) for line in fh if line.strip()]


def test_resume_continues_without_remeasuring_and_refuses_mismatches(example_model, tmp_path):
    out = tmp_path / "run"
    first = run_cli("tune", example_model, "--cpu-pct", "100", "--trials", "8", "--out", out, "--json")
    assert first.returncode == 0, first.stderr[-2000:]
    db = out / "records-cpu100"
    assert len(_record_lines(db)) == 8
    again = run_cli("tune", example_model, "--cpu-pct", "100", "--trials", "8", "--out", out)
    assert again.returncode != 0 and "--resume" in again.stderr and "Traceback" not in again.stderr
    assert len(_record_lines(db)) == 8  # refused before touching anything
    resumed = run_cli("tune", example_model, "--cpu-pct", "100", "--trials", "8", "--out", out, "--resume", "--json")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    lines = _record_lines(db)
    report = json.loads(resumed.stdout)["report"]
    assert len(lines) == 8 + report["trials"]["measured"] and report["trials"]["measured"] == 8
    # no candidate measured twice: every (workload, trace) pair is unique
    from tvm.s_tir.schedule import Trace  # noqa: F401  (registers the trace JSON reader)

    keys = [(w, json.dumps(rec[0], sort_keys=True)) for w, rec in lines]
    assert len(set(keys)) == len(keys)
    # a crash that cuts the last line: repaired on open (the cut bytes kept aside), not fatal
    records_file = db / "database_tuning_record.json"
    text = records_file.read_text()
    records_file.write_text(text[:-150])
    summary = run_cli("records", out, "--json")
    assert summary.returncode == 0, summary.stderr[-1000:]
    compiled = run_cli("compile", example_model, "--records", out, "--out", tmp_path / "m.so")
    assert compiled.returncode == 0, compiled.stderr[-1000:]
    assert len(_record_lines(db)) == 15 and any(p.name.startswith("database_tuning_record.json.damaged-")
                                                for p in db.iterdir())
    other = tmp_path / "other.onnx"
    from tunekit.models.examples import save_example

    save_example("tiny_cnn", str(other), seed=1)  # same graph, other weights: another model
    mismatch = run_cli("tune", other, "--cpu-pct", "100", "--trials", "8", "--out", out, "--resume")
    assert mismatch.returncode != 0 and "another model" in mismatch.stderr


def test_ctrl_c_stops_every_process_and_keeps_records(example_model, tmp_path):
    out = tmp_path / "int"
    proc = subprocess.Popen([sys.executable, "-m", "tunekit.cli", "tune", str(example_model), "--cpu-pct", "50",
                             "--trials", "200", "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    records = out / "records-cpu50" / "database_tuning_record.json"
    deadline = time.time() + 300
    while time.time() < deadline and not (records.exists() and records.stat().st_size > 0):
        assert proc.poll() is None, proc.stderr.read()[-2000:]
        time.sleep(0.5)
    children = psutil.Process(proc.pid).children(recursive=True)
    assert children, "the tracker and server should be running"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert "interrupted" in err and "Traceback" not in err
    time.sleep(1)
    alive = [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
    assert not alive, [c.cmdline() for c in alive]
    assert len([line for line in records.read_text().splitlines() if line.strip()]) >= 1


def test_untuned_gpu_baseline_leaves_the_workload_intact(example_model, tmp_path):
    """Regression (seen on the H100): DLight scheduled the task's module in place, so the database's
    workload changed and the tuned model silently got none of its records. Needs no GPU: it only
    schedules and applies for the CUDA target."""
    import tvm_ffi
    from tvm.s_tir import meta_schedule as ms
    from tvm.target import Target

    from tunekit import api
    from tunekit.clients.compiler import apply_records
    from tunekit.clients.search_loop import _untuned_module
    from tunekit.frontend.tasks import extract_tasks, prepare_for_tuning

    target = Target("nvidia/nvidia-h100")
    _, _, mod = api._load_model(example_model, {})
    prepared = prepare_for_tuning(mod, target)
    tasks = [t for t in extract_tasks(prepared, target) if "conv2d" in t.task_name][:1]
    (ctx,), _ = ms.relax_integration.extracted_tasks_to_tune_contexts(tasks, str(tmp_path), num_threads=1, seed=0)
    database = ms.database.MemoryDatabase()
    ctx.pre_tuning(max_trials=4, num_trials_per_iter=4, design_spaces=ctx.generate_design_space(),
                   database=database, cost_model=ms.cost_model.RandomModel())
    candidate = ctx.generate_measure_candidates()[0]
    workload = database.commit_workload(ctx.mod)
    database.commit_tuning_record(ms.database.TuningRecord(candidate.sch.trace, workload, [1e-5], target,
                                                           candidate.args_info))
    before = tvm_ffi.structural_hash(ctx.mod)
    baseline = _untuned_module(ctx, target)
    assert tvm_ffi.structural_hash(ctx.mod) == before
    assert next(iter(baseline.functions.values())).attrs.get("tirx.is_scheduled", False)
    applied = apply_records(prepared_mod=prepared, target=target, database=database)
    scheduled = [gv.name_hint for gv, f in applied.functions.items() if f.attrs and f.attrs.get("tirx.is_scheduled", False)]
    assert scheduled == [tasks[0].task_name]


def test_a_hung_candidate_fails_alone_and_its_server_is_replaced(tmp_path):
    from tvm.script import tirx as T

    @T.prim_func
    def hang(a: T.Buffer((1,), "float32")):
        while T.float32(1) > T.float32(0):
            a[0] = a[0] + T.float32(1)

    target = tvm.target.Target({"kind": "llvm"})
    pool = BuildPool(workers=1, timeout_s=60, artifact_dir=str(tmp_path))
    hang_mod = tvm.IRModule({"main": hang})
    ok_mod = _add_one_module()
    with RunnerFleet(key="t-hang", pinned=pinned_env(Share("cpu", 50)), config=FleetConfig(servers=1)) as fleet:
        runner = SessionRunner(RunnerConfig(tracker_port=fleet.tracker_port, key=fleet.key, sessions=1,
                                            candidate_timeout_s=5), on_hang=fleet.stop_server_on_port)
        try:
            built = pool.build([BuilderInput(hang_mod, target), BuilderInput(ok_mod, target)])
            assert [b.error_msg for b in built] == [None, None]
            futures = runner.run([RunnerInput(built[0].artifact_path, "cpu", ArgInfo.from_prim_func(hang)),
                                  RunnerInput(built[1].artifact_path, "cpu", ArgInfo.from_prim_func(ok_mod["main"]))])
            hung, after = [f.result() for f in futures]
            assert hung.error_msg is not None and "server was stopped" in hung.error_msg
            assert after.error_msg is None and min(after.run_secs) > 0  # the run goes on, on a new server
            assert runner.hangs == 1 and fleet.restarts == 1
        finally:
            runner.shutdown()
            pool.shutdown()


def test_pipelined_loop_searches_while_batches_build_and_keeps_the_budget(example_model, tmp_path):
    """overlap on: the next task is searched while earlier batches are built and measured (two
    batches in flight). The budget holds, no candidate is measured twice, every phase is timed."""
    config = tmp_path / "overlap.yaml"
    config.write_text("overlap: true\n")
    out = tmp_path / "run"
    tuned = run_cli("tune", example_model, "--cpu-pct", "100", "--trials", "12", "--trials-per-iter", "3",
                    "--config", config, "--out", out, "--json")
    assert tuned.returncode == 0, tuned.stderr[-2000:]
    report = json.loads(tuned.stdout)["report"]
    phases = report["phases"]
    assert phases["overlap"] is True
    assert report["trials"]["measured"] == 12
    lines = _record_lines(out / "records-cpu100")
    assert len(lines) == 12
    keys = [(w, json.dumps(rec[0], sort_keys=True)) for w, rec in lines]
    assert len(set(keys)) == len(keys)
    assert sum(task["trials"] for task in report["tasks"]) == 12
    assert all(phases["total_s"][k] > 0 for k in ("search_s", "build_s", "run_s"))
    # more than one task was tuned: the loop does not search a task whose batch is still in flight
    assert sum(1 for task in report["tasks"] if task["trials"]) >= 2


def _take_module(rows=4, cols=8, n=256):
    table = te.placeholder((rows, cols), name="table")
    index = te.placeholder((n,), dtype="int64", name="index")
    out = te.compute((n, cols), lambda i, j: table[index[i], j], name="out")
    return tvm.IRModule({"main": te.create_prim_func([table, index, out])})


def test_index_arguments_are_filled_in_range_so_a_take_kernel_measures(tmp_path):
    """An embedding lookup (take/gather) reads its table at the index argument's values: random
    int64 values read far outside the table and kill the server. The runner fills integer
    arguments with zeros, so such a candidate measures like any other."""
    pool = BuildPool(workers=1, timeout_s=60, artifact_dir=str(tmp_path))
    target = tvm.target.Target({"kind": "llvm"})
    mod = _take_module()
    with RunnerFleet(key="t-take", pinned=pinned_env(Share("cpu", 50)), config=FleetConfig(servers=1)) as fleet:
        runner = SessionRunner(RunnerConfig(tracker_port=fleet.tracker_port, key=fleet.key, sessions=1,
                                            candidate_timeout_s=60))
        try:
            built = pool.build([BuilderInput(mod, target)] * 2)
            futures = runner.run([RunnerInput(b.artifact_path, "cpu", ArgInfo.from_prim_func(mod["main"]))
                                  for b in built])
            results = [f.result() for f in futures]
            assert all(r.error_msg is None and min(r.run_secs) > 0 for r in results), [r.error_msg for r in results]
            assert runner.server_losses == 0 and runner.retried == 0 and fleet.restarts == 0
        finally:
            runner.shutdown()
            pool.shutdown()
