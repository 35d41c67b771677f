"""Fault injection on a small CPU tuning run: how many faults were survived, how many trials lost.

Kinds (everything that needs no Ray; real processes, real kills):
- server-sigkill:   SIGKILL the runner server N times during one `tunekit tune` run;
- hung-candidate:   N candidates that never return, between good ones (SessionRunner + fleet);
- crash-candidate:  N candidates that abort() their server, between good ones;
- tune-sigkill:     SIGKILL the whole `tunekit tune` process N times, `--resume` after each;
- servers-gone:     every server of the share killed as soon as it starts, N times: the run must
                    stop with a clear error, keep its records, and `--resume` must then finish.
Ray kinds (the coordinator: `--clients 2`, Ray started by the run or a `ray.cluster_utils.Cluster`):
- client-sigkill:      SIGKILL a TuningClientImpl actor process N times in one coordinated run;
- coordinator-sigkill: SIGKILL the whole coordinated `tunekit tune --clients 2` N times, `--resume`
                       after each (also counts processes that outlived the killed run);
- node-kill:           remove the non-head node of a 2-node Cluster (no grace) mid-run, N runs.
A fault is survived when the run (or the resumed run) completes with the fault accounted for;
trials lost = trials in the records at the moment of the fault that are missing afterwards,
plus good candidates that failed because of a neighbour's fault. Also measures what the
fsync after each committed trial costs.

    .venv/bin/python benchmarks/faults.py --n 2 --trials 16 --out /tmp/tunekit-faults
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import sys
import tempfile
import time

import psutil

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from tunekit.testing import (alive_after, children_running, distinct, record_keys, record_lines,  # noqa: E402
                             shard_dirs, tune_process, wait_for_records)

PY = sys.executable
WARM_SERVER = "tunekit.servers.warm_server"


def _lost(before: list[str], after: list[str]) -> int:
    present = set(after)
    return sum(1 for row in before if row not in present)


def _duplicates(db) -> int:
    """Trials of `db` whose (workload, trace) is already in it: measured twice."""
    keys = record_keys(db)
    return len(keys) - len(distinct(keys))


def _shard_rows(out):
    """Complete record lines of every client shard of a coordinated run, as (workload hash, trace)."""
    return [k for shard in shard_dirs(out) for k in record_keys(shard)]


def _tune(model, out, trials, *extra):
    return tune_process(model, out, "--trials", trials, "--trials-per-iter", "4", *extra)


def _wait_records(proc, db, n, timeout=900) -> str | None:
    """None once `db` holds `n` trials; else why not: the run ended first (with its stderr's tail, which
    is then read), or the timeout passed (the run is then killed)."""
    try:
        if wait_for_records(proc, db, n, timeout=timeout):
            return None
        return f"fewer than {n} trials after {timeout} s: killed"
    except AssertionError as exc:
        return str(exc)


# ---- kinds ----
def server_sigkill(model, root, n, trials):
    out = os.path.join(root, "server-sigkill")
    db = os.path.join(out, "records-cpu50")
    proc = _tune(model, out, trials, "--json")
    snapshots, ended = [], None
    for k in range(1, n + 1):
        ended = _wait_records(proc, db, k * trials // (n + 1))
        if ended:
            break
        servers = children_running(proc.pid, WARM_SERVER)
        if not servers:
            break
        servers[0].kill()
        snapshots.append(record_lines(db))
        # next kill only once the replacement took over (a kill of a server that is still starting
        # would test the servers-gone path instead)
        target = len(snapshots[-1]) + 1
        ended = _wait_records(proc, db, target)
    stdout, stderr = proc.communicate(timeout=1800)
    after = record_lines(db)
    faults = json.loads(stdout)["report"]["faults"] if proc.returncode == 0 else {}
    faults = {k: v for k, v in faults.items() if v}
    survived = min(len(snapshots), faults.get("server_restarts", 0)) if proc.returncode == 0 else 0
    return {"kind": "runner server SIGKILL (mid-run)", "injected": len(snapshots), "survived": survived,
            "lost": sum(_lost(s, after) for s in snapshots), "duplicates": _duplicates(db),
            "note": f"rc {proc.returncode}; faults {faults}" if proc.returncode == 0
            else (stderr.strip() or ended or "")[-300:]}


def _runner_kind(root, n, bad_kind):
    from tunekit.clients.build_pool import BuildPool
    from tunekit.testing import add_one_module, build_inputs, crash_module, hang_module, local_fleet, session_runner

    good = add_one_module()
    bad = hang_module() if bad_kind == "hung" else crash_module()
    pool = BuildPool(workers=1, timeout_s=60, artifact_dir=os.path.join(root, f"artifacts-{bad_kind}"))
    try:
        inputs = build_inputs(pool, [m for _ in range(n) for m in (bad, good)])
    finally:
        pool.shutdown()
    with local_fleet(f"bench-{bad_kind}") as fleet:
        runner = session_runner(fleet, candidate_timeout_s=5)
        try:
            results = [f.result() for f in runner.run(inputs)]
        finally:
            runner.shutdown()
        counts = {k: v for k, v in {**runner.fault_counts(), **fleet.fault_counts()}.items() if v}
    bad_results, good_results = results[0::2], results[1::2]
    expect = "server was stopped" if bad_kind == "hung" else "died twice"
    survived = sum(1 for b, g in zip(bad_results, good_results)
                   if b.error_msg and expect in b.error_msg and g.error_msg is None)
    return {"kind": "hung candidate (past its timeout)" if bad_kind == "hung" else "candidate that crashes its server",
            "injected": n, "survived": survived, "lost": sum(1 for g in good_results if g.error_msg is not None),
            "duplicates": 0, "note": f"recorded failed, next candidate measured; {counts}"}


def tune_sigkill(model, root, n, trials):
    out = os.path.join(root, "tune-sigkill")
    db = os.path.join(out, "records-cpu50")
    snapshots, survived, notes = [], 0, []
    for k in range(n):
        proc = _tune(model, out, trials, *(["--resume"] if k else []))
        start = len(record_lines(db))
        ended = _wait_records(proc, db, start + max(2, trials // 2))
        if ended:
            proc.communicate()
            notes.append(f"run {k} ended before the kill: {ended.strip()[-200:]}")
            continue
        tree = psutil.Process(proc.pid).children(recursive=True)
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
        snapshots.append(record_lines(db))
        alive = alive_after(tree, timeout=15)
        if alive:
            notes.append(f"{len(alive)} processes outlived the killed run")
            for p in alive:
                p.kill()
    final = _tune(model, out, trials, "--resume", "--json")
    stdout, stderr = final.communicate(timeout=1800)
    after = record_lines(db)
    if final.returncode == 0:
        report = json.loads(stdout)["report"]
        survived = len(snapshots)
        notes.append(f"final resume measured {report['trials']['measured']}; compile ok: "
                     f"{os.path.getsize(report['artifact']) > 0}; records {len(after)}")
    else:
        notes.append(stderr.strip()[-300:])
    return {"kind": "`tunekit tune` SIGKILL + --resume", "injected": len(snapshots), "survived": survived,
            "lost": sum(_lost(s, after) for s in snapshots), "duplicates": _duplicates(db), "note": "; ".join(notes)}


def servers_gone(model, root, n, trials):
    out = os.path.join(root, "servers-gone")
    db = os.path.join(out, "records-cpu50")
    snapshots, survived, notes = [], 0, []
    config = os.path.join(root, "servers-gone.yaml")  # a short wait for the servers (the default is 120 s)
    with open(config, "w") as fh:
        fh.write("servers_gone_timeout_s: 8\n")
    for k in range(n):
        proc = _tune(model, out, 400, "--config", config, *(["--resume"] if k else []))
        start = len(record_lines(db))
        ended = _wait_records(proc, db, start + 2)
        if ended:
            proc.communicate()
            notes.append(f"run {k} ended early: {ended.strip()[-200:]}")
            continue
        started = time.time()
        while proc.poll() is None and time.time() - started < 600:
            for server in children_running(proc.pid, WARM_SERVER):
                try:
                    server.kill()
                except psutil.Error:
                    pass
            time.sleep(0.05)
        _, stderr = proc.communicate()
        snapshots.append(record_lines(db))
        errors = [line for line in stderr.splitlines() if line.startswith("tunekit:")]
        # a runtime failure: exit code 1 (cli.common.EXIT_ERROR), not bad usage (2) or an interrupt (130)
        clean = (proc.returncode == 1 and len(errors) == 1 and "Traceback" not in stderr
                 and "cpu50" in errors[0] and "servers_gone_timeout_s" in errors[0])
        survived += clean
        notes.append(f"stopped after {time.time() - started:.0f} s, rc {proc.returncode}")
    final = _tune(model, out, trials, "--resume", "--json")
    _, stderr = final.communicate(timeout=1800)
    after = record_lines(db)
    if final.returncode != 0:
        survived = 0
        notes.append(stderr.strip()[-300:])
    else:
        notes.append("then --resume completed")
    return {"kind": "all servers of the share gone (> timeout)", "injected": len(snapshots), "survived": survived,
            "lost": sum(_lost(s, after) for s in snapshots), "duplicates": _duplicates(db),
            "note": "survived = clear one-line error, records kept; " + "; ".join(notes)}


# ---- Ray kinds ----
def client_sigkill(model, root, n, trials):
    out = os.path.join(root, "client-sigkill")
    db = os.path.join(out, "records-cpu50")
    proc = _tune(model, out, trials, "--clients", "2", "--json")
    snapshots = []
    for k in range(1, n + 1):
        deadline = time.time() + 600
        while time.time() < deadline and proc.poll() is None and len(_shard_rows(out)) < k * trials // (n + 1):
            time.sleep(0.2)
        if proc.poll() is not None:
            break
        clients = [p for p in psutil.Process(proc.pid).children(recursive=True)
                   if "TuningClientImpl" in " ".join(_cmdline(p))]
        if not clients:
            break
        clients[0].kill()
        time.sleep(0.5)
        snapshots.append(_shard_rows(out))
    stdout, stderr = proc.communicate(timeout=1800)
    after = record_keys(db)
    faults = {k: v for k, v in (json.loads(stdout)["report"]["faults"] if proc.returncode == 0 else {}).items() if v}
    survived = min(len(snapshots), faults.get("client_restarts", 0)) if proc.returncode == 0 else 0
    return {"kind": "tuning client actor SIGKILL (Ray, --clients 2)", "injected": len(snapshots),
            "survived": survived, "lost": sum(len(set(s) - set(after)) for s in snapshots),
            "duplicates": len(after) - len(set(after)),
            "note": f"rc 0; faults {faults}" if proc.returncode == 0 else stderr.strip()[-300:]}


def _cmdline(proc):
    try:
        return proc.cmdline()
    except psutil.Error:
        return []


def coordinator_sigkill(model, root, n, trials):
    out = os.path.join(root, "coordinator-sigkill")
    db = os.path.join(out, "records-cpu50")
    snapshots, notes, orphans = [], [], 0
    for k in range(n):
        proc = _tune(model, out, trials, "--clients", "2", *(["--resume"] if k else []))
        start = len(_shard_rows(out))
        deadline = time.time() + 600
        while time.time() < deadline and proc.poll() is None and len(_shard_rows(out)) < start + max(2, trials // 4):
            time.sleep(0.2)
        if proc.poll() is not None:
            notes.append(f"run {k} ended before the kill: {proc.communicate()[1].strip()[-200:]}")
            continue
        tree = psutil.Process(proc.pid).children(recursive=True)
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
        snapshots.append(_shard_rows(out))
        alive = alive_after(tree, timeout=60)
        if alive:
            orphans += len(alive)
            notes.append(f"{len(alive)} processes outlived the killed run: "
                         f"{sorted({' '.join(_cmdline(p))[:30] for p in alive})}")
            for p in alive:
                try:
                    p.kill()
                except psutil.Error:
                    pass
    final = _tune(model, out, trials, "--clients", "2", "--resume", "--json")
    stdout, stderr = final.communicate(timeout=1800)
    after = record_keys(db)
    survived = 0
    if final.returncode == 0:
        report = json.loads(stdout)["report"]
        survived = len(snapshots) if not orphans else 0
        notes.append(f"no orphan process; final resume measured {report['trials']['measured']}; compile ok: "
                     f"{os.path.getsize(report['artifact']) > 0}; records {len(after)}" if not orphans else
                     "final resume completed")
    else:
        notes.append(stderr.strip()[-300:])
    return {"kind": "coordinated `tunekit tune --clients 2` SIGKILL + --resume", "injected": len(snapshots),
            "survived": survived, "lost": sum(len(set(s) - set(after)) for s in snapshots),
            "duplicates": len(after) - len(set(after)), "note": "; ".join(notes)}


def node_kill(model, root, n, trials):
    """Each of N runs: a 2-node Cluster, the non-head node removed (no grace) once shards hold records."""
    import threading

    import ray
    from ray.cluster_utils import Cluster

    from tunekit import CoordinatorConfig, api
    from tunekit.config import TuneConfig

    injected = survived = lost = duplicates = 0
    notes = []
    for k in range(n):
        out = os.path.join(root, f"node-kill-{k}")
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
        worker = cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        snapshot, killed = [], []

        def remove_node():
            deadline = time.time() + 600
            while time.time() < deadline:
                if len(_shard_rows(out)) >= max(2, trials // 4):
                    snapshot.extend(_shard_rows(out))
                    cluster.remove_node(worker, allow_graceful=False)
                    killed.append(1)
                    return
                time.sleep(0.2)

        try:
            ray.init(address=cluster.address, log_to_driver=False)
            killer = threading.Thread(target=remove_node, daemon=True)
            killer.start()
            result = api.tune(model, cpu_pct=50, out=out,
                              config=TuneConfig(trials=trials, trials_per_iter=4, servers_gone_timeout_s=20),
                              coordinator=CoordinatorConfig(clients=2, ray_address=cluster.address))
            killer.join(timeout=5)
            after = record_keys(result.records_dir)
            faults = {key: v for key, v in result.report["faults"].items() if v}
            ok = bool(killed) and set(snapshot) <= set(after) and os.path.getsize(result.artifact) > 0
            notes.append(f"run {k}: faults {faults}")
        except Exception as exc:  # the run stopped: count it as not survived, keep what is on disk
            after = record_keys(os.path.join(out, "records-cpu50")) + _shard_rows(out)
            ok = False
            notes.append(f"run {k}: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}")
        finally:
            ray.shutdown()
            cluster.shutdown()
        injected += bool(killed)
        survived += ok
        lost += len(set(snapshot) - set(after))
        duplicates += _duplicates(os.path.join(out, "records-cpu50"))
    return {"kind": "non-head Ray node removed (Cluster, no grace)", "injected": injected, "survived": survived,
            "lost": lost, "duplicates": duplicates, "note": "; ".join(notes)}


def fsync_cost(root, count=300):
    import tvm
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    from tunekit.records.tuning_database import commit_durably
    from tunekit.testing import add_one_module

    mod = add_one_module(1024)
    sch = tvm.s_tir.Schedule(mod)
    block = sch.get_sblock("B") if hasattr(sch, "get_sblock") else sch.get_block("B")
    (loop,) = sch.get_loops(block)
    sch.split(loop, [None, 64])
    target = tvm.target.Target({"kind": "llvm"})
    result = {}
    for label, commit in (("plain", lambda db, r: db.commit_tuning_record(r)), ("fsync", commit_durably)):
        work = tempfile.mkdtemp(prefix=f"fsync-{label}-", dir=root)
        db = ms.database.JSONDatabase(work_dir=work)
        workload = db.commit_workload(mod)
        records = [ms.database.TuningRecord(sch.trace, workload, [1e-5 * (i + 1)], target,
                                            ArgInfo.from_prim_func(mod["main"])) for i in range(count)]
        started = time.perf_counter()
        for record in records:
            commit(db, record)
        result[label] = (time.perf_counter() - started) / count * 1e3
        result["line_bytes"] = os.path.getsize(db.path_tuning_record) // count
    result["extra_ms"] = result["fsync"] - result["plain"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=2, help="faults injected of each kind")
    parser.add_argument("--trials", type=int, default=16, help="trials of each tuning run")
    parser.add_argument("--out", default=None, help="work dir (default: a temp dir, removed at the end)")
    parser.add_argument("--kinds", default="server-sigkill,hung-candidate,crash-candidate,tune-sigkill,servers-gone",
                        help="comma-separated; Ray kinds (not in the default): client-sigkill, "
                             "coordinator-sigkill, node-kill; 'ray' = all three")
    parser.add_argument("--no-fsync", action="store_true", help="skip the fsync micro-benchmark")
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    root = args.out or tempfile.mkdtemp(prefix="tunekit-faults-")
    if os.path.exists(root) and args.out:
        shutil.rmtree(root)
    os.makedirs(root, exist_ok=True)
    model = os.path.join(root, "tiny_cnn.onnx")
    from tunekit.models.examples import save_example

    save_example("tiny_cnn", model)
    started = time.time()
    kinds = args.kinds.replace("ray", "client-sigkill,coordinator-sigkill,node-kill").split(",")
    rows = []
    for kind in kinds:
        t = time.time()
        if kind == "server-sigkill":
            row = server_sigkill(model, root, args.n, args.trials)
        elif kind == "hung-candidate":
            row = _runner_kind(root, args.n, "hung")
        elif kind == "crash-candidate":
            row = _runner_kind(root, args.n, "crash")
        elif kind == "tune-sigkill":
            row = tune_sigkill(model, root, args.n, args.trials)
        elif kind == "servers-gone":
            row = servers_gone(model, root, args.n, args.trials)
        elif kind == "client-sigkill":
            row = client_sigkill(model, root, args.n, args.trials)
        elif kind == "coordinator-sigkill":
            row = coordinator_sigkill(model, root, args.n, args.trials)
        elif kind == "node-kill":
            row = node_kill(model, root, args.n, args.trials)
        else:
            raise SystemExit(f"unknown kind {kind}")
        row["wall_s"] = round(time.time() - t, 1)
        rows.append(row)
        print(f"[{kind}] {row}", file=sys.stderr, flush=True)
    fsync = None if args.no_fsync else fsync_cost(root)
    import tvm

    print(f"machine: {platform.node()}, {os.cpu_count()} CPUs ({platform.processor() or platform.machine()}), "
          f"python {platform.python_version()}, TVM {tvm.__version__}; total {time.time() - started:.0f} s")
    print(f"command: {' '.join([os.path.relpath(PY), *sys.argv])}\n")
    print("| fault kind | injected | survived | trials lost | duplicates | wall s | notes |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for r in rows:
        print(f"| {r['kind']} | {r['injected']} | {r['survived']} | {r['lost']} | {r['duplicates']} | "
              f"{r['wall_s']} | {r['note']} |")
    if fsync:
        print(f"\nfsync per committed trial: commit {fsync['plain']:.3f} ms -> commit + fsync {fsync['fsync']:.3f} ms "
              f"(+{fsync['extra_ms']:.3f} ms a trial; {fsync['line_bytes']} B lines, 300 commits)")
    if not args.out:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
