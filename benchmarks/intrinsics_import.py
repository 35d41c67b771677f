"""What registering the target's tensor intrinsics costs a process, with TVMScript's frame stack read lazily
(tunekit.metaschedule_env) against read whole (TVM's `inspect.stack()`), rounds alternating, a fresh process each.

Every GPU tune pays it in the main process (the engine's start, in the warm-up) and in each build worker.

  python benchmarks/intrinsics_import.py --kinds cuda,llvm --rounds 5 --json out.json > out.md
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys

# `main`: what the tune's main process has loaded when its engine starts (the ONNX importer, onnxruntime);
# `worker`: a build worker, TVM only.
_CHILD = """
import contextlib, sys, time
kind, mode, process = sys.argv[1:4]
if process == "main":
    import onnx, onnxruntime, tunekit.cli  # noqa: F401
import tvm  # noqa: F401
from tvm.s_tir import meta_schedule  # noqa: F401
from tunekit import metaschedule_env
if mode == "whole":  # the same import with TVM's own inspect.stack()
    metaschedule_env._lazy_frame_stacks = contextlib.nullcontext
started = time.perf_counter()
metaschedule_env.import_for_target(kind)
print(time.perf_counter() - started, len(sys.modules))
"""


def once(kind: str, mode: str, process: str) -> tuple[float, int]:
    proc = subprocess.run([sys.executable, "-c", _CHILD, kind, mode, process], capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{kind} {mode} {process}: {proc.stderr.strip().splitlines()[-1:]}")
    seconds, modules = proc.stdout.split()
    return float(seconds), int(modules)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", default="cuda,llvm", help="target kinds, comma-separated")
    parser.add_argument("--processes", default="worker,main", help="worker (TVM only) and/or main (the tune's imports)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", help="write every timing here")
    args = parser.parse_args()
    kinds, processes = args.kinds.split(","), args.processes.split(",")
    times: dict[tuple, list[float]] = {}
    modules: dict[tuple, int] = {}
    for _ in range(args.rounds):
        for kind in kinds:
            for process in processes:
                for mode in ("whole", "lazy"):  # alternating within each round
                    seconds, count = once(kind, mode, process)
                    times.setdefault((kind, process, mode), []).append(seconds)
                    modules[(kind, process, mode)] = count
    print(f"{platform.node() or 'this machine'}, Python {platform.python_version()}, {args.rounds} rounds; "
          "seconds to register the target's tensor intrinsics in a fresh process (median, min-max)\n")
    print("| target | process (modules loaded) | inspect.stack() whole | lazy (tunekit) | whole / lazy |")
    print("| --- | --- | ---: | ---: | ---: |")
    for kind in kinds:
        for process in processes:
            whole, lazy = times[(kind, process, "whole")], times[(kind, process, "lazy")]
            print(f"| {kind} | {process} ({modules[(kind, process, 'lazy')]}) | {statistics.median(whole):.2f} "
                  f"({min(whole):.2f}-{max(whole):.2f}) | {statistics.median(lazy):.2f} ({min(lazy):.2f}-{max(lazy):.2f}) "
                  f"| **{statistics.median(whole) / statistics.median(lazy):.2f}×** |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{"kind": k, "process": p, "mode": m, "seconds": v} for (k, p, m), v in times.items()], f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
