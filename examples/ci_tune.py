"""Tune a model in a CI job, on every model change, and gate the merge on a latency SLO.

    python examples/ci_tune.py model.onnx --cpu-pct 50 --cache .tunekit-cache --trials 64 --slo-ms 5 \\
        --artifacts build/ --summary build/tunekit-summary.json

What it does, in the order a CI job needs it:
1. restores the records cache of the previous run (`--cache`, a directory the CI system keeps
   between runs: GitHub's actions/cache, GitLab's cache:). Tuning continues from those records
   (`resume`), so every run adds `--trials` to what earlier runs measured instead of starting over;
   a cache from another model (or share, target, precision) is set aside and tuning starts fresh;
2. tunes within a trial budget (`--trials`) and, optionally, a wall-clock budget (`--time-budget`);
3. saves the records back into the cache;
4. copies the compiled model and its metadata to `--artifacts`, and writes a JSON summary for the
   CI system (`--summary`);
5. exits 0 when the tuned latency at the share meets `--slo-ms`, 3 when it does not (the build
   fails), 1 when tuning failed, 2 on bad usage (tunekit's exit codes).

It uses only tunekit's public Python API.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time

import tunekit
from tunekit import TuneConfig, TunekitError

EXIT_SLO_NOT_MET = 3


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description="Tune a model in CI and gate on a latency SLO.")
    parser.add_argument("model", help="the ONNX model")
    share = parser.add_mutually_exclusive_group()
    share.add_argument("--gpu-pct", type=int)
    share.add_argument("--cpu-pct", type=int)
    parser.add_argument("--cache", required=True, help="records cache kept by the CI system between runs")
    parser.add_argument("--trials", type=int, default=64, help="trials this run adds")
    parser.add_argument("--time-budget", type=float, help="stop tuning after this many seconds")
    parser.add_argument("--slo-ms", type=float, help="fail (exit 3) when the tuned latency is above this")
    parser.add_argument("--artifacts", default="tunekit-artifacts", help="where the compiled model goes")
    parser.add_argument("--summary", default="tunekit-summary.json")
    parser.add_argument("--work", default=".tunekit-work", help="scratch dir of this run")
    return parser.parse_args(argv)


def restore_cache(cache: str, out: str) -> bool:
    """Copy the cached records into a fresh out dir. Returns whether there was anything to resume."""
    if os.path.isdir(out):
        shutil.rmtree(out)
    os.makedirs(out)
    found = False
    if os.path.isdir(cache):
        for name in os.listdir(cache):
            if name.startswith("records-"):
                shutil.copytree(os.path.join(cache, name), os.path.join(out, name))
                found = True
    return found


def save_cache(out: str, cache: str) -> None:
    os.makedirs(cache, exist_ok=True)
    for name in os.listdir(out):
        if name.startswith("records-"):
            target = os.path.join(cache, name)
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(os.path.join(out, name), target)


def tune(args, out: str, resume: bool):
    config = TuneConfig(trials=args.trials, time_budget_s=args.time_budget, resume=resume)
    return tunekit.tune(args.model, gpu_pct=args.gpu_pct, cpu_pct=args.cpu_pct, out=out, config=config)


def main(argv=None) -> int:
    args = parse_args(argv)
    started = time.time()
    out = os.path.join(args.work, "out")
    resumed = restore_cache(args.cache, out)
    try:
        try:
            result = tune(args, out, resumed)
        except TunekitError as exc:
            if not (resumed and "cannot resume" in str(exc)):
                raise
            print(f"ci_tune: the cached records are for something else ({exc}); tuning from scratch",
                  file=sys.stderr)
            restore_cache("", out)
            resumed = False
            result = tune(args, out, resumed)
    except TunekitError as exc:
        print(f"ci_tune: {exc}", file=sys.stderr)
        return 1 if isinstance(exc, tunekit.RunFailed) else 2
    save_cache(out, args.cache)
    os.makedirs(args.artifacts, exist_ok=True)
    artifact = shutil.copy2(result.artifact, args.artifacts)
    metadata = shutil.copy2(os.path.splitext(result.artifact)[0] + ".json", args.artifacts)
    with open(metadata) as fh:
        trials_total = json.load(fh)["tuned_trials"]  # every trial in the records the artifact was built from
    met = args.slo_ms is None or result.tuned_ms <= args.slo_ms
    summary = {"model": os.path.abspath(args.model), "share": result.share, "resumed_from_cache": resumed,
               "trials_this_run": result.trials, "trials_total": trials_total,
               "untuned_ms": result.untuned_ms, "tuned_ms": result.tuned_ms, "slo_ms": args.slo_ms, "slo_met": met,
               "artifact": os.path.abspath(artifact), "report": os.path.abspath(result.report_path),
               "wall_s": round(time.time() - started, 1)}
    with open(args.summary, "w") as fh:
        json.dump(summary, fh, indent=2)
    print(f"{result.share}: {result.untuned_ms:.3f} -> {result.tuned_ms:.3f} ms"
          + (f" (SLO {args.slo_ms:g} ms {'met' if met else 'NOT met'})" if args.slo_ms is not None else ""))
    return 0 if met else EXIT_SLO_NOT_MET


if __name__ == "__main__":
    sys.exit(main())
