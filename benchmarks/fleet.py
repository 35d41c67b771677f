"""A fleet against its models tuned one after another and side by side, with the same wall-clock budget.

Three setups, each given `--budget` seconds of tuning in all, each model at its share (`--share`, e.g. cpu50 for
each of two models on a CPU):
- fleet:       `tunekit tune a.onnx b.onnx --<kind>-pct P --time-budget B` (one search, one budget);
- sequential:  `tunekit tune m.onnx --<kind>-pct P --time-budget B/n` for each model, one after another;
- parallel:    the same per model with `--time-budget B`, all processes at once (the ledger lets them share).
Every artifact is then timed again with `tunekit bench` at its share, the setups in turns (`--rounds`), so that the
ratios compare artifacts timed side by side. Prints and writes (`--results`) one Markdown table: per setup, each
model's tuned latency, the weighted sum, its ratio to sequential, and each setup's tuning wall.

  python benchmarks/fleet.py --share cpu50 --budget 180              # the CPU version in `make bench`
  python benchmarks/fleet.py --share gpu25 --budget 600 --models resnet18,mobilenet,transformer,resnet18:classes=10
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from tuning_time import write_results  # noqa: E402  (the same machine line as every benchmark)

SETUPS = ("fleet", "sequential", "parallel")


def make_models(specs: str, *, image: int, work: str) -> list[str]:
    """`name[:key=value...]` example models (tunekit.models.examples), e.g. resnet18:classes=10, at `image`."""
    from tunekit.models.examples import save_example

    paths = []
    for i, spec in enumerate(specs.split(",")):
        name, *options = spec.split(":")
        kwargs = {"image": image, **{k: int(v) for k, v in (o.split("=") for o in options)}}
        if name == "resnet18":
            kwargs.setdefault("width", 32)
        paths.append(save_example(name, os.path.join(work, f"m{i}-{name}.onnx"), seed=i, **kwargs))
    return paths


def tunekit(*args: str) -> tuple[dict, float]:
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "tunekit.cli", *args, "--json"], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"tunekit {' '.join(args)} failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
    return json.loads(proc.stdout), time.perf_counter() - started


def run_setups(models: list[str], *, flag: str, pct: str, budget: float, work: str) -> dict:
    """{setup: {"artifacts": [per model], "wall_s": seconds}}."""
    out = {}
    payload, wall = tunekit("tune", *models, flag, pct, "--time-budget", f"{budget:g}", "--trials", "1000000",
                            "--out", os.path.join(work, "fleet"))
    out["fleet"] = {"artifacts": [row["artifact"] for row in payload["report"]["fleet"]], "wall_s": wall,
                    "trials": sum(payload["report"]["trials"]["measured"].values())}
    artifacts, trials, started = [], 0, time.perf_counter()
    for i, model in enumerate(models):
        payload, _ = tunekit("tune", model, flag, pct, "--time-budget", f"{budget / len(models):g}", "--trials",
                             "1000000", "--out", os.path.join(work, f"seq{i}"))
        artifacts.append(payload["artifact"])
        trials += payload["trials"]
    out["sequential"] = {"artifacts": artifacts, "wall_s": time.perf_counter() - started, "trials": trials}
    started = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-m", "tunekit.cli", "tune", model, flag, pct, "--time-budget",
                               f"{budget:g}", "--trials", "1000000", "--out", os.path.join(work, f"par{i}"), "--json",
                               "--wait-for-share", "600"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i, model in enumerate(models)]
    results = [proc.communicate() for proc in procs]
    for proc, (_, stderr) in zip(procs, results):
        if proc.returncode != 0:
            raise SystemExit(f"a parallel tune failed: {(stderr.strip().splitlines() or ['?'])[-1]}")
    payloads = [json.loads(stdout) for stdout, _ in results]
    out["parallel"] = {"artifacts": [p["artifact"] for p in payloads], "wall_s": time.perf_counter() - started,
                       "trials": sum(p["trials"] for p in payloads)}
    return out


def bench_all(runs: dict, *, flag: str, pct: str, rounds: int) -> dict:
    """{setup: [median over rounds of each model's p50 ms]}: every artifact timed once per round, setups in turns."""
    times = {setup: [[] for _ in run["artifacts"]] for setup, run in runs.items()}
    for _ in range(rounds):
        for setup, run in runs.items():
            for i, artifact in enumerate(run["artifacts"]):
                payload, _ = tunekit("bench", artifact, flag, pct, "--repeats", "50")
                times[setup][i].append(payload["p50_ms"])
    return {setup: [statistics.median(t) for t in per_model] for setup, per_model in times.items()}


def table(models: list[str], runs: dict, latency: dict, weights: list[float]) -> str:
    names = [os.path.splitext(os.path.basename(m))[0] for m in models]
    weighted = {setup: sum(w * t for w, t in zip(weights, latency[setup])) for setup in runs}
    lines = [f"| setup | {' | '.join(f'{n} ms' for n in names)} | weighted sum ms | / sequential | trials | wall s |",
             "| --- |" + " ---: |" * (len(names) + 4)]
    for setup in runs:
        lines.append(f"| {setup} | " + " | ".join(f"{t:.4f}" for t in latency[setup])
                     + f" | {weighted[setup]:.4f} | {weighted[setup] / weighted['sequential']:.3f} | "
                     f"{runs[setup]['trials']} | {runs[setup]['wall_s']:.0f} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="resnet18,mobilenet", help="example models, name[:key=value...] each")
    p.add_argument("--image", type=int, default=64)
    p.add_argument("--share", default="cpu50", help="every model's share, e.g. cpu50 or gpu25")
    p.add_argument("--budget", type=float, default=180, help="seconds of tuning per setup")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--results", default=os.path.join("tunekit-out", "fleet-bench.md"), help="write the table here")
    args = p.parse_args(argv)
    flag, pct = f"--{args.share[:3]}-pct", args.share[3:]
    with tempfile.TemporaryDirectory(prefix="tunekit-fleet-bench-") as work:
        models = make_models(args.models, image=args.image, work=work)
        runs = run_setups(models, flag=flag, pct=pct, budget=args.budget, work=work)
        latency = bench_all(runs, flag=flag, pct=pct, rounds=args.rounds)
        text = table(models, runs, latency, [1.0] * len(models))
    write_results(text, args.results, script="fleet.py", argv=argv)


if __name__ == "__main__":
    main()
