"""Build once, measure at every share (issue 15): what tuning several shares in one search costs, and
whether each share's result holds up against a search for that share alone at equal trials.

  python benchmarks/multi_share.py run --model M.onnx --pcts 20,40,100 --trials 64 --setups every,alone40 \
      --work /tmp/ms --results benchmarks/results/h100-resnet18-multi-share
  python benchmarks/multi_share.py run ... --setups alone20,alone100        # a later device call
  python benchmarks/multi_share.py summarize --results benchmarks/results/h100-resnet18-multi-share

Setups (each one `tunekit tune` command, timed as a user runs it):
- `every`: `--gpu-pct 20,40,100 --robust`: one search, each candidate measured at every share, plus the
  share-robust artifact and its regret matrix;
- `alone<P>`: `--gpu-pct P`: a search for that share alone (what `every` is compared with).
Resumable across calls: each finished setup is kept in <results>/setups.json and skipped next time;
`summarize` writes README-ready tables (multi_share.md) from it. `--kind cpu` runs CPU shares.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time


def _machine(kind: str) -> str:
    if kind == "gpu":
        try:
            return subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                                  text=True, timeout=30).stdout.strip().splitlines()[0]
        except (OSError, IndexError, subprocess.SubprocessError):
            return "unknown GPU"
    with open("/proc/cpuinfo") as fh:
        model = next((line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")), "unknown CPU")
    return f"{model}, {os.cpu_count()} cores"


def _load(results: str) -> dict:
    path = os.path.join(results, "setups.json")
    return json.load(open(path)) if os.path.exists(path) else {"setups": {}}


def _save(results: str, data: dict) -> None:
    os.makedirs(results, exist_ok=True)
    path = os.path.join(results, "setups.json")
    with open(path + ".tmp", "w") as fh:
        json.dump(data, fh, indent=1)
    os.replace(path + ".tmp", path)


def _command(args, setup: str, out: str) -> list[str]:
    flag = f"--{args.kind}-pct"
    pcts = args.pcts if setup == "every" else setup.removeprefix("alone")
    cmd = [sys.executable, "-m", "tunekit.cli", "tune", args.model, flag, pcts, "--trials", str(args.trials),
           "--trials-per-iter", str(args.trials_per_iter), "--out", out, "--json"]
    return cmd + (["--robust"] if setup == "every" else [])


def _summary_of(setup: str, payload: dict, wall_s: float) -> dict:
    """What the tables need from a run's --json output."""
    if setup == "every":
        report = payload["report"]
        shares = {label: {"tuned_ms": r["latency_ms"]["tuned"]["median_ms"],
                          "untuned_ms": r["latency_ms"]["untuned"]["median_ms"], "trials": r["trials"]["measured"],
                          "phases": r["phases"]["total_s"], "proposed_by": r["phases"].get("proposed_by")}
                  for label, r in report["per_share"].items()}
        first = next(iter(report["per_share"].values()))
        return {"command_wall_s": wall_s, "tuning_wall_s": first["tuning_wall_s"], "command_s": first["command_s"],
                "shares": shares, "robust": report.get("robust"), "search": report["search"]}
    report = payload["report"]
    return {"command_wall_s": wall_s, "tuning_wall_s": report["tuning_wall_s"], "command_s": report["command_s"],
            "shares": {report["environment"]["share"]: {
                "tuned_ms": report["latency_ms"]["tuned"]["median_ms"],
                "untuned_ms": report["latency_ms"]["untuned"]["median_ms"], "trials": report["trials"]["measured"],
                "phases": report["phases"]["total_s"]}}}


def run(args) -> None:
    data = _load(args.results)
    data.update({"machine": _machine(args.kind), "model": os.path.basename(args.model), "trials": args.trials,
                 "pcts": args.pcts, "kind": args.kind})
    for setup in args.setups.split(","):
        if setup in data["setups"]:
            print(f"{setup}: already measured, kept", file=sys.stderr)
            continue
        out = os.path.join(args.work, setup)
        cmd = _command(args, setup, out)
        print("running:", " ".join(cmd), file=sys.stderr, flush=True)
        started = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout_s)
        wall = time.perf_counter() - started
        with open(os.path.join(args.work, f"{setup}.log"), "w") as fh:
            fh.write(proc.stderr)
        if proc.returncode != 0:
            print(f"{setup}: exit {proc.returncode}\n{proc.stderr[-1500:]}", file=sys.stderr)
            continue
        data["setups"][setup] = {**_summary_of(setup, json.loads(proc.stdout), round(wall, 1)),
                                 "command": " ".join(["tunekit", *cmd[3:]]),
                                 "date": datetime.date.today().isoformat()}
        _save(args.results, data)
        print(f"{setup}: {wall:.0f} s", file=sys.stderr, flush=True)


def _ratio(a, b) -> str:
    return f"{a / b:.2f}×" if a and b else "n/a"


def summarize(args) -> None:
    data = _load(args.results)
    setups = data["setups"]
    every = setups.get("every")
    if every is None:
        raise SystemExit("multi_share: no `every` setup measured yet")
    labels = list(every["shares"])
    lines = [f"# Build once, measure at every share: {data['model']}, {data['trials']} trials", "",
             f"Machine: {data['machine']}. Commands (benchmarks/multi_share.py):", ""]
    lines += [f"- `{s}`: `{v['command']}` ({v['date']})" for s, v in setups.items()]
    lines += ["", "## Cost: one search for every share vs a search for one share", "",
              "| setup | tuning wall s | whole command s | measured s (load + run, summed over shares) |",
              "| --- | ---: | ---: | ---: |"]
    for name, v in setups.items():
        measured = sum(s["phases"].get("load_s", 0) + s["phases"].get("run_s", 0) for s in list(v["shares"].values())[:1])
        lines.append(f"| {name} | {v['tuning_wall_s']:.1f} | {v['command_wall_s']:.1f} | {measured:.1f} |")
    alone = {label: setups.get(f"alone{label.removeprefix(data['kind'])}") for label in labels}
    for label, single in alone.items():
        if single:
            lines.append(f"\n`every` ({len(labels)} shares) / `alone` at {label}: tuning wall "
                         f"{_ratio(every['tuning_wall_s'], single['tuning_wall_s'])}, whole command "
                         f"{_ratio(every['command_wall_s'], single['command_wall_s'])}")
    lines += ["", "## Each share's tuned model: one search for all vs a search for that share alone", "",
              "| share | untuned ms | every: tuned ms | alone: tuned ms | every / alone |", "| --- | ---: | ---: | ---: | ---: |"]
    for label in labels:
        mine = every["shares"][label]
        own = (alone.get(label) or {}).get("shares", {}).get(label)
        lines.append(f"| {label} | {mine['untuned_ms']:.4f} | {mine['tuned_ms']:.4f} | "
                     f"{own['tuned_ms']:.4f} | {mine['tuned_ms'] / own['tuned_ms']:.3f} |" if own else
                     f"| {label} | {mine['untuned_ms']:.4f} | {mine['tuned_ms']:.4f} | n/a | n/a |")
    robust = every.get("robust")
    if robust:
        lines += ["", "## Share-robust artifact: regret (latency / the best artifact's at that share) per share", "",
                  "| artifact | " + " | ".join(robust["shares"]) + " | worst |",
                  "| --- |" + " ---: |" * (len(robust["shares"]) + 1)]
        for name, row in robust["matrix"].items():
            lines.append(f"| {name} | " + " | ".join(f"{row['regret'][s]:.3f} ({row['latency_ms'][s]:.4f} ms)"
                                                    for s in robust["shares"]) + f" | {row['worst_regret']:.3f} |")
        chosen = robust["tasks"]
        lines.append(f"\nPer task: {sum(1 for t in chosen if t['chosen'] == 'untuned')} of {len(chosen)} tasks keep "
                     f"the untuned kernel; worst per-task regret {max(t['worst_regret'] for t in chosen):.3f}.")
    text = "\n".join(lines) + "\n"
    with open(os.path.join(args.results, "multi_share.md"), "w") as fh:
        fh.write(text)
    print(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="step", required=True)
    p = sub.add_parser("run")
    p.add_argument("--model", required=True)
    p.add_argument("--kind", choices=["gpu", "cpu"], default="gpu")
    p.add_argument("--pcts", default="20,40,100")
    p.add_argument("--trials", type=int, default=64)
    p.add_argument("--trials-per-iter", type=int, default=16)
    p.add_argument("--setups", default="every,alone40")
    p.add_argument("--work", default="/tmp/multi-share")
    p.add_argument("--timeout-s", type=float, default=900)
    p.add_argument("--results", required=True)
    s = sub.add_parser("summarize")
    s.add_argument("--results", required=True)
    args = parser.parse_args()
    run(args) if args.step == "run" else summarize(args)


if __name__ == "__main__":
    main()
