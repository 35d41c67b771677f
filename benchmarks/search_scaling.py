"""Candidates per second of MetaSchedule's evolutionary search: one search with every core, or several at once.

A tuning run searches one task at a time on the loop thread with `num_threads` = every core, and on the H100
the search set the pace (benchmarks/results/h100-resnet18-share-study/). This measures whether the cores are
better used by W searches of different tasks at once, each with T threads (W x T = the cores). No GPU needed:
the search only lowers and verifies (CUDA target).

The same work for every configuration: the `--tasks` heaviest fp16 tasks of the model, `--batches` batches of
16 each (tunekit's CUDA setting 128:2:16), answered with random run times so the search advances as in a run.
Workers take whole tasks from a queue (a task's batches are sequential, as in the loop).

A config WxT runs W searches as threads of this process; WxTp runs them as W processes (each imports TVM and
prepares its contexts, then all start together). 1x1 against 1xN says how one search scales with its threads,
WxT against WxTp whether searches in one process hold each other up.

  python benchmarks/search_scaling.py --model resnet18.onnx --configs 1x16,2x8,4x4,4x4p --json out.json
"""
from __future__ import annotations

import argparse
import json
import os
import queue
import random
import resource
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def heaviest_tasks(model: str, target, count: int) -> list:
    """The model's `count` tasks with the most FLOPs x weight, fp16 (tensor-core tasks on CUDA)."""
    from tunekit.metaschedule_env import import_for_target
    from tunekit.frontend.onnx_loader import import_to_relax, load_onnx, model_inputs
    from tunekit.frontend.precision import prepare
    from tunekit.frontend.tasks import extract_tasks, task_flops
    from tunekit.models import examples

    import_for_target(target.kind.name)
    onnx_model = load_onnx(model) if os.path.isfile(model) else getattr(examples, model)()
    prepared, _ = prepare(import_to_relax(onnx_model, model_inputs(onnx_model, {})), target, precision="fp16")
    tasks = extract_tasks(prepared, target)
    tasks.sort(key=lambda t: -(task_flops(t.mod)) * t.weight)
    return tasks[:count]


def _contexts(tasks, work: str, threads: int):
    """(TuneContext, XGBModel) per task, ready to search, with `threads` search threads each."""
    from tvm.s_tir import meta_schedule as ms

    prepared = []
    for i, task in enumerate(tasks):
        strategy = ms.search_strategy.EvolutionarySearch(population_size=128, genetic_num_iters=2,
                                                         init_min_unmeasured=16)
        (ctx,), _ = ms.relax_integration.extracted_tasks_to_tune_contexts(
            [task], os.path.join(work, str(i)), strategy=strategy, num_threads=threads, seed=i)
        model = ms.cost_model.XGBModel(num_tuning_cores=1)
        ctx.pre_tuning(max_trials=1 << 20, num_trials_per_iter=16, design_spaces=ctx.generate_design_space(),
                       database=ms.database.MemoryDatabase(), cost_model=model)
        prepared.append((task.task_name, ctx, model))
    return prepared


def run_config(tasks, workers: int, threads: int, batches: int) -> dict:
    from tvm.s_tir.meta_schedule.runner import RunnerResult

    with tempfile.TemporaryDirectory(prefix="tunekit-search-scaling-") as work:
        todo = queue.Queue()
        for item in _contexts(tasks, work, threads):
            todo.put(item)
        batch_s, candidates, lock = [], [0], threading.Lock()

        def worker(seed: int) -> None:
            rng = random.Random(seed)
            while True:
                try:
                    name, ctx, model = todo.get_nowait()
                except queue.Empty:
                    return
                for _ in range(batches):
                    t = time.perf_counter()
                    found = ctx.generate_measure_candidates() or []
                    with lock:
                        batch_s.append((name, time.perf_counter() - t))
                        candidates[0] += len(found)
                    results = [RunnerResult([rng.uniform(1e-4, 1e-3)], None) for _ in found]
                    if found:
                        model.update(ctx, found, results)
                        ctx.notify_runner_results(found, results)

        started, cpu = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
        threads_ = [threading.Thread(target=worker, args=(w,)) for w in range(workers)]
        for th in threads_:
            th.start()
        for th in threads_:
            th.join()
        wall = time.perf_counter() - started
        user_s, sys_s = _cpu_since(cpu)
    return {"workers": workers, "threads": threads, "wall_s": round(wall, 2), "candidates": candidates[0],
            "candidates_per_s": round(candidates[0] / wall, 3), "user_s": user_s, "sys_s": sys_s,
            "batch_s": [(n, round(s, 2)) for n, s in batch_s]}


def _cpu_since(before) -> tuple[float, float]:
    """(user, system) CPU seconds this process used since `before` (a getrusage result), every thread."""
    now = resource.getrusage(resource.RUSAGE_SELF)
    return round(now.ru_utime - before.ru_utime, 2), round(now.ru_stime - before.ru_stime, 2)


def _process_worker(model: str, target_spec: str, count: int, threads: int, batches: int, todo, barrier,
                    results) -> None:
    """One search process of a WxTp config: the same tasks, its own TVM, its share of the queue."""
    import tvm

    from tunekit.metaschedule_env import prepare_metaschedule_logging
    from tvm.s_tir.meta_schedule.runner import RunnerResult

    prepare_metaschedule_logging()
    target = tvm.target.Target(json.loads(target_spec) if target_spec.startswith("{") else target_spec)
    tasks = heaviest_tasks(model, target, count)
    batch_s, candidates = [], 0
    with tempfile.TemporaryDirectory(prefix="tunekit-search-scaling-") as work:
        prepared = _contexts(tasks, work, threads)
        barrier.wait()
        cpu = resource.getrusage(resource.RUSAGE_SELF)
        rng = random.Random(os.getpid())
        while True:
            try:  # not get_nowait: it says Empty whenever another process holds the queue's lock
                index = todo.get(timeout=1.0)
            except queue.Empty:
                break
            name, ctx, model_ = prepared[index]
            for _ in range(batches):
                t = time.perf_counter()
                found = ctx.generate_measure_candidates() or []
                batch_s.append((name, round(time.perf_counter() - t, 2)))
                candidates += len(found)
                outcome = [RunnerResult([rng.uniform(1e-4, 1e-3)], None) for _ in found]
                if found:
                    model_.update(ctx, found, outcome)
                    ctx.notify_runner_results(found, outcome)
        user_s, sys_s = _cpu_since(cpu)
    results.put((batch_s, candidates, user_s, sys_s))


def run_processes(model: str, target_spec: str, count: int, workers: int, threads: int, batches: int) -> dict:
    """W processes x T threads over the same task queue; the wall runs from their common start."""
    import multiprocessing

    mp = multiprocessing.get_context("spawn")
    todo, results, barrier = mp.Queue(), mp.Queue(), mp.Barrier(workers + 1)
    for index in range(count):
        todo.put(index)
    procs = [mp.Process(target=_process_worker, args=(model, target_spec, count, threads, batches, todo, barrier,
                                                      results)) for _ in range(workers)]
    for proc in procs:
        proc.start()
    barrier.wait()
    started = time.perf_counter()
    outcomes = [results.get() for _ in procs]
    wall = time.perf_counter() - started
    for proc in procs:
        proc.join()
    candidates = sum(o[1] for o in outcomes)
    return {"workers": workers, "threads": threads, "processes": True, "wall_s": round(wall, 2),
            "candidates": candidates, "candidates_per_s": round(candidates / wall, 3),
            "user_s": round(sum(o[2] for o in outcomes), 2), "sys_s": round(sum(o[3] for o in outcomes), 2),
            "batch_s": [b for o in outcomes for b in o[0]]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="an ONNX file, or an example's name")
    parser.add_argument("--target", default="nvidia/nvidia-h100", help="a target tag or JSON")
    parser.add_argument("--configs", default="1x16,2x8,4x4", help="WORKERSxTHREADS[p],... (p: processes)")
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--batches", type=int, default=2)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)

    import tvm

    from tunekit.metaschedule_env import prepare_metaschedule_logging

    prepare_metaschedule_logging()
    target = tvm.target.Target(json.loads(args.target) if args.target.startswith("{") else args.target)
    tasks = heaviest_tasks(args.model, target, args.tasks)
    print(f"{os.path.basename(args.model)}: {', '.join(t.task_name for t in tasks)}; {args.batches} batches of 16 "
          f"each; {len(os.sched_getaffinity(0))} cores\n", flush=True)
    print("| searches at once x threads each | wall s | candidates | candidates/s | vs first "
          "| CPU s (user + system) | cores busy | system share |\n"
          "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |", flush=True)
    rows = []
    for config in args.configs.split(","):
        processes = config.endswith("p")
        workers, threads = (int(x) for x in config.rstrip("p").split("x"))
        row = run_processes(args.model, args.target, args.tasks, workers, threads, args.batches) if processes \
            else run_config(tasks, workers, threads, args.batches)
        rows.append(row)
        print(f"| {workers} x {threads}{' processes' if processes else ''} | {row['wall_s']} | {row['candidates']} | {row['candidates_per_s']} | "
              f"{row['candidates_per_s'] / rows[0]['candidates_per_s']:.2f}x | {row['user_s'] + row['sys_s']:.1f} | "
              f"{(row['user_s'] + row['sys_s']) / row['wall_s']:.1f} of {workers * threads} | "
              f"{row['sys_s'] / max(1e-9, row['user_s'] + row['sys_s']):.0%} |", flush=True)
        if args.json:  # after every row: a run cut off by a time limit keeps its rows
            with open(args.json, "w") as fh:
                json.dump({"model": args.model, "target": str(target.kind.name),
                           "cores": len(os.sched_getaffinity(0)), "tasks": [t.task_name for t in tasks],
                           "rows": rows}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
