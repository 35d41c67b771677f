"""What the build workers do to the evolutionary search when both run at once, by build-worker niceness.

In a tuning run the loop thread searches the next batch while the build pool compiles earlier ones
(the search sets the pace: benchmarks/results/h100-resnet18-share-study/). This times search batches
of the model's heaviest fp16 tensor-core task on the CUDA target (no GPU needed: search only lowers and verifies)
  1. alone,
  2. while a BuildPool of `--workers` builds that task's candidates without pause, workers at nice 0,
  3. the same with the workers at `--nice`,
and counts the candidates built meanwhile. Rounds alternate 2 and 3 so drift hits both alike.

  python benchmarks/search_contention.py --model resnet18.onnx --workers 2 --nice 10
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def search_batches(task, target, batches: int, threads: int, seed: int) -> list[float]:
    """Seconds per search batch of 16 (tunekit's CUDA setting 128:2:16), runs answered at random."""
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule.runner import RunnerResult

    strategy = ms.search_strategy.EvolutionarySearch(population_size=128, genetic_num_iters=2, init_min_unmeasured=16)
    with tempfile.TemporaryDirectory(prefix="tunekit-contention-") as work:
        (ctx,), _ = ms.relax_integration.extracted_tasks_to_tune_contexts([task], work, strategy=strategy,
                                                                         num_threads=threads, seed=seed)
        cost_model = ms.cost_model.XGBModel(num_tuning_cores=threads)
        ctx.pre_tuning(max_trials=batches * 16, num_trials_per_iter=16, design_spaces=ctx.generate_design_space(),
                       database=ms.database.MemoryDatabase(), cost_model=cost_model)
        rng, seconds = random.Random(seed), []
        for _ in range(batches):
            started = time.perf_counter()
            candidates = ctx.generate_measure_candidates()
            seconds.append(time.perf_counter() - started)
            results = [RunnerResult([rng.uniform(1e-4, 1e-3)], None) for _ in candidates]
            cost_model.update(ctx, candidates, results)
            ctx.notify_runner_results(candidates, results)
        ctx.post_tuning()
    return seconds


class BackgroundBuilds:
    """A BuildPool kept busy with `mods` (round robin) until stopped; counts what it built."""

    def __init__(self, mods, target, *, workers: int, nice: int):
        from tunekit.clients.build_pool import BuildPool

        self.pool = BuildPool(workers=workers, timeout_s=300.0, cuda_aot=True, nice=nice)
        self.pool.wait_until_warm()
        self.mods, self.target, self.built = mods, target, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        from tvm.s_tir.meta_schedule.builder import BuilderInput

        i = 0
        while not self._stop.is_set():
            futures = self.pool.submit([BuilderInput(self.mods[(i + k) % len(self.mods)], self.target)
                                        for k in range(self.pool.workers)])
            i += self.pool.workers
            for future in futures:
                self.built += self.pool.collect(future)[0].error_msg is None

    def __enter__(self):
        self.started = time.perf_counter()
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self.started
        self._stop.set()
        self._thread.join()
        self.pool.shutdown()


def heaviest_task(model_path: str, target):
    """(the model's heaviest fp16 task on `target`, 16 of its candidates as IRModules to build)."""
    from build_compile import sample_candidates
    from tunekit.metaschedule_env import import_for_target
    from tunekit.frontend.onnx_loader import import_to_relax, load_onnx, model_inputs
    from tunekit.frontend.precision import prepare
    from tunekit.frontend.tasks import extract_tasks

    import_for_target("cuda")
    model = load_onnx(model_path)
    prepared, _ = prepare(import_to_relax(model, model_inputs(model, {})), target, precision="fp16")
    sampled = sample_candidates(model_path, target, 16, 16, "fp16")  # 16 of the heaviest task
    task = next(t for t in extract_tasks(prepared, target) if t.task_name == sampled[0][0])
    return task, [mod for _, mod in sampled]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="an ONNX file")
    parser.add_argument("--target", default="nvidia/nvidia-h100")
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--nice", type=int, default=10)
    parser.add_argument("--batches", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)

    import tvm

    target = tvm.target.Target(args.target)
    task, mods = heaviest_task(args.model, target)
    threads = len(os.sched_getaffinity(0))
    print(f"task {task.task_name}, {threads} search threads, {args.workers} build workers, "
          f"{len(mods)} candidates to build", flush=True)

    rows = [{"setting": "search alone", "search_s": search_batches(task, target, args.batches, threads, 0)}]
    print(rows[-1], flush=True)
    for r in range(args.rounds):
        for nice in ((0, args.nice) if r % 2 == 0 else (args.nice, 0)):
            with BackgroundBuilds(mods, target, workers=args.workers, nice=nice) as builds:
                secs = search_batches(task, target, args.batches, threads, 0)
            rows.append({"setting": f"with builds at nice {nice}", "search_s": secs,
                         "built_per_s": round(builds.built / builds.seconds, 3)})
            print(rows[-1], flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
