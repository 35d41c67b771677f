"""A tuning client: a Ray actor that tunes one shard of a model's tasks for one share.

It owns its build workers, its XGBoost cost model and its database shard, and measures on the
share's servers (all of them, through one FanoutRunner). Everything it measures is committed to
its shard as it completes, so a client that dies loses nothing: the coordinator starts a new one
on the same shard, which counts what is there against the budgets and never re-measures it.
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


class TuningClientImpl:
    def __init__(self, *, client_id: int, share_label: str, target: dict, config: dict, work_dir: str,
                 shard_dir: str, known_dir: str | None, fleets: list[dict], build_workers: int,
                 build_cores: list[int] | None = None, shared_servers: bool = True, rpc_secret: bytes | None = None):
        self.client_id = client_id
        self.rpc_secret = rpc_secret  # what the fleets' servers demand (a file path may not exist on this node)
        self.share_label = share_label
        self.target_spec = target
        self.config_dict = config
        self.work_dir = work_dir
        self.shard_dir = shard_dir
        self.known_dir = known_dir
        self.fleets = fleets  # [{"host", "port", "key", "sessions", "actor"}]
        self.build_workers = max(1, build_workers)
        self.build_cores = build_cores or sorted(os.sched_getaffinity(0))
        self.shared = shared_servers  # other clients measure on the same servers
        # Ray sets OMP_NUM_THREADS=1 in an actor that asks for <= 1 CPU, and TVM's thread pool falls
        # back to OMP_NUM_THREADS: the evolutionary search then ran on one thread (seen on the H100:
        # 0.24 trials/s against 0.72 in one process). Give the search this client's cores.
        threads = str(max(1, build_workers))
        os.environ["TVM_NUM_THREADS"] = threads
        os.environ["OMP_NUM_THREADS"] = threads
        self._ready = False

    def _setup(self) -> None:
        if self._ready:
            return
        import tvm
        from tvm.s_tir import meta_schedule as ms

        from ..clients.build_pool import BuildPool
        from ..clients.fanout_runner import FanoutRunner
        from ..clients.intrinsics import import_for_target, prepare_metaschedule_logging
        from ..clients.session_runner import RunnerConfig, SessionRunner
        from ..config import TuneConfig
        from ..records.database import open_database

        prepare_metaschedule_logging()
        self.target = tvm.target.Target(self.target_spec)
        import_for_target(self.target.kind.name)
        self.config = TuneConfig(**self.config_dict)
        os.sched_setaffinity(0, self.build_cores)  # the search runs in this process
        self.builder = BuildPool(workers=self.build_workers, timeout_s=self.config.build_timeout_s,
                                 cores=self.build_cores, cuda_aot=self.target.kind.name == "cuda",
                                 artifact_dir=os.path.join(self.work_dir, "artifacts"))
        runners = []
        for fleet in self.fleets:
            actor = fleet.get("actor")

            def on_hang(port, actor=actor):
                if actor is not None:
                    actor.stop_server_on_port.remote(port)

            runners.append(SessionRunner(RunnerConfig(tracker_host=fleet["host"], tracker_port=fleet["port"],
                                                      key=fleet["key"], sessions=fleet["sessions"],
                                                      candidate_timeout_s=self.config.session_timeout_s,
                                                      # a fleet lost with its node is given up after the
                                                      # configured timeout (was: RunnerConfig's 120 s)
                                                      servers_gone_timeout_s=self.config.servers_gone_timeout_s,
                                                      min_repeat_ms=self.config.min_repeat_ms,
                                                      label=self.share_label, release_idle_sessions=self.shared,
                                                      secret=self.rpc_secret),
                                         on_hang=on_hang))
        self.runner = FanoutRunner(runners)
        self.database = open_database(self.shard_dir)
        self.known = open_database(self.known_dir) if self.known_dir and os.path.isdir(self.known_dir) else None
        self.cost_model = ms.cost_model.XGBModel(num_tuning_cores=len(self.build_cores))
        self._ready = True

    def tune(self, *, tasks: list[dict], budgets: list[int], pool, improving_only: bool = True,
             measure_untuned: bool = True, resume_counts: bool = False) -> dict:
        """Tune `tasks` (name, mod JSON, weight) within `budgets`; unused trials go to `pool`."""
        import dataclasses

        from ..clients.search_loop import run_search
        from .budget import RemotePool

        self._setup()
        extracted = _tasks_from_json(tasks, self.target)
        overlap = self.config.overlap if self.config.overlap in (True, False) else self.target.kind.name == "cuda"
        # No cooperative() signal handling here: Ray runs actor methods off the main thread.
        outcome = run_search(extracted_tasks=extracted, target=self.target, database=self.database,
                             builder=self.builder, runner=self.runner, cost_model=self.cost_model,
                             config=self.config, search_threads=len(self.build_cores),
                             work_dir=os.path.join(self.work_dir, f"client-{self.client_id}"), overlap=overlap,
                             measure_untuned=measure_untuned, task_budgets=budgets,
                             pool=RemotePool(pool) if pool is not None else None,
                             known_database=self.known, count_existing=resume_counts,
                             improving_only=improving_only, tag={"client": self.client_id})
        result = dataclasses.asdict(outcome)
        result["hung_candidates"] = self.runner.hangs
        result["runner_faults"] = self.runner.fault_counts()
        result["pid"] = os.getpid()
        return result

    def pid(self) -> int:
        return os.getpid()

    def shutdown(self) -> None:
        if self._ready:
            self.runner.shutdown()
            self.builder.shutdown()
            self._ready = False


def client_class(num_cpus: float):
    import ray

    return ray.remote(num_cpus=num_cpus)(TuningClientImpl)
