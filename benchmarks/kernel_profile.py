"""Where a model's time goes, kernel by kernel, as the whole model runs (not each kernel alone).

The tuner times each task's kernel alone, back to back, with its inputs hot in L2; in the model a
kernel reads what the kernel before it wrote and its weights from memory. This builds the model
(untuned, or with a run's records applied as tunekit would), without CUDA graphs so that every
kernel is a call of its own, and times every kernel call at the share in a pinned process (the
VM's instrument hook, between device synchronizations): per kernel, its calls per inference and
its median µs over `--repeats` inferences.

  python benchmarks/kernel_profile.py MODEL.onnx --gpu-pct 40 [--records OUT/records-gpu40] [--json F]
  python benchmarks/kernel_profile.py MODEL.onnx --cpu-pct 50 --repeats 3
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def worker(artifact: str, inputs: str, device: str, repeats: int) -> None:
    """In the pinned process: one JSON line {kernel: [µs of each call, over all profiled runs]}.
    Each VM call is timed between device synchronizations (the VM's instrument hook), so a kernel's
    time includes its launch, as it does in a model run without CUDA graphs."""
    import time

    import numpy as np
    import tvm
    from tvm import relax

    dev = tvm.cuda(0) if device == "cuda" else tvm.cpu(0)
    vm = relax.VirtualMachine(tvm.runtime.load_module(artifact), dev)
    with np.load(inputs) as data:
        args = [tvm.runtime.tensor(data[k], device=dev) for k in data.files]
    vm["main"](*args)  # warm-up: module load, first launches
    calls: dict[str, list[float]] = collections.defaultdict(list)
    started: list[float] = []

    def instrument(func, symbol, before_run, ret_value, *call_args):
        if symbol.startswith("vm.builtin") or symbol.startswith("relax."):
            return 0  # allocation, shape and tuple bookkeeping: not kernels
        dev.sync()
        if before_run:
            started.append(time.perf_counter())
        else:
            calls[symbol].append((time.perf_counter() - started.pop()) * 1e6)
        return 0

    vm.set_instrument(instrument)
    for _ in range(repeats):
        vm["main"](*args)
    print(json.dumps({"repeats": repeats, "calls": calls}))


def table(calls: dict, repeats: int) -> tuple[list[dict], str]:
    rows = []
    for name, durations in calls.items():
        per_run = len(durations) / repeats
        rows.append({"kernel": name, "calls": round(per_run, 2), "median_us": round(statistics.median(durations), 3),
                     "us_per_inference": round(sum(durations) / repeats, 2)})
    rows.sort(key=lambda r: -r["us_per_inference"])
    total = sum(r["us_per_inference"] for r in rows)
    lines = ["| kernel | calls | median µs | µs per inference | share |", "| --- | ---: | ---: | ---: | ---: |"]
    lines += [f"| {r['kernel'][:80]} | {r['calls']:g} | {r['median_us']:.2f} | {r['us_per_inference']:.1f} | "
              f"{r['us_per_inference'] / total:.1%} |" for r in rows]
    lines.append(f"| **sum** | {sum(r['calls'] for r in rows):g} | | {total:.1f} | |")
    return rows, "\n".join(lines)


def _run_precision(records: str | None) -> str:
    """The precision a run tuned in, from the report.json next to its records folder."""
    report = os.path.join(os.path.dirname(os.path.abspath(records)), "report.json") if records else ""
    if os.path.isfile(report):
        with open(report) as fh:
            return json.load(fh).get("precision") or "auto"
    return "auto"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model")
    parser.add_argument("--gpu-pct", type=int)
    parser.add_argument("--cpu-pct", type=int)
    parser.add_argument("--records", help="a run's records-<share> folder: apply them as tunekit does")
    parser.add_argument("--precision", help="default: the precision the run of --records tuned in (its "
                        "report.json: auto may have fallen back to fp32), else auto")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--json")
    parser.add_argument("--worker", nargs=3, metavar=("ARTIFACT", "INPUTS", "DEVICE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(*args.worker, args.repeats)
    if (args.gpu_pct is None) == (args.cpu_pct is None):
        sys.exit("give one of --gpu-pct or --cpu-pct")

    import numpy as np

    from tunekit.clients.compiler import compile_and_export, kernels_worth_applying
    from tunekit.metaschedule_env import import_for_target
    from tunekit.frontend.precision import prepare
    from tunekit.records.baselines import read_baselines
    from tunekit.records.database import open_database
    from tunekit.run.session import ShareSession, load_model
    from tunekit.shares.share import Share
    from tunekit.targets import target_for

    share = Share("gpu", args.gpu_pct) if args.gpu_pct is not None else Share("cpu", args.cpu_pct)
    loaded = load_model(args.model)
    target = target_for(share)
    prepared, precision = prepare(loaded.mod, target, precision=args.precision or _run_precision(args.records))
    import_for_target(target.kind.name)  # a tensor-core record's trace names CUDA's intrinsics
    database = open_database(args.records, create=False, read_only=True) if args.records else None
    # as the run's artifact is built: a record no faster than its kernel's untuned time is not applied
    baselines = read_baselines(args.records) if args.records else None
    with tempfile.TemporaryDirectory(prefix="tunekit-kprof-") as tmp:
        # and the kernels of another kind (Triton's) that beat them, as the run's artifact takes them
        kernels = kernels_worth_applying(args.records, database) if args.records else None
        artifact = compile_and_export(prepared_mod=prepared, target=target, database=database, cuda_graph=False,
                                      baselines=baselines, kernels=kernels, path=os.path.join(tmp, "model.so"))
        inputs = os.path.join(tmp, "in.npz")
        np.savez(inputs, **loaded.inputs.random(seed=0))
        with ShareSession(share, allow_unenforced=False) as session:
            cmd = [sys.executable, os.path.abspath(__file__), args.model, "--repeats", str(args.repeats),
                   "--worker", artifact, inputs, "cuda" if share.kind == "gpu" else "cpu"]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, **session.pinned.popen_kwargs())
    if proc.returncode != 0:
        sys.exit(f"profiling failed: {proc.stderr[-2000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    rows, text = table(result["calls"], result["repeats"])
    print(f"{loaded.name} at {share.label}, {precision}, {'tuned' if args.records else 'untuned'}, no CUDA graphs\n")
    print(text)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"model": os.path.abspath(args.model), "share": share.label, "precision": precision,
                       "records": args.records, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
