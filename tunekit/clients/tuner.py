"""The tuning client: MetaSchedule search with an XGBoost cost model, measuring only on the share's servers.

Two engines, chosen by `TuneConfig.engine`:
- "tunekit" (default): persistent build workers, persistent RPC sessions, tunekit's overlapped
  search loop with de-duplication and a per-phase time breakdown;
- "stock": `ms.tune_tasks` with `LocalBuilder` and `RPCRunner`, exactly as TVM ships them: the
  baseline the benchmark compares against.
"""
from __future__ import annotations

import contextlib
import logging
import os
import time
from dataclasses import dataclass, field

from ..config import TuneConfig
from .progress import ProgressBar, make_progress_callback

log = logging.getLogger("tunekit.tuner")


@dataclass
class TuningOutcome:
    database: object
    trials_done: int
    trials_failed: int
    wall_s: float
    tasks: list[dict]
    engine: str = "tunekit"
    trials_cached: int = 0
    phases: dict = field(default_factory=dict)
    session_failures: int = 0
    faults: dict = field(default_factory=dict)  # the runner's fault counts (session_runner.fault_counts)


@dataclass
class Measurement:
    """Where candidates are measured: the share's tracker, and how the share's cores are laid out."""

    tracker_port: int
    key: str
    servers: int
    device_kind: str                    # "cpu" or "gpu"
    share_cores: list[int] | None = None  # CPU share: the cores the servers are pinned to
    host: str = "127.0.0.1"
    share_env: dict = field(default_factory=dict)  # what pins a process to the share (MPS vars on GPU)
    on_hang: object = None  # callable(port): stop the server a hung candidate holds (the fleet's)
    secret: bytes | None = field(default=None, repr=False)  # the warm servers' shared secret (never logged)


def builder_cores(measurement: Measurement, *, overlap: bool) -> list[int]:
    """Cores for building and searching. When they overlap a CPU measurement they stay off the
    share's cores (if there are others), so that building never disturbs a running measurement."""
    allowed = sorted(os.sched_getaffinity(0))
    if overlap and measurement.device_kind == "cpu" and measurement.share_cores:
        others = [c for c in allowed if c not in measurement.share_cores]
        if others:
            return others
    return allowed


def overlap_allowed(measurement: Measurement, config: TuneConfig) -> bool:
    if config.overlap in (True, False):
        return config.overlap
    # GPU: building is CPU work and does not disturb the measurement. CPU: the search and the
    # builders would share the machine with the share being measured, and giving them all the
    # cores while the (short) measurement runs alone is faster than splitting the cores.
    return measurement.device_kind == "gpu"


@contextlib.contextmanager
def _process_on(cores: list[int]):
    # The search (evolutionary mutation, XGBoost) runs in this process: keep it off a CPU share's cores.
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cores)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def tune_tasks(*, extracted_tasks, target, database, work_dir: str, measurement: Measurement,
               config: TuneConfig, show_progress: bool) -> TuningOutcome:
    from .intrinsics import prepare_metaschedule_logging

    prepare_metaschedule_logging()
    progress = ProgressBar(total=config.trials, show=show_progress)
    try:
        if config.engine == "stock":
            return _tune_stock(extracted_tasks, target, database, work_dir, measurement, config, progress)
        return _tune_tunekit(extracted_tasks, target, database, work_dir, measurement, config, progress)
    finally:
        progress.close()


def _tune_tunekit(extracted_tasks, target, database, work_dir, measurement, config, progress) -> TuningOutcome:
    from tvm.s_tir import meta_schedule as ms

    from .build_pool import BuildPool
    from .search_loop import run_search
    from .session_runner import RunnerConfig, SessionRunner

    from ..interrupts import cooperative
    from .intrinsics import import_for_target

    import_for_target(target.kind.name)
    overlap = overlap_allowed(measurement, config)
    cores = builder_cores(measurement, overlap=overlap)
    builder = BuildPool(workers=config.builder_workers or len(cores), timeout_s=config.build_timeout_s,
                        cores=cores, cuda_aot=target.kind.name == "cuda",
                        artifact_dir=os.path.join(work_dir, "artifacts"))
    runner = SessionRunner(RunnerConfig(tracker_host=measurement.host, tracker_port=measurement.tracker_port,
                                        key=measurement.key, sessions=measurement.servers,
                                        candidate_timeout_s=config.session_timeout_s,
                                        min_repeat_ms=config.min_repeat_ms,
                                        servers_gone_timeout_s=config.servers_gone_timeout_s,
                                        label=measurement.key.removeprefix("tunekit-"),
                                        secret=measurement.secret), on_hang=measurement.on_hang)
    log.info("engine tunekit: %d build workers on cores %s, %d sessions, overlap %s",
             builder.workers, cores, measurement.servers, overlap)
    try:
        with cooperative(), _process_on(cores):
            outcome = run_search(extracted_tasks=extracted_tasks, target=target, database=database,
                                 builder=builder, runner=runner,
                                 cost_model=ms.cost_model.XGBModel(num_tuning_cores=len(cores)),
                                 config=config, search_threads=len(cores), work_dir=work_dir,
                                 overlap=overlap, progress=progress, measure_untuned=config.measure_untuned_tasks)
    finally:
        runner.shutdown()
        builder.shutdown()
    return TuningOutcome(database, outcome.trials_done, outcome.trials_failed, outcome.wall_s, outcome.tasks,
                         engine="tunekit", trials_cached=outcome.trials_cached,
                         phases={**outcome.phases, "overlap": overlap, "build_workers": builder.workers,
                                 "hung_candidates": runner.hangs},
                         session_failures=outcome.session_failures, faults=runner.fault_counts())


def _stock_runner_kind(measurement: Measurement, config: TuneConfig) -> str:
    if config.stock_runner != "auto":
        return config.stock_runner
    return "local" if measurement.device_kind == "gpu" else "rpc"


def _tune_stock(extracted_tasks, target, database, work_dir, measurement, config, progress) -> TuningOutcome:
    """TVM's own path, untouched: the baseline."""
    from tvm.s_tir import meta_schedule as ms

    search_threads = len(measurement.share_cores) if measurement.share_cores else max(1, len(os.sched_getaffinity(0)))
    contexts, weights = ms.relax_integration.extracted_tasks_to_tune_contexts(
        extracted_tasks, work_dir, num_threads=search_threads, seed=config.seed)
    names = [t.task_name for t in extracted_tasks]
    callback = make_progress_callback(progress=progress, task_names=names)
    rpc_config = ms.runner.RPCConfig(tracker_host=measurement.host, tracker_port=measurement.tracker_port,
                                     tracker_key=measurement.key, session_timeout_sec=config.session_timeout_s)
    evaluator = ms.runner.EvaluatorConfig(number=3, repeat=1, min_repeat_ms=config.min_repeat_ms,
                                          enable_cpu_cache_flush=False)
    builder = ms.builder.LocalBuilder(max_workers=config.builder_workers or max(1, len(os.sched_getaffinity(0))),
                                      timeout_sec=config.build_timeout_s)
    if _stock_runner_kind(measurement, config) == "local":
        # The stock RPC server cannot measure CUDA well (fork mode: cudaErrorInitializationError;
        # --no-fork: ~8 s a measurement), so stock's best working setup on a GPU is LocalRunner,
        # whose worker inherits this process's environment: put the MPS share there first.
        os.environ.update(measurement.share_env)
        runner = ms.runner.LocalRunner(evaluator_config=evaluator, timeout_sec=config.session_timeout_s)
    else:
        runner = ms.runner.RPCRunner(rpc_config=rpc_config, evaluator_config=evaluator,
                                     max_workers=measurement.servers)
    started = time.time()
    ms.tune_tasks(tasks=contexts, task_weights=weights, work_dir=work_dir, max_trials_global=config.trials,
                  num_trials_per_iter=config.trials_per_iter, builder=builder, runner=runner, database=database,
                  cost_model=ms.cost_model.XGBModel(num_tuning_cores=search_threads),
                  measure_callbacks=[*ms.measure_callback.MeasureCallback.create("default"), callback],
                  task_scheduler="gradient")
    wall = time.time() - started
    tasks = [{"name": task.task_name, "weight": int(task.weight),
              "tuned_us": round(callback.best_us[i], 3) if i in callback.best_us else None}
             for i, task in enumerate(extracted_tasks)]
    return TuningOutcome(database, callback.done, callback.failed, wall, tasks, engine="stock",
                         phases={"wall_s": round(wall, 3), "stock_runner": _stock_runner_kind(measurement, config)})
