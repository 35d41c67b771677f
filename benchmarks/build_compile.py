"""Build throughput with tunekit's lean NVRTC compile against TVM's own, side by side in one run.

Samples real candidates (the evolutionary search's first batches, random cost model) from the
heaviest tasks of a model in the fp16 tensor-core space, then builds the same candidates with the
same BuildPool twice per order (TVM, lean, lean, TVM), and reports wall time, candidates/s and
where a candidate's build time went. No GPU is needed to build; on a GPU machine the target is
the device's.

  python benchmarks/build_compile.py --model /tmp/vs/resnet18.onnx --candidates 64 --out DIR

`--scaling 16,32,32,16` instead builds the same candidates with tunekit's compile only, once per entry,
with that many workers pinned to the first that many CPUs: how the machine's build rate grows with the
CPUs that build (issue 14's 2-GPU run has twice the build workers of the 1-GPU run on twice the CPUs).
A count named twice is pooled (all its candidates over all its walls), so the order 16,32,32,16 lets a
drift of the machine's speed fall on both alike. Tables: build_scaling.md and .json.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MODES = {"tvm": "TVM's NVRTC path (tvm.support.nvcc)", "lean": "tunekit (clients/cuda_compile.py)"}


def sample_candidates(model_path: str, target, count: int, per_task: int, precision: str):
    """[(task name, candidate IRModule)]: `per_task` candidates of each task, heaviest tasks first."""
    from tvm.s_tir import meta_schedule as ms

    from tunekit.metaschedule_env import import_for_target
    from tunekit.frontend.onnx_loader import import_to_relax, load_onnx, model_inputs
    from tunekit.frontend.precision import prepare
    from tunekit.frontend.tasks import extract_tasks, task_flops

    import_for_target("cuda")
    model = load_onnx(model_path)
    prepared, _ = prepare(import_to_relax(model, model_inputs(model, {})), target, precision=precision)
    tasks = sorted(extract_tasks(prepared, target), key=lambda t: -t.weight * task_flops(t.dispatched[0]))
    picked = []
    for task in tasks:
        if len(picked) >= count:
            break
        ctx = ms.TuneContext(mod=task.dispatched[0], target=target, space_generator="post-order-apply",
                             search_strategy=ms.search_strategy.EvolutionarySearch(
                                 population_size=128, genetic_num_iters=1, init_min_unmeasured=per_task),
                             num_threads=os.cpu_count(), task_name=task.task_name, rand_state=0)
        ctx.pre_tuning(max_trials=per_task, num_trials_per_iter=per_task, design_spaces=ctx.generate_design_space(),
                       database=ms.database.MemoryDatabase(), cost_model=ms.cost_model.RandomModel())
        for candidate in (ctx.generate_measure_candidates() or [])[:per_task]:
            picked.append((task.task_name, candidate.sch.mod))
    return picked[:count]


def build_all(candidates, target, mode: str, workers: int, cores: list[int] | None = None) -> dict:
    """Build every candidate with a fresh pool whose workers use `mode`'s compile (on `cores`, if given)."""
    from tvm.s_tir.meta_schedule.builder import BuilderInput

    from tunekit.clients.build_pool import BuildPool
    from tunekit.clients.build_profile import ProfileTotals

    os.environ["TUNEKIT_CUDA_COMPILE"] = mode  # the pool's workers inherit it when they start
    pool = BuildPool(workers=workers, timeout_s=300.0, cuda_aot=True, cores=cores)
    try:
        pool.wait_until_warm()
        # One untimed build per worker first: a worker's first build also loads NVRTC and sets up
        # TVM's passes, which a tuning run pays once per worker, not per candidate.
        for future in pool.submit([BuilderInput(candidates[i % len(candidates)][1], target) for i in range(workers)]):
            pool.collect(future)
        pool.profile = ProfileTotals()
        started = time.perf_counter()
        futures = pool.submit([BuilderInput(mod, target) for _, mod in candidates])
        built = [pool.collect(f)[0].error_msg is None for f in futures]
        wall = time.perf_counter() - started
        profile = pool.profile.summary()
    finally:
        pool.shutdown()
    return {"mode": mode, "wall_s": round(wall, 2), "built": sum(built), "failed": len(built) - sum(built),
            "candidates_per_s": round(sum(built) / wall, 2), "ok": built, "profile": profile}


PHASES = ("total", "passes", "nvrtc", "codegen", "export")


def scaling_rows(runs: list[dict]) -> list[dict]:
    """One row per worker count, in first-seen order: its runs pooled (all candidates over all walls),
    its rate against the smallest count's, and the per-candidate phase seconds averaged over its runs
    (wall inside a worker, so they grow when workers slow each other)."""
    counts: dict[int, list[dict]] = {}
    for run in runs:
        counts.setdefault(run["workers"], []).append(run)
    smallest = min(counts)
    rate = {w: sum(r["built"] for r in rs) / sum(r["wall_s"] for r in rs) for w, rs in counts.items()}
    rows = []
    for workers, rs in counts.items():
        phases = {k: round(sum(r["profile"][f"{k}_per_candidate_s"] for r in rs) / len(rs), 4) for k in PHASES}
        rows.append({"workers": workers, "runs": len(rs), "built": sum(r["built"] for r in rs),
                     "failed": sum(r["failed"] for r in rs), "wall_s": round(sum(r["wall_s"] for r in rs), 2),
                     "each_candidates_per_s": [r["candidates_per_s"] for r in rs],
                     "candidates_per_s": round(rate[workers], 3),
                     "vs_smallest": round(rate[workers] / rate[smallest], 3),
                     "per_worker_vs_smallest": round(rate[workers] / rate[smallest] * smallest / workers, 3),
                     "per_candidate_s": phases})
    return rows


def scaling_table(rows: list[dict]) -> str:
    smallest = min(r["workers"] for r in rows)
    lines = [f"| workers (CPUs 0..W-1) | runs | built | failed | wall s | candidates/s (each run) | vs {smallest} | "
             f"per worker vs {smallest} | per candidate: total s | passes s | NVRTC s | codegen s | export s |",
             "| ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        p = r["per_candidate_s"]
        lines.append(f"| {r['workers']} | {r['runs']} | {r['built']} | {r['failed']} | {r['wall_s']} | "
                     f"{r['candidates_per_s']} ({', '.join(map(str, r['each_candidates_per_s']))}) | "
                     f"{r['vs_smallest']:.2f}x | {r['per_worker_vs_smallest']:.2f} | {p['total']} | {p['passes']} | "
                     f"{p['nvrtc']} | {p['codegen']} | {p['export']} |")
    return "\n".join(lines)


def run_scaling(candidates, target, counts: list[int], args, argv, environment) -> int:
    cpus = sorted(os.sched_getaffinity(0))
    if args.warm_up_pass:
        # The first pass over these candidates on a fresh machine was the slowest (NVRTC 0.88 s per
        # candidate against 0.21 s in the next passes, on the H100 x2), whatever its worker count:
        # a cold start of the machine, not of the workers. Built once with every CPU and not counted.
        warm = build_all(candidates, target, "lean", len(cpus), cores=cpus)
        print(f"warm-up pass ({len(cpus)} workers, not counted): {warm['candidates_per_s']} candidates/s", flush=True)
    runs = []
    for workers in counts:
        run = build_all(candidates, target, "lean", workers, cores=cpus[:workers])
        run.pop("ok")
        runs.append({"workers": workers, **run})
        print(f"{workers} workers: {run['candidates_per_s']} candidates/s", flush=True)
    rows = scaling_rows(runs)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "build_scaling.json"), "w") as f:
        json.dump({"environment": environment, "runs": runs, "rows": rows}, f, indent=1)
    text = "\n".join([
        f"Machine: {environment['gpu'] or 'no GPU'}; {environment['host_cpus']} CPUs; target {environment['target']}; "
        f"{len(candidates)} candidates of {environment['model']} ({args.precision}) from "
        f"{len(environment['tasks'])} tasks, built with tunekit's compile by W workers pinned to CPUs 0..W-1.", "",
        f"Command: `python benchmarks/build_compile.py {' '.join(argv or sys.argv[1:])}`", "",
        scaling_table(rows), ""])
    with open(os.path.join(args.out, "build_scaling.md"), "w") as f:
        f.write(text)
    print(text)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--candidates", type=int, default=64)
    parser.add_argument("--per-task", type=int, default=16)
    parser.add_argument("--precision", default="fp16")
    parser.add_argument("--workers", type=int, default=os.cpu_count())
    parser.add_argument("--rounds", type=int, default=2, help="1: TVM then tunekit; 2: also tunekit then TVM")
    parser.add_argument("--scaling", default=None, metavar="W,W,...",
                        help="tunekit's compile only, once per worker count (see the module's help)")
    parser.add_argument("--warm-up-pass", action="store_true",
                        help="with --scaling: build the candidates once with every CPU first, not counted")
    parser.add_argument("--out", default="benchmarks/results/build-compile")
    args = parser.parse_args(argv)
    counts = None
    if args.scaling:  # checked before the minutes of sampling candidates
        cpus = len(os.sched_getaffinity(0))
        try:
            counts = [int(w) for w in args.scaling.split(",")]
        except ValueError:
            parser.error(f"--scaling takes worker counts like 16,32,32,16, not {args.scaling!r}")
        if min(counts) < 1 or max(counts) > cpus:
            parser.error(f"--scaling counts must be 1..{cpus} (the CPUs this process may use), not {args.scaling}")

    import tvm

    from tunekit.shares.mps import gpu_present
    from tunekit.targets import cuda_target, gpu_info

    target = cuda_target(gpu_info()) if gpu_present() else tvm.target.Target("nvidia/nvidia-h100")
    candidates = sample_candidates(args.model, target, args.candidates, args.per_task, args.precision)
    environment = {"host_cpus": os.cpu_count(), "workers": args.workers, "target": str(target.attrs.get("arch", "")),
                   "gpu": gpu_info().name if gpu_present() else None, "model": os.path.basename(args.model),
                   "tasks": sorted({name for name, _ in candidates}), "candidates": len(candidates)}
    if counts:
        return run_scaling(candidates, target, counts, args, argv, environment)
    order = ("tvm", "lean", "lean", "tvm")[:2 * max(1, min(2, args.rounds))]
    runs = [build_all(candidates, target, mode, args.workers) for mode in order]
    by_mode = {m: [r for r in runs if r["mode"] == m] for m in MODES}
    same = all(a == b for a, b in zip(by_mode["tvm"][0]["ok"], by_mode["lean"][0]["ok"]))
    best = {m: min(rs, key=lambda r: r["wall_s"]) for m, rs in by_mode.items()}
    ratio = best["tvm"]["wall_s"] / best["lean"]["wall_s"]
    os.makedirs(args.out, exist_ok=True)
    for run in runs:
        run.pop("ok")
    with open(os.path.join(args.out, "build_compile.json"), "w") as f:
        json.dump({"environment": environment, "runs": runs, "tvm_over_lean_wall": round(ratio, 2),
                   "same_candidates_built": same}, f, indent=1)
    lines = [f"Machine: {environment['gpu'] or 'no GPU'}; {environment['host_cpus']} CPUs, {args.workers} build "
             f"workers; target {environment['target']}; {len(candidates)} candidates of {environment['model']} "
             f"({args.precision}) from {len(environment['tasks'])} tasks.", "",
             f"Command: `python benchmarks/build_compile.py {' '.join(argv or sys.argv[1:])}`", "",
             "| compile | run | wall s | candidates/s | per candidate: total s | NVRTC s | TIR passes s | fallbacks |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for i, run in enumerate(runs):
        p = run["profile"]
        lines.append(f"| {MODES[run['mode']]} | {i + 1} | {run['wall_s']} | {run['candidates_per_s']} | "
                     f"{p['total_per_candidate_s']} | {p['nvrtc_per_candidate_s']} | {p['passes_per_candidate_s']} | "
                     f"{p.get('nvrtc_fallback_candidates', 0)} |")
    lines += ["", f"Wall, best of {len(runs) // 2} each: TVM / tunekit = **{ratio:.2f}x**. The same candidates built in both: {same}."]
    with open(os.path.join(args.out, "build_compile.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
