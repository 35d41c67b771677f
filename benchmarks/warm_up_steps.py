"""Where a several-share run's warm-up goes, this tree against another, rounds alternating, one machine.

Runs `tunekit tune MODEL --<kind>-pct P1,P2,... --trials N` from each source tree in turn (PYTHONPATH puts the
tree first, for its servers and workers too) and reads report.json's `phases.warm_up`: the fleets' start, the
engine's, the build workers', how long the warm-up took and how long tuning waited for it, and the whole
command's wall time.

  git archive HEAD~1 tunekit | tar -x -C /tmp/before
  python benchmarks/warm_up_steps.py --model resnet18 --cpu-pct 50,100 --trials 8 --before-src /tmp/before --rounds 3
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
TREE = os.path.dirname(HERE)


def run_once(src: str, model: str, share_flag: list[str], trials: int, out: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
           "RAY_AUTH_MODE": "disabled"}
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", "from tunekit.cli import main; raise SystemExit(main())", "tune", model, *share_flag,
                           "--trials", str(trials), "--trials-per-iter", "4", "--out", out, "--json"],
                          env=env, capture_output=True, text=True, cwd=tempfile.gettempdir())
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        sys.exit(f"tune from {src} failed: {proc.stderr.strip().splitlines()[-1:]}")
    report = json.loads(proc.stdout)["report"]
    first = next(iter(report["per_share"].values()))
    warm = first["phases"]["warm_up"]
    return {"wall_s": round(wall, 2), "took_s": warm["took_s"], "tuning_waited_s": warm["tuning_waited_s"],
            **warm["steps"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resnet18", help="an example name or an ONNX path")
    parser.add_argument("--cpu-pct", help="a share list, e.g. 50,100")
    parser.add_argument("--gpu-pct", help="a share list, e.g. 20,40,100")
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--before-src", required=True, help="the other source tree (a folder holding tunekit/)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    share_flag = ["--gpu-pct", args.gpu_pct] if args.gpu_pct else ["--cpu-pct", args.cpu_pct or "50,100"]

    with tempfile.TemporaryDirectory(prefix="tunekit-warm-up-") as work:
        model = args.model
        if not os.path.isfile(model):
            model = os.path.join(work, f"{args.model}.onnx")
            subprocess.run([sys.executable, "-m", "tunekit.cli", "example", "--name", args.model, "--out", model],
                           check=True, capture_output=True, cwd=TREE)
        runs: dict[str, list[dict]] = {"before": [], "this tree": []}
        for r in range(args.rounds):  # alternating, so drift hits both alike
            for name, src in (("before", os.path.abspath(args.before_src)), ("this tree", TREE)):
                runs[name].append(run_once(src, model, share_flag, args.trials, os.path.join(work, f"{name}-{r}")))
                print(f"round {r} {name}: {runs[name][-1]}", file=sys.stderr, flush=True)
    keys = ["fleets_s", "engine_s", "build_workers_s", "took_s", "tuning_waited_s", "wall_s"]
    print(f"{args.model}, {' '.join(share_flag)}, {args.trials} trials, {args.rounds} rounds alternating "
          f"(median, then each round)\n")
    print("| run | " + " | ".join(keys) + " |\n| --- |" + " ---: |" * len(keys))
    for name, rows in runs.items():
        cells = []
        for key in keys:
            values = [row.get(key) for row in rows if row.get(key) is not None]
            cells.append(f"{statistics.median(values):.2f} ({', '.join(f'{v:.2f}' for v in values)})" if values else "–")
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
