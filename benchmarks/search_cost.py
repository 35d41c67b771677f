"""What one batch of MetaSchedule's evolutionary search costs, by search setting, without a GPU.

Times `generate_measure_candidates` for one task of an example model on a target (CUDA works on a
machine without a GPU: search only lowers and verifies, it does not run). Each batch is answered
with random run times so the search state advances as in a real run.

  python benchmarks/search_cost.py --model resnet18 --target nvidia/nvidia-h100 --task conv2d9_add7_add8 \
      --settings 256:3:50,256:3:16,128:2:16
Settings are POPULATION:GENERATIONS:VALID_SAMPLES. Prints seconds per batch for each.
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time


def time_setting(tasks, index: int, target, population: int, generations: int, samples: int, *, batches: int,
                 batch: int, threads: int, profile: bool = False, shared_memory: str = "static") -> list[float]:
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule.runner import RunnerResult

    from tunekit.clients.search_loop import tasks_to_search

    strategy = ms.search_strategy.EvolutionarySearch(population_size=population, genetic_num_iters=generations,
                                                     init_min_unmeasured=samples)
    with tempfile.TemporaryDirectory(prefix="tunekit-search-cost-") as work:
        (ctx,), _ = ms.relax_integration.extracted_tasks_to_tune_contexts(
            tasks_to_search([tasks[index]], target, shared_memory=shared_memory), work, strategy=strategy,
            num_threads=threads, seed=0)
        cost_model = ms.cost_model.XGBModel(num_tuning_cores=threads)
        ctx.pre_tuning(max_trials=batches * batch, num_trials_per_iter=batch, design_spaces=ctx.generate_design_space(),
                       database=ms.database.MemoryDatabase(), cost_model=cost_model)
        rng = random.Random(0)
        seconds = []
        for _ in range(batches):
            started = time.perf_counter()
            with ms.Profiler() as profiler:  # MetaSchedule's own scopes: sampling, evolution, prediction
                candidates = ctx.generate_measure_candidates()
            if profile:
                print(profiler.table(), flush=True)
            seconds.append(time.perf_counter() - started)
            results = [RunnerResult([rng.uniform(1e-4, 1e-3)], None) for _ in candidates]
            cost_model.update(ctx, candidates, results)
            ctx.notify_runner_results(candidates, results)
        ctx.post_tuning()
        if profile:  # MetaSchedule's per-task log: how many samples and mutations its checks rejected
            import glob

            for path in glob.glob(os.path.join(work, "logs", "*.log")):
                with open(path) as fh:
                    print("".join(line for line in fh if "summary" in line or "failure" in line.lower()
                                  or line.startswith(" ") or "Sample" in line or "Evolve" in line)[-6000:])
    return seconds


def example_tasks(model_name: str, target_spec: str, precision: str):
    """(target, tasks) of an example model (tunekit.models.examples) after tunekit's conversion for `precision`;
    `target_spec` is a tag or JSON."""
    import json

    import tvm

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from tunekit.metaschedule_env import import_for_target
    from tunekit.frontend.onnx_loader import import_to_relax, model_inputs
    from tunekit.frontend.precision import prepare
    from tunekit.frontend.tasks import extract_tasks
    from tunekit.models import examples

    target = tvm.target.Target(json.loads(target_spec) if target_spec.startswith("{") else target_spec)
    import_for_target(target.kind.name)
    model = getattr(examples, model_name)()
    prepared, _ = prepare(import_to_relax(model, model_inputs(model, {})), target, precision=precision)
    return target, extract_tasks(prepared, target)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--target", default="nvidia/nvidia-h100", help="a target tag or JSON")
    parser.add_argument("--task", default="conv2d9_add7_add8", help="part of the task's name")
    parser.add_argument("--settings", default="256:3:50,256:3:16,128:2:16")
    parser.add_argument("--batches", type=int, default=3)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--precision", default="fp32", choices=("fp32", "fp16", "auto"),
                        help="tunekit's conversion before extraction (fp16: NHWC, tensor-core tasks on CUDA)")
    parser.add_argument("--profile", action="store_true", help="print MetaSchedule's profiler table per batch")
    parser.add_argument("--shared-memory", default="static",
                        help="comma-separated --gpu-shared-memory modes, each timed in turn for every setting")
    args = parser.parse_args()

    target, tasks = example_tasks(args.model, args.target, args.precision)
    index = next((i for i, t in enumerate(tasks) if args.task in t.task_name), None)
    if index is None:
        sys.exit(f"no task matches {args.task!r}: {', '.join(t.task_name for t in tasks)}")
    threads = int(os.environ.get("SEARCH_THREADS", 0)) or len(os.sched_getaffinity(0))
    print(f"{args.model} task {tasks[index].task_name} on {target.kind.name}, {threads} threads, "
          f"batches of {args.batch}\n")
    print("| population | generations | valid samples | shared memory | seconds per batch |\n"
          "| ---: | ---: | ---: | --- | --- |")
    for setting in args.settings.split(","):
        population, generations, samples = (int(x) for x in setting.split(":"))
        for mode in args.shared_memory.split(","):
            secs = time_setting(tasks, index, target, population, generations, samples, batches=args.batches,
                                batch=args.batch, threads=threads, profile=args.profile, shared_memory=mode)
            print(f"| {population} | {generations} | {samples} | {mode} | {', '.join(f'{s:.1f}' for s in secs)} |",
                  flush=True)


if __name__ == "__main__":
    main()
