"""The Ray executor: one model, one or more shares, several tuning clients, runner fleets per share.

  shares ──group_shares──> groups that fit on the device together (sum of pct x servers <= 100)
  per group:  fleets (Ray actors on the device's node: GPU at the MPS share / disjoint core sets)
              per share: tasks ──allocate_trials──> budgets ──shard_tasks──> clients (Ray actors on
              the nodes --client-nodes allows, each sized by its node's cores over the clients there)
              clients tune their shards, measuring on all of the share's servers; the share's pool
              starts with a reserve of the trials (several clients) that goes to whichever client is
              free, and takes what tasks could not use; a client that dies is
              started again on its shard (its records are kept and count against its budgets)
              shards ──merge_shards──> records-<share>
Everything before and after tuning (untuned and tuned latency, compile, report) is the pipeline's
(run.pipeline); this module only tunes. Its fleets and clients start in `warm_up`, while the pipeline
compiles and times the untuned model.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import os
import time
import uuid
from dataclasses import dataclass, field

from ..clients.measurement import TuningOutcome
from ..config import CoordinatorConfig, TuneConfig
from ..errors import RunFailed, TunekitError
from ..frontend.tasks import task_flops
from ..run.executor import ShareJob
from ..run.session import ShareSession
from ..run.warmup import WarmUps
from . import plan as planning
from ..counts import sum_counts
from .outcomes import coordinator_section, fold_extra, sum_phases

log = logging.getLogger("tunekit.coordinator")

# A client that has not started after this long (its node has no room for it: Ray's CPUs are booked,
# or the node went away) stops the run instead of waiting for ever.
CLIENT_START_TIMEOUT_S = 300.0
MIN_TIME_LEFT_S = 0.001  # a restarted client past the time budget still records what it has (a budget must be > 0)


@dataclass
class _ShareRun:
    """A share while its group is tuned: its plan, fleets, pool, clients and what they returned."""

    job: ShareJob
    plans: list = field(default_factory=list)
    fleets: list = field(default_factory=list)       # actor handles
    addresses: list = field(default_factory=list)    # [{"host","port","key","sessions","cores","actor"}]
    pool: object = None
    clients: dict = field(default_factory=dict)      # shard index -> actor
    outcomes: dict = field(default_factory=dict)     # shard index -> outcome dict
    client_restarts: int = 0
    client_deaths: int = 0
    server_restarts: int = 0
    fleet_faults: dict = field(default_factory=dict)
    lost_fleets: set = field(default_factory=set)    # fleet actors found dead (their node was lost)
    placements: dict = field(default_factory=dict)   # shard index -> where each start of its client ran
    started: float = 0.0
    wall_s: float = 0.0
    reserve: int = 0    # trials the pool held at the start, for whichever client is free (plan.reserve_trials)
    done_s: dict = field(default_factory=dict)       # shard index -> seconds from the start to its result
    # shard index -> seconds from the start until its client's search began (what starting the client cost)
    search_started_s: dict = field(default_factory=dict)
    leftover_shards: list = field(default_factory=list)  # shards whose clients got a leftover round

    @property
    def label(self) -> str:
        return self.job.label


def _task_spec(task) -> dict:
    import tvm

    return {"name": task.task_name, "mod": tvm.ir.save_json(task.mod), "weight": int(task.weight)}


def plan_share(tasks, *, trials: int, clients: int, trials_per_iter: int) -> tuple[list[planning.TaskPlan], int]:
    """Each task's budget and client, and the trials the share's pool starts with."""
    plans = [planning.TaskPlan(i, t.task_name, int(t.weight), task_flops(t.mod)) for i, t in enumerate(tasks)]
    reserve = planning.reserve_trials(trials, tasks=len(plans), clients=clients, trials_per_iter=trials_per_iter)
    budgets = planning.allocate_trials([p.flops * max(1, p.weight) for p in plans], trials - reserve)
    for p, b in zip(plans, budgets):
        p.budget = b
    planning.shard_tasks([p for p in plans if p.budget > 0], clients)
    return plans, reserve


def _ranges(cores: list[int]) -> str:
    """[0, 1, 2, 3, 8, 9] -> "0-3,8-9" (the report's `client_cores`)."""
    parts, start = [], None
    for i, core in enumerate(cores):
        if start is None:
            start = core
        if i + 1 == len(cores) or cores[i + 1] != core + 1:
            parts.append(f"{start}-{core}" if core != start else str(core))
            start = None
    return ",".join(parts)


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[-1] if text else type(exc).__name__)[:300]


def _shard_dirs(root: str) -> list[str]:
    found = []
    if os.path.isdir(root):
        for run_id in sorted(os.listdir(root)):
            base = os.path.join(root, run_id)
            found += [os.path.join(base, c) for c in sorted(os.listdir(base)) if c.startswith("client-")]
    return found


class RayExecutor:
    name = "ray"

    def __init__(self, config: TuneConfig, coordinator: CoordinatorConfig, *, rpc_secret: bytes | None):
        if config.engine != "tunekit":
            raise TunekitError(f"--engine {config.engine} runs in one process and cannot be sharded over Ray tuning "
                               "clients: drop --clients/--gpus/--ray-address and share lists, or use --engine tunekit")
        self.config, self.coord, self.rpc_secret = config, coordinator, rpc_secret
        self.run_id = time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
        self.mps_actors: dict[str, object] = {}
        self.cluster = None
        self._client_node_of: dict[tuple, str] = {}  # (share, shard) -> node of its latest client
        self._warm_ups = WarmUps()
        self._total_clients = 1

    # ---------------------------------------------------------------- the executor protocol
    @contextlib.contextmanager
    def connect(self):
        import ray

        from .ray_runtime import connect

        with connect(address=self.coord.ray_address, gpus=self.coord.gpus,
                     debug=logging.getLogger().level <= logging.DEBUG) as cluster:
            self.cluster = cluster
            try:
                yield self
            finally:
                for actor in self.mps_actors.values():
                    try:
                        ray.get(actor.stop.remote(), timeout=30)
                    except Exception:
                        pass

    def recover(self, job: ShareJob) -> None:
        """Shards of an earlier run that stopped before merging: their trials are not lost."""
        from .merge import merge_shards

        earlier = _shard_dirs(os.path.join(job.work_dir, "shards", job.label))
        if earlier:
            merge_shards(earlier, job.db_dir)

    def measures_every_share(self, jobs: list[ShareJob]) -> bool:
        return False  # each share is searched by its own clients

    def groups(self, jobs: list[ShareJob]) -> list[list[ShareJob]]:
        if self.config.robust:
            raise TunekitError("--robust measures every candidate at every share in one process: drop the Ray "
                               "flags (--clients, --gpus, --ray-address, --client-nodes, RAY_ADDRESS)")
        kinds = {job.share.kind for job in jobs}
        if len(kinds) != 1:
            raise TunekitError("tune GPU shares and CPU shares in separate runs")
        if len({job.label for job in jobs}) != len(jobs):
            raise TunekitError("a share is listed twice")
        self._check_placement(next(iter(kinds)))
        by_label = {job.label: job for job in jobs}
        groups = planning.group_shares([job.share for job in jobs], servers=self.config.servers,
                                       oversubscribe=self.coord.oversubscribe)
        return [[by_label[share.label] for share in group] for group in groups]

    def progress_total(self, group: list[ShareJob]) -> int:
        return self.config.trials * len(group)  # the clients search each share on its own

    @contextlib.contextmanager
    def group_sessions(self, group: list[ShareJob]):
        import ray

        if group[0].share.kind == "gpu":
            # The driver's node already has an MPS daemon (its actor's): measure under the same one.
            env = self._mps_env(ray, ray.get_runtime_context().get_node_id())
            os.environ.update({k: v for k, v in env.items() if v})
        with contextlib.ExitStack() as stack:
            # Books the group's shares on the driver's device (the machine's ledger); fleets on other
            # GPUs or nodes are not booked there.
            yield {job.label: stack.enter_context(ShareSession.for_tuning(job.share, self.config,
                                                                          oversubscribe=self.coord.oversubscribe))
                   for job in group}

    def warm_up(self, group: list[ShareJob], sessions: dict):
        """Start the group's fleets and tuning clients (each importing TVM and starting its build workers)
        on a thread while the pipeline compiles and times the untuned model; `tune` takes them over. Started
        in `tune`, the clients' start is a fixed cost in every tuning wall that more GPUs do not shrink."""
        return self._warm_ups.hold(lambda stack, steps: self._start(group, stack, steps))

    def _start(self, group: list[ShareJob], stack: contextlib.ExitStack, steps: dict) -> list[_ShareRun]:
        """The group's share runs with their plans, fleets, pools and clients started and ready to tune;
        `steps`: the seconds the fleets and the clients took."""
        import ray

        runs = []
        for job in group:
            plans, reserve = plan_share(job.tasks, trials=self.config.trials, clients=self.coord.clients,
                                        trials_per_iter=self.config.trials_per_iter)
            runs.append(_ShareRun(job, plans=plans, reserve=reserve))
        log.info("tuning %s together: %d clients each, %d server(s) per device",
                 ", ".join(r.label for r in runs), self.coord.clients, self.config.servers)
        stack.callback(self._stop_group, ray, runs)
        clock = time.perf_counter()
        self._start_fleets(ray, runs)
        steps["fleets_s"], clock = time.perf_counter() - clock, time.perf_counter()
        self._start_clients_of(ray, runs)
        steps["clients_s"] = time.perf_counter() - clock
        return runs

    def tune(self, group: list[ShareJob], sessions: dict, progress) -> dict:
        import ray

        warm = self._warm_ups.take(lambda stack, steps: self._start(group, stack, steps))
        try:
            runs = warm.result()
            self._tune_group(ray, runs, progress)
        finally:
            warm.close()  # the clients and servers go now, before the shards are merged and the model compiled
        outcomes = {run.label: self._outcome(ray, run) for run in runs}
        for outcome in outcomes.values():
            outcome.phases["warm_up"] = warm.describe()
        return outcomes

    # ---------------------------------------------------------------- fleets
    def _devices(self, ray, kind: str) -> list[tuple[str, int | None]]:
        """(node id, device) pairs servers go on: every GPU (of --gpus) on every GPU node, or
        every node for a CPU share."""
        from .fleet_actor import visible_gpus

        nodes = [n for n in ray.nodes() if n.get("Alive")]
        if kind == "cpu":
            return [(n["NodeID"], None) for n in planning.cpu_fleet_nodes(nodes, self.coord.client_nodes)]
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

    def _check_placement(self, kind: str) -> None:
        """Before any work: --client-nodes names nodes that exist, and a CPU share keeps a node for
        its fleets (nodes that advertise the client resource host none)."""
        import ray

        setting = self.coord.client_nodes
        nodes = ray.nodes()
        if not planning.client_nodes(nodes, setting):
            if setting == planning.CPU_ONLY:
                raise TunekitError("--client-nodes cpu-only: every node of the Ray cluster has GPUs; add a node "
                                   "without (ray start --address ADDR --num-gpus 0) or use --client-nodes any")
            raise TunekitError(f"--client-nodes {setting}: no node of the Ray cluster advertises the resource "
                               f"{setting}; start client nodes with ray start --address ADDR --resources "
                               f"'{{\"{setting}\": 1}}'")
        if kind == "cpu" and not planning.cpu_fleet_nodes(nodes, setting):
            raise TunekitError(f"--client-nodes {setting}: every node advertises {setting}, so none is left for "
                               "the CPU share's runner servers (client nodes host no fleets); add a node without it")

    def _mps_env(self, ray, node_id: str) -> dict:
        from .fleet_actor import actor_classes, node_affinity

        if node_id not in self.mps_actors:
            _, mps_class = actor_classes()
            self.mps_actors[node_id] = mps_class.options(scheduling_strategy=node_affinity(node_id)).remote()
        return ray.get(self.mps_actors[node_id].env.remote())

    def _listen_host(self, ray) -> str:
        """Where fleets listen. Loopback while the whole cluster is this machine (the default, and
        `ray.cluster_utils.Cluster`); on several machines each fleet listens on its node's IP, so
        clients on other nodes reach it, and only with the RPC secret (docs/running.md, "Security")."""
        from ..servers.fleet import is_loopback
        from .fleet_actor import NODE_ADDRESS

        machines = {n.get("NodeManagerAddress") for n in ray.nodes() if n.get("Alive")}
        if len(machines) <= 1 and is_loopback(self.config.listen_host):
            return self.config.listen_host
        if self.rpc_secret is None:
            raise TunekitError(f"this Ray cluster spans {len(machines)} machines, so runner servers must listen on "
                               "each node's address; that needs a shared secret: pass --rpc-secret-file FILE or set "
                               "TUNEKIT_RPC_SECRET (docs/running.md: Security)")
        return NODE_ADDRESS

    def _start_fleets(self, ray, runs: list[_ShareRun]) -> None:
        from .fleet_actor import actor_classes, node_affinity

        fleet_class, _ = actor_classes()
        kind = runs[0].job.share.kind
        devices = self._devices(ray, kind)
        listen_host = self._listen_host(ray)
        core_sets, overlapped = planning.cpu_slots([r.job.share for r in runs], servers=self.config.servers)
        if overlapped and kind == "cpu":
            log.warning("not enough cores for disjoint servers of %s: some servers share cores",
                        ", ".join(r.label for r in runs))
        pending = []
        for run in runs:
            for node_id, device in devices:
                options = {"scheduling_strategy": node_affinity(node_id)}
                if device is not None and not self.coord.oversubscribe:
                    # Books the GPU fraction the servers use; MPS is what enforces it.
                    options["num_gpus"] = run.job.share.pct * self.config.servers / 100
                actor = fleet_class.options(**options).remote(
                    share_kind=kind, pct=run.job.share.pct, key=f"tunekit-{run.label}-{node_id[:6]}",
                    device=device, core_sets=core_sets[run.label], servers=self.config.servers,
                    server_mode=self.config.server_mode, host=listen_host, secret=self.rpc_secret,
                    mps_env=self._mps_env(ray, node_id) if device is not None else None, log_dir=run.job.log_dir)
                run.fleets.append(actor)
                pending.append((run, actor, actor.start.remote()))
        for run, actor, ref in pending:
            try:
                addresses = ray.get(ref)
            except Exception as exc:
                raise RunFailed(f"runner servers for {run.label} did not start: {_short(exc)}") from None
            run.addresses += [{**a, "actor": actor} for a in addresses]

    def _stop_group(self, ray, runs: list[_ShareRun]) -> None:
        for run in runs:
            for actor in run.clients.values():
                try:
                    ray.get(actor.shutdown.remote(), timeout=30)
                except Exception:
                    pass
                ray.kill(actor)
            for fleet in run.fleets:
                try:
                    run.server_restarts += ray.get(fleet.restarts.remote(), timeout=10)
                    run.fleet_faults = sum_counts([run.fleet_faults, ray.get(fleet.fault_counts.remote(), timeout=10)])
                    ray.get(fleet.stop.remote(), timeout=60)
                except ray.exceptions.RayActorError:
                    run.lost_fleets.add(fleet._actor_id.hex())
                except Exception:
                    pass
                ray.kill(fleet)

    # ---------------------------------------------------------------- clients
    def _start_clients(self, ray, starts: list[tuple[_ShareRun, int]], attempt: int = 1) -> None:
        """A client for each (share, shard) on a node that --client-nodes allows; each one's build
        workers are then sized from the node it landed on: its cores over the clients there."""
        from .client_actor import client_class

        for (run, shard), (strategy, num_cpus) in zip(starts, self._client_targets(ray, starts)):
            os.makedirs(os.path.dirname(self._shard_dir(run, shard)), exist_ok=True)
            run.clients[shard] = client_class(num_cpus=num_cpus).options(
                scheduling_strategy=strategy, max_restarts=0).remote(
                client_id=shard, share_label=run.label, target=run.job.target.export(),
                config=dataclasses.asdict(self.config), work_dir=os.path.join(run.job.work_dir, run.label),
                shard_dir=self._shard_dir(run, shard),
                known_dir=run.job.db_dir if os.path.isdir(run.job.db_dir) else None,
                fleets=self._live_addresses(run), rpc_secret=self.rpc_secret)
        unplaced = self._size_clients(ray, starts)
        if unplaced and attempt >= 3:
            raise RunFailed(f"no node took tuning client {unplaced[0][1]} of {unplaced[0][0].label} "
                            f"(--client-nodes {self.coord.client_nodes}): its nodes went away")
        if unplaced:
            self._start_clients(ray, unplaced, attempt + 1)

    def _client_targets(self, ray, starts: list[tuple[_ShareRun, int]]) -> list[tuple]:
        """(scheduling strategy, CPUs Ray books) for each new client."""
        if self.coord.client_nodes == planning.ANY_NODE:  # Ray spreads them, as before --client-nodes
            cpus = max(len(os.sched_getaffinity(0)), 1)
            return [("SPREAD", min(1.0, cpus / self._total_clients))] * len(starts)
        from .fleet_actor import node_affinity

        nodes = planning.client_nodes(ray.nodes(), self.coord.client_nodes)
        if not nodes:  # checked before the run; they went away since
            raise RunFailed(f"no Ray node left for the tuning clients (--client-nodes {self.coord.client_nodes})")
        leaving = {(run.label, shard) for run, shard in starts}
        busy = collections.Counter(n for key, n in self._client_node_of.items() if key not in leaving)
        placed = planning.place_clients(nodes, len(starts), busy)
        there = busy + collections.Counter(placed)
        cpus = {n["NodeID"]: planning.node_cpus(n) for n in nodes}
        # Hard affinity: a client must never fall back onto a GPU node or one without the resource.
        return [(node_affinity(node), min(1.0, cpus[node] / there[node])) for node in placed]

    def _size_clients(self, ray, starts: list[tuple[_ShareRun, int]]) -> list[tuple[_ShareRun, int]]:
        """Ask each new client where it runs (the report's `ran_on`), then give it its node's cores
        over the clients on that node. Its size() call runs before its first tune() call (one caller,
        calls in order). Returns the clients that could not be placed (their node went away)."""
        asked = [(run, shard, run.clients[shard].where.remote(os.path.dirname(self._shard_dir(run, shard))))
                 for run, shard in starts]
        cpus = {n["NodeID"]: planning.node_cpus(n) for n in ray.nodes()}
        landed, unplaced = [], []
        for run, shard, ref in asked:
            try:
                place = ray.get(ref, timeout=CLIENT_START_TIMEOUT_S)
            except ray.exceptions.GetTimeoutError:
                raise RunFailed(f"tuning client {shard} of {run.label} did not start in "
                                f"{CLIENT_START_TIMEOUT_S:.0f} s: no node with room for it "
                                f"(--client-nodes {self.coord.client_nodes})") from None
            except ray.exceptions.ActorUnschedulableError:
                unplaced.append((run, shard))  # its node was listed alive, then went: place it again
                continue
            except ray.exceptions.RayActorError:
                continue  # died before it answered: its tune() call fails too and starts it again
            if not place.pop("sees_out"):
                # Its shard would be written on that machine's disk and never merged here.
                raise TunekitError(f"tuning client {shard} runs on {place['ip']}, which does not see the out dir "
                                   f"{run.job.work_dir}: clients write their shards there; put --out on a "
                                   "filesystem every client node mounts")
            place["node_cpus"] = cpus.get(place["node_id"], 0.0)
            run.placements.setdefault(shard, []).append(place)
            self._client_node_of[(run.label, shard)] = place["node_id"]
            landed.append((run, shard, place))
        for run, shard, place in landed:
            cores = place.pop("core_ids")
            neighbours = [key for key, node in self._client_node_of.items() if node == place["node_id"]]
            place["build_workers"] = planning.build_workers_for(place["cores"], place["node_cpus"], len(neighbours))
            place["client_cores"] = _ranges(cores)
            run.clients[shard].size.remote(place["build_workers"], cores=cores)
        return unplaced

    def _shard_dir(self, run: _ShareRun, shard: int) -> str:
        return os.path.join(run.job.work_dir, "shards", run.label, self.run_id, f"client-{shard}")

    def _shard_call(self, run: _ShareRun, shard: int, *, resume: bool):
        specs = [p for p in run.plans if p.client == shard and p.budget > 0]
        return run.clients[shard].tune.remote(tasks=[_task_spec(run.job.tasks[p.index]) for p in specs],
                                              budgets=[p.budget for p in specs], pool=run.pool,
                                              # with a reserve, a client whose budgets are spent draws from the pool
                                              # for its best task (gradient) whether or not it improved last batch:
                                              # a client left idle until the others are done is what the reserve
                                              # is there to prevent
                                              improving_only=not run.reserve,
                                              resume_counts=resume, time_budget_s=self._time_left(run) if resume else None,
                                              # the fused attentions' kernel trials: one client's, into its shard
                                              fused=[_task_spec(t) for t in run.job.fused_tasks] if shard == 0 else [])

    def _time_left(self, run: _ShareRun) -> float | None:
        """What is left of --time-budget since the share's clients started (None: no time budget): every call of
        a client after its first gets only that, or the budget would start again with each."""
        budget = self.config.time_budget_s
        return None if budget is None else max(MIN_TIME_LEFT_S, budget - (time.time() - run.started))

    def _start_clients_of(self, ray, runs: list[_ShareRun]) -> None:
        """Each share's trial pool and its clients, started, sized and set up (TVM imported, the engine and
        its build workers started), so that tuning starts with the first search."""
        from .budget import ray_pool_class
        from .fleet_actor import node_affinity

        pool_class = ray_pool_class()
        self._total_clients = sum(max(p.client for p in run.plans) + 1 for run in runs)
        self._client_node_of = {}
        here = ray.get_runtime_context().get_node_id()
        starts = []
        for run in runs:
            # The trial pool lives on the coordinator's node: placed on another node, losing that
            # node lost the pool and stopped the run (ActorUnavailableError; tests/test_faults_ray.py).
            shards = self._shards(run)
            run.pool = pool_class.options(scheduling_strategy=node_affinity(here)).remote(run.reserve,
                                                                                          takers=len(shards))
            starts += [(run, shard) for shard in shards]
        self._start_clients(ray, starts)  # all at once: each is sized by the clients on its node
        for (run, shard), ref in [((run, shard), run.clients[shard].prepare.remote()) for run, shard in starts]:
            try:
                ray.get(ref)
            except ray.exceptions.RayActorError:
                pass  # died while starting: its tune() call fails too, and the client is started again
            except ray.exceptions.RayTaskError as exc:
                raise RunFailed(f"tuning client {shard} of {run.label} failed to start: {_short(exc)}") from None

    @staticmethod
    def _shards(run: _ShareRun) -> list[int]:
        return sorted({p.client for p in run.plans if p.budget > 0})

    def _tune_group(self, ray, runs: list[_ShareRun], progress) -> None:
        starts = [(run, shard) for run in runs for shard in self._shards(run)]
        for run in runs:
            run.started = time.time()
        pending = {self._shard_call(run, shard, resume=False): (run, shard) for run, shard in starts}
        restarts: dict[tuple, int] = {}
        shown = 0
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
            for ref in ready:
                run, shard = pending.pop(ref)
                if self._collect(ray, ref, run, shard, restarts):
                    pending[self._shard_call(run, shard, resume=True)] = (run, shard)
            measured = sum(ray.get(run.pool.status.remote())["measured"] for run in runs)
            progress.advance(measured - shown, status=", ".join(r.label for r in runs))
            shown = measured
        for run in runs:
            self._spend_leftover(ray, run)
            run.wall_s = time.time() - run.started

    def _collect(self, ray, ref, run: _ShareRun, shard: int, restarts: dict) -> bool:
        """A client's call returned. Returns True when the client died and was started again on its
        shard (its call must be made again); what it measured counts against its budgets."""
        try:
            run.outcomes[shard] = ray.get(ref)
            run.done_s[shard] = round(time.time() - run.started, 3)  # when its client went idle: the balance
            # taken now: a leftover round later moves done_s, and the search's own wall does not cover the start
            run.search_started_s[shard] = round(max(0.0, run.done_s[shard] - run.outcomes[shard]["wall_s"]), 3)
            return False
        except ray.exceptions.RayActorError as exc:
            # The client process died (killed, OOM, node lost). Its shard is on disk.
            run.client_deaths += 1
            key = (run.label, shard)
            restarts[key] = restarts.get(key, 0) + 1
            if restarts[key] > self.coord.client_restarts:
                raise RunFailed(f"tuning client {shard} of {run.label} died {restarts[key]} times: "
                                f"{_short(exc)}") from None
            log.warning("tuning client %d of %s died (%s); starting it again on its shard", shard, run.label,
                        _short(exc))
            run.client_restarts += 1
            self._drop_lost_fleets(ray, run)  # a client lost with its node may have taken a fleet along
            self._start_clients(ray, [(run, shard)])
            return True
        except ray.exceptions.RayTaskError as exc:
            log.debug("tuning client %d of %s failed:\n%s", shard, run.label, exc)
            raise RunFailed(f"tuning client {shard} of {run.label} failed: {_short(exc)}") from None

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
        are not exhausted, so the --trials budget is spent when the search still can use it. The
        clients draw from the pool side by side (one after another, the others' cores sat idle)."""
        left = self._time_left(run)
        if ray.get(run.pool.status.remote())["available"] <= 0 or (left is not None and left <= MIN_TIME_LEFT_S):
            return
        calls = {}
        for shard in sorted(run.outcomes):
            rows = {t["name"]: t for t in run.outcomes[shard]["tasks"]}
            open_specs = [p for p in run.plans if p.client == shard and p.budget > 0
                          and not rows.get(p.name, {}).get("exhausted")]
            if open_specs:
                calls[shard] = run.clients[shard].tune.remote(
                    tasks=[_task_spec(run.job.tasks[p.index]) for p in open_specs], budgets=[0] * len(open_specs),
                    pool=run.pool, improving_only=False, measure_untuned=False, time_budget_s=left)
        run.leftover_shards = sorted(calls)
        for shard, ref in calls.items():
            fold_extra(run.outcomes[shard], ray.get(ref))
            run.done_s[shard] = round(time.time() - run.started, 3)

    # ---------------------------------------------------------------- results
    def _outcome(self, ray, run: _ShareRun) -> TuningOutcome:
        """Merge the clients' shards into the share's database; one TuningOutcome for the share."""
        from .merge import merge_shards

        merged = merge_shards([self._shard_dir(run, s) for s in sorted(run.outcomes)], run.job.db_dir)
        outcomes = [run.outcomes[s] for s in sorted(run.outcomes)]
        measured = sum(o["trials_done"] for o in outcomes)
        faults = {**run.fleet_faults, **sum_counts([o.get("runner_faults", {}) for o in outcomes]),
                  "client_deaths": run.client_deaths, "client_restarts": run.client_restarts,
                  "fleets_lost": len(run.lost_fleets)}
        return TuningOutcome(
            measured, sum(o["trials_failed"] for o in outcomes), run.wall_s,
            [row for o in outcomes for row in o["tasks"]], engine="tunekit",
            trials_cached=sum(o["trials_cached"] for o in outcomes),
            phases=sum_phases([o["phases"] for o in outcomes], run.wall_s, measured),
            session_failures=sum(o["session_failures"] for o in outcomes), faults=faults,
            server_restarts=run.server_restarts,
            extra={"coordinator": coordinator_section(run, ray.get(run.pool.status.remote()), merged, self.run_id,
                                                      self.config.servers, client_nodes=self.coord.client_nodes,
                                                      last_grants=ray.get(run.pool.last_grants.remote()))},
            environment=self.cluster.describe())
