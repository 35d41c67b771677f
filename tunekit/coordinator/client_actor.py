"""A tuning client: a Ray actor that tunes one shard of a model's tasks for one share.

It owns its engine (build workers, XGBoost cost model, runner over all of the share's fleets:
clients.tunekit_engine.make_engine, the same engine the one-process executor uses) and its database
shard. Everything it measures is committed to its shard as it completes, so a client that dies
loses nothing: the executor starts a new one on the same shard, which counts what is there
against the budgets and never re-measures it.
"""
from __future__ import annotations

import logging
import os

log = logging.getLogger("tunekit.client")


def _tasks_from_json(task_specs: list[dict], target):
    import tvm
    from tvm.s_tir import meta_schedule as ms

    tasks = []
    for spec in task_specs:
        mod = tvm.ir.load_json(spec["mod"])
        tasks.append(ms.ExtractedTask(spec["name"], mod, target, [mod], int(spec["weight"])))
    return tasks


def _fleet_addresses(fleets: list[dict]) -> list:
    from ..clients.measurement import FleetAddress

    addresses = []
    for fleet in fleets:
        actor = fleet.get("actor")

        def on_hang(port, actor=actor):
            if actor is not None:
                actor.stop_server_on_port.remote(port)

        addresses.append(FleetAddress(fleet["host"], fleet["port"], fleet["key"], fleet["sessions"], on_hang=on_hang))
    return addresses


class TuningClientImpl:
    def __init__(self, *, client_id: int, share_label: str, target: dict, config: dict, work_dir: str,
                 shard_dir: str, known_dir: str | None, fleets: list[dict], build_workers: int | None = None,
                 build_cores: list[int] | None = None, shared_servers: bool = True, rpc_secret: bytes | None = None):
        """`build_workers` None: this node's cores until the executor calls size() (it knows how many
        clients landed on this node only once they all did)."""
        self.client_id = client_id
        self.rpc_secret = rpc_secret  # what the fleets' servers demand (a file path may not exist on this node)
        self.share_label = share_label
        self.target_spec = target
        self.config_dict = config
        self.work_dir = work_dir
        self.shard_dir = shard_dir
        self.known_dir = known_dir
        self.fleets = fleets  # [{"host", "port", "key", "sessions", "actor"}]
        self.build_cores = build_cores or sorted(os.sched_getaffinity(0))
        self.shared = shared_servers  # other clients measure on the same servers
        self.engine = None
        self.size(build_workers or len(self.build_cores))

    def size(self, build_workers: int, cores: list[int] | None = None) -> None:
        """Build workers (and search threads) of this client, and the cores they and the search run on
        (None: all this process may use); before its first tune() call."""
        if self.engine is not None:
            log.warning("client %d: build workers already started; size(%d) ignored", self.client_id, build_workers)
            return
        self.build_workers = max(1, build_workers)
        if cores:
            self.build_cores = sorted(cores)
        # Ray sets OMP_NUM_THREADS=1 in an actor that asks for <= 1 CPU, and TVM's thread pool falls
        # back to OMP_NUM_THREADS: the evolutionary search then runs on one thread, about a third as fast
        # (benchmarks/RESULTS.md, "search threads in a Ray actor"). Give the search this client's cores.
        threads = str(self.build_workers)
        os.environ["TVM_NUM_THREADS"] = threads
        os.environ["OMP_NUM_THREADS"] = threads

    def where(self, run_dir: str) -> dict:
        """The node this client runs on, the cores it may use (the report's `ran_on`) and whether it
        sees `run_dir`, which the coordinator made on its own machine for this run's shards."""
        import ray

        return {"node_id": ray.get_runtime_context().get_node_id(), "ip": ray.util.get_node_ip_address(),
                "cores": len(os.sched_getaffinity(0)), "core_ids": sorted(os.sched_getaffinity(0)), "pid": os.getpid(),
                "sees_out": os.path.isdir(run_dir)}

    def _setup(self) -> None:
        if self.engine is not None:
            return
        import tvm

        from ..clients.measurement import Measurement
        from ..clients.tunekit_engine import make_engine
        from ..config import TuneConfig
        from ..records.tuning_database import open_for_tuning, read_known, seeds_per_workload
        from ..shares.share import Share

        self.target = tvm.target.Target(self.target_spec)
        self.config = TuneConfig(**self.config_dict)
        os.sched_setaffinity(0, self.build_cores)  # the search runs in this process
        measurement = Measurement(fleets=_fleet_addresses(self.fleets), device_kind=Share.from_label(self.share_label).kind,
                                  label=self.share_label, shared=self.shared, secret=self.rpc_secret)
        # The search gets this client's part of the node's cores, as the build pool does, not all of them:
        # with a search thread per core of the node in every client, 4 clients on 32 cores ran 4 search
        # threads per core, and 2 clients on 16 cores 2: the more clients on a node, the more threads per core
        self.engine = make_engine(target=self.target, measurement=measurement, config=self.config,
                                  work_dir=self.work_dir, cores=self.build_cores, build_workers=self.build_workers,
                                  search_threads=self.build_workers)
        self.database = open_for_tuning(self.shard_dir, seeds=seeds_per_workload(self.config.population))
        self.known = read_known(self.known_dir) if self.known_dir and os.path.isdir(self.known_dir) else None

    def prepare(self) -> None:
        """Import TVM and start the engine (its build workers start importing TVM too) before the first
        tune() call, while the coordinator's pipeline still compiles and times the untuned model."""
        self._setup()

    def tune(self, *, tasks: list[dict], budgets: list[int], pool, improving_only: bool = True,
             measure_untuned: bool = True, resume_counts: bool = False, time_budget_s: float | None = None,
             fused: list[dict] | None = None) -> dict:
        """Tune `tasks` (name, mod JSON, weight) within `budgets`; unused trials go to `pool`. `time_budget_s`: what
        is left of the run's --time-budget (a leftover round, a restarted client), else the config's. `fused`:
        tasks built as they are (fused attention) whose kernels of another kind this client tries."""
        import dataclasses

        from ..clients import warm_start
        from ..clients.search_loop import SearchRequest
        from .budget import RemotePool

        ready = self.engine is not None  # prepare() ran in the coordinator's warm-up
        self._setup()
        # No cooperative() signal handling here: Ray runs actor methods off the main thread.
        outcome = self.engine.search(SearchRequest(
            extracted_tasks=_tasks_from_json(tasks, self.target), target=self.target, database=self.database,
            config=self.config if time_budget_s is None else dataclasses.replace(self.config, time_budget_s=time_budget_s),
            work_dir=os.path.join(self.work_dir, f"client-{self.client_id}"), measure_untuned=measure_untuned, task_budgets=budgets, pool=RemotePool(pool) if pool is not None else None,
            known_database=self.known, count_existing=resume_counts, improving_only=improving_only,
            tag={"client": self.client_id}, warm_start=warm_start.open_sources(self.config.warm_start),
            records_dirs={self.share_label: self.shard_dir},  # kernels of another kind: merged with the shard
            fused_tasks=_tasks_from_json(fused or [], self.target)))
        result = dataclasses.asdict(outcome)
        result["hung_candidates"] = self.engine.runner.hangs
        # seconds per candidate inside this client's build workers, by phase: whether a busier machine slows the
        # builds themselves or only the batches' waits for them (phases.build_s is the stage thread's wall)
        result["build_profile"] = self.engine.describe()["build_profile"]
        result["runner_faults"] = self.engine.runner.fault_counts()
        result["pid"] = os.getpid()
        result["ready_before_tuning"] = ready
        return result

    def pid(self) -> int:
        return os.getpid()

    def shutdown(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()
            self.engine = None


def client_class(num_cpus: float):
    import ray

    return ray.remote(num_cpus=num_cpus)(TuningClientImpl)
