"""The tuning client: MetaSchedule search with an XGBoost cost model, measuring only on the share's servers."""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass

from ..config import TuneConfig
from .progress import make_progress_callback

log = logging.getLogger("tunekit.tuner")


@dataclass
class TuningOutcome:
    database: object
    trials_done: int
    trials_failed: int
    wall_s: float
    tasks: list[dict]


def make_runner(*, tracker_port: int, key: str, config: TuneConfig, host: str = "127.0.0.1"):
    from tvm.s_tir import meta_schedule as ms

    rpc_config = ms.runner.RPCConfig(tracker_host=host, tracker_port=tracker_port, tracker_key=key,
                                     session_timeout_sec=config.session_timeout_s)
    evaluator = ms.runner.EvaluatorConfig(number=3, repeat=1, min_repeat_ms=20, enable_cpu_cache_flush=False)
    return ms.runner.RPCRunner(rpc_config=rpc_config, evaluator_config=evaluator, max_workers=config.servers)


def make_builder(config: TuneConfig):
    from tvm.s_tir import meta_schedule as ms

    workers = config.builder_workers or max(1, len(os.sched_getaffinity(0)))
    return ms.builder.LocalBuilder(max_workers=workers, timeout_sec=config.build_timeout_s)


def tune_tasks(*, extracted_tasks, target, database, work_dir: str, tracker_port: int, key: str,
               config: TuneConfig, search_threads: int, show_progress: bool) -> TuningOutcome:
    from tvm.s_tir import meta_schedule as ms

    contexts, weights = ms.relax_integration.extracted_tasks_to_tune_contexts(
        extracted_tasks, work_dir, num_threads=search_threads, seed=config.seed)
    names = [t.task_name for t in extracted_tasks]
    progress = make_progress_callback(total_trials=config.trials, task_names=names, show=show_progress)
    callbacks = [*ms.measure_callback.MeasureCallback.create("default"), progress]
    started = time.time()
    try:
        ms.tune_tasks(tasks=contexts, task_weights=weights, work_dir=work_dir,
                      max_trials_global=config.trials, num_trials_per_iter=config.trials_per_iter,
                      builder=make_builder(config),
                      runner=make_runner(tracker_port=tracker_port, key=key, config=config),
                      database=database,
                      cost_model=ms.cost_model.XGBModel(num_tuning_cores=search_threads),
                      measure_callbacks=callbacks, task_scheduler="gradient")
    finally:
        progress.close()
    wall = time.time() - started
    tasks = []
    for i, task in enumerate(extracted_tasks):
        best = progress.best_us.get(i)
        tasks.append({"name": task.task_name, "weight": int(task.weight),
                      "tuned_us": round(best, 3) if best is not None else None})
    return TuningOutcome(database, progress.done, progress.failed, wall, tasks)
