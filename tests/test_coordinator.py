"""The Ray coordinator on CPU shares: real Ray, real tuning clients, real servers, real merges."""
import collections
import json
import os
import threading
import time

import psutil
import pytest

from tunekit.coordinator import plan as planning
from tunekit.coordinator.merge import merge_shards
from tunekit.errors import TunekitError
from tunekit.records.jsonl import RECORDS, WORKLOADS, read_records, read_workloads
from tunekit.shares.share import Share
from tunekit.testing import QUICK_SEARCH, distinct, new_children, record_keys, record_lines, run_cli, shard_dirs


# ---------------------------------------------------------------- planning (no processes)
def test_allocate_trials_is_exact_and_favours_heavy_tasks():
    for total in (1, 3, 7, 16, 64, 1000):
        parts = planning.allocate_trials([1e9, 1e6, 1e3, 10.0], total)
        assert sum(parts) == total
        assert parts[0] >= parts[-1]
        if total >= 4:
            assert min(parts) >= 1  # every task gets a trial when there are enough
    assert planning.allocate_trials([], 10) == []


def test_reserve_goes_to_the_pool_only_with_several_clients_and_leaves_every_task_a_batch():
    # 768 ResNet-18 trials, 21 tasks, 4 clients: half in the pool at the start
    assert planning.reserve_trials(768, tasks=21, clients=4, trials_per_iter=16) == 384
    assert planning.reserve_trials(768, tasks=21, clients=1, trials_per_iter=16) == 0  # nobody to balance
    # what every task's first batch needs stays in the budgets
    assert planning.reserve_trials(16, tasks=5, clients=4, trials_per_iter=2) == 6
    assert planning.reserve_trials(40, tasks=21, clients=2, trials_per_iter=16) == 0
    assert planning.reserve_trials(0, tasks=3, clients=2, trials_per_iter=1) == 0


def test_shards_are_balanced_by_cost_not_by_count():
    plans = [planning.TaskPlan(i, f"t{i}", 1, flops, budget=1) for i, flops in enumerate([100.0, 1, 1, 1, 1, 1])]
    shards = planning.shard_tasks(plans, 2)
    heavy = next(s for s in shards if any(p.index == 0 for p in s))
    assert [p.index for p in heavy] == [0]  # the heavy task alone; the five light ones together
    assert sorted(p.index for s in shards for p in s) == list(range(6))
    assert all(p.client in (0, 1) for p in plans)


def test_share_groups_fit_the_device_and_refuse_overlap():
    groups = planning.group_shares([Share("gpu", 25), Share("gpu", 50), Share("gpu", 100)], servers=1,
                                   oversubscribe=False)
    assert sorted(sorted(s.pct for s in g) for g in groups) == [[25, 50], [100]]
    assert all(sum(s.pct for s in g) <= 100 for g in groups)
    with pytest.raises(TunekitError, match="at most 2 fit"):
        planning.group_shares([Share("gpu", 40)], servers=3, oversubscribe=False)
    assert len(planning.group_shares([Share("gpu", 40)], servers=3, oversubscribe=True)) == 1
    slots, overlapped = planning.cpu_slots([Share("cpu", 25), Share("cpu", 50)], servers=1, available=[0, 1, 2, 3])
    assert slots == {"cpu25": [[0]], "cpu50": [[1, 2]]} and not overlapped



def _node(node_id, cpus, alive=True, **resources):
    return {"NodeID": node_id, "Alive": alive, "Resources": {"CPU": cpus, **resources}}


def test_client_placement_follows_client_nodes_and_cpu_fleets_skip_client_nodes():
    gpu, small, big = _node("gpu", 16, GPU=2), _node("small", 4, tunekit_client=1), _node("big", 32, tunekit_client=1)
    nodes = [gpu, small, big, _node("dead", 64, alive=False, tunekit_client=1)]
    ids = lambda found: [n["NodeID"] for n in found]  # noqa: E731
    assert ids(planning.client_nodes(nodes, "any")) == ["gpu", "small", "big"]
    assert ids(planning.client_nodes(nodes, "cpu-only")) == ["small", "big"]
    assert ids(planning.client_nodes(nodes, "tunekit_client")) == ["small", "big"]
    assert ids(planning.client_nodes(nodes, "other")) == []
    # A CPU share measures on every node but the client nodes (their cores are for building).
    assert ids(planning.cpu_fleet_nodes(nodes, "tunekit_client")) == ["gpu"]
    assert ids(planning.cpu_fleet_nodes(nodes, "cpu-only")) == ["gpu", "small", "big"]
    # Fewest clients per CPU first: the 32-core node takes most; one already busy counts.
    placed = planning.place_clients([small, big], 9)
    assert placed.count("big") == 8 and placed.count("small") == 1
    assert planning.place_clients([small, big], 1, busy={"big": 8}) == ["small"]
    # Build workers come from the node the client landed on, not the coordinator's machine.
    assert planning.build_workers_for(32, 32.0, 4) == 8
    assert planning.build_workers_for(2, 1.0, 2) == 1  # Ray's CPUs of the node cap the cores
    assert planning.build_workers_for(8, 0.0, 3) == 2   # a node that declares no CPUs: its cores


def test_client_nodes_setting_is_checked_before_any_work(monkeypatch):
    import ray

    from tunekit.config import CoordinatorConfig, TuneConfig
    from tunekit.coordinator.executor import RayExecutor

    for bad in ("", "a b", "GPU", 3):
        with pytest.raises(TunekitError, match="--client-nodes"):
            CoordinatorConfig(client_nodes=bad)
    nodes = [_node("gpu", 16, GPU=1), _node("cpu", 8, tunekit_client=1)]
    monkeypatch.setattr(ray, "nodes", lambda: nodes)
    check = lambda setting, kind: RayExecutor(  # noqa: E731
        TuneConfig(), CoordinatorConfig(client_nodes=setting), rpc_secret=None)._check_placement(kind)
    check("tunekit_client", "cpu")
    check("cpu-only", "gpu")
    with pytest.raises(TunekitError, match="no node of the Ray cluster advertises the resource nope"):
        check("nope", "cpu")
    nodes[:] = [_node("gpu", 16, GPU=1)]
    with pytest.raises(TunekitError, match="every node of the Ray cluster has GPUs"):
        check("cpu-only", "gpu")
    nodes[:] = [_node("cpu", 8, tunekit_client=1)]
    with pytest.raises(TunekitError, match="none is left for the CPU share's runner servers"):
        check("tunekit_client", "cpu")


# ---------------------------------------------------------------- merge
def _shard(path, workloads, records):
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, WORKLOADS), "w") as fh:
        fh.writelines(json.dumps(w) + "\n" for w in workloads)
    with open(os.path.join(path, RECORDS), "w") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in records)


def test_merge_reindexes_workloads_and_is_idempotent(tmp_path):
    rec = lambda name, secs: [[[["Trace", [], [name], []]], []], [secs], {"kind": "llvm"}, []]  # noqa: E731
    _shard(tmp_path / "a", [["h1", "modA"], ["h2", "modB"]], [[0, rec("x", 1.0)], [1, rec("y", 2.0)]])
    _shard(tmp_path / "b", [["h2", "modB"]], [[0, rec("z", 3.0)], [0, rec("y", 2.0)]])  # y: same trace again
    with open(tmp_path / "b" / RECORDS, "a") as fh:
        fh.write('[0, [[[["Trace"')  # a line cut off by a crash
    into = str(tmp_path / "merged")
    counts = merge_shards([str(tmp_path / "a"), str(tmp_path / "b")], into)
    assert counts["new_records"] == 3 and counts["new_workloads"] == 2 and counts["skipped_lines"] == 1
    workloads = [w[0] for w in read_workloads(into)]
    skipped = []
    records = list(read_records(into, skipped=skipped))
    assert workloads == ["h1", "h2"] and skipped == []
    assert sorted((workloads[r.workload], r.trace[0][0][2][0]) for r in records) == [("h1", "x"), ("h2", "y"),
                                                                                    ("h2", "z")]
    assert merge_shards([str(tmp_path / "a"), str(tmp_path / "b")], into)["new_records"] == 0


def test_merge_brings_each_shards_kernel_records_once(tmp_path):
    """A Ray client's Triton kernels, measured into its shard, reach the share's records (clients.kernel_trials)."""
    from tunekit.records import kernel_records
    from tunekit.records.kernel_records import KernelRecord

    for shard, configs in (("a", ["m16n64k64w4s4g8", "m32n64k32w2s5g8"]), ("b", ["m32n64k32w2s5g8"])):
        _shard(tmp_path / shard, [], [])
        for config in configs:
            kernel_records.append(str(tmp_path / shard), KernelRecord("h1", "triton", config, (1e-5,), True))
    into = str(tmp_path / "merged")
    assert merge_shards([str(tmp_path / "a"), str(tmp_path / "b")], into)["new_kernel_records"] == 2
    assert sorted(r.config for r in kernel_records.read(into)) == ["m16n64k64w4s4g8", "m32n64k32w2s5g8"]
    assert merge_shards([str(tmp_path / "a"), str(tmp_path / "b")], into)["new_kernel_records"] == 0


# ---------------------------------------------------------------- real runs
@pytest.fixture(scope="module")
def four_clients(example_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("coord") / "run"
    proc = run_cli("tune", example_model, "--cpu-pct", "50", "--clients", "4", "--trials", "16",
                   "--trials-per-iter", "2", "--out", out, "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)["report"], str(out)


def _expand(ranges: str) -> list[int]:
    """"0-3,8" -> [0, 1, 2, 3, 8]"""
    cores = []
    for part in ranges.split(","):
        first, _, last = part.partition("-")
        cores += list(range(int(first), int(last or first) + 1))
    return cores


def _records_per_workload(db_dir):
    """{workload hash: trials}, and the distinct (workload, trace) pairs."""
    keys = record_keys(db_dir)
    assert all(workload is not None for workload, _ in keys), "a record points at no workload"
    return dict(collections.Counter(workload for workload, _ in keys)), distinct(keys)


@pytest.mark.e2e
def test_four_clients_tune_every_task_within_its_budget(four_clients):
    report, out = four_clients
    coord = report["coordinator"]
    assert coord["clients"] == 4 and len(coord["shards"]) == 4
    # The total budget holds exactly, and each task stays within its own budget plus what it
    # took from the shared pool (what exhausted tasks gave back).
    assert report["trials"]["measured"] == 16
    assert sum(t["trials"] for t in report["tasks"]) == 16
    per, traces = _records_per_workload(report["records_dir"])
    per_task = {f"{int(h) & 0xFFFFFFFFFFFFFFFF:016x}": n for h, n in per.items()}  # as the report keys tasks
    for task in report["tasks"]:
        assert task["trials"] <= task["budget"] + task["extra"], task
        # Every task was measured, unless its space ran out or it is negligible. Asked of the merged
        # database: a client restarted mid-run reports only its own trials, not its predecessor's.
        assert per_task.get(task["workload_hash"], 0) >= 1 or task["exhausted"] or task["negligible"], task
    assert sum(t["extra"] for t in report["tasks"]) == coord["pool"]["reassigned"]
    # The pool started with a reserve (plan.reserve_trials: half of the 16 trials, less what leaves every task a
    # first batch of 2) and the clients drew all of it, with what tasks gave back: nothing was left at the end
    assert coord["pool"]["reserve"] == min(8, 16 - 2 * len(report["tasks"])) > 0, coord["pool"]
    assert coord["pool"]["reassigned"] == coord["pool"]["reserve"] + coord["pool"]["released"], coord["pool"]
    assert coord["pool"]["available"] == 0
    # When each client was done (how balanced the shards were): within the tuning wall, which the report rounds
    # to 0.01 s (done_s to 0.001: the last client's done_s can be up to 0.005 s past it)
    assert all(0 < shard["done_s"] <= report["tuning_wall_s"] + 0.005 for shard in coord["shards"]), coord["shards"]
    # each client may use every core of its node
    rows = [row for shard in coord["shards"] for row in shard["ran_on"]]
    assert rows and all(len(_expand(row["client_cores"])) == row["cores"] for row in rows), rows
    # and when each client's search began (before it was done)
    assert all(0 <= shard["search_started_s"] < shard["done_s"] for shard in coord["shards"]), coord["shards"]
    # and when each client last drew from the pool (the tail is what it did after): the clients that drew
    drew = {t["client"] for t in report["tasks"] if t["extra"]}
    assert drew and {s["client"] for s in coord["shards"] if s["last_draw_s"] is not None} == drew, coord["shards"]
    assert all(0 < s["last_draw_s"] <= s["done_s"] + 0.005 for s in coord["shards"] if s["client"] in drew)
    # and what a candidate's build cost inside each client's workers
    assert all(s["build_profile"]["candidates"] > 0 and s["build_profile"]["total_per_candidate_s"] > 0
               for s in coord["shards"]), [s["build_profile"] for s in coord["shards"]]
    # and how full each client kept its pipeline
    assert all(0 < s["pipeline"]["mean_in_flight"] <= s["pipeline"]["most_in_flight"] <= s["pipeline"]["depth"]
               for s in coord["shards"]), [s["pipeline"] for s in coord["shards"]]
    # The fleets and the clients (TVM imported, engine and build workers started) were started in the warm-up,
    # beside the untuned model, so the tuning wall starts with the first search
    assert all(shard["ready_before_tuning"] is True for shard in coord["shards"]), coord["shards"]
    warm = report["phases"]["warm_up"]
    assert warm["before_tuning"] is True and set(warm["steps"]) == {"fleets_s", "clients_s"}, warm
    assert min(warm["steps"].values()) > 0 and sum(warm["steps"].values()) <= warm["took_s"] + 0.01, warm
    # Every task was tuned by exactly one client, and the shards cover all tasks.
    names = [n for shard in coord["shards"] for n in shard["tasks"]]
    assert sorted(names) == sorted(t["name"] for t in report["tasks"])
    # The merged database holds every trial once.
    assert sum(per.values()) == 16 and len(traces) == 16


@pytest.mark.e2e
def test_the_time_budget_holds_for_the_whole_run_not_for_each_round_of_the_clients(example_model, tmp_path):
    """--time-budget with trials to spare: the pool still holds trials when the clients stop, and a leftover round
    given a fresh budget tuned a fleet on the H200 for 660 s of a 200 s budget. Past the budget, none is given."""
    budget = 12
    proc = run_cli("tune", example_model, "--cpu-pct", "50", "--clients", "2", "--trials", "100000",
                   "--trials-per-iter", "2", "--time-budget", str(budget), "--out", tmp_path / "run", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)["report"]
    # a leftover round with a fresh budget takes a second budget (>= 2x); a busy 2-core clone overshot 1.5x once
    assert report["trials"]["measured"] > 0 and report["tuning_wall_s"] < 2 * budget, report["tuning_wall_s"]
    coord = report["coordinator"]
    assert coord["pool"]["available"] > 0 and coord["leftover_shards"] == [], coord


@pytest.mark.e2e
def test_a_clients_task_sends_batches_ahead_within_its_own_budget(example_model, tmp_path):
    """Per-task budgets (a coordinator client) with batches sent from a task's reserve: 2 tasks to tune over 2 clients, each client's
    pipeline 3 deep, so a client's one task sends batches from its reserve while others are in flight. Its
    batches in flight count against its cap: every task stays within its budget and what it drew, the run's
    budget holds exactly, and no candidate is measured twice."""
    config = tmp_path / "ahead.yaml"
    config.write_text("overlap: true\nsearch: {pipeline_depth: 3, batches: 3}\nmin_task_share: 0.2\n")
    proc = run_cli("tune", example_model, "--cpu-pct", "50", "--clients", "2", "--trials", "16",
                   "--trials-per-iter", "2", "--config", config, "--out", tmp_path / "run", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)["report"]
    assert report["trials"]["measured"] == 16 and sum(t["trials"] for t in report["tasks"]) == 16
    assert all(t["trials"] <= t["budget"] + t["extra"] for t in report["tasks"]), report["tasks"]
    shards = report["coordinator"]["shards"]
    # each client tunes one task (the others are negligible), yet held more than one batch in flight
    assert sum(s["pipeline"]["sent_ahead"] for s in shards) > 0, [s["pipeline"] for s in shards]
    assert any(s["pipeline"]["most_in_flight"] > 1 for s in shards), [s["pipeline"] for s in shards]
    per, traces = _records_per_workload(report["records_dir"])
    assert sum(per.values()) == 16 and len(traces) == 16


@pytest.mark.e2e
def test_merged_records_compile_like_a_single_process_database(four_clients, example_model, tmp_path):
    import tvm_ffi
    from tvm.s_tir import meta_schedule as ms

    from tunekit.clients.compiler import apply_records
    from tunekit.frontend.tasks import prepare_for_tuning
    from tunekit.records.database import open_database
    from tunekit.run.session import load_model
    from tunekit.targets import target_for

    report, out = four_clients
    merged = open_database(report["records_dir"], create=False)
    # The same records committed through TVM's own API, one process, one database.
    single = open_database(str(tmp_path / "single"))
    shards = shard_dirs(out, "cpu50")
    assert shards
    for shard_dir in shards:
        shard = ms.database.JSONDatabase(work_dir=shard_dir, module_equality="structural")
        for record in shard.get_all_tuning_records():
            single.commit_tuning_record(ms.database.TuningRecord(
                record.trace, single.commit_workload(record.workload.mod), record.run_secs, record.target,
                record.args_info))
    assert len(single) == len(merged) == 16
    target = target_for(Share("cpu", 50))
    prepared = prepare_for_tuning(load_model(example_model).mod, target)
    a = apply_records(prepared_mod=prepared, target=target, database=merged)
    b = apply_records(prepared_mod=prepared, target=target, database=single)
    assert tvm_ffi.structural_equal(a, b)
    assert not tvm_ffi.structural_equal(a, prepared)  # records were applied at all
    assert os.path.getsize(report["artifact"]) > 0


@pytest.mark.e2e
def test_a_refused_untuned_model_stops_the_clients_the_warm_up_started(example_model, tmp_path):
    """The numerics gate refuses the untuned model while the coordinator's warm-up starts its fleets and
    clients: the run ends with the refusal, and nothing it started (Ray, clients, servers) is left behind."""
    import tunekit
    from tunekit.config import CoordinatorConfig

    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(tunekit.RunFailed, match="refused"):
        tunekit.tune(example_model, cpu_pct=50, out=str(tmp_path / "o"), coordinator=CoordinatorConfig(clients=2),
                     config=tunekit.TuneConfig(trials=2, max_output_error=1e-12))
    left = new_children(before, timeout=30)  # Ray's own processes take a moment to exit after its shutdown
    assert not left


@pytest.mark.e2e
def test_two_shares_in_one_run_get_two_databases_with_different_bests(example_model, tmp_path):
    out = tmp_path / "two"
    proc = run_cli("tune", example_model, "--cpu-pct", "50,100", "--clients", "2", "--trials", "12",
                   "--trials-per-iter", "3", "--out", out, "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)["report"]
    assert [r["share"] for r in report["shares"]] == ["cpu50", "cpu100"]
    dbs = {r["share"]: r["records_dir"] for r in report["shares"]}
    assert dbs["cpu50"] != dbs["cpu100"] and all(os.path.isdir(d) for d in dbs.values())
    for label, db in dbs.items():
        per, _ = _records_per_workload(db)
        assert sum(per.values()) == 12, label
        assert json.load(open(os.path.join(out, f"report-{label}.json")))["share"] == label
    # Best record per task, straight from each database: at least one task differs.
    from tunekit.records.database import open_database

    bests = {}
    for label, db in dbs.items():
        database = open_database(db, create=False)
        bests[label] = {}
        for record in database.get_all_tuning_records():
            top = database.get_top_k(record.workload, 1)
            if top:
                bests[label][str(tvm_hash(record.workload.mod))] = json.dumps(top[0].trace.as_json(remove_postproc=True), default=str)
    common = set(bests["cpu50"]) & set(bests["cpu100"])
    assert common and any(bests["cpu50"][k] != bests["cpu100"][k] for k in common)
    assert report["tasks_whose_best_differs"] >= 1


@pytest.mark.e2e
def test_fleets_off_loopback_listen_on_the_node_address_and_demand_the_secret(example_model, tmp_path):
    """On a cluster of several machines (or with --listen-host), fleets listen on their node's IP
    and every client must prove the shared secret; without one the run is refused up front."""
    import ray

    refused = run_cli("tune", example_model, "--cpu-pct", "50", "--clients", "2", "--trials", "4",
                      "--listen-host", "0.0.0.0", "--out", tmp_path / "refused")
    assert refused.returncode != 0 and "secret" in refused.stderr and "Traceback" not in refused.stderr
    assert not os.path.exists(tmp_path / "refused" / "records-cpu50")
    secret = "coordinator-test-secret-0123456789abcdef"
    (tmp_path / "secret").write_text(secret + "\n")
    os.chmod(tmp_path / "secret", 0o600)
    proc = run_cli("tune", example_model, "--cpu-pct", "50", "--clients", "2", "--trials", "6", "--trials-per-iter",
                   "3", "--listen-host", "0.0.0.0", "--rpc-secret-file", tmp_path / "secret",
                   "--out", tmp_path / "net", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)["report"]
    assert {f["host"] for f in report["coordinator"]["fleets"]} == {ray.util.get_node_ip_address()}
    assert report["trials"]["measured"] == 6 and report["trials"]["failed"] == 0
    assert secret not in proc.stdout + proc.stderr  # never logged
    # each client may use every core of its node
    rows = [row for shard in report["coordinator"]["shards"] for row in shard["ran_on"]]
    assert rows and all(len(_expand(row["client_cores"])) == row["cores"] for row in rows), rows


def tvm_hash(mod):
    import tvm_ffi

    return tvm_ffi.structural_hash(mod)


@pytest.mark.e2e
def test_the_pool_actor_hears_what_each_client_has_ahead():
    """What a client tells the pool travels through Ray: the trials it has ahead with its draw, and what it
    measured since (fire and forget, yet heard before its next draw, as Ray runs one caller's calls in order)."""
    import ray

    from tunekit.coordinator.budget import RemotePool, ray_pool_class

    ray.init(address="local", num_cpus=1, include_dashboard=False)  # a cluster of its own, never another test's
    try:
        pool = RemotePool(ray_pool_class().remote(40, takers=4))
        assert pool.take(16, key="a", ahead=48) == 0  # more ahead than its part: deferred
        pool.report(48, key="a")  # a measured all it had: only b's 20 are ahead now ...
        assert pool.take(16, key="b", ahead=20) == 0  # ... so b's 20 >= ceil((40 + 20) / 4) (before: 27)
        assert pool.take(16, key="a", ahead=0) == 10
        assert ray.get(pool.handle.status.remote())["deferred"] == 2
    finally:
        ray.shutdown()


@pytest.mark.e2e
def test_multi_node_cluster_spreads_servers_and_survives_a_killed_client(example_model, tmp_path):
    """Ray's own multi-node test cluster: servers go on every node, a tuning client killed with
    SIGKILL mid-run is started again on its shard, and no trial is lost or measured twice."""
    import ray
    from ray.cluster_utils import Cluster

    from tunekit import CoordinatorConfig, api
    from tunekit.config import TuneConfig

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    killed = []
    out = str(tmp_path / "cluster")

    def kill_a_client_once_it_has_records():
        deadline = time.time() + 600
        while time.time() < deadline and not killed:
            for shard in shard_dirs(out, "cpu50"):
                if record_lines(shard):
                    # Only this test's cluster: its raylets are our children, the actors theirs.
                    for proc in psutil.Process().children(recursive=True):
                        try:
                            if "TuningClientImpl" in " ".join(proc.cmdline()):
                                proc.kill()
                                killed.append(proc.pid)
                                return
                        except psutil.Error:
                            continue
            time.sleep(0.2)

    try:
        ray.init(address=cluster.address)
        killer = threading.Thread(target=kill_a_client_once_it_has_records, daemon=True)
        killer.start()
        result = api.tune(example_model, cpu_pct=50, out=out,
                          config=TuneConfig(trials=12, trials_per_iter=2, search=dict(QUICK_SEARCH)),
                          coordinator=CoordinatorConfig(clients=2, ray_address=cluster.address))
        killer.join(timeout=5)
    finally:
        ray.shutdown()
        cluster.shutdown()
    report = result.report
    assert report["environment"]["ray"]["nodes"] == 2
    nodes = {f["key"].split("-")[2] for f in report["coordinator"]["fleets"]}
    assert len(nodes) == 2  # a fleet on each node
    assert killed, "no client was killed: the test did not test anything"
    assert report["faults"]["client_restarts"] >= 1
    per, traces = _records_per_workload(report["records_dir"])
    assert sum(per.values()) == len(traces)  # nothing measured twice
    assert report["trials"]["measured"] == sum(per.values()) <= 12
    assert os.path.getsize(report["artifact"]) > 0


@pytest.mark.e2e
def test_clients_run_only_on_client_nodes_and_measure_on_the_fleet_nodes(example_model, tmp_path):
    """`--client-nodes tunekit_client` on a 2-node `ray.cluster_utils.Cluster`: the head (no client
    resource) hosts the CPU share's fleet; the other node advertises tunekit_client and hosts every
    tuning client and no fleet. Fleets listen on the node address with the secret, as on several
    machines. The budget is spent exactly and nothing is measured twice."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    client_node = cluster.add_node(num_cpus=2, resources={"tunekit_client": 1})
    cluster.wait_for_nodes()
    (tmp_path / "secret").write_text("client-nodes-test-secret-0123456789abcdef\n")
    os.chmod(tmp_path / "secret", 0o600)
    try:
        proc = run_cli("tune", example_model, "--cpu-pct", "50", "--clients", "2", "--trials", "8",
                       "--trials-per-iter", "2", "--ray-address", cluster.address, "--client-nodes", "tunekit_client",
                       "--listen-host", "0.0.0.0", "--rpc-secret-file", tmp_path / "secret",
                       "--out", tmp_path / "split", "--json")
        head_id, head_ip = cluster.head_node.node_id, cluster.head_node.node_ip_address
    finally:
        cluster.shutdown()
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)["report"]
    coord = report["coordinator"]
    assert report["environment"]["ray"]["nodes"] == 2 and coord["client_nodes"] == "tunekit_client"
    ran_on = [place for shard in coord["shards"] for place in shard["ran_on"]]
    assert len(coord["shards"]) == 2 and len(ran_on) == 2, coord["shards"]
    assert {p["node_id"] for p in ran_on} == {client_node.node_id}, ran_on
    # Sized from the client node (2 CPUs, 2 clients), not from the coordinator's machine.
    assert all(p["node_cpus"] == 2 and p["build_workers"] == 1 and p["cores"] >= 1 for p in ran_on), ran_on
    # The fleet stays on the head, on its node address (clients prove the secret to reach it).
    assert {f["key"].split("-")[2] for f in coord["fleets"]} == {head_id[:6]}
    assert {f["host"] for f in coord["fleets"]} == {head_ip}
    assert report["trials"]["measured"] == 8 and report["trials"]["failed"] == 0
    keys = record_keys(report["records_dir"])
    assert len(keys) == 8 and len(distinct(keys)) == 8  # exactly the budget, no candidate twice
