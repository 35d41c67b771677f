"""What one cost-model update costs, by XGBoost thread count, on idle cores and beside busy build workers.

tunekit trains the XGBoost cost model on its own thread after every measured batch, while the search
and the build pool keep the cores busy (with several shares, one model per share). This times
`XGBModel.update` with batches of 16 real candidates of the model's heaviest fp16 tensor-core task on
the CUDA target (no GPU needed; run times are random), `--batches` updates per setting (the data grows
as in a run), for each thread count in `--threads`:
  1. on idle cores,
  2. while a BuildPool of `--workers` builds candidates without pause (benchmarks/search_contention.py),
  3. with `--spinners` N > 0: while N processes keep N cores fully busy, standing in for the search's threads
     (which in a run are busy whenever the loop searches).

  python benchmarks/cost_model_contention.py --model resnet18.onnx --threads 1,8 --workers 2
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def sixteen_candidates(task, target):
    """One batch of MeasureCandidates of `task` (random sampling, no evolution)."""
    from tvm.s_tir import meta_schedule as ms

    work = tempfile.mkdtemp(prefix="tunekit-cm-contention-")
    strategy = ms.search_strategy.EvolutionarySearch(population_size=64, genetic_num_iters=0, init_min_unmeasured=16)
    (ctx,), _ = ms.relax_integration.extracted_tasks_to_tune_contexts([task], work, strategy=strategy,
                                                                     num_threads=len(os.sched_getaffinity(0)), seed=0)
    ctx.pre_tuning(max_trials=16, num_trials_per_iter=16, design_spaces=ctx.generate_design_space(),
                   database=ms.database.MemoryDatabase(), cost_model=ms.cost_model.RandomModel())
    return ctx, ctx.generate_measure_candidates()


def time_updates(ctx, candidates, threads: int, batches: int) -> list[tuple[float, float]]:
    """(wall s, CPU s of this process) per update, `batches` updates of one fresh model."""
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule.runner import RunnerResult

    rng, model, out = random.Random(0), ms.cost_model.XGBModel(num_tuning_cores=threads), []
    for _ in range(batches):
        results = [RunnerResult([rng.uniform(1e-5, 1e-3)], None) for _ in candidates]
        wall, cpu = time.perf_counter(), time.process_time()
        model.update(ctx, candidates, results)
        out.append((round(time.perf_counter() - wall, 3), round(time.process_time() - cpu, 3)))
    return out


class Spinners:
    """`n` processes that keep a core busy each, until the block ends."""

    def __init__(self, n: int):
        self.n = n

    def __enter__(self):
        import subprocess

        self.procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(self.n)]
        return self

    def __exit__(self, *exc):
        for proc in self.procs:
            proc.kill()
            proc.wait()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="an ONNX file")
    parser.add_argument("--target", default="nvidia/nvidia-h100")
    parser.add_argument("--threads", default=f"1,{len(os.sched_getaffinity(0)) * 4}")
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--batches", type=int, default=12)
    parser.add_argument("--spinners", type=int, default=0)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)

    import tvm

    from search_contention import BackgroundBuilds, heaviest_task

    target = tvm.target.Target(args.target)
    task, mods = heaviest_task(args.model, target)
    ctx, candidates = sixteen_candidates(task, target)
    print(f"task {task.task_name}, {len(os.sched_getaffinity(0))} cores, {args.workers} build workers", flush=True)

    rows = []
    for load in ("none", "builds", "spinners")[:3 if args.spinners else 2]:
        for threads in (int(t) for t in args.threads.split(",")):
            if load == "builds":
                with BackgroundBuilds(mods, target, workers=args.workers, nice=0):
                    times = time_updates(ctx, candidates, threads, args.batches)
            elif load == "spinners":
                with Spinners(args.spinners):
                    times = time_updates(ctx, candidates, threads, args.batches)
            else:
                times = time_updates(ctx, candidates, threads, args.batches)
            label = {"none": "idle", "builds": f"{args.workers} build workers",
                     "spinners": f"{args.spinners} busy processes"}[load]
            rows.append({"load": label, "xgboost threads": threads, "updates": times,
                         "median wall s": statistics.median(w for w, _ in times),
                         "median cpu s": statistics.median(c for _, c in times)})
            print({k: v for k, v in rows[-1].items() if k != "updates"}, flush=True)
    print("\n| beside | XGBoost threads | update, median wall s | median CPU s |\n| --- | ---: | ---: | ---: |")
    for row in rows:
        print(f"| {row['load']} | {row['xgboost threads']} | {row['median wall s']:.3f} | {row['median cpu s']:.3f} |")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
