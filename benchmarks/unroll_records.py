"""Would capping explicit unrolling cost tuned latency? Read off a tuning run's own records.

Issue 14 lists "cap explicit unrolling if tuned latency does not regress" as a way to cut the build: on the
H100, NVRTC is most of a candidate's build (1.65 of 2.31 CPU-s for fp32 MobileNetV2, 108 KB of CUDA source),
and MetaSchedule's CUDA rules sample `pragma_auto_unroll_max_step` from 0..1024. A cap removes the large
steps from the space. Whether that costs latency is a question about the kernels, and every record of a
run is a measured kernel with its unroll step in its trace:

  python benchmarks/unroll_records.py --work W [--caps 64,256,512] [--out W]

W is a `tunekit tune` out dir (records-<share> dirs, and report-<share>.json / report.json for the task
weights). Per share it writes how the unroll step of each task's best candidate is distributed, and for
each cap the model's weighted kernel sum when every task keeps its best candidate at or under the cap,
over the sum of each task's best (1.0: the cap loses nothing among these candidates). A search run with
the cap would spend all its trials under it and might find better kernels there, so this is the cost of
the cap among the candidates that were measured, not a bound. Writes W/unroll_records.{json,md}.
No TVM needed: the records are JSON.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

# MetaSchedule's CUDA ParallelizeVectorizeUnroll samples the step from this list (TVM 0.27)
UNROLL_STEPS = [0, 16, 32, 64, 128, 256, 512, 1024]


def unroll_step(trace: list) -> int | None:
    """The step a trace's SampleCategorical chose for its `meta_schedule.unroll_explicit` annotation."""
    insts, decisions = trace[0], dict((i, d) for i, d in trace[1])
    sampled = {}
    for index, (name, inputs, attrs, outputs, *_rest) in enumerate(insts):
        if name == "SampleCategorical" and attrs and attrs[0] == UNROLL_STEPS and index in decisions:
            sampled[outputs[0]] = UNROLL_STEPS[decisions[index]]
        elif (name == "Annotate" and attrs and attrs[0] == "meta_schedule.unroll_explicit"
              and len(inputs) > 1 and inputs[1] in sampled):
            return sampled[inputs[1]]
    return None


def share_candidates(db_dir: str) -> dict[str, list[tuple[float, int | None]]]:
    """{workload key: [(mean us, unroll step)]} of the measured candidates of one share's database."""
    from tunekit.records.jsonl import read_records, read_workloads

    keys = [f"{int(w[0]) & 0xFFFFFFFFFFFFFFFF:016x}" if w else None for w in read_workloads(db_dir)]
    out: dict[str, list] = {}
    for line in read_records(db_dir):
        secs = [float(x) for x in line.run_secs if x is not None and float(x) < 1e9]
        if secs and line.workload < len(keys) and keys[line.workload]:
            out.setdefault(keys[line.workload], []).append((1e6 * sum(secs) / len(secs), unroll_step(line.trace)))
    return out


def task_weights(work: str) -> dict[str, int]:
    weights = {}
    for path in glob.glob(os.path.join(work, "report*.json")):
        report = json.load(open(path))
        weights.update({t["workload_hash"]: t.get("weight", 1) for t in report.get("tasks", [])
                        if t.get("workload_hash")})
    return weights


def summarize(candidates: dict[str, list], weights: dict[str, int], caps: list[int]) -> dict:
    best_steps: dict[str, int] = {}
    every_steps: dict[str, int] = {}
    best_sum = 0.0
    capped_sum = {cap: 0.0 for cap in caps}
    worst_task = {cap: 1.0 for cap in caps}
    for wk, rows in candidates.items():
        weight = weights.get(wk, 1)
        best_us, best_step = min(rows, key=lambda r: r[0])
        best_steps[str(best_step)] = best_steps.get(str(best_step), 0) + 1
        for _, step in rows:
            every_steps[str(step)] = every_steps.get(str(step), 0) + 1
        best_sum += weight * best_us
        for cap in caps:
            # a trace without the annotation (e.g. an untiled elementwise task) is not affected by a cap
            kept = min((us for us, step in rows if step is None or step <= cap), default=float("inf"))
            capped_sum[cap] += weight * kept
            worst_task[cap] = max(worst_task[cap], kept / best_us)
    return {"tasks": len(candidates), "candidates": sum(len(r) for r in candidates.values()),
            "best_candidate_step": dict(sorted(best_steps.items(), key=_step_order)),
            "every_candidate_step": dict(sorted(every_steps.items(), key=_step_order)),
            "best_kernel_sum_us": round(best_sum, 2),
            "capped": {str(cap): {"kernel_sum_over_best": round(capped_sum[cap] / best_sum, 4),
                                  "worst_task": round(worst_task[cap], 3)} for cap in caps}}


def _step_order(item):
    return (item[0] == "None", int(item[0]) if item[0] != "None" else 0)


def write(out_dir: str, result: dict, caps: list[int]) -> str:
    lines = ["Unroll step of each task's best candidate (tasks), per share:", "",
             "| share | " + " | ".join(str(s) for s in UNROLL_STEPS) + " | candidates at each step |",
             "| --- | " + " | ".join("---:" for _ in UNROLL_STEPS) + " | --- |"]
    for share, row in result["shares"].items():
        every = ", ".join(f"{k}: {v}" for k, v in row["every_candidate_step"].items())
        lines.append(f"| {share} | " + " | ".join(str(row["best_candidate_step"].get(str(s), 0))
                                                  for s in UNROLL_STEPS) + f" | {every} |")
    lines += ["", "With a cap: each task's best candidate at or under it. The weighted kernel sum over the sum of "
              "each task's best (worst single task in brackets):", "",
              "| share | " + " | ".join(f"cap {c}" for c in caps) + " |",
              "| --- | " + " | ".join("---:" for _ in caps) + " |"]
    for share, row in result["shares"].items():
        lines.append(f"| {share} | " + " | ".join(
            f"{row['capped'][str(c)]['kernel_sum_over_best']} ({row['capped'][str(c)]['worst_task']})" for c in caps)
                     + " |")
    text = "\n".join(lines) + "\n"
    with open(os.path.join(out_dir, "unroll_records.md"), "w") as fh:
        fh.write(text)
    with open(os.path.join(out_dir, "unroll_records.json"), "w") as fh:
        json.dump(result, fh, indent=1)
    return text


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", required=True, help="a tunekit tune out dir (records-<share> dirs)")
    parser.add_argument("--caps", default="64,128,256,512")
    parser.add_argument("--out", help="where unroll_records.{json,md} go (default: --work)")
    args = parser.parse_args(argv)
    caps = [int(c) for c in args.caps.split(",")]
    dirs = sorted(glob.glob(os.path.join(args.work, "records-*")))
    if not dirs:
        parser.error(f"no records-<share> dirs in {args.work}")
    weights = task_weights(args.work)
    result = {"work": os.path.basename(os.path.abspath(args.work)), "caps": caps,
              "shares": {os.path.basename(d)[len("records-"):]: summarize(share_candidates(d), weights, caps)
                         for d in dirs}}
    print(write(args.out or args.work, result, caps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
