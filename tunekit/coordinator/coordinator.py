"""The Ray coordinator: one model, one or more shares, several tuning clients, runner fleets per share.

  shares ──group_shares──> groups that fit on the device together (sum of pct x servers <= 100)
  per group:  fleets (Ray actors on the device's node: GPU at the MPS share / disjoint core sets)
              per share: tasks ──allocate_trials──> budgets ──shard_tasks──> clients (Ray actors)
              clients tune their shards, measuring on all of the share's servers; unused trials
              go through the share's pool to tasks that still improve; a client that dies is
              started again on its shard (its records are kept and count against its budgets)
              shards ──merge_shards──> records-<share>  ──> compiled model + report per share
"""
from __future__ import annotations

import dataclasses
import logging
import os
import time
import uuid
from dataclasses import dataclass, field

from ..config import TuneConfig
from ..errors import TunekitError
from ..shares.share import Share
from . import plan as planning

log = logging.getLogger("tunekit.coordinator")


@dataclass
class CoordinatorConfig:
    clients: int = 2                  # tuning clients per share (Ray actors)
    gpus: list[int] | None = None     # GPU indices to put servers on (default: every visible GPU)
    ray_address: str | None = None    # join this Ray cluster (default: RAY_ADDRESS, else start Ray here)
    oversubscribe: bool = False       # allow the shares on one device to sum past 100%
    client_restarts: int = 2          # how often a client that died is started again, per shard

    def __post_init__(self):
        if not isinstance(self.clients, int) or self.clients < 1:
            raise TunekitError(f"--clients must be a positive integer, got {self.clients!r}")


@dataclass
class _ShareRun:
    share: Share
    target: object
    tasks: list
    db_dir: str
    plans: list = field(default_factory=list)
    fleets: list = field(default_factory=list)       # actor handles
    addresses: list = field(default_factory=list)    # [{"host","port","key","sessions","actor"}]
    pool: object = None
    clients: dict = field(default_factory=dict)      # shard index -> actor
    outcomes: dict = field(default_factory=dict)     # shard index -> outcome dict
    client_restarts: int = 0
    client_deaths: int = 0
    fleet_faults: dict = field(default_factory=dict)
    lost_fleets: set = field(default_factory=set)      # fleet actors found dead (their node was lost)
    untuned: dict | None = None
    started: float = 0.0
    wall_s: float = 0.0


def _task_spec(task) -> dict:
    import tvm

    return {"name": task.task_name, "mod": tvm.ir.save_json(task.mod), "weight": int(task.weight)}


def plan_share(tasks, *, trials: int, clients: int) -> list[planning.TaskPlan]:
    plans = [planning.TaskPlan(i, t.task_name, int(t.weight), planning.task_flops(t.mod)) for i, t in enumerate(tasks)]
    budgets = planning.allocate_trials([p.flops * max(1, p.weight) for p in plans], trials)
    for p, b in zip(plans, budgets):
        p.budget = b
    planning.shard_tasks([p for p in plans if p.budget > 0], clients)
    return plans


class Coordinator:
    def __init__(self, *, model: str, shares: list[Share], out: str, config: TuneConfig,
                 coordinator: CoordinatorConfig, show_progress: bool = False):
        if len({s.kind for s in shares}) != 1:
            raise TunekitError("tune GPU shares and CPU shares in separate runs")
        if len({s.label for s in shares}) != len(shares):
            raise TunekitError("a share is listed twice")
        self.model, self.shares, self.out = model, shares, out
        self.config, self.coord = config, coordinator
        self.show_progress = show_progress
        self.kind = shares[0].kind
        self.run_id = time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
        self.mps_actors: dict[str, object] = {}
        self.faults = {"client_deaths": 0, "client_restarts": 0}
        from ..servers.fleet import listen_secret

        # Checked before Ray starts: an off-loopback --listen-host without a secret is refused.
        self.rpc_secret = listen_secret(listen_host=config.listen_host, secret_file=config.rpc_secret_file,
                                        server_mode=config.server_mode, engine=config.engine)

    # ---------------------------------------------------------------- Ray
    def _devices(self, ray) -> list[tuple[str, int | None]]:
        """(node id, device) pairs servers go on: every GPU (of --gpus) on every GPU node, or
        every node for a CPU share."""
        from .fleet_actor import visible_gpus

        nodes = [n for n in ray.nodes() if n.get("Alive")]
        if self.kind == "cpu":
            return [(n["NodeID"], None) for n in nodes]
        pairs = []
        here = ray.get_runtime_context().get_node_id()
        for node in nodes:
            count = int(node.get("Resources", {}).get("GPU", 0))
            if count == 0:
                continue
            indices = visible_gpus() if node["NodeID"] == here else list(range(count))
            if self.coord.gpus is not None:
                missing = [g for g in self.coord.gpus if g not in indices]
                if missing and node["NodeID"] == here:
                    raise TunekitError(f"--gpus {','.join(map(str, self.coord.gpus))}: no GPU {missing} "
                                       f"here (visible: {indices})")
                indices = [g for g in self.coord.gpus if g in indices]
            pairs += [(node["NodeID"], g) for g in indices]
        if not pairs:
            raise TunekitError("no GPU node in the Ray cluster (use --cpu-pct, or add a node with GPUs)")
        return pairs

    def _mps_env(self, ray, node_id: str) -> dict:
        from .fleet_actor import actor_classes, node_affinity

        if node_id not in self.mps_actors:
            _, mps_class = actor_classes()
            self.mps_actors[node_id] = mps_class.options(scheduling_strategy=node_affinity(node_id)).remote()
        return ray.get(self.mps_actors[node_id].env.remote())

    def _listen_host(self, ray) -> str:
        """Where fleets listen. Loopback while the whole cluster is this machine (the default, and
        `ray.cluster_utils.Cluster`); on several machines each fleet listens on its node's IP, so
        clients on other nodes reach it, and only with the RPC secret (README "Security")."""
        from ..servers.fleet import is_loopback
        from .fleet_actor import NODE_ADDRESS

        machines = {n.get("NodeManagerAddress") for n in ray.nodes() if n.get("Alive")}
        if len(machines) <= 1 and is_loopback(self.config.listen_host):
            return self.config.listen_host
        if self.rpc_secret is None:
            raise TunekitError(f"this Ray cluster spans {len(machines)} machines, so runner servers must listen on "
                               "each node's address; that needs a shared secret: pass --rpc-secret-file FILE or set "
                               "TUNEKIT_RPC_SECRET (README: Security)")
        return NODE_ADDRESS

    def _start_fleets(self, ray, group: list[_ShareRun]) -> None:
        from .fleet_actor import actor_classes, node_affinity

        fleet_class, _ = actor_classes()
        devices = self._devices(ray)
        listen_host = self._listen_host(ray)
        core_sets, overlapped = planning.cpu_slots([r.share for r in group], servers=self.config.servers)
        if overlapped and self.kind == "cpu":
            log.warning("not enough cores for disjoint servers of %s: some servers share cores",
                        ", ".join(r.share.label for r in group))
        pending = []
        for run in group:
            for node_id, device in devices:
                options = {"scheduling_strategy": node_affinity(node_id)}
                if device is not None and not self.coord.oversubscribe:
                    # Books the GPU fraction the servers use; MPS is what enforces it.
                    options["num_gpus"] = run.share.pct * self.config.servers / 100
                actor = fleet_class.options(**options).remote(
                    share_kind=run.share.kind, pct=run.share.pct, key=f"tunekit-{run.share.label}-{node_id[:6]}",
                    device=device, core_sets=core_sets[run.share.label], servers=self.config.servers,
                    server_mode=self.config.server_mode, host=listen_host, secret=self.rpc_secret,
                    mps_env=self._mps_env(ray, node_id) if device is not None else None)
                run.fleets.append(actor)
                pending.append((run, actor, actor.start.remote()))
        for run, actor, ref in pending:
            try:
                addresses = ray.get(ref)
            except Exception as exc:
                raise TunekitError(f"runner servers for {run.share.label} did not start: {_short(exc)}") from None
            run.addresses += [{**a, "actor": actor} for a in addresses]

    # ---------------------------------------------------------------- clients
    def _start_client(self, ray, run: _ShareRun, shard: int, total_clients: int):
        from .client_actor import client_class

        cpus = max(len(os.sched_getaffinity(0)), 1)
        actor = client_class(num_cpus=min(1.0, cpus / total_clients)).options(
            scheduling_strategy="SPREAD", max_restarts=0).remote(
            client_id=shard, share_label=run.share.label, target=run.target.export(),
            config=dataclasses.asdict(self.config), work_dir=os.path.join(self.out, "work", run.share.label),
            shard_dir=self._shard_dir(run, shard), known_dir=run.db_dir if os.path.isdir(run.db_dir) else None,
            fleets=self._live_addresses(run), build_workers=max(1, cpus // total_clients), rpc_secret=self.rpc_secret)
        run.clients[shard] = actor
        return actor

    def _shard_dir(self, run: _ShareRun, shard: int) -> str:
        return os.path.join(self.out, "work", "shards", run.share.label, self.run_id, f"client-{shard}")

    def _shard_call(self, run: _ShareRun, shard: int, *, resume: bool):
        specs = [p for p in run.plans if p.client == shard and p.budget > 0]
        return run.clients[shard].tune.remote(tasks=[_task_spec(run.tasks[p.index]) for p in specs],
                                              budgets=[p.budget for p in specs], pool=run.pool,
                                              measure_untuned=self.config.measure_untuned_tasks,
                                              resume_counts=resume)

    def _tune_group(self, ray, group: list[_ShareRun], progress) -> None:
        from .budget import ray_pool_class

        pool_class = ray_pool_class()
        total_clients = sum(max(p.client for p in run.plans) + 1 for run in group)
        pending = {}  # ref -> (run, shard)
        from .fleet_actor import node_affinity

        here = ray.get_runtime_context().get_node_id()
        for run in group:
            # The trial pool lives on the coordinator's node: placed on another node, losing that
            # node lost the pool and stopped the run (ActorUnavailableError; tests/test_faults_ray.py).
            run.pool = pool_class.options(scheduling_strategy=node_affinity(here)).remote(0)
            run.started = time.time()
            for shard in sorted({p.client for p in run.plans if p.budget > 0}):
                self._start_client(ray, run, shard, total_clients)
                pending[self._shard_call(run, shard, resume=False)] = (run, shard)
        restarts: dict[tuple, int] = {}
        shown = 0
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
            for ref in ready:
                run, shard = pending.pop(ref)
                try:
                    run.outcomes[shard] = ray.get(ref)
                except ray.exceptions.RayActorError as exc:
                    # The client process died (killed, OOM, node lost). Its shard is on disk:
                    # start a new client on it; what it measured counts against the budgets.
                    self.faults["client_deaths"] += 1
                    run.client_deaths += 1
                    key = (run.share.label, shard)
                    restarts[key] = restarts.get(key, 0) + 1
                    if restarts[key] > self.coord.client_restarts:
                        raise TunekitError(f"tuning client {shard} of {run.share.label} died {restarts[key]} "
                                           f"times: {_short(exc)}") from None
                    log.warning("tuning client %d of %s died (%s); starting it again on its shard",
                                shard, run.share.label, _short(exc))
                    self.faults["client_restarts"] += 1
                    run.client_restarts += 1
                    self._drop_lost_fleets(ray, run)  # a client lost with its node may have taken a fleet along
                    self._start_client(ray, run, shard, total_clients)
                    pending[self._shard_call(run, shard, resume=True)] = (run, shard)
                except ray.exceptions.RayTaskError as exc:
                    log.debug("tuning client %d of %s failed:\n%s", shard, run.share.label, exc)
                    raise TunekitError(f"tuning client {shard} of {run.share.label} failed: {_short(exc)}") from None
            if progress is not None:
                measured = sum(ray.get(run.pool.status.remote())["measured"] for run in group)
                progress.advance(measured - shown, status=", ".join(r.share.label for r in group))
                shown = measured
        for run in group:
            self._spend_leftover(ray, run)
            run.wall_s = time.time() - run.started

    def _drop_lost_fleets(self, ray, run: _ShareRun) -> None:
        """Mark fleets whose actor is gone, so a restarted client does not wait
        `servers_gone_timeout_s` on them; they count as `faults.fleets_lost`."""
        for address in run.addresses:
            try:
                ray.get(address["actor"].restarts.remote(), timeout=10)
            except ray.exceptions.RayActorError:
                run.lost_fleets.add(address["actor"]._actor_id.hex())
            except Exception:  # slow, not dead: keep it
                pass

    @staticmethod
    def _live_addresses(run: _ShareRun) -> list:
        live = [a for a in run.addresses if a["actor"]._actor_id.hex() not in run.lost_fleets]
        return live or run.addresses  # none left: the client reports "servers gone" itself

    def _spend_leftover(self, ray, run: _ShareRun) -> None:
        """Trials released after every other client had finished: give them to clients whose tasks
        are not exhausted, so the --trials budget is spent when the search still can use it."""
        for shard in sorted(run.outcomes, key=lambda s: -sum(not t.get("exhausted") for t in run.outcomes[s]["tasks"])):
            if ray.get(run.pool.status.remote())["available"] <= 0:
                return
            open_specs = [p for p in run.plans if p.client == shard and p.budget > 0]
            rows = {t["name"]: t for t in run.outcomes[shard]["tasks"]}
            open_specs = [p for p in open_specs if not rows.get(p.name, {}).get("exhausted")]
            if not open_specs:
                continue
            extra = ray.get(run.clients[shard].tune.remote(
                tasks=[_task_spec(run.tasks[p.index]) for p in open_specs], budgets=[0] * len(open_specs),
                pool=run.pool, improving_only=False, measure_untuned=False))
            _fold_extra(run.outcomes[shard], extra)

    # ---------------------------------------------------------------- the run
    def run(self):
        import ray

        from .. import api
        from ..clients.compiler import compile_and_export
        from ..clients.progress import ProgressBar
        from ..frontend.tasks import extract_tasks, prepare_for_tuning
        from ..records.database import count_trials, database_dir
        from ..records.identity import check_or_write, out_dir_lock, run_identity
        from ..servers.latency import measure_latency
        from ..shares.mps import gpu_name
        from ..targets import target_for
        from .merge import merge_shards
        from .ray_runtime import connect

        started = time.time()
        model_name = os.path.splitext(os.path.basename(self.model))[0]
        _, inputs, mod = api._load_model(self.model, self.config.input_shapes)
        api._check_out_dir(self.out)
        sample = inputs.random(seed=self.config.seed)
        device_name = gpu_name() if self.kind == "gpu" else api._cpu_model()
        runs: list[_ShareRun] = []
        by_target: dict[str, tuple] = {}
        for share in self.shares:
            target = target_for(share, gpu_name=gpu_name() if share.kind == "gpu" else None)
            key = str(target.export())
            if key not in by_target:  # tasks depend only on the target (CPU: its core count)
                prepared = prepare_for_tuning(mod, target)
                by_target[key] = (prepared, extract_tasks(prepared, target))
            prepared, tasks = by_target[key]
            run = _ShareRun(share, target, [t for t in tasks if not t.mod.attrs.get("tirx.is_scheduled", False)],
                            database_dir(self.out, share.label))
            run.prepared = prepared
            run.plans = plan_share(run.tasks, trials=self.config.trials, clients=self.coord.clients)
            runs.append(run)
        groups = planning.group_shares(self.shares, servers=self.config.servers,
                                       oversubscribe=self.coord.oversubscribe)
        by_label = {r.share.label: r for r in runs}
        results = []
        with out_dir_lock(self.out), connect(address=self.coord.ray_address, gpus=self.coord.gpus,
                                             debug=logging.getLogger().level <= logging.DEBUG) as cluster:
            for run in runs:
                identity = run_identity(model_path=self.model, share_label=run.share.label, target=run.target,
                                        device=device_name, input_shapes=inputs.shapes)
                check_or_write(run.db_dir, identity, resume=self.config.resume,
                               existing_trials=count_trials(run.db_dir))
                # Shards of an earlier run that stopped before merging: their trials are not lost.
                earlier = _shard_dirs(os.path.join(self.out, "work", "shards", run.share.label))
                if earlier:
                    merge_shards(earlier, run.db_dir)
            try:
                for group_shares in groups:
                    group = [by_label[s.label] for s in group_shares]
                    log.info("tuning %s together: %d clients each, %d server(s) per device",
                             ", ".join(s.label for s in group_shares), self.coord.clients, self.config.servers)
                    for run in group:
                        run.untuned = self._latency(ray, run, os.path.join(self.out, f"untuned-{run.share.label}.so"),
                                                    sample, compile_and_export, measure_latency)
                    self._start_fleets(ray, group)
                    progress = ProgressBar(total=sum(self.config.trials for _ in group), show=self.show_progress)
                    try:
                        self._tune_group(ray, group, progress)
                    finally:
                        progress.close()
                        self._stop_group(ray, group)
                    for run in group:
                        results.append(self._finish(ray, run, model_name, sample, started, cluster))
            finally:
                for actor in self.mps_actors.values():
                    try:
                        ray.get(actor.stop.remote(), timeout=30)
                    except Exception:
                        pass
        order = [s.label for s in self.shares]  # as the user listed them, whatever ran first
        return sorted(results, key=lambda r: order.index(r.share))

    def _stop_group(self, ray, group: list[_ShareRun]) -> None:
        for run in group:
            for actor in run.clients.values():
                try:
                    ray.get(actor.shutdown.remote(), timeout=30)
                except Exception:
                    pass
                ray.kill(actor)
            for fleet in run.fleets:
                try:
                    run.server_restarts = getattr(run, "server_restarts", 0) + ray.get(fleet.restarts.remote(), timeout=10)
                    for key, value in ray.get(fleet.fault_counts.remote(), timeout=10).items():
                        run.fleet_faults[key] = run.fleet_faults.get(key, 0) + value
                    ray.get(fleet.stop.remote(), timeout=60)
                except ray.exceptions.RayActorError:
                    run.lost_fleets.add(fleet._actor_id.hex())
                except Exception:
                    pass
                ray.kill(fleet)

    def _session(self, ray, share: Share):
        from .. import api

        if share.kind == "gpu":
            # The driver's node already has an MPS daemon (its actor's): measure under the same one.
            env = self._mps_env(ray, ray.get_runtime_context().get_node_id())
            os.environ.update({k: v for k, v in env.items() if v})
        return api._ShareSession(share, allow_unenforced=self.config.allow_unenforced_share)

    def _latency(self, ray, run: _ShareRun, path: str, sample, compile_and_export, measure_latency,
                 database=None) -> dict:
        compile_and_export(prepared_mod=run.prepared, target=run.target, database=database, path=path)
        with self._session(ray, run.share) as session:
            info, _ = measure_latency(artifact=path, inputs=sample, pinned=session.pinned,
                                      repeats=self.config.measure_repeats)
            run.environment_session = session
        return info

    def _finish(self, ray, run: _ShareRun, model_name: str, sample, started: float, cluster):
        from ..clients.compiler import compile_and_export, useful_records
        from ..records.baselines import read_baselines, write_baselines
        from ..records.database import open_database
        from ..reports.report import write_report
        from ..servers.latency import measure_latency
        from .merge import merge_shards
        from .. import api
        from ..api import TuneResult
        from ..records.database import repaired_bytes

        shard_dirs = [self._shard_dir(run, s) for s in sorted(run.outcomes)]
        merged = merge_shards(shard_dirs, run.db_dir)
        rows = [row for s in sorted(run.outcomes) for row in run.outcomes[s]["tasks"]]
        write_baselines(run.db_dir, {r["workload_hash"]: r.get("untuned_us") for r in rows if r.get("workload_hash")})
        database = open_database(run.db_dir)
        records, applied = useful_records(database, read_baselines(run.db_dir))
        for row in rows:
            if row.get("workload_hash") in applied:
                row["record_applied"] = applied[row["workload_hash"]]
        artifact = os.path.join(self.out, f"{model_name}-{run.share.label}.so")
        tuned = self._latency(ray, run, artifact, sample, compile_and_export, measure_latency, database=records)
        measured = sum(o["trials_done"] for o in run.outcomes.values())
        pool = ray.get(run.pool.status.remote())
        phases = _sum_phases([o["phases"] for o in run.outcomes.values()], run.wall_s, measured)
        report = {
            "model": os.path.abspath(self.model), "share": run.share.label,
            "share_choice": {"mode": "fixed", "chosen": run.share.label}, "target": str(run.target.export()),
            "trials": {"requested": self.config.trials, "measured": measured,
                       "failed": sum(o["trials_failed"] for o in run.outcomes.values()),
                       "cached": sum(o["trials_cached"] for o in run.outcomes.values())},
            "engine": "tunekit", "phases": phases,
            "session_failures": sum(o["session_failures"] for o in run.outcomes.values()),
            "latency_ms": {"untuned": run.untuned, "tuned": tuned,
                           "speedup": round(run.untuned["median_ms"] / tuned["median_ms"], 3)},
            "tasks": rows, "tuning_wall_s": round(run.wall_s, 2), "wall_s": round(time.time() - started, 2),
            "server_restarts": getattr(run, "server_restarts", 0), "records_dir": run.db_dir,
            "artifact": artifact, "environment": {**api._environment(run.environment_session), **cluster.describe()},
            "config": dataclasses.asdict(self.config),
            "coordinator": {"clients": len(run.outcomes), "servers_per_device": self.config.servers,
                            "fleets": [{**{k: v for k, v in a.items() if k != "actor"},
                                        "lost": a["actor"]._actor_id.hex() in run.lost_fleets} for a in run.addresses],
                            "shards": [{"client": s, "tasks": [p.name for p in run.plans if p.client == s],
                                        "budget": sum(p.budget for p in run.plans if p.client == s),
                                        "estimated_cost": sum(p.cost for p in run.plans if p.client == s),
                                        "trials": run.outcomes[s]["trials_done"],
                                        "hung_candidates": run.outcomes[s].get("hung_candidates", 0)}
                                       for s in sorted(run.outcomes)],
                            "pool": pool, "merge": merged, "run_id": self.run_id,
                            "client_restarts": run.client_restarts},
            "faults": {**run.fleet_faults, **_sum_dicts([o.get("runner_faults", {}) for o in run.outcomes.values()]),
                       "client_deaths": run.client_deaths, "client_restarts": run.client_restarts,
                       "fleets_lost": len(run.lost_fleets),
                       "records_repaired_bytes": repaired_bytes(run.db_dir)},
        }
        report_path = write_report(report, self.out) if len(self.shares) == 1 else _write_share_report(report, self.out)
        return TuneResult(share=run.share.label, out_dir=self.out, records_dir=run.db_dir, artifact=artifact,
                          report_path=report_path, untuned_ms=run.untuned["median_ms"], tuned_ms=tuned["median_ms"],
                          trials=measured, wall_s=report["wall_s"], report=report)


def _write_share_report(report: dict, out: str) -> str:
    from ..atomic import write_json_atomic

    return write_json_atomic(os.path.join(out, f"report-{report['share']}.json"), report)


def _fold_extra(outcome: dict, extra: dict) -> None:
    """Add a leftover round's trials to the shard's outcome (same tasks, by name)."""
    rows = {t["name"]: t for t in outcome["tasks"]}
    for row in extra["tasks"]:
        mine = rows.get(row["name"])
        if mine is None:
            continue
        mine["trials"] += row["trials"]
        mine["failed"] += row["failed"]
        mine["extra"] = mine.get("extra", 0) + row.get("extra", 0)
        mine["exhausted"] = row.get("exhausted", False)
        if row.get("tuned_us") and (mine.get("tuned_us") is None or row["tuned_us"] < mine["tuned_us"]):
            mine["tuned_us"] = row["tuned_us"]
            if mine.get("untuned_us"):
                mine["speedup"] = round(mine["untuned_us"] / mine["tuned_us"], 3)
    for key in ("trials_done", "trials_failed", "trials_cached"):
        outcome[key] += extra[key]


def _sum_dicts(dicts: list[dict]) -> dict:
    totals: dict = {}
    for d in dicts:
        for key, value in d.items():
            totals[key] = totals.get(key, 0) + value
    return totals


def _sum_phases(phase_dicts: list[dict], wall_s: float, trials: int) -> dict:
    totals: dict[str, float] = {}
    for phases in phase_dicts:
        for k, v in phases.get("total_s", {}).items():
            totals[k] = totals.get(k, 0.0) + v
    work = min(wall_s * max(1, len(phase_dicts)), totals.get("build_s", 0) + totals.get("run_s", 0))
    return {"total_s": {k: round(v, 3) for k, v in totals.items()},
            "per_trial_s": {k: round(v / max(1, trials), 4) for k, v in totals.items()},
            "wall_s": round(wall_s, 3), "clients": len(phase_dicts),
            # Summed over clients that work at the same time: a fraction of client-seconds.
            "overhead_fraction": round(1 - work / (wall_s * max(1, len(phase_dicts))), 3) if wall_s else None}


def _shard_dirs(root: str) -> list[str]:
    found = []
    if os.path.isdir(root):
        for run_id in sorted(os.listdir(root)):
            base = os.path.join(root, run_id)
            found += [os.path.join(base, c) for c in sorted(os.listdir(base)) if c.startswith("client-")]
    return found


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[-1] if text else type(exc).__name__)[:300]


def tune_shares(model: str, *, shares: list[Share], out: str, config: TuneConfig,
                coordinator: CoordinatorConfig, show_progress: bool = False):
    return Coordinator(model=model, shares=shares, out=out, config=config, coordinator=coordinator,
                       show_progress=show_progress).run()
