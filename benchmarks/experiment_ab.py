"""A/B of an experimental switch on one model at one share: the model tuned twice with the same budget, once with
the switch (an environment variable NAME=VALUE, or `tunekit tune` options such as "--config on.yaml") and once
without, then both artifacts timed in turns (`tunekit bench` at the
share, --rounds alternating which goes first). The table: each side's p50 (median over rounds), its tuned estimate
and trials, and on / off. A switch ships on by default only from such a run (benchmarks/RESULTS.md).

  python3 benchmarks/experiment_ab.py --model vit_b_16.onnx --switch "--config robust.yaml" \\
      --share gpu40 --time-budget 240 --work /tmp/ab --results /tmp/ab/ab.md
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from tuning_time import write_results  # noqa: E402  (the same machine line as every benchmark)

SIDES = ("on", "off")


def tune(side: str, *, args, env: dict, options: list[str]) -> dict:
    """`tunekit tune --json` of the model with the switch `side`: its JSON (or {"error": last stderr line})."""
    kind, pct = args.share[:3], args.share[3:]
    cmd = [sys.executable, "-m", "tunekit.cli", "tune", args.model, f"--{kind}-pct", pct, "--time-budget",
           str(args.time_budget), "--trials", "1000000", "--out", os.path.join(args.work, side), "--json",
           *args.tune_args.split(), *options]  # the time budget, not --trials' default of 64, ends the tune
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    with open(os.path.join(args.work, f"{side}.log"), "w") as fh:
        fh.write(proc.stderr)
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(proc.stdout)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="an ONNX model")
    p.add_argument("--switch", required=True, help="NAME=VALUE (an environment variable) or tune options ('--...')")
    p.add_argument("--share", default="gpu40", help="gpuNN or cpuNN")
    p.add_argument("--time-budget", type=float, default=240, help="seconds of tuning per side")
    p.add_argument("--tune-args", default="", help="more `tunekit tune` options, for both sides")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--repeats", type=int, default=300)
    p.add_argument("--work", required=True)
    p.add_argument("--results", required=True)
    args = p.parse_args(argv)
    options = args.switch.split() if args.switch.startswith("--") else []
    name, _, value = ("", "", "") if options else args.switch.partition("=")
    if not (options or name) or args.share[:3] not in ("gpu", "cpu"):
        raise SystemExit("--switch is NAME=VALUE or tune options, --share gpuNN or cpuNN")
    os.makedirs(args.work, exist_ok=True)
    off_env = {k: v for k, v in os.environ.items() if k != name}
    runs = {side: tune(side, args=args, env={**off_env, name: value} if side == "on" and name else off_env,
                       options=options if side == "on" else []) for side in SIDES}
    with open(os.path.join(args.work, "runs.json"), "w") as fh:
        json.dump(runs, fh, indent=1)
    from tunekit.deploy import bench

    share = {f"{args.share[:3]}_pct": int(args.share[3:])}
    timed = {side: [] for side in SIDES if "artifact" in runs[side]}
    for r in range(args.rounds):
        for side in (list(timed) if r % 2 == 0 else list(reversed(timed))):
            timed[side].append(bench(runs[side]["artifact"], repeats=args.repeats, warmup=30, **share).p50_ms)
    lines = [f"{os.path.basename(args.model)} at {args.share}, {args.time_budget:g} s of tuning per side, switch "
             f"`{args.switch}`", "", "| side | p50 ms (median of rounds) | trials | error |", "| --- | ---: | ---: | --- |"]
    for side in SIDES:
        p50 = f"{statistics.median(timed[side]):.4f}" if timed.get(side) else "-"
        trials = runs[side].get("report", {}).get("trials", {}).get("measured", "-")
        lines.append(f"| {side} | {p50} | {trials} | {runs[side].get('error', '')} |")
    if len(timed) == 2:
        lines += ["", f"on / off: {statistics.median(timed['on']) / statistics.median(timed['off']):.3f}"]
    write_results("\n".join(lines), args.results, script="experiment_ab.py", argv=argv)


if __name__ == "__main__":
    main()
