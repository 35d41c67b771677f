"""Unit tests of tunekit's pure parts (no processes): the trial pool, task picking, the several-shares
comparison, count and outcome folding, the JSON-lines readers, the engine and server-launcher
factories, and which records are worth applying (real TVM records in a MemoryDatabase)."""
import json

import pytest

from tunekit.clients.scheduler import TaskScheduler, TaskState
from tunekit.coordinator.budget import TrialPool
from tunekit.errors import TunekitError


# ---------------------------------------------------------------- the trial pool
def test_pool_never_grants_more_than_it_holds():
    pool = TrialPool(5)
    assert pool.take(3) == 3 and pool.available == 2
    assert pool.take(10) == 2 and pool.available == 0  # only what is left
    assert pool.take(4) == 0 and pool.available == 0
    assert pool.take(-2) == 0 and pool.available == 0  # a negative wish takes nothing (and gives nothing)
    assert pool.reassigned == 5 and pool.released == 0


def test_the_pools_last_trials_are_split_over_its_takers():
    """With less than a batch per client left, each draw gets a part of it, so no client measures a last whole
    batch while the others are done; never under a quarter of a batch; whole batches while there is plenty."""
    pool = TrialPool(200, takers=8)
    assert pool.take(16) == 16  # 184 left: more than 8 batches' worth
    pool = TrialPool(40, takers=8)
    # ceil(left / 8), at least 4 (a quarter of 16), and the last 2 as they are
    assert [pool.take(16) for _ in range(10)] == [5, 5, 4, 4, 4, 4, 4, 4, 4, 2] and pool.available == 0
    assert TrialPool(40, takers=1).take(16) == 16  # one client: nothing to share
    pool = TrialPool(3, takers=8)
    assert pool.take(16) == 3 and pool.available == 0  # never more than it holds
    assert TrialPool(10, takers=4).take(2) == 2  # a part is at least a quarter of the batch asked for, at least 1


def test_in_the_pools_last_trials_a_client_with_a_long_pipeline_measures_it_before_drawing_more():
    """The pool ran dry while one client still had batches in flight and the others were done (2 x H100, 4
    clients: the last done 6.4 s after the first). In the last trials, a client whose pipeline holds its
    part of all that is left draws nothing until it measured; the others draw; the budget stays exact."""
    pool = TrialPool(40, takers=4)
    # a: 48 trials in flight; (40 + 48) / 4 = 22 each: a has more than its part
    assert pool.take(16, key="a", ahead=48) == 0 and pool.available == 40 and pool.status()["deferred"] == 1
    assert pool.take(16, key="b", ahead=0) == 10  # ceil(40 / 4): the usual part, b had nothing ahead
    assert pool.take(16, key="c", ahead=4) == 8  # ceil(30 / 4)
    assert set(pool.last_grants()) == {"b", "c"}  # when each client last drew (a deferred draw is none)
    assert pool.take(16, key="a", ahead=48) == 0  # ceil((22 + 48 + 10 + 12) / 4) = 23: still deferred
    pool.report(32, key="a")  # a measured two of its batches: 16 ahead, the pool hears it ...
    assert pool.take(16, key="a", ahead=16) == 0  # ... still not under ceil((22 + 16 + 10 + 12) / 4) = 15
    pool.report(16, key="a")
    assert pool.take(16, key="a", ahead=0) == 6  # nothing ahead: its part, ceil(22 / 4)
    pool.report(10, key="b")  # b measured its part and has nothing ahead: it draws again
    assert pool.take(16, key="b", ahead=0) == 4
    assert [pool.take(16, key=k, ahead=0) for k in "dbcd"] == [4, 4, 4, 0] and pool.available == 0
    assert pool.reassigned == 40 and pool.status()["deferred"] == 3
    # plenty left, or a client without a key (one process): whole batches, whatever is ahead
    assert TrialPool(200, takers=4).take(16, key="a", ahead=64) == 16
    assert TrialPool(40, takers=4).take(16, ahead=64) == 10
    # a client with nothing ahead always gets a part while the pool holds any: the run cannot stall
    pool = TrialPool(5, takers=4)
    pool.take(1, key="x", ahead=1000)
    assert pool.take(16, key="y", ahead=0) == 4


def test_pool_release_and_status():
    pool = TrialPool()
    assert pool.take(1) == 0
    pool.release(4)
    pool.release(-3)  # nothing to give back: ignored, never a negative pool
    assert pool.available == 4 and pool.released == 4
    assert pool.take(3) == 3
    pool.report(2, task="conv", best_us=12.5)
    pool.report(1)
    assert pool.status() == {"available": 1, "released": 4, "reassigned": 3, "returned": 0, "measured": 3,
                             "deferred": 0}
    assert pool.best == {"conv": 12.5}


def test_a_restarted_client_gives_back_what_its_predecessor_drew_and_never_measured():
    """A client that drew 8 pool trials died after measuring 3 of them (beyond its task's budget of 4,
    which the shard's records show as 7 measured): the 5 that died with it go back, once."""
    pool = TrialPool(20, takers=1)
    task = _task(0, 1, 10.0, cap=4, measured=4)
    first = TaskScheduler([task], pool=pool, trials_per_iter=4, pool_key="0")
    assert first.next_task(set()) is task and task.cap == 8
    task.measured = 8
    assert first.next_task(set()) is task and task.cap == 12 and pool.available == 12  # 2 draws of 4
    # the restart: budgets as planned, `measured` from the shard's records
    again = TaskScheduler([_task(0, 1, 10.0, cap=4, measured=7)], pool=pool, trials_per_iter=4, pool_key="0")
    assert again.settle_restart() == 5 and pool.available == 17 and pool.status()["returned"] == 5
    assert again.settle_restart() == 0 and pool.available == 17  # a second restart returns nothing more
    # another shard's draws are its own
    other = TaskScheduler([_task(0, 1, 10.0, cap=4, measured=4)], pool=pool, trials_per_iter=4, pool_key="1")
    other.next_task(set())
    assert pool.settle("1", 4) == 0 and pool.available == 13


# ---------------------------------------------------------------- task picking
def _task(index, weight, untuned_us, *, cap=100, measured=0, **kw):
    return TaskState(index=index, name=f"t{index}", weight=weight, untuned_us=untuned_us, cap=cap, budget=cap,
                     measured=measured, **kw)


@pytest.mark.parametrize("policy", ["gradient", "score"])
def test_scheduler_picks_the_heaviest_weight_times_latency(policy):
    # no task has had a batch yet (the gradient policy's warm-up): weight x latency decides
    tasks = [_task(0, 1, 100.0), _task(1, 3, 50.0), _task(2, 10, 5.0)]  # 100, 150, 50
    scheduler = TaskScheduler(tasks, trials_per_iter=4, policy=policy)
    assert scheduler.next_task(set()).index == 1
    assert scheduler.next_task({1}).index == 0  # a task with a batch in flight is skipped
    assert scheduler.next_task({0, 1}).index == 2
    assert scheduler.next_task({0, 1, 2}) is None
    tasks[1].exhausted = True
    assert scheduler.next_task(set()).index == 0  # an exhausted task is never picked
    tasks[0].best_us = 1.0  # the best record counts when faster than the untuned kernel: score 1
    assert scheduler.next_task(set()).index == 2


def test_scheduler_favours_a_task_never_measured_and_fades_stale_ones():
    fresh = TaskState(index=0, name="fresh", weight=1, cap=10)  # no latency known yet: first
    known = _task(1, 100, 100.0, cap=10)
    assert TaskScheduler([known, fresh], trials_per_iter=4).next_task(set()) is fresh
    # the "score" policy: weight x latency, halved for every batch that did not improve
    a, b = _task(0, 1, 100.0, batches=1), _task(1, 1, 60.0, batches=1)
    scheduler = TaskScheduler([a, b], trials_per_iter=4, policy="score")
    assert scheduler.next_task(set()) is a
    a.stale_batches = 1  # 100 x 0.5 = 50 < 60
    assert scheduler.next_task(set()) is b


def test_scheduler_gives_every_task_a_first_batch_before_any_gets_a_second():
    heavy, light = _task(0, 10, 100.0), _task(1, 1, 10.0)
    scheduler = TaskScheduler([heavy, light], trials_per_iter=4)
    assert scheduler.next_task(set()) is heavy
    heavy.batches = 1
    assert scheduler.next_task(set()) is light  # not the heavy one again, however heavy
    with pytest.raises(ValueError, match="policy"):
        TaskScheduler([heavy], trials_per_iter=4, policy="round-robin")


def test_scheduler_without_a_pool_stops_when_every_cap_is_spent():
    tasks = [_task(0, 1, 10.0, cap=4, measured=4), _task(1, 1, 10.0, cap=4, measured=3)]
    scheduler = TaskScheduler(tasks, trials_per_iter=4)
    assert scheduler.next_task(set()).index == 1
    tasks[1].measured = 4
    assert scheduler.next_task(set()) is None


def test_a_task_that_spent_its_cap_takes_from_the_pool_only_while_it_improves():
    improving = _task(0, 1, 100.0, cap=8, measured=8)                      # score 100, still improving
    stale = _task(1, 10, 100.0, cap=8, measured=8, stale_batches=1)         # score 500, stopped improving
    pool = TrialPool(10)
    scheduler = TaskScheduler([improving, stale], pool=pool, trials_per_iter=4)
    assert scheduler.next_task(set()) is improving
    assert (improving.cap, improving.extra, improving.budget) == (12, 4, 8)
    assert pool.available == 6 and pool.reassigned == 4
    assert stale.cap == 8 and stale.extra == 0
    # improving_only=False: the best by score asks, stale or not
    anyone = TaskScheduler([improving, stale], pool=pool, trials_per_iter=4, improving_only=False)
    improving.measured = 12
    assert anyone.next_task(set()) is stale and (stale.cap, stale.extra) == (12, 4) and pool.available == 2
    # the pool has less than a batch: the task gets what is left
    improving.stale_batches = 0
    stale.measured = 12
    assert scheduler.next_task(set()) is improving and improving.cap == 14 and pool.available == 0
    # an empty pool: nobody gets more, nothing changes
    improving.measured = 14
    assert scheduler.next_task(set()) is None and improving.cap == 14 and improving.extra == 6


def test_the_pool_is_asked_only_when_no_task_has_trials_left():
    spent = _task(0, 100, 100.0, cap=8, measured=8)
    open_ = _task(1, 1, 1.0, cap=8, measured=2)
    pool = TrialPool(10)
    scheduler = TaskScheduler([spent, open_], pool=pool, trials_per_iter=4)
    assert scheduler.next_task(set()) is open_ and pool.available == 10
    # a task with a batch in flight does not ask, nor an exhausted one, nor (improving_only) a stale one
    open_.measured = 8
    assert scheduler.next_task({0, 1}) is None and pool.available == 10
    open_.stale_batches = 2
    assert scheduler.next_task({0}) is None and pool.available == 10
    spent.exhausted = True
    assert scheduler.next_task(set()) is None and pool.available == 10
    assert open_.cap == 8 and spent.cap == 8 and open_.extra == spent.extra == 0


def test_release_unused_and_exhaust_give_back_cap_minus_measured():
    pool = TrialPool(0)
    task = _task(0, 1, 10.0, cap=10, measured=3)
    scheduler = TaskScheduler([task], pool=pool, trials_per_iter=4)
    scheduler.release_unused(task)
    assert pool.available == 7 and pool.released == 7 and task.cap == 3
    scheduler.release_unused(task)  # nothing left to give
    assert pool.available == 7 and pool.released == 7
    other = _task(1, 1, 10.0, cap=6, measured=1)
    scheduler.tasks.append(other)
    scheduler.exhaust(other)
    assert other.exhausted and other.cap == 1 and pool.available == 12 and pool.released == 12
    assert scheduler.next_task(set()) is not other
    # without a pool the cap stays (one global budget: nothing to give it to)
    alone = _task(2, 1, 10.0, cap=6, measured=1)
    TaskScheduler([alone], trials_per_iter=4).exhaust(alone)
    assert alone.exhausted and alone.cap == 6


def test_task_state_counts_stale_batches():
    task = _task(0, 1, None)
    task.record(80.0)
    task.record(None)
    assert (task.measured, task.failed, task.best_us) == (2, 1, 80.0)
    task.after_batch(None, fresh=2, cached=0)
    assert task.stale_batches == 0  # the first latency known: an improvement
    task.record(79.5)
    task.after_batch(80.0, fresh=1, cached=0)
    assert task.stale_batches == 1  # better by less than 1%: stale
    task.after_batch(79.5, fresh=1, cached=0)
    assert task.stale_batches == 2  # no better at all
    task.record(70.0)
    task.after_batch(79.5, fresh=1, cached=0)
    assert task.stale_batches == 0  # better by more than 1%: improving again
    task.after_batch(70.0, fresh=0, cached=3)
    assert task.stale_batches == 2 and task.cached == 3  # only known candidates proposed: converging
    slow_record = _task(1, 1, 50.0)
    slow_record.record(60.0)  # slower than the untuned kernel: what the model runs stays 50
    slow_record.after_batch(50.0, fresh=1, cached=0)
    assert slow_record.effective_us == 50.0 and slow_record.stale_batches == 1


# ---------------------------------------------------------------- several shares
def _result(share, untuned_ms, tuned_ms, tasks, trials=8):
    from tunekit.results import TuneResult

    report = {"model": "m.onnx", "tasks": tasks, "tuning_wall_s": 3.5, "environment": {"share": share}}
    return TuneResult(share=share, out_dir="o", records_dir=f"o/records-{share}", artifact=f"o/m-{share}.so",
                      report_path=f"o/report-{share}.json", untuned_ms=untuned_ms, tuned_ms=tuned_ms, trials=trials,
                      wall_s=1.0, report=report)


def test_compare_shares_counts_tasks_whose_best_differs():
    from tunekit.reports.shares import compare_shares

    a = _result("cpu50", 2.0, 1.0, [{"name": "conv", "workload_hash": "h1", "tuned_us": 10.0},
                                     {"name": "dense", "workload_hash": "h2", "tuned_us": 5.0},
                                     {"name": "pool", "workload_hash": "h3", "tuned_us": None},
                                     {"name": "relu", "tuned_us": 1.0},
                                     {"name": "add", "workload_hash": "h4", "tuned_us": 4.0, "best_trace": "t1"},
                                     {"name": "mul", "workload_hash": "h5", "tuned_us": 3.0, "best_trace": "t2"}])
    b = _result("cpu100", 1.5, 0.5, [{"name": "conv", "workload_hash": "h1", "tuned_us": 7.0},
                                      {"name": "dense", "workload_hash": "h2", "tuned_us": 5.0},
                                      {"name": "pool", "workload_hash": "h3", "tuned_us": 3.0},
                                      {"name": "relu", "tuned_us": 2.0},
                                      {"name": "add", "workload_hash": "h4", "tuned_us": 6.0, "best_trace": "t1"},
                                      {"name": "mul", "workload_hash": "h5", "tuned_us": 3.0, "best_trace": "t3"}])
    report = compare_shares([a, b])
    # conv (10 vs 7) and relu (keyed by name: 1 vs 2) differ; dense is equal; pool is tuned at one share only;
    # with trace keys (measure every share) the schedule decides: add is one schedule timed at two shares,
    # mul two schedules that happen to time alike
    assert report["tasks_whose_best_differs"] == 3
    by_name = {t["name"]: t for t in report["tasks_best_us"]}
    assert by_name["conv"] == {"name": "conv", "cpu50": 10.0, "cpu100": 7.0}
    assert [r["share"] for r in report["shares"]] == ["cpu50", "cpu100"]  # in the order given
    assert report["shares"][1]["speedup"] == 3.0 and report["shares"][0]["records_dir"] == "o/records-cpu50"
    table = report["table_md"].splitlines()
    assert table[0].startswith("| share |") and len(table) == 4
    assert table[2] == "| cpu50 | 2.0 | 1.0 | 2.0 | 8 | 3.5 |"
    assert table[3] == "| cpu100 | 1.5 | 0.5 | 3.0 | 8 | 3.5 |"
    assert list(report["per_share"]) == ["cpu50", "cpu100"] and report["model"] == "m.onnx"
    reversed_report = compare_shares([b, a])
    assert [line.split("|")[1].strip() for line in reversed_report["table_md"].splitlines()[2:]] == ["cpu100", "cpu50"]
    same = compare_shares([a, _result("cpu100", 1.5, 0.5, a.report["tasks"])])
    assert same["tasks_whose_best_differs"] == 0


# ---------------------------------------------------------------- counts and outcomes
def test_sum_counts():
    from tunekit.counts import sum_counts

    total = sum_counts([{"a": 1}, {"a": 2, "b": 1}, {}, {"c": 0, "b": 4}])
    assert total == {"a": 3, "b": 5, "c": 0} and list(total) == ["a", "b", "c"]
    assert sum_counts([]) == {}
    assert sum_counts(iter([{"x": 2}])) == {"x": 2}  # any iterable, read once


def test_fold_extra_adds_a_leftover_round_to_the_shard():
    from tunekit.coordinator.outcomes import fold_extra

    outcome = {"tasks": [{"name": "conv", "trials": 4, "failed": 1, "extra": 0, "tuned_us": 10.0, "untuned_us": 40.0},
                         {"name": "dense", "trials": 4, "failed": 0, "tuned_us": 3.0, "untuned_us": 6.0}],
               "trials_done": 8, "trials_failed": 1, "trials_cached": 0}
    extra = {"tasks": [{"name": "conv", "trials": 2, "failed": 1, "extra": 2, "tuned_us": 8.0, "exhausted": True},
                       {"name": "dense", "trials": 1, "failed": 0, "tuned_us": 4.0},
                       {"name": "unknown", "trials": 5, "failed": 5, "tuned_us": 1.0}],
             "trials_done": 3, "trials_failed": 1, "trials_cached": 2}
    fold_extra(outcome, extra)
    conv, dense = outcome["tasks"]
    assert (conv["trials"], conv["failed"], conv["extra"], conv["exhausted"]) == (6, 2, 2, True)
    assert conv["tuned_us"] == 8.0 and conv["speedup"] == 5.0  # a better best replaces the old one
    assert dense["trials"] == 5 and dense["tuned_us"] == 3.0 and "speedup" not in dense  # a worse one does not
    assert dense["exhausted"] is False and dense["extra"] == 0
    assert len(outcome["tasks"]) == 2  # a task of another shard is not added
    assert (outcome["trials_done"], outcome["trials_failed"], outcome["trials_cached"]) == (11, 2, 2)


def test_sum_phases_adds_clients_and_measures_overhead_over_client_seconds():
    from tunekit.coordinator.outcomes import sum_phases

    phases = sum_phases([{"total_s": {"search_s": 3.0, "build_s": 2.0, "run_s": 1.0}},
                         {"total_s": {"build_s": 1.0, "run_s": 1.0}}, {}], wall_s=5.0, trials=10)
    assert phases["total_s"] == {"search_s": 3.0, "build_s": 3.0, "run_s": 2.0}
    assert phases["per_trial_s"] == {"search_s": 0.3, "build_s": 0.3, "run_s": 0.2}
    assert phases["clients"] == 3 and phases["wall_s"] == 5.0
    assert phases["overhead_fraction"] == pytest.approx(1 - 5.0 / 15.0, abs=1e-3)  # 3 clients x 5 s
    assert sum_phases([], wall_s=0.0, trials=0)["overhead_fraction"] is None
    busy = sum_phases([{"total_s": {"build_s": 9.0, "run_s": 9.0}}], wall_s=4.0, trials=1)
    assert busy["overhead_fraction"] == 0.0  # work capped at the client-seconds


# ---------------------------------------------------------------- the JSON-lines format
def _record(name, secs):
    return [[[["Trace", [], [name], []]], []], [secs], {"kind": "llvm"}, []]


def _write_db(path, workloads, records):
    from tunekit.records.jsonl import RECORDS, WORKLOADS

    path.mkdir(parents=True, exist_ok=True)
    (path / WORKLOADS).write_text("".join(line + "\n" for line in workloads))
    (path / RECORDS).write_text("".join(line + "\n" for line in records))


def test_jsonl_readers_skip_garbage_and_a_torn_last_line(tmp_path):
    from tunekit.records import jsonl
    from tunekit.testing import distinct, record_keys, record_lines

    db = tmp_path / "db"
    good = [json.dumps([0, _record("x", 1e-5)]), json.dumps([1, _record("y", 2e-5)]),
            json.dumps([0, _record("z", 3e-5)])]
    _write_db(db, [json.dumps(["h0", "mod0"]), json.dumps(["h1", "mod1"])],
              [good[0], "this is not json", good[1], "", json.dumps([0, "not a record"]),
               json.dumps(["0", _record("q", 1.0)]), good[2]])
    with open(db / jsonl.RECORDS, "a") as fh:
        fh.write(good[2][:25])  # the last line, cut off by a crash
    skipped = []
    lines = list(jsonl.read_records(str(db), skipped=skipped))
    assert [line.text for line in lines] == good
    assert [line.workload for line in lines] == [0, 1, 0]
    assert lines[1].run_secs == [2e-5] and lines[1].trace == _record("y", 2e-5)[0]
    assert lines[0].trace_text() == json.dumps(_record("x", 1)[0], sort_keys=True)
    assert len(skipped) == 4 and skipped[0] == "this is not json" and skipped[-1] == good[2][:25]
    assert jsonl.count_records(str(db)) == 3
    keys = jsonl.record_keys(str(db))
    assert [w for w, _ in keys] == ["h0", "h1", "h0"] and len(set(keys)) == 3
    # tunekit.testing reads through the same module
    assert record_lines(db) == good and record_keys(db) == keys and distinct(keys + keys[:1]) == set(keys)


def test_jsonl_workload_lines_keep_their_index_when_one_is_torn(tmp_path):
    from tunekit.records import jsonl

    db = tmp_path / "db"
    _write_db(db, [json.dumps(["h0", "m"]), '["h1", "cut', json.dumps(["h2", "m"])],
              [json.dumps([2, _record("a", 1e-5)]), json.dumps([1, _record("b", 1e-5)]),
               json.dumps([7, _record("c", 1e-5)])])
    assert jsonl.read_workloads(str(db)) == [["h0", "m"], None, ["h2", "m"]]
    assert [w for w, _ in jsonl.record_keys(str(db))] == ["h2", None, None]  # torn workload, index out of range
    empty = tmp_path / "nothing"
    assert jsonl.read_workloads(str(empty)) == [] and list(jsonl.read_records(str(empty))) == []
    assert jsonl.count_records(str(empty)) == 0 and jsonl.record_keys(str(empty)) == []


def test_shard_dirs_finds_every_client_database(tmp_path):
    from tunekit.testing import shard_dirs

    for client in ("client-0", "client-1"):
        _write_db(tmp_path / "work" / "shards" / "cpu50" / "run-1" / client, [], [])
    (tmp_path / "work" / "shards" / "cpu50" / "run-1" / "client-2").mkdir()  # never wrote a record
    _write_db(tmp_path / "work" / "shards" / "cpu100" / "run-1" / "client-0", [], [])
    found = shard_dirs(tmp_path, "cpu50")
    assert [p.split("/")[-1] for p in found] == ["client-0", "client-1"]
    assert shard_dirs(tmp_path, "gpu40") == []


# ---------------------------------------------------------------- factories
def test_engine_create_takes_names_and_objects():
    from tunekit.clients.engine import Engine
    from tunekit.clients.stock_engine import StockEngine
    from tunekit.clients.tunekit_engine import TunekitEngine

    assert isinstance(Engine.create("tunekit"), TunekitEngine) and Engine.create("tunekit").name == "tunekit"
    assert isinstance(Engine.create("stock"), StockEngine)
    mine = StockEngine()
    assert Engine.create(mine) is mine
    with pytest.raises(TunekitError, match="'turbo'"):
        Engine.create("turbo")


def test_a_cuda_search_keeps_four_batches_in_flight_by_default_and_a_config_overrides_it():
    """The pipeline depth measured on the H100 (benchmarks/results/h100-pipeline-depth) is the CUDA default;
    CPU overlap keeps 2; a YAML value wins on both."""
    from tunekit.config import TuneConfig

    assert TuneConfig().pipeline_depth_for("cuda") == 4 and TuneConfig().pipeline_depth_for("llvm") == 2
    assert TuneConfig(pipeline_depth=3).pipeline_depth_for("cuda") == 3
    assert TuneConfig(pipeline_depth=1).pipeline_depth_for("llvm") == 1
    with pytest.raises(TunekitError, match="pipeline_depth"):
        TuneConfig(pipeline_depth=0)


def test_server_launcher_create_takes_names_and_objects():
    from tunekit.servers.launcher import ServerLauncher, StockServerLauncher, WarmServerLauncher

    warm, stock = ServerLauncher.create("warm"), ServerLauncher.create("stock")
    assert isinstance(warm, WarmServerLauncher) and warm.checks_secret
    assert isinstance(stock, StockServerLauncher) and not stock.checks_secret
    assert ServerLauncher.create(stock) is stock
    with pytest.raises(TunekitError, match="'cold'"):
        ServerLauncher.create("cold")
    cmd = dict(tracker="127.0.0.1:1", key="k", host="127.0.0.1", port=5000)
    assert "tunekit.servers.warm_server" in warm.command(**cmd, gpu=False)
    assert warm.command(**cmd, gpu=True)[-1] == "--check-cuda" and "--check-cuda" not in warm.command(**cmd, gpu=False)
    assert "--no-fork" in stock.command(**cmd, gpu=True) and "--no-fork" not in stock.command(**cmd, gpu=False)


# ---------------------------------------------------------------- records worth applying
@pytest.fixture(scope="module")
def conv_records(example_model, tmp_path_factory):
    """A real conv task of the example model on llvm, two real TuningRecords (20 us, then 50 us) in a
    MemoryDatabase: no servers, nothing measured (the run times are written by hand)."""
    from tvm.s_tir import meta_schedule as ms
    from tvm.target import Target

    from tunekit.metaschedule_env import import_for_target, prepare_metaschedule_logging
    from tunekit.frontend.tasks import extract_tasks, prepare_for_tuning
    from tunekit.records.baselines import workload_key
    from tunekit.run.session import load_model

    import_for_target("llvm")  # as the engine does: not every backend's intrinsics (24 s on 2 cores)
    prepare_metaschedule_logging()
    target = Target({"kind": "llvm", "num-cores": 1})
    prepared = prepare_for_tuning(load_model(example_model).mod, target)
    tasks = [t for t in extract_tasks(prepared, target) if "conv2d" in t.task_name][:1]
    (ctx,), _ = ms.relax_integration.extracted_tasks_to_tune_contexts(
        tasks, str(tmp_path_factory.mktemp("units")), strategy="replay-trace", num_threads=1, seed=0)
    scratch = ms.database.MemoryDatabase()
    ctx.pre_tuning(max_trials=4, num_trials_per_iter=4, design_spaces=ctx.generate_design_space(),
                   database=scratch, cost_model=ms.cost_model.RandomModel())
    candidates = ctx.generate_measure_candidates()
    assert len(candidates) >= 2

    def database(*secs, into=None):
        """The candidates in turn with these run times, in a new MemoryDatabase (or `into`)."""
        db = ms.database.MemoryDatabase() if into is None else into
        workload = db.commit_workload(ctx.mod)
        for candidate, s in zip(candidates, secs):
            db.commit_tuning_record(ms.database.TuningRecord(candidate.sch.trace, workload, s if isinstance(s, list)
                                                             else [s], target, candidate.args_info))
        return db

    return database, workload_key(ctx.mod)


def test_useful_records_keeps_a_record_faster_than_the_untuned_kernel(conv_records):
    from tunekit.clients.compiler import useful_records

    database, key = conv_records
    kept, applied = useful_records(database(20e-6, 50e-6), {key: 30.0})
    assert applied == {key: True}
    (record,) = kept.get_all_tuning_records()  # only the best one, of the workload
    assert [float(s) for s in record.run_secs] == [20e-6]


def test_useful_records_drops_a_record_no_faster_than_the_untuned_kernel(conv_records):
    from tunekit.clients.compiler import useful_records
    from tunekit.records.database import mean_run_us

    database, key = conv_records
    kept, applied = useful_records(database(20e-6, 50e-6), {key: 15.0})
    assert applied == {key: False} and len(kept.get_all_tuning_records()) == 0
    kept, applied = useful_records(database(20e-6), {key: mean_run_us([20e-6])})  # a tie is not faster
    assert applied == {key: False} and len(kept.get_all_tuning_records()) == 0
    kept, applied = useful_records(database(1e10), {key: 1e9})  # only failed trials: nothing to apply
    assert not applied.get(key) and len(kept.get_all_tuning_records()) == 0


def test_best_records_are_what_the_json_database_ranks_first_without_parsing_every_trace(conv_records, tmp_path):
    """open_best_records reads the lines and parses one trace per workload: the record JSONDatabase's
    get_top_k(workload, 1) gives (lowest mean run time; failed trials never; on a tie the first in the
    file), with a torn last line skipped."""
    from tvm.s_tir import meta_schedule as ms

    from tunekit.records.database import open_best_records, open_database
    from tunekit.records.jsonl import RECORDS

    database, _ = conv_records

    def json_database(name):
        (tmp_path / name).mkdir()
        return tmp_path / name, ms.database.JSONDatabase(work_dir=str(tmp_path / name))

    def best_of(db_dir):
        full, best = open_database(db_dir), open_best_records(db_dir)
        (workload,) = {r.workload.mod for r in full.get_all_tuning_records()}
        expected, got = full.get_top_k(full.commit_workload(workload), 1), best.get_top_k(best.commit_workload(workload), 1)
        assert [str(r.trace) for r in got] == [str(r.trace) for r in expected]
        assert [[float(s) for s in r.run_secs] for r in got] == [[float(s) for s in r.run_secs] for r in expected]
        return got

    ranked, db = json_database("ranked")  # failed first, then a mean of 20 us over two runs, then 30 us
    database(1e10, [10e-6, 30e-6], 30e-6, into=db)
    (best,) = best_of(ranked)
    assert [float(s) for s in best.run_secs] == [10e-6, 30e-6]
    tie, db = json_database("tie")  # two candidates, equal means: the first one committed
    database(20e-6, 20e-6, into=db)
    with open(tie / RECORDS, "a") as fh:
        fh.write('[0, [["cut off')  # a crash mid-line
    best_of(tie)
    failed, db = json_database("failed")  # only failed trials: nothing to apply
    database(1e10, 1e10, into=db)
    assert best_of(failed) == [] and open_best_records(failed).get_all_tuning_records() == []


def test_robust_records_pick_the_candidate_with_the_smallest_worst_regret_from_the_record_lines(conv_records,
                                                                                               tmp_path):
    """run.robust reads every share's record lines (not their JSONDatabases): a candidate is the same trace in
    each share's file. Of two candidates, the one whose worst regret over both shares is smaller is chosen,
    though it is only one share's best, and its record parses into the chosen database."""
    from tvm.s_tir import meta_schedule as ms

    from tunekit.run.robust import robust_records

    database, key = conv_records
    dirs = {}
    for share, secs in (("gpu20", (20e-6, 25e-6)), ("gpu100", (90e-6, 60e-6))):
        (tmp_path / share).mkdir()
        database(*secs, into=ms.database.JSONDatabase(work_dir=str(tmp_path / share)))
        dirs[share] = str(tmp_path / share)
    chosen, rows, estimate = robust_records(dirs, {}, {key: 1})
    # the first candidate: regret 1.0 at 20%, 1.5 at 100%; the second: 1.25 and 1.0
    (row,) = rows
    assert row["workload_hash"] == key and row["chosen"] == "record" and row["candidates"] == 2
    assert row["us"] == {"gpu20": 25.0, "gpu100": 60.0} and row["worst_regret"] == 1.25
    (record,) = chosen.get_all_tuning_records()
    assert [float(s) for s in record.run_secs] == [25e-6]  # read from the first share's file
    second = ms.database.MemoryDatabase()
    database(1e10, 25e-6, into=second)  # the second candidate's trace, as the first share recorded it
    assert str(record.trace) == str(second.get_all_tuning_records()[1].trace)
    assert estimate["worst_regret"] == 1.25


def test_useful_records_keeps_the_best_when_there_is_no_baseline(conv_records):
    from tunekit.clients.compiler import useful_records

    database, key = conv_records
    kept, applied = useful_records(database(50e-6, 20e-6), {"0" * 16: 1.0})  # baselines of other workloads only
    assert applied == {key: True}
    assert [float(s) for s in kept.get_all_tuning_records()[0].run_secs] == [20e-6]
    original = database(50e-6)
    same, applied = useful_records(original, None)  # no baselines at all: the database as it is
    assert same is original and applied == {}
    assert useful_records(original, {})[0] is original


def test_builds_stay_off_the_core_a_gpu_shares_servers_launch_from():
    from tunekit.clients.measurement import Measurement, builder_cores
    from tunekit.shares.pinning import measurement_cores

    allowed = list(range(16))
    reserved = measurement_cores(allowed)
    assert reserved == [15]
    gpu = Measurement(fleets=[], device_kind="gpu", share_cores=reserved)
    assert builder_cores(gpu, overlap=True, allowed=allowed) == list(range(15))
    # measured with nothing building beside it (overlap off), the builds may take every core
    assert builder_cores(gpu, overlap=False, allowed=allowed) == allowed
    # on a small machine the builds need the core more: the servers are not pinned
    assert measurement_cores([0, 1]) is None
    assert builder_cores(Measurement(fleets=[], device_kind="gpu", share_cores=None), overlap=True,
                         allowed=[0, 1]) == [0, 1]


def test_an_untuned_build_is_reused_only_while_its_file_still_holds_it(tmp_path):
    """A GPU's shares share one untuned build. When another build (the fp32 fallback) is written to the
    file the first was kept at, the next share must build again, not copy the fp32 build as its fp16."""
    from tunekit.run.untuned_builds import UntunedBuilds

    builds, made = UntunedBuilds(), []

    def writer(path, text):
        def write():
            made.append(text)
            with open(path, "w") as fh:
                fh.write(text)
        return write

    first, second, third = (str(tmp_path / name) for name in ("untuned-gpu100.so", "untuned-gpu40.so", "x.so"))
    builds.build(first, writer(first, "fp16"), key="fp16 module")
    builds.build(second, writer(second, "fp16 again"), key="fp16 module")
    assert open(second).read() == "fp16" and made == ["fp16"]  # copied, not built again
    builds.build(first, writer(first, "fp32"), key="fp32 module")  # the fallback, over the same file
    builds.build(third, writer(third, "fp16 rebuilt"), key="fp16 module")
    assert open(third).read() == "fp16 rebuilt"
    builds.build(third, writer(third, "tuned"), key=None)  # a build with records, over the kept file
    fourth = str(tmp_path / "y.so")
    builds.build(fourth, writer(fourth, "fp16 built a third time"), key="fp16 module")
    assert open(fourth).read() == "fp16 built a third time"
    assert made == ["fp16", "fp32", "fp16 rebuilt", "tuned", "fp16 built a third time"]
