"""TVM's own tuning path, untouched: `ms.tune_tasks` with `LocalBuilder` and `RPCRunner` (or
`LocalRunner` on a GPU). The baseline `benchmarks/tuning_time.py` compares tunekit's engine with."""
from __future__ import annotations

import os
import time

from .design_spaces import stock_contexts, stock_seed
from .measurement import TuningOutcome
from .progress import make_progress_callback


# Milliseconds per measurement in TVM's time evaluator (its RPCRunner default is 0: noisy on a share).
MIN_REPEAT_MS = 20


def stock_runner_kind(device_kind: str) -> str:
    # The stock RPC server cannot measure CUDA well (fork mode: cudaErrorInitializationError;
    # --no-fork: ~8 s a measurement), so stock's best working setup on a GPU is LocalRunner.
    return "local" if device_kind == "gpu" else "rpc"


class StockEngine:
    name = "stock"

    def tune(self, *, tasks, target, database, work_dir, measurement, config, progress,
             records_dir: str | None = None, fused_tasks: list | None = None,
             task_models: dict | None = None) -> TuningOutcome:
        from tvm.s_tir import meta_schedule as ms

        from ..metaschedule_env import prepare_metaschedule_logging

        prepare_metaschedule_logging()
        threads = len(measurement.share_cores) if measurement.share_cores else max(1, len(os.sched_getaffinity(0)))
        # TVM's tensor-core tiling rule fails on some seeds' draws, and Tune cannot retry (clients.design_spaces)
        seed, passed_over = stock_seed(tasks, work_dir, threads=threads, seed=config.seed)
        prepare_metaschedule_logging()
        contexts, weights = ms.relax_integration.extracted_tasks_to_tune_contexts(
            tasks, work_dir, num_threads=threads, seed=seed)
        contexts, weights, left_out = stock_contexts(contexts, weights)
        tasks = [t for t in tasks if t.task_name not in left_out]  # they keep their untuned kernel
        callback = make_progress_callback(progress=progress, task_names=[t.task_name for t in tasks])
        builder = ms.builder.LocalBuilder(max_workers=config.builder_workers or max(1, len(os.sched_getaffinity(0))),
                                          timeout_sec=config.build_timeout_s)
        runner = self._runner(measurement, config)
        started = time.time()
        ms.tune_tasks(tasks=contexts, task_weights=weights, work_dir=work_dir, max_trials_global=config.trials,
                      num_trials_per_iter=config.trials_per_iter, builder=builder, runner=runner, database=database,
                      cost_model=ms.cost_model.XGBModel(num_tuning_cores=threads),
                      measure_callbacks=[*ms.measure_callback.MeasureCallback.create("default"), callback],
                      task_scheduler="gradient")
        wall = time.time() - started
        rows = [{"name": task.task_name, "weight": int(task.weight),
                 "tuned_us": round(callback.best_us[i], 3) if i in callback.best_us else None}
                for i, task in enumerate(tasks)]
        return TuningOutcome(callback.done, callback.failed, wall, rows, engine=self.name,
                             phases={"wall_s": round(wall, 3),
                                     "stock_runner": stock_runner_kind(measurement.device_kind),
                                     "seed": seed, **({"seeds_passed_over": passed_over} if passed_over else {}),
                                     **({"tasks_left_out": left_out} if left_out else {})})

    @staticmethod
    def _runner(measurement, config):
        from tvm.s_tir import meta_schedule as ms

        evaluator = ms.runner.EvaluatorConfig(number=3, repeat=1, min_repeat_ms=MIN_REPEAT_MS,
                                              enable_cpu_cache_flush=False)
        if stock_runner_kind(measurement.device_kind) == "local":
            # LocalRunner's worker inherits this process's environment: put the MPS share there first.
            os.environ.update(measurement.share_env)
            return ms.runner.LocalRunner(evaluator_config=evaluator, timeout_sec=config.session_timeout_s)
        fleet = measurement.fleets[0]
        rpc_config = ms.runner.RPCConfig(tracker_host=fleet.host, tracker_port=fleet.port, tracker_key=fleet.key,
                                         session_timeout_sec=config.session_timeout_s)
        return ms.runner.RPCRunner(rpc_config=rpc_config, evaluator_config=evaluator, max_workers=fleet.sessions)
