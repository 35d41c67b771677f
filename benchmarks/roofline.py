"""Per task of a tuned model: how far its kernel is from its roofline at the share.

  python benchmarks/roofline.py MODEL.onnx REPORT.json [--sm-share 52/132] [--out roofline.md]

Runs anywhere (no GPU): the tasks are extracted again for the report's target and precision, and
each task's FLOPs (TVM's estimate) and bytes (every buffer of the kernel read or written once) give
its floor at the share: max(FLOPs / compute peak, bytes / memory bandwidth). The peaks are the H100
SXM's at the SMs the share gets: 989 TFLOP/s fp16 dense on tensor cores and 67 TFLOP/s fp32 on CUDA
cores at 132 SMs (scaled by SMs), and the 3.0 TB/s device-to-device copy measured on the device
(docs: KINDS.md; not scaled: at 40% of the SMs the copy is not known to be slower, so this floor
is optimistic for memory-bound kernels).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

H100_SMS = 132
PEAK_TFLOPS = {"fp16": 989.0, "fp32": 67.0}
COPY_TBPS = 3.0


def kernel_bytes(mod) -> int:
    """Bytes of every buffer argument of the task's PrimFunc (each read or written once)."""
    import numpy as np
    from tvm import tirx
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    total = 0
    for func in mod.functions.values():
        if isinstance(func, tirx.PrimFunc):
            for info in ArgInfo.from_prim_func(func):
                _, dtype, shape = info.as_json()
                total += int(np.prod(shape)) * np.dtype(str(dtype)).itemsize
    return total


def analyse(model: str, report: dict, sms: int) -> list[dict]:
    from tvm.target import Target

    from tunekit.frontend.precision import prepare
    from tunekit.frontend.tasks import extract_tasks, task_flops
    from tunekit.run.session import load_model

    target = Target(report["target"])  # a JSON object since the report has one (tunekit.targets.target_dict)
    precision = report.get("precision", "fp32")
    loaded = load_model(model, report.get("config", {}).get("input_shapes") or {})
    prepared, _ = prepare(loaded.mod, target, precision=precision)
    tasks = {t.task_name: t for t in extract_tasks(prepared, target)}
    compute = PEAK_TFLOPS[precision] * 1e12 * sms / H100_SMS
    rows = []
    for row in report["tasks"]:
        task = tasks.get(row["name"])
        if task is None:
            continue
        flops, nbytes = task_flops(task.mod), kernel_bytes(task.mod)
        floor_us = max(flops / compute, nbytes / (COPY_TBPS * 1e12)) * 1e6
        used = row.get("tuned_us") if row.get("record_applied") else row.get("untuned_us")
        used = used or row.get("untuned_us")
        rows.append({"task": row["name"], "weight": row["weight"], "trials": row.get("trials"),
                     "untuned_us": row.get("untuned_us"), "tuned_us": row.get("tuned_us"),
                     "applied": row.get("record_applied"), "tensorized": row.get("best_tensorized"),
                     "gflop": flops / 1e9, "mbytes": nbytes / 1e6, "floor_us": floor_us,
                     "bound": "compute" if flops / compute > nbytes / (COPY_TBPS * 1e12) else "memory",
                     "in_model_us": used, "x_floor": used / floor_us if used and floor_us else None})
    return sorted(rows, key=lambda r: -(r["in_model_us"] or 0) * r["weight"])


def _cell(value, fmt="{}") -> str:
    return "–" if value is None else fmt.format(value)


def render(rows: list[dict], sms: int) -> str:
    lines = [f"Roofline at {sms} SMs (of {H100_SMS}); floor = max(FLOPs / peak, bytes / {COPY_TBPS} TB/s).", "",
             "| task | weight | trials | untuned µs | tuned µs | applied | tensor cores | GFLOP | MB | bound | "
             "floor µs | in model µs × weight | × floor |", "|" + " --- |" + " ---: |" * 12]
    total = floor = 0.0
    for r in rows:
        in_model = (r["in_model_us"] or 0) * r["weight"]
        total += in_model
        floor += r["floor_us"] * r["weight"]
        lines.append(f"| {r['task']} | {r['weight']} | {_cell(r['trials'])} | {_cell(r['untuned_us'])} | "
                     f"{_cell(r['tuned_us'])} | {_cell(r['applied'])} | {_cell(r['tensorized'])} | {r['gflop']:.3f} | "
                     f"{r['mbytes']:.2f} | {r['bound']} | {r['floor_us']:.1f} | {in_model:.1f} | "
                     f"{_cell(r['x_floor'], '{:.1f}')} |")
    if floor:
        lines.append(f"| **sum** | | | | | | | | | | {floor:.1f} | {total:.1f} | {total / floor:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model")
    parser.add_argument("report")
    parser.add_argument("--sms", type=int, help="SMs at the share (default: the report's sm_count_at_share)")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    with open(args.report) as fh:
        report = json.load(fh)
    report = report.get("report", report)
    sms = args.sms or report.get("environment", {}).get("sm_count_at_share") or H100_SMS
    text = render(analyse(args.model, report, sms), sms)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text)
    print(text)


if __name__ == "__main__":
    main()
