"""Why a GPU search throws away most of the schedules it samples, and what that costs, without a GPU.

MetaSchedule's search samples random schedules of a task and keeps those its postprocs accept. On the CUDA
target the last check, VerifyGPUCode, lowers the whole candidate before it can say no, so a rejected sample
costs about as much as a kept one. This draws N random schedules per task (each design space's trace with
fresh decisions), runs the postprocs in MetaSchedule's order, and sorts VerifyGPUCode's rejections by the
limit they break: each rejected candidate is checked again with the shared-memory limit raised to what an
H100 block may opt into (227 KB), then with no shared-memory limit, then with the thread limit lifted too;
what still fails broke another limit (vthreads, vector width) or failed to lower.

  python benchmarks/search_rejections.py --model resnet18 --precision fp16 --samples 60 \
      --tasks conv2d9_cast5_add7_add8,conv2d3_cast3_add3_relu2,conv2d_cast1_add_relu --json OUT.json
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import time

LIFTED_SHARED_BYTES = 232448  # what an H100 block may opt into (227 KB), against the target's static 48 KB
NO_LIMIT = 1 << 40


def _verifier(task_ctx, target_json: dict, **limits):
    """VerifyGPUCode initialized with the task's target, some limits changed."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    config = {k: v for k, v in target_json.items() if k not in ("tag", "keys")}
    config.update(limits)
    verify = ms.postproc.VerifyGPUCode()
    verify._initialize_with_tune_context(ms.TuneContext(mod=task_ctx.mod, target=tvm.target.Target(config),
                                                        task_name=task_ctx.task_name))
    return verify


def count(task, target, samples: int) -> dict:
    """Outcomes of `samples` random schedules of one task, and the seconds spent per stage."""
    from tvm.s_tir import Schedule, Trace
    from tvm.s_tir import meta_schedule as ms

    with tempfile.TemporaryDirectory(prefix="tunekit-rejections-") as work:
        (ctx,), _ = ms.relax_integration.extracted_tasks_to_tune_contexts([task], work, num_threads=1, seed=0)
        spaces = ctx.generate_design_space()
        postprocs = list(ctx.space_generator.postprocs)
        names = [type(p).__name__ for p in postprocs]
        verify_at = names.index("VerifyGPUCode")
        target_json = dict(target.export())
        opt_in = _verifier(ctx, target_json, max_shared_memory_per_block=LIFTED_SHARED_BYTES)
        any_shared = _verifier(ctx, target_json, max_shared_memory_per_block=NO_LIMIT)
        any_threads = _verifier(ctx, target_json, max_shared_memory_per_block=NO_LIMIT, max_threads_per_block=NO_LIMIT)
        outcomes = collections.Counter()
        seconds = collections.Counter()
        for i in range(samples):
            space = spaces[i % len(spaces)]
            sch = Schedule(ctx.mod, seed=i + 1)
            started = time.perf_counter()
            try:  # the space's instructions with no decisions: each sampling instruction draws afresh
                Trace(space.trace.simplified(remove_postproc=True).insts, {}).apply_to_schedule(sch, remove_postproc=True)
                rejected_by = next((n for p, n in zip(postprocs[:verify_at], names) if not p.apply(sch)), None)
            except Exception:
                rejected_by = "sampling failed"
            seconds["sample and earlier postprocs"] += time.perf_counter() - started
            if rejected_by:
                outcomes[f"rejected by {rejected_by}"] += 1
                continue
            started = time.perf_counter()
            kept = postprocs[verify_at].apply(sch)
            seconds["VerifyGPUCode (lowers the candidate)"] += time.perf_counter() - started
            if kept:
                outcomes["kept"] += 1
            elif opt_in.apply(sch):
                outcomes["VerifyGPUCode: shared memory 48-227 KB"] += 1
            elif any_shared.apply(sch):
                outcomes["VerifyGPUCode: shared memory over 227 KB"] += 1
            elif any_threads.apply(sch):
                outcomes["VerifyGPUCode: threads per block over the limit"] += 1
            else:
                outcomes["VerifyGPUCode: another limit, or lowering failed"] += 1
    return {"task": task.task_name, "samples": samples, "design_spaces": len(spaces),
            "outcomes": dict(outcomes), "seconds": {k: round(v, 3) for k, v in seconds.items()}}


def table(rows: list[dict]) -> str:
    kinds = sorted({k for r in rows for k in r["outcomes"]}, key=lambda k: (k != "kept", k))
    lines = ["| task | samples | " + " | ".join(kinds) + " | s in VerifyGPUCode / s sampling |",
             "| --- | ---: |" + " ---: |" * len(kinds) + " ---: |"]
    for r in rows:
        verify = r["seconds"].get("VerifyGPUCode (lowers the candidate)", 0.0)
        sample = r["seconds"].get("sample and earlier postprocs", 0.0)
        cells = [f"{r['outcomes'].get(k, 0)}" for k in kinds]
        lines.append(f"| {r['task']} | {r['samples']} | " + " | ".join(cells) + f" | {verify:.1f} / {sample:.1f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resnet18", help="an example model (tunekit.models.examples)")
    parser.add_argument("--target", default="nvidia/nvidia-h100", help="a target tag or JSON")
    parser.add_argument("--precision", default="fp16", choices=("fp32", "fp16"))
    parser.add_argument("--tasks", default="conv2d", help="comma-separated parts of task names")
    parser.add_argument("--samples", type=int, default=60, help="random schedules per task")
    parser.add_argument("--json", help="write the counts here too")
    args = parser.parse_args()

    from search_cost import example_tasks  # this script's folder is on sys.path

    target, tasks = example_tasks(args.model, args.target, args.precision)
    rows = []
    for part in args.tasks.split(","):
        task = next((t for t in tasks if part in t.task_name), None)
        if task is None:
            sys.exit(f"no task matches {part!r}: {', '.join(t.task_name for t in tasks)}")
        rows.append(count(task, target, args.samples))
        print(f"{task.task_name}: {rows[-1]['outcomes']}", file=sys.stderr, flush=True)
    print(f"{args.model} ({args.precision}) on {target.kind.name} {target.attrs.get('arch', '')}, "
          f"{args.samples} random schedules per task\n")
    print(table(rows))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"model": args.model, "precision": args.precision, "target": str(target), "rows": rows}, fh,
                      indent=1)


if __name__ == "__main__":
    main()
