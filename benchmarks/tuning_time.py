"""Tuning time: stock MetaSchedule vs tunekit, same model, trials, seed and share, in one run.

Each engine runs as its own `tunekit tune` process (so each pays its own imports and start-up):
- stock:   `--engine stock --server-mode stock`: ms.tune_tasks + LocalBuilder + RPCRunner, measuring
           on TVM's own rpc_server at the share (--no-fork on GPU: fork mode breaks CUDA);
- tunekit: the defaults (persistent build pool, warm servers, persistent sessions, overlapped loop).

Prints one Markdown table (wall time, trials/s, seconds per trial by phase, final latency at the
share, and the stock/tunekit ratio) and writes it, with the machine and command, to --results.

  python benchmarks/tuning_time.py --model tiny_cnn --cpu-pct 50 --trials 32
  python benchmarks/tuning_time.py --model resnet18 --gpu-pct 40 --trials 64
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

ENGINES = {"stock": ["--engine", "stock", "--server-mode", "stock"], "tunekit": []}


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next(line.split(":", 1)[1].strip() for line in fh if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    text = f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}"
    try:
        import pynvml

        pynvml.nvmlInit()
        text += f", GPU: {pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))}"
    except Exception:
        text += ", no GPU"
    return text


def model_path(name: str, workdir: str) -> str:
    if os.path.isfile(name):
        return name
    from tunekit.models.examples import save_example

    return save_example(name, os.path.join(workdir, f"{name}.onnx"))


def run_engine(engine: str, model: str, share_flag: list[str], args, workdir: str) -> dict:
    out = os.path.join(workdir, engine)
    cmd = [sys.executable, "-m", "tunekit.cli", "tune", model, *share_flag, "--trials", str(args.trials),
           "--trials-per-iter", str(args.trials_per_iter), "--seed", str(args.seed), "--out", out, "--json",
           *ENGINES[engine], *args.extra]
    print(f"[{engine}] {' '.join(cmd[2:])}", file=sys.stderr, flush=True)
    started = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{engine} failed:\n{proc.stderr[-3000:]}")
    report = json.loads(proc.stdout)["report"]
    report["process_wall_s"] = round(time.time() - started, 1)
    return report


def table(reports: dict) -> str:
    stock, fast = reports.get("stock"), reports.get("tunekit")
    rows = [("tuning wall time (s)", lambda r: r["tuning_wall_s"], "{:.1f}"),
            ("whole command (s)", lambda r: r["process_wall_s"], "{:.1f}"),
            ("trials measured", lambda r: r["trials"]["measured"], "{}"),
            ("failed trials", lambda r: r["trials"]["failed"], "{}"),
            ("trials / s", lambda r: r["trials"]["measured"] / r["tuning_wall_s"], "{:.3f}"),
            ("s / trial", lambda r: r["tuning_wall_s"] / max(1, r["trials"]["measured"]), "{:.3f}"),
            ("untuned latency (ms)", lambda r: r["latency_ms"]["untuned"]["median_ms"], "{:.4f}"),
            ("tuned latency (ms)", lambda r: r["latency_ms"]["tuned"]["median_ms"], "{:.4f}")]
    lines = ["| metric | stock | tunekit | stock / tunekit |", "| --- | ---: | ---: | ---: |"]
    for label, get, fmt in rows:
        a = get(stock) if stock else None
        b = get(fast) if fast else None
        ratio = f"{a / b:.2f}" if a is not None and b else ""
        lines.append(f"| {label} | {fmt.format(a) if a is not None else ''} | {fmt.format(b) if b is not None else ''} | {ratio} |")
    if fast and fast.get("phases", {}).get("per_trial_s"):
        per = fast["phases"]["per_trial_s"]
        lines += ["", "tunekit seconds per trial by phase (search is the loop's thread; build is the stage thread, "
                  "overlapping search; load and run are summed over candidates on the servers; wait is the loop "
                  "blocked on a batch's build or measurements):", "",
                  "| " + " | ".join(per) + " | overhead fraction |",
                  "|" + " ---: |" * (len(per) + 1),
                  "| " + " | ".join(f"{v:.4f}" for v in per.values()) + f" | {fast['phases']['overhead_fraction']} |"]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny_cnn", help="an example name or an ONNX path")
    parser.add_argument("--cpu-pct", type=int)
    parser.add_argument("--gpu-pct", type=int)
    parser.add_argument("--trials", type=int, default=32)
    parser.add_argument("--trials-per-iter", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--engines", default="tunekit,stock")
    parser.add_argument("--results", help="write the table here (Markdown)")
    parser.add_argument("extra", nargs="*", help="more `tunekit tune` flags for both engines (after --)")
    args = parser.parse_args()
    share_flag = ["--gpu-pct", str(args.gpu_pct)] if args.gpu_pct else ["--cpu-pct", str(args.cpu_pct or 50)]
    with tempfile.TemporaryDirectory(prefix="tunekit-bench-") as workdir:
        model = model_path(args.model, workdir)
        reports = {}
        for engine in args.engines.split(","):
            reports[engine] = run_engine(engine, model, share_flag, args, workdir)
            if args.results:  # each engine's report as soon as it exists: a cut-off run keeps it
                os.makedirs(os.path.dirname(os.path.abspath(args.results)), exist_ok=True)
                with open(os.path.splitext(args.results)[0] + ".json", "w") as fh:
                    json.dump(reports, fh, indent=1, default=str)
    text = (f"# Tuning time: {args.model} at {share_flag[0][2:]} {share_flag[1]}%, {args.trials} trials, "
            f"seed {args.seed}\n\nMachine: {machine()}\n\nCommand: `python benchmarks/tuning_time.py "
            f"{' '.join(sys.argv[1:])}`\n\n{table(reports)}\n")
    print(text)
    if args.results:
        os.makedirs(os.path.dirname(os.path.abspath(args.results)), exist_ok=True)
        with open(args.results, "w") as fh:
            fh.write(text)
        with open(os.path.splitext(args.results)[0] + ".json", "w") as fh:
            json.dump(reports, fh, indent=1, default=str)


if __name__ == "__main__":
    main()
