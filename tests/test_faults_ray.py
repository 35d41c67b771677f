"""Fault injection on the Ray coordinator (issue 6): real Ray, real processes, CPU share, tiny budgets.

- the whole coordinated `tunekit tune --clients 2` process is SIGKILLed once shards hold records;
  `--resume` merges every shard trial into records-cpu50, measures nothing twice, compiles, and
  the killed run leaves no process behind (raylet, gcs_server, workers, trackers, servers);
- a whole non-head node of `ray.cluster_utils.Cluster` is removed (no grace) mid-run: the run
  completes, every trial recorded before the kill is kept, no duplicates.
"""
import json
import os
import signal
import threading
import time

import psutil
import pytest

from tunekit.testing import QUICK_SEARCH, record_keys, shard_dirs, tune_process

pytestmark = pytest.mark.e2e


def _shard_trials(out):
    """(workload hash, trace) of every complete record line in the run's client shards."""
    return [k for shard in shard_dirs(out) for k in record_keys(shard)]


def _tune(model, out, *extra):
    return tune_process(model, out, "--clients", "2", "--trials", "10", "--trials-per-iter", "2", *extra)


def test_sigkill_of_the_coordinated_run_then_resume_keeps_every_shard_trial(example_model, tmp_path):
    out = str(tmp_path / "coord-kill")
    proc = _tune(example_model, out)
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None and len(_shard_trials(out)) < 2:
        time.sleep(0.2)
    assert proc.poll() is None, f"the run ended before the kill: {proc.communicate()[1][-2000:]}"
    assert len(_shard_trials(out)) >= 2, "no shard records within the deadline"
    tree = psutil.Process(proc.pid).children(recursive=True)
    names = sorted({p.name() for p in tree if p.is_running()})
    assert any("raylet" in n or "gcs_server" in n for n in names), names  # Ray was started by the run
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    before = set(_shard_trials(out))  # after the kill: nothing is written any more
    # No orphan: Ray's processes, the actors' workers, trackers and servers all go with the run.
    _, alive = psutil.wait_procs(tree, timeout=60)
    orphans = [f"{p.pid} {' '.join(p.cmdline())[:120]}" for p in alive if p.is_running()]
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    assert not orphans, orphans

    resumed = _tune(example_model, out, "--resume", "--json")
    stdout, stderr = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, stderr[-3000:]
    report = json.loads(stdout)["report"]
    after = record_keys(os.path.join(out, "records-cpu50"))
    assert before and before <= set(after), f"{len(before - set(after))} trials of the killed run lost"
    assert len(after) == len(set(after)), "a trace was measured twice"
    assert os.path.getsize(report["artifact"]) > 0
    assert report["trials"]["measured"] <= 10


def test_removing_a_whole_ray_node_mid_run_keeps_every_trial(example_model, tmp_path):
    """A 2-node `ray.cluster_utils.Cluster`; the non-head node (its raylet, its workers: a tuning
    client and/or a fleet of runner servers) is killed without grace once records exist."""
    import ray
    from ray.cluster_utils import Cluster

    from tunekit import CoordinatorConfig, api
    from tunekit.config import TuneConfig

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    worker = cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    out = str(tmp_path / "node-kill")
    killed, snapshot = [], []

    def remove_the_node_once_there_are_records():
        deadline = time.time() + 300
        while time.time() < deadline and not killed:
            if len(_shard_trials(out)) >= 2:
                snapshot.extend(_shard_trials(out))
                cluster.remove_node(worker, allow_graceful=False)
                killed.append(time.time())
                return
            time.sleep(0.2)

    try:
        ray.init(address=cluster.address)
        killer = threading.Thread(target=remove_the_node_once_there_are_records, daemon=True)
        killer.start()
        result = api.tune(example_model, cpu_pct=50, out=out,
                          config=TuneConfig(trials=10, trials_per_iter=2, servers_gone_timeout_s=20,
                                            search=dict(QUICK_SEARCH)),
                          coordinator=CoordinatorConfig(clients=2, ray_address=cluster.address))
        killer.join(timeout=5)
    finally:
        ray.shutdown()
        cluster.shutdown()
    assert killed, "the node was not removed: the test did not test anything"
    report = result.report
    assert len({f["key"] for f in report["coordinator"]["fleets"]}) == 2  # a fleet was on the lost node
    assert [f["lost"] for f in report["coordinator"]["fleets"]].count(True) == 1
    assert report["faults"]["fleets_lost"] == 1
    after = record_keys(report["records_dir"])
    assert set(snapshot) <= set(after), f"{len(set(snapshot) - set(after))} trials recorded before the kill lost"
    assert len(after) == len(set(after)), "a trace was measured twice"
    assert report["trials"]["measured"] <= 10
    assert os.path.getsize(report["artifact"]) > 0
    print("faults:", report["faults"], "fleets:", report["coordinator"]["fleets"])
